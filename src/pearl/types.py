"""Value types shared by every layer: pools, roles, phases, layout shapes.

This module imports nothing from the rest of the package; everything else may import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Pool(str, Enum):
    """Who owns a device."""

    TRAIN = "train"  # the trainer's; lendable while it idles
    ROLLOUT = "rollout"  # dedicated to rollout
    ELASTIC = "elastic"  # external; arrives and is revoked, maybe with notice


class Role(str, Enum):
    """What a worker does."""

    MIXED = "mixed"  # colocated prefill + decode (chunked prefill)
    PREFILL = "prefill"
    DECODE = "decode"


class Mode(str, Enum):
    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


class DeviceStatus(str, Enum):
    FREE = "free"  # available, not serving
    SERVING = "serving"  # part of a worker
    TRAINING = "training"  # used by the trainer
    GONE = "gone"  # revoked / lost


class WorkerPhase(str, Enum):
    LOADING = "loading"
    SERVING = "serving"
    STOPPED = "stopped"


@dataclass(frozen=True, order=True)
class LayoutShape:
    """The shape of a layout: colocated (n_mixed workers) or disaggregated (n_prefill : n_decode).

    `tp` is the number of devices per worker.
    """

    mode: Mode
    n_mixed: int = 0
    n_prefill: int = 0
    n_decode: int = 0
    tp: int = 1

    @staticmethod
    def colocated(n: int, tp: int = 1) -> "LayoutShape":
        return LayoutShape(Mode.COLOCATED, n_mixed=n, tp=tp)

    @staticmethod
    def disaggregated(p: int, d: int, tp: int = 1) -> "LayoutShape":
        return LayoutShape(Mode.DISAGGREGATED, n_prefill=p, n_decode=d, tp=tp)

    @property
    def n_workers(self) -> int:
        return self.n_mixed + self.n_prefill + self.n_decode

    @property
    def n_devices(self) -> int:
        return self.n_workers * self.tp

    def count(self, role: Role) -> int:
        return {Role.MIXED: self.n_mixed, Role.PREFILL: self.n_prefill, Role.DECODE: self.n_decode}[role]

    def roles(self) -> list[Role]:
        """One role per worker slot, in a canonical order (prefill, decode, mixed)."""
        return [Role.PREFILL] * self.n_prefill + [Role.DECODE] * self.n_decode + [Role.MIXED] * self.n_mixed

    def __str__(self) -> str:
        tp = f"@tp{self.tp}" if self.tp != 1 else ""
        if self.mode is Mode.COLOCATED:
            return f"colocated×{self.n_mixed}{tp}"
        return f"{self.n_prefill}P:{self.n_decode}D{tp}"
