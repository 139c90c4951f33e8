"""How many torch threads each part of `pearl train` computes with, and setting them.

torch's intra-op thread count is process-wide (torch 2.13: a count one thread sets is the count every
thread reads and its OpenMP regions use; MKL keeps a copy per thread), so each part sets its count
right before it computes: the trainer thread before each update (once its lent core is back), an
engine before each step (`TorchEngine(num_threads=...)`; a worker that took the trainer's lent core
computes with both counts added). When rollout and training overlap (η ≥ 1) with different counts, an
engine step during an update sets the count for the rest of it; the automatic plan gives the trainer
more than one thread only on hosts with more cores than rollout workers plus one. The automatic
plan (`threads.trainer` / `threads.engine` left unset) gives each rollout worker one thread (a decode
step is many small kernels: OpenMP threads waiting at barriers for a busy core make it slower, not
faster) and the trainer the rest of the cores this process may run on, at least one. Inter-op
threads (torch's pool for parallel graph branches, unused by these models) are set once per
process, to 1 unless `threads.interop` says otherwise.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def host_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which a container or taskset limits)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadPlan:
    cores: int
    trainer: int
    engine: int  # per rollout worker
    interop: int
    source: str  # "auto" or "config"

    def describe(self) -> str:
        return (f"threads: trainer {self.trainer}, {self.engine} per rollout worker, interop {self.interop} "
                f"({self.source}, {self.cores} cores)")


def plan_threads(cores: int, local_workers: int, trainer: int | None = None, engine: int | None = None,
                 interop: int | None = None) -> ThreadPlan:
    """The thread counts for a run with `local_workers` rollout workers on this host's `cores` cores (in
    this process, or Ray actors of the local instance: `TrainConfig.host_workers`; 0 when they are
    actors of a joined cluster); a given count overrides its automatic value."""
    auto_engine = 1
    auto_trainer = max(1, cores - local_workers * (engine or auto_engine))
    source = "config" if trainer is not None or engine is not None else "auto"
    return ThreadPlan(cores, trainer or auto_trainer, engine or auto_engine, interop or 1, source)


def set_interop_threads(n: int) -> bool:
    """Set torch's inter-op pool size; False when torch already started it (it is fixed after that)."""
    if torch.get_num_interop_threads() == n:
        return True
    try:
        torch.set_num_interop_threads(n)
        return True
    except RuntimeError:
        return False
