"""Lending the trainer's idle devices to rollout and handing them back: the controller's side of borrowing.

`Lending` is a mixin of `pearl.control.controller.Controller` (it uses the controller's policy, costs,
predictions and bookkeeping):

- `_lend` (on `TrainerIdle`, and on a periodic tick while the trainer idles with nothing lent):
  estimate when the next batch is ready (`next_batch_at`), ask `control.borrowing` whether lending
  the trainer's devices until then pays (a policy without a cost model lends at once), then lend
  them and start workers on them in the role that gains most, or, where the runtime can resize a
  live worker (`pearl train`'s local engines: a lent core becomes a second intra-op thread), let the
  live workers take them if that is predicted faster (`_lend_gain`); where a start takes longer than a
  lend lasts (`ControlSetting.lend_starts` off: the Ray backend's actors), only the latter, or no lend;
- `_return` (on `TrainerNeedsDevices`): stop the lent workers one at a time (their requests migrate)
  or shrink the workers that took a lent device back to their own, then reclaim the devices and
  re-decide the remaining layout;
- `_window`: how long the budget's transient devices (lent, or elastic) should stay, the horizon a
  switch's gain is counted over.

Before the first batch there is no batch interval to go by: the first batch is assumed to be ready
as long after the run's start again as has passed (at 2·t). The estimate is crude on purpose: a
batch that comes early is covered by the return path (the devices come back at once, and
`BorrowPlanner.should_lend` refuses a lend whose immediate return would exceed the bound), and one
that comes late just leaves the devices serving rollout longer.

What it must not do: any I/O, own time (the observation carries it), or import a runtime.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pearl.control.observation import (Decision, DeviceObs, Effects, Lend, Observation, Reclaim, Redecide, Resize,
                                       Start, Stop, TrainerNeedsDevices, TrainerObs, WorkerObs)
from pearl.control.planner import DeviceView
from pearl.errors import ResourceError
from pearl.types import LayoutShape, Mode, Pool, Role

__all__ = ["RETURNED", "Lending", "next_batch_at", "serves", "trainer_idles"]

RETURNED = "borrowed devices returned"  # the trigger of the re-decision after a return


def serves(shape: LayoutShape) -> bool:
    """Whether a layout can serve a turn end to end (a disaggregated one needs both roles; prefill +
    mixed is a transient the planner passes through)."""
    return shape.n_workers > 0 and (shape.n_mixed + shape.n_decode) > 0 and \
        (shape.mode is Mode.COLOCATED or (shape.n_prefill > 0 and shape.n_decode > 0))


def next_batch_at(tr: TrainerObs, t: float) -> tuple[float, str]:
    """When the trainer's next batch is expected ready, and how that was estimated: as far after the
    last batch as the last (up to three) batches were apart (the run's start counts as a batch at
    0); before any batch, at 2·t (as long again as the run has taken so far). A batch already
    overdue by that estimate is, as a rule, nearly in (docs/results.md, twelfth session): it is
    assumed the share of its groups still missing of a mean interval from now ("due now" would
    refuse every lend while the trainer waits, on s1-swe for 300 s and more; a whole interval, as
    until 2026-12-08, over-estimated nine in ten of those waits). Without a group count, one mean
    interval from now. A batch that comes earlier is covered by the return path."""
    if not tr.batch_ready_t:
        return 2.0 * t, "no batch yet: the first assumed ready at 2·t"
    ready = tr.batch_ready_t if len(tr.batch_ready_t) > 1 else (0.0, *tr.batch_ready_t)  # 0: the run's start
    gaps = [b - a for a, b in zip(ready, ready[1:])][-3:]
    gap = sum(gaps) / len(gaps)
    if ready[-1] + gap > t:
        return ready[-1] + gap, f"the last {len(gaps)} batch interval(s)"
    late = f"overdue since {ready[-1] + gap:.6g}: "
    if tr.groups_needed > 0:
        missing = max(tr.groups_needed - tr.groups_ready, 0)
        return t + missing / tr.groups_needed * gap, (f"{late}{missing} of {tr.groups_needed} groups to come, "
                                                      f"at the pace of the last {len(gaps)} interval(s)")
    return t + gap, f"{late}one mean interval of the last {len(gaps)} from now"


def trainer_idles(tr: TrainerObs) -> bool:
    """Whether the trainer waits for its next batch (not training, the batch not complete)."""
    return not tr.busy and tr.groups_ready < tr.groups_needed


class Lending:
    """The lend and return half of the controller (see the module docstring)."""

    cfg: Any
    k: Any
    setting: Any
    costs: Any
    borrower: Any
    base_perf: Any
    cost_model: bool
    return_migrate: bool
    adapt_pd: bool
    lent: list[int]
    lifetimes: Any
    _return_wait: float
    _changes: int

    def _predict(self, shapes: list[LayoutShape]) -> list:  # the controller's
        raise NotImplementedError

    def _lend(self, obs: Observation, trigger: str = "trainer idle") -> Effects:
        """Lend the trainer's devices until its next batch is expected ready, if that pays (with a
        cost model; else always), and start workers on them."""
        tr = obs.trainer
        if not self.cfg.borrow or self.lent or not trainer_idles(tr):
            return Effects()
        t = obs.t
        idle_until, how_next = next_batch_at(tr, t)
        devs, eff = tuple(tr.devices), Effects()
        wide, how = None, ""
        if self.cost_model:
            gain, role, wide, how = self._lend_gain(obs, len(devs))
            if wide is None and not self.setting.lend_starts:
                eff.decisions.append(Decision(
                    t=t, trigger=trigger, kind="borrow", switch=False, rule="no-start", borrow=False,
                    reason="no-start: no live worker can take the lent devices as more threads, and this runtime "
                           f"starts no worker on one (a new worker would start long after the trainer needs it){how}"))
                return eff
            start = 0.0 if wide else self.k.wake_s  # a resize loads nothing
            ret_cost = self.costs.stop_s + self.costs.migrate_request_s * self.k.return_requests
            v = self.borrower.should_lend(t, idle_until, len(devs), gain, start, ret_cost)
            eff.decisions.append(Decision(t=t, trigger=trigger, kind="borrow", switch=False,
                                          reason=f"{v.reason} (next batch at {idle_until:.6g}: {how_next}){how}",
                                          rule=v.rule, borrow=v.lend, gain_s=v.gain_s, cost_s=start + ret_cost))
            if not v.lend:
                return eff
            deadline = v.deadline
        elif not self.setting.lend_starts:  # (no model to say whether a live worker can take them)
            return eff
        else:
            deadline, role = max(idle_until, t + 1.0), Role.MIXED
        self._changes += 1
        self.lent = list(devs)
        eff.actions.append(Lend(devs, deadline))
        # The lend was approved only if vacating takes less than the bound (`should_lend` refuses
        # otherwise), so the devices may serve until the batch is really ready: the return starts
        # then (TrainerNeedsDevices) and the trainer waits at most the bound.
        if wide:  # each live worker takes an equal share of the lent devices
            k = len(devs) // len(wide)
            eff.actions += [Resize(w.id, w.devices + devs[i * k:(i + 1) * k]) for i, w in enumerate(wide)]
            return eff
        tp = obs.shape.tp if obs.workers else self.setting.engine.tp
        if len(devs) < tp:
            tp = self.setting.engine.tp
        eff.actions += [Start(devs[i:i + tp], role, self.k.wake_s) for i in range(0, len(devs) - tp + 1, tp)]
        return eff

    def _lend_gain(self, obs: Observation, n: int) -> tuple[float, Role, list[WorkerObs] | None, str]:
        """The best use of `n` lent devices and its predicted fraction of batch time saved per lent
        device per second it serves: new workers in the role that gains most (ties go to prefill: it
        holds no long-lived KV, so it is the cheapest to vacate) or, where workers can change size live
        (`ControlSetting.live_resize`), the live colocated workers each taking an equal share (a larger
        tp; it wins ties: nothing to load, nothing to migrate back). Returns (gain, role, the workers to
        resize or None, a note for the decision record)."""
        cur = obs.shape
        tp, add = cur.tp, n // cur.tp
        if not serves(cur):  # e.g. decode workers left without a prefill worker: nothing to predict from
            return 0.0, Role.MIXED, None, ""
        if cur.n_prefill and self.adapt_pd:  # (mixed workers a layout still has are kept in both options)
            options = {Role.PREFILL: replace(cur, n_prefill=cur.n_prefill + add),
                       Role.DECODE: replace(cur, n_decode=cur.n_decode + add)}
        else:
            options = {Role.MIXED: replace(cur, n_mixed=cur.n_mixed + add) if cur.n_side else
                       LayoutShape.colocated(cur.n_workers + add, tp)}
        live = [w for w in obs.workers if w.accepting]
        wide = None
        if self.setting.live_resize and cur.mode is Mode.COLOCATED and live and n and n % len(live) == 0 and \
                len({len(w.devices) for w in live}) == 1 and cur.n_workers == len(live):
            try:
                self.setting.perf_for(tp + n // len(live))
                wide = LayoutShape.colocated(len(live), tp + n // len(live))
            except ResourceError:  # no model of the larger size: new workers only
                pass
        preds = self._predict([cur, *options.values(), *([wide] if wide else [])])
        base = preds[0].completion_s
        gains = {role: (base - p.completion_s) / base for role, p in zip(options, preds[1:])}
        role = max(gains, key=lambda r: (round(gains[r], 3), r is Role.PREFILL))
        if wide is None:
            return max(0.0, gains[role]) / max(1, n), role, None, ""
        g_wide = (base - preds[-1].completion_s) / base
        ways = [f"{wide} ({preds[-1].completion_s:.4g} s)", f"{options[role]} ({base * (1 - gains[role]):.4g} s)"]
        better = round(g_wide, 3) >= round(gains[role], 3)
        use = better or not self.setting.lend_starts
        why = " (no worker starts on a lent device here)" if use and not better else ""
        how = f"; as {ways[not use]}, not {ways[use]}{why}; now {cur} ({base:.4g} s)"
        if use:
            return max(0.0, g_wide) / n, Role.MIXED, live, how
        return max(0.0, gains[role]) / n, role, None, how

    def _return(self, obs: Observation) -> Effects:
        """Give the lent devices back: stop their workers one at a time (requests migrate token-level,
        with KV unless the policy recomputes; each stop is priced by the load it holds then, which
        includes requests moved onto it by the previous stops) — a worker that also holds devices of
        its own just gives the lent ones back (`Resize`) —, then reclaim and re-decide.
        `trainer_wait_s` (on the last round): how long the trainer waits for its devices."""
        if not self.lent:
            return Effects()
        on_lent = obs.workers_on(self.lent)
        if on_lent:
            w = on_lent[0]
            own = tuple(d for d in w.devices if d not in self.lent)
            if own:  # a worker that took a lent device gives it back and goes on (no migration)
                return Effects([Resize(w.id, own)], then=TrainerNeedsDevices())
            hand_off = self.base_perf.kv_transfer_time(self.k.migrate_tokens, True) if self.return_migrate else 0.0
            self._return_wait = max(self._return_wait,
                                    self.costs.stop_s + w.load * self.k.return_request_s + (hand_off if w.load else 0.0))
            return Effects([Stop(w.id, migrate=self.return_migrate)], then=TrainerNeedsDevices())
        eff = Effects([Reclaim(tuple(self.lent))], then=Redecide(RETURNED),
                      trainer_wait_s=self._return_wait)  # the remaining layout may need a role back
        self._changes += 1
        self.lent, self._return_wait = [], 0.0
        return eff

    def _window(self, obs: Observation, free: list[DeviceView]) -> float:
        """How long the devices a switch adds (`free`) should stay, or with none, the transient devices
        (lent or elastic) already serving: an elastic device that arrives while the trainer's devices
        are lent pays over its own stay, not until the lend ends."""
        by_id = {d.id: d for d in obs.devices}
        devs: list[DeviceObs] = [by_id[d.id] for d in free] or [by_id[d] for w in obs.workers for d in w.devices]
        w = math.inf
        for d in devs:
            if d.pool is Pool.TRAIN and d.lease_deadline is not None:  # (the first batch: its estimate grows)
                w = min(w, max(d.lease_deadline, next_batch_at(obs.trainer, obs.t)[0]) - obs.t)
            elif d.pool is Pool.ELASTIC:  # expected stay: the lifetimes observed so far, or until the notice
                w = min(w, (d.notice_at - obs.t) if d.notice_at is not None
                        else self.lifetimes.expected_stay_s(obs.t))
        return max(w, 0.0)
