"""Where the agent loop's turns go: routing by role, and load balancing onto a new worker.

A mixin of `pearl.runtime.agent.AgentLoop` (it uses the loop's engines, episodes and sampling
parameters). While a prefill and a decode worker both serve, a turn starts on a prefill worker and
continues on a decode worker with its KV; otherwise turns run on mixed (or decode) workers. An
episode keeps the worker that starts its turns while that worker serves (prefix reuse), so a worker
that joins mid-batch — a lent trainer device, an elastic one — would get only new episodes: when it
joins, `rebalance` moves episodes onto it from the busiest workers until it has its share (RLBoost's
token-level migration used for load balancing). A turn in flight moves with its KV where the engine
can export it, else resumes from its tokens; an episode between turns starts its next turn there.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any

from pearl.engine.router import take_share
from pearl.types import Role

__all__ = ["Routing"]


class Routing:
    engines: list[Any]
    stopped: set[int]
    draining: set[int]
    episodes: dict[str, Any]
    parked: list[tuple[Any, Any]]
    params: Any
    seed: int | None
    _rr: int

    def params_for(self, session: str) -> Any:
        """The sampling parameters of trajectory `session`'s requests: with a run seed, each trajectory
        draws from its own seed, so its tokens do not depend on which worker samples them, in what
        batch, or whether it moved (`pearl.real.sampling`: a token is a function of weights, context
        and seed)."""
        if self.seed is None or self.params.seed is not None:
            return self.params
        return dataclasses.replace(self.params, seed=zlib.crc32(f"{self.seed}:{session}".encode()))

    def serving(self, *roles: Role) -> list[int]:
        """Indices of the engines taking new turns in one of `roles`."""
        return [i for i, e in enumerate(self.engines)
                if i not in self.stopped and i not in self.draining and e.role in roles]

    def turn_targets(self) -> list[int]:
        """Where a turn starts: a prefill worker while prefill and decode workers both serve, else a
        mixed (or decode, or as a last resort prefill) worker."""
        pre, dec = self.serving(Role.PREFILL), self.serving(Role.DECODE)
        if pre and dec:
            return pre
        return self.serving(Role.MIXED, Role.DECODE) or pre

    def decode_targets(self) -> list[int]:
        """Where a turn whose prefill is done continues."""
        return self.serving(Role.DECODE) or self.serving(Role.MIXED) or self.serving(Role.PREFILL)

    def _pick_engine(self) -> int:
        """The next worker to start a turn, round robin; -1 while none serves (mid-switch, or while a
        Ray worker starts): the turn then waits for one (`AgentLoop.waiting`)."""
        cands = self.turn_targets()
        if not cands:
            return -1
        self._rr = (self._rr + 1) % len(cands)
        return cands[self._rr]

    def _resubmit(self, req: Any, kv: Any) -> None:
        """Continue a request elsewhere: a turn still prefilling starts again where turns start; one
        that is decoding continues on a decode-capable worker (with its KV if it travelled)."""
        cands = self.decode_targets() if req.num_generated > 0 else self.turn_targets()
        if not cands:
            self.parked.append((req, kv))
            return
        i = cands[zlib.crc32(req.session.encode()) % len(cands)]  # stable across processes
        self.engines[i].submit(req, self.params_for(req.session), kv=kv)
        ep = self.episodes.get(req.session)
        if ep is not None and i in self.turn_targets():
            ep.engine = i

    def rebalance(self, new: int) -> int:
        """Move episodes onto worker `new` (just joined) from the busiest workers that start turns,
        until it holds its share; returns how many moved. Turns in flight go first (they move with
        their KV: nothing is recomputed)."""
        targets = self.turn_targets()
        if new not in targets or len(targets) < 2:
            return 0
        on: dict[int, list[Any]] = {i: [] for i in targets}
        for ep in self.episodes.values():
            if ep.engine in on:
                on[ep.engine].append(ep)
        # each worker's turns in flight, asked once (a Ray worker answers remotely)
        live = {i: {r.session: r.rid for r in self.engines[i].requests()} for i in targets if i != new}
        for i, eps in live.items():
            on[i].sort(key=lambda ep, inflight=eps: ep.traj.id in inflight)  # in flight last: popped first
        moves = take_share(on, new)
        for ep, src in moves:
            self._move(src, new, ep, live[src].get(ep.traj.id))
        return len(moves)

    def _move(self, src: int, dst: int, ep: Any, rid: str | None) -> None:
        """Episode `ep` continues on `dst`: its turn in flight (`rid`) with its KV where `src` can
        export it (`migrate_out` leaves it out otherwise: it resumes from its tokens); the context
        `src` retained for it is freed."""
        e = self.engines[src]
        if rid is not None:
            m = e.migrate_out(rid)
            self.engines[dst].submit(m.req, self.params_for(m.req.session), kv=m.kv)
        if e.holds(ep.traj.id):
            e.drop_session(ep.traj.id)
        ep.engine = dst
