"""Engines: per-request state, the role-aware scheduler, and the emulated engine (no torch here)."""
