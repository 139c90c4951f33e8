"""The simulator's load balancing onto a worker that joins mid-batch, as the real runtime does it
(`pearl.runtime.agent_routing.Routing.rebalance`): a trajectory keeps the worker that holds its KV
while that worker serves, so a worker that becomes ready while trajectories are in flight (a lent
trainer device, an elastic device, a layout change) would get only the trajectories admitted after
it. When it becomes ready it takes trajectories from the busiest workers until it holds its share:
turns in flight first (a decoding turn moves with its KV, priced as a KV transfer; a queued one is
prefilled there), then trajectories between turns (their next turn starts there; the prefix the old
worker retained is dropped). Where a prefill and a decode worker both serve, turns start on prefill
workers, which hold no long-lived state: nothing is moved then (as in the real runtime, which moves
episodes among the workers turns start on). A mixin of `pearl.runtime.sim.Simulator`."""
from __future__ import annotations

from typing import Any

from pearl.engine.emulated import EmulatedEngine
from pearl.engine.router import take_share
from pearl.runtime.sim_records import SimTrajectory
from pearl.types import Role

__all__ = ["SimBalance"]


class SimBalance:
    clock: Any
    perf: Any
    inflight: dict[str, SimTrajectory]  # admitted, not finished
    migrated: int
    serving: Any  # the simulator's: workers taking new turns, by role
    node_of: Any
    _arrive_decode: Any

    def _rebalance(self, new: EmulatedEngine) -> int:
        """Move trajectories onto `new` (just ready) until it holds its share; how many moved."""
        if self.serving(Role.PREFILL) and self.serving(Role.DECODE):
            return 0
        targets = self.serving(Role.MIXED, Role.DECODE)
        if new not in targets or len(targets) < 2:
            return 0
        for e in targets:  # first: turns that complete in the step in flight finish, not move
            e.sync(self.clock.now)
        on: dict[EmulatedEngine, list[SimTrajectory]] = {e: [] for e in targets}
        for tr in self.inflight.values():
            if tr.home in on:
                on[tr.home].append(tr)
        busy = {e: {r.meta.id: r for r in e.requests()} for e in targets if e is not new}
        for e, reqs in busy.items():
            on[e].sort(key=lambda tr, reqs=reqs: tr.id in reqs)  # turns in flight last: popped first
        moves = take_share(on, new)
        for tr, src in moves:
            self._move(tr, src, new, busy[src].get(tr.id))
        return len(moves)

    def _move(self, tr: SimTrajectory, src: EmulatedEngine, dst: EmulatedEngine, r: Any) -> None:
        t = self.clock.now
        src.drop_session(tr.id)
        tr.home = dst
        if r is None:  # between turns: the next one starts on dst
            return
        decoding = r in src.dec
        src.abort(r, t)
        if decoding:  # its KV travels
            tr.migrations += 1
            self.migrated += 1
            dst.incoming_tokens += r.num_tokens
            self.clock.at(t + self.handoff_s(src, dst, r.num_tokens), self._arrive_decode, tr, r, dst)
            return
        tr.min_version = min(tr.min_version, dst.version)
        dst.submit(r, t)
