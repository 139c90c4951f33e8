"""Value types shared by every layer: pools, roles, phases, layout shapes.

This module imports nothing from the rest of the package; everything else may import it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import total_ordering


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


@total_ordering
@dataclass(frozen=True)
class LayoutShape:
    """The shape of a layout: colocated (n_mixed workers) or disaggregated (n_prefill : n_decode).

    `tp` is the number of devices per worker. A disaggregated layout may give its prefill workers a
    tp of their own, `tp_prefill` (None, the default, or equal to `tp`: the same as `tp`, stored as
    None so that equal shapes compare equal); `tp_of(role)` is a worker's tp either way.
    """

    mode: Mode
    n_mixed: int = 0
    n_prefill: int = 0
    n_decode: int = 0
    tp: int = 1
    tp_prefill: int | None = None

    def __post_init__(self) -> None:
        if self.tp_prefill is not None and (self.tp_prefill == self.tp or self.mode is Mode.COLOCATED):
            object.__setattr__(self, "tp_prefill", None)

    def _key(self) -> tuple:
        return (self.mode, self.n_mixed, self.n_prefill, self.n_decode, self.tp, self.tp_of(Role.PREFILL))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, LayoutShape):
            return NotImplemented
        return self._key() < other._key()

    @staticmethod
    def colocated(n: int, tp: int = 1) -> "LayoutShape":
        return LayoutShape(Mode.COLOCATED, n_mixed=n, tp=tp)

    @staticmethod
    def disaggregated(p: int, d: int, tp: int = 1, tp_prefill: int | None = None) -> "LayoutShape":
        return LayoutShape(Mode.DISAGGREGATED, n_prefill=p, n_decode=d, tp=tp, tp_prefill=tp_prefill)

    @property
    def per_role_tp(self) -> bool:
        """Whether the prefill workers' tp differs from the others'."""
        return self.tp_prefill is not None

    def tp_of(self, role: Role) -> int:
        """Devices per worker of `role`."""
        return self.tp_prefill if role is Role.PREFILL and self.tp_prefill is not None else self.tp

    @property
    def n_workers(self) -> int:
        return self.n_mixed + self.n_prefill + self.n_decode

    @property
    def n_devices(self) -> int:
        return self.n_prefill * self.tp_of(Role.PREFILL) + (self.n_decode + self.n_mixed) * self.tp

    def count(self, role: Role) -> int:
        return {Role.MIXED: self.n_mixed, Role.PREFILL: self.n_prefill, Role.DECODE: self.n_decode}[role]

    def fits(self, node_sizes: Iterable[int]) -> bool:
        """Whether every worker's tp devices can sit on one node, given how many devices each node
        offers (the widest workers placed first: exact when each tp divides the larger ones)."""
        room = list(node_sizes)
        for tp, k in sorted(((self.tp_of(Role.PREFILL), self.n_prefill), (self.tp, self.n_decode + self.n_mixed)),
                            reverse=True):
            for i, c in enumerate(room):
                took = min(k, c // tp)
                room[i], k = c - took * tp, k - took
            if k:
                return False
        return True

    def roles(self) -> list[Role]:
        """One role per worker slot, in a canonical order (prefill, decode, mixed)."""
        return [Role.PREFILL] * self.n_prefill + [Role.DECODE] * self.n_decode + [Role.MIXED] * self.n_mixed

    def __str__(self) -> str:
        tp = f"@tp{self.tp}" if self.tp != 1 else ""
        if self.mode is Mode.COLOCATED:
            return f"colocated×{self.n_mixed}{tp}"
        if self.tp_prefill is not None:  # per-role tp: each side says its own
            return f"{self.n_prefill}P@tp{self.tp_prefill}:{self.n_decode}D@tp{self.tp}"
        return f"{self.n_prefill}P:{self.n_decode}D{tp}"
