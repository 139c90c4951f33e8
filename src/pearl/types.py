"""Value types shared by every layer: pools, roles, phases, layout shapes.

This module imports nothing from the rest of the package; everything else may import it.
"""
from __future__ import annotations

from collections import Counter
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
    None so that equal shapes compare equal); `tp_of(role)` is a worker's tp either way. A colocated
    layout may add `n_side` mixed workers of a smaller tp, `tp_side`, beside its `n_mixed` of `tp`:
    e.g. tp 8 on whole nodes and tp 2 on the pieces of nodes that a tp-8 worker cannot use.
    """

    mode: Mode
    n_mixed: int = 0
    n_prefill: int = 0
    n_decode: int = 0
    tp: int = 1
    tp_prefill: int | None = None
    n_side: int = 0
    tp_side: int | None = None

    def __post_init__(self) -> None:
        if self.tp_prefill is not None and (self.tp_prefill == self.tp or self.mode is Mode.COLOCATED):
            object.__setattr__(self, "tp_prefill", None)
        if self.n_side and (self.mode is not Mode.COLOCATED or self.tp_side is None or self.tp_side > self.tp):
            raise ValueError(f"side workers need a colocated layout and a tp below its tp {self.tp} "
                             f"(got {self.n_side} at tp {self.tp_side})")
        if self.tp_side == self.tp:  # side workers of the main tp are main workers
            object.__setattr__(self, "n_mixed", self.n_mixed + self.n_side)
            object.__setattr__(self, "n_side", 0)
        if not self.n_side:
            object.__setattr__(self, "tp_side", None)

    def _key(self) -> tuple:
        return (self.mode, self.n_mixed, self.n_prefill, self.n_decode, self.tp, self.tp_of(Role.PREFILL),
                self.n_side, self.tp_side or 0)

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

    @staticmethod
    def observed(workers: Iterable[tuple[Role, int]]) -> "LayoutShape":
        """The shape of live workers given as (role, tp). Disaggregated as soon as one prefill/decode
        worker exists (mixed ones are then counted too). Colocated workers of two tps: the larger is
        `tp`, the smaller `tp_side`. Otherwise tp is the most common worker size (the larger on a tie),
        unless the prefill workers all have one size and the others all another: then each side has its
        own (`tp_prefill`, `tp`). (A passing mix of more sizes is thus summarised, not exact.)"""
        ws = list(workers)
        if not ws:
            return LayoutShape.colocated(0)
        n = Counter(r for r, _ in ws)
        sizes = Counter(k for _, k in ws)
        tp, tp_p = max(sizes, key=lambda k: (sizes[k], k)), None
        if not n[Role.PREFILL] and not n[Role.DECODE]:
            if len(sizes) == 2:
                small, big = sorted(sizes)
                return LayoutShape(Mode.COLOCATED, n_mixed=sizes[big], tp=big, n_side=sizes[small], tp_side=small)
            return LayoutShape.colocated(len(ws), tp)
        pre = {k for r, k in ws if r is Role.PREFILL}
        rest = {k for r, k in ws if r is not Role.PREFILL}
        if len(pre) == 1 and len(rest) == 1 and pre != rest:
            tp, tp_p = rest.pop(), pre.pop()
        return LayoutShape(Mode.DISAGGREGATED, n_mixed=n[Role.MIXED], n_prefill=n[Role.PREFILL],
                           n_decode=n[Role.DECODE], tp=tp, tp_prefill=tp_p)

    @property
    def per_role_tp(self) -> bool:
        """Whether the prefill workers' tp differs from the others'."""
        return self.tp_prefill is not None

    def tp_of(self, role: Role) -> int:
        """Devices per worker of `role`."""
        return self.tp_prefill if role is Role.PREFILL and self.tp_prefill is not None else self.tp

    @property
    def n_workers(self) -> int:
        return self.n_mixed + self.n_prefill + self.n_decode + self.n_side

    @property
    def n_devices(self) -> int:
        return sum(tp * k for tp, k in self._sizes())

    def count(self, role: Role) -> int:
        return {Role.MIXED: self.n_mixed + self.n_side, Role.PREFILL: self.n_prefill, Role.DECODE: self.n_decode}[role]

    def _sizes(self) -> list[tuple[int, int]]:
        """(tp, workers of that tp) for each kind of worker slot (without building `tp_groups`' lists:
        a budget of a thousand devices ranks thousands of shapes)."""
        return [(tp, k) for tp, k in ((self.tp_of(Role.PREFILL), self.n_prefill), (self.tp, self.n_decode + self.n_mixed),
                                      (self.tp_side or 0, self.n_side)) if k]

    def tp_groups(self) -> list[tuple[int, list[Role]]]:
        """The worker slots by tp, the larger tp first (one group when every worker has one tp)."""
        if self.n_side:
            return [g for g in ((self.tp, [Role.MIXED] * self.n_mixed), (self.tp_side, [Role.MIXED] * self.n_side))
                    if g[1]]
        if not self.per_role_tp:
            return [(self.tp, self.roles())]
        groups = [(self.tp_of(Role.PREFILL), [Role.PREFILL] * self.n_prefill),
                  (self.tp, [Role.DECODE] * self.n_decode + [Role.MIXED] * self.n_mixed)]
        return sorted((g for g in groups if g[1]), key=lambda g: -g[0])

    def fits(self, node_sizes: Iterable[int]) -> bool:
        """Whether every worker's tp devices can sit on one node, given how many devices each node
        offers (the widest workers placed first: exact when each tp divides the larger ones)."""
        room = list(node_sizes)
        for tp, k in sorted(self._sizes(), reverse=True):
            for i, c in enumerate(room):
                took = min(k, c // tp)
                room[i], k = c - took * tp, k - took
            if k:
                return False
        return True

    def roles(self) -> list[Role]:
        """One role per worker slot, in a canonical order (prefill, decode, mixed)."""
        return [Role.PREFILL] * self.n_prefill + [Role.DECODE] * self.n_decode + [Role.MIXED] * (self.n_mixed + self.n_side)

    def __str__(self) -> str:
        tp = f"@tp{self.tp}" if self.tp != 1 else ""
        if self.mode is Mode.COLOCATED:
            side = f"+{self.n_side}@tp{self.tp_side}" if self.n_side else ""
            return f"colocated×{self.n_mixed}{tp}{side}"
        if self.tp_prefill is not None:  # per-role tp: each side says its own
            return f"{self.n_prefill}P@tp{self.tp_prefill}:{self.n_decode}D@tp{self.tp}"
        return f"{self.n_prefill}P:{self.n_decode}D{tp}"
