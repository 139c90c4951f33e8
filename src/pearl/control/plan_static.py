"""`plan-static` / `plan-warmup`: the static layout a careful user picks with `pearl plan`, then keeps.

The strongest natural static baseline (issue 9): the PD mode, P:D ratio and tensor-parallel size
ranked best by the same predictor and selector PEARL uses (`pearl plan` calls the same predictor),
for the rollout pool, the batch in flight ((η + 1) · B, or `rl.max_concurrent_trajectories` when
lower) and the workload statistics the controller is given before the run (`ControlSetting.stats`:
it knows no more than PEARL). It plans once and never changes: no re-decision, no borrowing of the
trainer's devices, no elastic devices (a static layout cannot use devices that come and go), every
event ignored.

The simulator builds the planned layout at t = 0 (`initial_shape`), so the baseline pays no
switch; a runtime that started the configured layout instead gets one switch on the first tick,
planned make-before-break like any of PEARL's.

`plan-warmup` is the same user who first runs the configured layout for `policy.plan_after_s`
(the first hour by default), then plans from the workload *observed* in that time (the estimate
PEARL itself learns, `control.estimate`; it is told nothing before the run), switches once and
keeps that layout. Like `plan-static` it neither borrows nor uses elastic devices.
"""
from __future__ import annotations

import math

from pearl.control.controller import Controller
from pearl.control.observation import Effects, Event, Observation, plan_actions
from pearl.control.planner import plan_transition
from pearl.types import LayoutShape, Pool

__all__ = ["PlanStatic", "PlanWarmup"]


class PlanStatic(Controller):
    """Plan once from the declared workload (see the module docstring), then never change."""

    name = "plan-static"
    static = True  # the driver hands it no events: no elastic devices, no borrowing
    adapt_pd = True  # the plan chooses mode, ratio and tp, as `pearl plan` ranks them
    cost_model = False
    absorbs_elastic = False
    adapt_cap = False  # a static layout with the configured cap, as a user would run it

    def __init__(self, policy, setting):
        super().__init__(policy, setting)
        self.planned: LayoutShape | None = None
        self._ticked = False

    def initial_shape(self, n_devices: int) -> LayoutShape:
        """The best shape for `n_devices` rollout devices (planned once, remembered)."""
        if self.planned is None:
            self.planned = self._ranked(n_devices)[0][0]
        return self.planned

    def _ranked(self, n_devices: int):
        tps = [tp for tp in self._tps() if n_devices >= tp] or [self.setting.engine.tp]
        tp0 = self.setting.engine.tp
        per_node = self.setting.devices_per_node  # (the rollout devices fill nodes in order)
        sizes = [per_node] * (n_devices // per_node) + [n_devices % per_node] * bool(n_devices % per_node)
        return self._rank(sizes, tps, LayoutShape.colocated(max(1, n_devices // tp0), tp0))

    def first_tick_t(self) -> float | None:
        return 0.0

    def on_tick(self, obs: Observation) -> Effects:
        """The one tick: keep the planned layout if it runs, else switch to it; no tick after."""
        if self._ticked:
            return Effects()
        self._ticked = True
        pools = {d.id: d.pool for d in obs.devices}
        workers = [w for w in self._workers(obs) if all(pools[d] is Pool.ROLLOUT for d in w.devices)]
        free = [d for d in self._usable_free(obs) if d.pool is Pool.ROLLOUT]
        n = sum(len(w.devices) for w in workers) + len(free)
        ranked = self._ranked(n)
        preds = dict(ranked)
        best = self.planned if self.planned in preds else ranked[0][0]
        self.planned, cur = best, obs.shape
        if cur == best:
            return self._effects(obs, "plan", ranked, cur, math.nan, None, f"keep: {best} is the planned layout",
                                 best, preds[best])
        plan = plan_transition(workers, free, best, self.costs, device_nodes={d.id: d.node for d in obs.devices})
        eff = self._effects(obs, "plan", ranked, cur, math.nan, plan, f"switch: to the planned layout {best}", best,
                            preds[best], None, plan.makespan_s)
        eff.actions += plan_actions(plan)
        return eff

    def on_event(self, ev: Event, obs: Observation) -> Effects:
        return Effects()


class PlanWarmup(PlanStatic):
    """Run the configured layout for `policy.plan_after_s`, learning the workload from what finishes;
    then plan from that estimate, switch once and keep the layout (see the module docstring)."""

    name = "plan-warmup"

    def initial_shape(self, n_devices: int) -> None:
        return None  # the configured layout until the plan

    def first_tick_t(self) -> float | None:
        return min(self.cfg.decision_interval_s, self.cfg.plan_after_s)

    def on_tick(self, obs: Observation) -> Effects:
        """Learn from what finished; at `plan_after_s`, plan and switch (once); no tick after."""
        if self._ticked:
            return Effects()
        self._estimate(obs)
        if obs.t < self.cfg.plan_after_s:
            return Effects(next_tick_t=min(obs.t + self.cfg.decision_interval_s, self.cfg.plan_after_s))
        return super().on_tick(obs)  # its decision record carries the estimate it planned from
