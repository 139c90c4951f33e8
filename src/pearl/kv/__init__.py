"""KV-cache bookkeeping (no torch)."""
