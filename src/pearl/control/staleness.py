"""The staleness gate (admission control for asynchronous RL).

A trajectory may start only if it can still be trained on within η policy versions. With a rollout
batch of B trajectories, at most (η + v + 1)·B trajectories may have been started by the time the
trainer is at version v (AReaL's rule): capacity = min(concurrency limit − running,
(η + v + 1)·B − (accepted + running)). Trajectories that fail or are discarded give their slot back.
Pure: no clocks, no I/O.
"""
from __future__ import annotations


class StalenessGate:
    def __init__(self, batch_size: int, eta: int, max_concurrent: int | None = None):
        if batch_size < 1 or eta < 0:
            raise ValueError(f"batch_size must be >= 1 and eta >= 0 (got {batch_size}, {eta})")
        self.batch_size = batch_size
        self.eta = eta
        self.max_concurrent = max_concurrent
        self.running = 0
        self.accepted = 0  # finished and kept for training (trained or waiting to be)

    def capacity(self, version: int) -> int:
        cap = (self.eta + version + 1) * self.batch_size - (self.accepted + self.running)
        if self.max_concurrent is not None:
            cap = min(cap, self.max_concurrent - self.running)
        return max(0, cap)

    def on_start(self, n: int = 1) -> None:
        self.running += n

    def on_finish(self, n: int = 1, accepted: bool = True) -> None:
        """n trajectories left the running set; `accepted=False` gives their slots back."""
        self.running -= n
        if accepted:
            self.accepted += n

    def on_discard(self, n: int = 1) -> None:
        """Accepted trajectories that the trainer discarded (too stale): their slots come back."""
        self.accepted -= n
