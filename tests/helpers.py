"""Helpers shared by test modules."""
from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def deadline(seconds: float):
    """Turn a hang into a TimeoutError (SIGALRM; main thread, POSIX)."""
    def expire(signum, frame):
        raise TimeoutError(f"did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
