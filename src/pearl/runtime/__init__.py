"""Runtimes: the only code that owns time (virtual or wall), threads, processes and Ray."""
