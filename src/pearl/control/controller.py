"""The PEARL controller: one object that both runtimes tick, with zero I/O.

`Controller.on_tick(obs)` and `Controller.on_event(event, obs)` take an `Observation` (devices,
workers, the trainer, counters, the time as data) and return `Effects` (typed actions, decisions with
their reasons, the next tick). The simulator (`pearl.runtime.sim_control`) and the real runtime
(`pearl.runtime.real_control`) build the observations and carry out the actions through their own
`Actuators`; neither is known here.

One decision (`decide`): the budget (live workers + usable free devices, per node) → predictions of the
in-flight pipeline batch per candidate shape (`control.predictor`; with the admission control on, the best
few each at the cap it would settle at: `AdmissionControl.caps`), corrected by what each shape was measured
to deliver (`control.refit`) → the best shape whose workers each fit on a node (`control.selector`) → the
smallest make-before-break plan (`control.planner`) → the cost-aware gate (`control.switching`) → actions.
Borrowing (`control.lending`: on `TrainerIdle`, and on a tick while the trainer waits for its batch with
nothing lent) asks `control.borrowing` whether lending the trainer's devices pays, and
`TrainerNeedsDevices` hands them back. The baselines are configurations of this class (`control.policies`).
"""
from __future__ import annotations

import math
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Callable

from pearl.config import EngineConfig, PolicyConfig
from pearl.control.admission import AdmissionControl
from pearl.control.borrowing import BorrowPlanner
from pearl.control.estimate import LifetimeEstimator, WorkloadEstimator
from pearl.control.lending import RETURNED, Lending, serves as _valid
from pearl.control.observation import (Decision, DevicesAdded, DevicesRemoved, Effects, Event, Notice, Observation,
                                       Redecide, SetCap, Stop, TrainerIdle, TrainerNeedsDevices, plan_actions)
from pearl.control.planner import DeviceView, Plan, TransitionCosts, WorkerView, plan_transition
from pearl.control.predictor import BatchState, Prediction, WorkloadStats, prepare
from pearl.control.predictor_mix import predict_shapes
from pearl.control.refit import ThroughputRefit
from pearl.control.restart import plan_full_restart
from pearl.control.selector import budgets, fitting_models, select, side_shapes
from pearl.control.switching import SwitchGate
from pearl.errors import ResourceError
from pearl.perf.roofline import PerfModel
from pearl.types import DeviceStatus, LayoutShape, Pool, Role, WorkerPhase

__all__ = ["ControlSetting", "Controller"]


@dataclass(frozen=True)
class ControlSetting:
    """What the controller knows about the set-up (fixed for a run)."""

    perf_for: Callable[[int], PerfModel]  # the worker model at a tp (raises ResourceError if it does not fit)
    engine: EngineConfig
    # The workload known before the run (`pearl train`'s environment probe; plan-static's declared workload),
    # or None: the prior `policy.controller.estimate`. PEARL learns it from what finishes (`control.estimate`).
    stats: WorkloadStats | None
    batch_size: int  # trajectories per training batch
    staleness: int  # η
    devices_per_node: int
    num_kv_heads: int  # a tp must divide it (heads are sharded); 0: tp is intra-op threads, any fits
    train_devices: tuple[int, ...] = ()
    cold_start_s: float = 0.0  # a worker's first start on an elastic device (process, weight pull, warm-up)
    group_size: int = 1  # trajectories admitted together (one prompt's samples): a cap is never below it
    max_concurrent: int | None = None  # the configured cap on trajectories in flight (None: none)
    live_resize: bool = False  # a worker can take a lent device and give it back without a restart (Resize)
    lend_starts: bool = True  # a lent device may host a new worker (off: Ray, an actor starts slower than a lend lasts)


class Controller(Lending):
    """PEARL (see the module docstring). Subclasses in `pearl.control.policies` switch mechanisms off."""

    name = "pearl"
    static = False  # a static policy ignores every event (see `pearl.control.policies`)
    adapt_pd = True  # choose the PD mode, ratio and tp (else colocated at the configured tp)
    cost_model = True  # gate switches and lends on predicted gain vs cost
    return_migrate = True  # vacate lent devices by token-level migration with KV (else recompute)
    absorbs_elastic = True  # decide when elastic devices arrive
    adapt_cap = True  # choose the cap on trajectories in flight (`control.admission`)

    def __init__(self, policy: PolicyConfig, setting: ControlSetting):
        self.cfg, self.k, self.setting = policy, policy.controller, setting
        k = self.k
        self.gate = SwitchGate.from_policy(policy)
        self.scale_out_gate = SwitchGate.from_policy(policy, hysteresis=0.0)
        self.borrower = BorrowPlanner.from_policy(policy)
        base = setting.perf_for(setting.engine.tp)
        self.base_perf = base
        self.costs = TransitionCosts(flip_s=k.flip_s, migrate_request_s=base.kv_transfer_time(k.migrate_tokens, False),
                                     start_s=base.weight_transfer_time("peer") + k.wake_s, stop_s=k.stop_s)
        # In async RL, (η + 1) batches are in flight: the next batch is done when that pipeline drains,
        # so that is the batch whose completion we predict (a lone batch is set by its slowest member),
        # with a weight push per batch trained meanwhile (a cap on trajectories in flight: `_recap`).
        self.pipeline = (setting.staleness + 1) * setting.batch_size
        self.batch = BatchState(n_fresh=self.pipeline, syncs=setting.staleness + 1)
        # What the controller is not told: the workload and elastic lifetimes (learned, from a prior)
        self.workload = WorkloadEstimator(k.estimate, setting.stats)
        self.lifetimes = LifetimeEstimator(k.elastic_stay_s, k.estimate.lifetime_prior_weight)
        self.reps = prepare(self.workload.stats, self.batch, k.predict_reps, k.predict_events)
        self.refit = ThroughputRefit(k.refit_min_samples, k.refit_min_seconds)
        self.last_switch: float | None = None
        self.explored: set[LayoutShape] = set()
        self._trial: tuple[LayoutShape, LayoutShape] | None = None  # (the shape left, the shape explored)
        self.lent: list[int] = []
        self._return_wait = 0.0
        self._preds, self._shares = {}, {}  # predictions per shape; a side shape's last split (a search hint)
        self._scored: dict[int, dict] = {}  # per batch size, the selector's predictions for this estimate
        self._max_active = 0.0
        self._mark: tuple | None = None  # (t, shape, tokens, changes, full, active integral) at the last tick
        self._changes = 0  # layout changes made by this controller (a measurement spans none)
        self._avg_active, self._steady = 0.0, False  # since the last tick: trajectories in flight, same layout
        self.admission = (AdmissionControl(k.admission, self.pipeline, setting.group_size, setting.max_concurrent)
                          if self.adapt_cap and policy.adapt_cap else None)
        if setting.max_concurrent is not None and setting.max_concurrent < self.pipeline:
            self._recap(setting.max_concurrent)  # a configured cap (`rl.max_concurrent_trajectories`)

    # ------------------------------------------------------------------ entry points
    def first_tick_t(self) -> float | None:
        """When the first periodic tick is due (a static policy answers None: it never ticks)."""
        return self.cfg.decision_interval_s

    def on_tick(self, obs: Observation) -> Effects:
        """A periodic tick: measure the current layout, re-decide, tick again."""
        self._estimate(obs)
        self._measure(obs)
        eff = self.decide(obs, "periodic")
        if not any(d.switch for d in eff.decisions):  # (a new layout first: lend on the next tick)
            lend = self._lend(obs, "periodic: trainer idle, nothing lent")  # e.g. before the first batch
            eff.actions += lend.actions
            eff.decisions += lend.decisions
        if self.admission is not None and (cap := self.admission.observe(
                obs.t, obs.kv_evictions, obs.requests_finished, obs.finished_count, self._avg_active, self._steady,
                sum(len(w.devices) for w in obs.workers if w.role is not Role.PREFILL))) is not None:
            eff.actions.append(SetCap(cap[0]))
            self._recap(cap[0])
            eff.decisions.append(Decision(t=obs.t, trigger="periodic", kind="admission", switch=False, reason=cap[1],
                                          rule="cap", chosen=str(cap[0]), estimate=self.workload.summary()))
        eff.next_tick_t = obs.t + self.cfg.decision_interval_s
        return eff

    def on_event(self, ev: Event, obs: Observation) -> Effects:
        if isinstance(ev, DevicesAdded):
            if self.cfg.elastic and self.absorbs_elastic:
                return self.decide(obs, f"{len(ev.devices)} elastic devices arrived")
            return Effects()
        if isinstance(ev, Notice):  # move requests off before the devices go (token-level + KV)
            stops = [Stop(w.id, migrate=True) for w in obs.workers_on(ev.devices)]
            return Effects(stops, then=Redecide(f"revocation notice for {len(ev.devices)} devices at t={ev.at:.0f}"))
        if isinstance(ev, DevicesRemoved):
            return self.decide(obs, f"{len(ev.devices)} elastic devices gone")
        if isinstance(ev, TrainerIdle):
            return self._lend(obs)
        if isinstance(ev, TrainerNeedsDevices):
            return self._return(obs)
        if isinstance(ev, Redecide):
            return self.decide(obs, ev.trigger)
        raise TypeError(f"unknown event {ev!r}")

    # ------------------------------------------------------------------ the budget
    def _usable_free(self, obs: Observation) -> list[DeviceView]:
        return [DeviceView(d.id, d.pool, d.node, d.pool is not Pool.ROLLOUT) for d in obs.devices
                if d.status is DeviceStatus.FREE and d.notice_at is None
                and (d.pool is not Pool.TRAIN or self.setting.lend_starts)  # (a lent one whose worker died)
                and (d.pool is not Pool.ELASTIC or (self.cfg.elastic and self.absorbs_elastic))]

    @staticmethod
    def _workers(obs: Observation) -> list[WorkerView]:
        pools = {d.id: d.pool for d in obs.devices}
        return [WorkerView(w.id, w.devices, w.role, {pools[d] for d in w.devices} != {Pool.ROLLOUT}, w.load, w.kv_used)
                for w in obs.workers if w.accepting or w.phase is WorkerPhase.LOADING]

    def _tps(self) -> list[int]:
        """Tensor-parallel sizes to consider: the configured list, or every size that fits."""
        s = self.setting
        if not self.adapt_pd:
            return [s.engine.tp]
        want = self.cfg.tps or [tp for tp in (1, 2, 4, 8) if tp <= s.devices_per_node and s.num_kv_heads % tp == 0]
        out = []
        for tp in want:
            try:
                s.perf_for(tp)
                out.append(tp)
            except ResourceError:
                continue
        return out or [s.engine.tp]

    def _estimate(self, obs: Observation) -> None:
        """Learn from the observation: elastic arrivals and removals, and the trajectories finished
        since the last one. A new workload estimate re-predicts every shape; the refit's ratios
        (measured / predicted) are carried over to the new predictions, so what was measured stays."""
        self.lifetimes.observe(obs.t, obs.devices)
        if self.workload.observe(obs.finished, obs.finished_count, obs.running):
            self._repredict()

    def _recap(self, cap: int | None) -> None:
        """The cap on trajectories in flight changed: predict the layouts at the concurrency they will
        run at (`cap` in flight, the rest of the pipeline queued behind them: `BatchState.queued`), not
        at the staleness gate's level: the KV a layout needs, and so its ranking, depend on it."""
        if (n := min(cap, self.pipeline) if cap is not None else self.pipeline) != self.batch.size:
            self.batch = replace(self.batch, n_fresh=n, queued=self.pipeline - n)
            self._repredict()

    def _repredict(self) -> None:
        """Re-predict every shape predicted so far; the refit's ratios (measured / predicted) are
        carried over to the new predictions, so what was measured stays."""
        old = {sh: p.tokens_per_s for sh, p in self._preds.items() if self.refit.seen(sh)}
        self.reps = prepare(self.workload.stats, self.batch, self.k.predict_reps, self.k.predict_events)
        self._preds.clear()
        self._scored.clear()
        for sh, new in zip(old, self._predict(list(old))):
            self.refit.rescale(sh, old[sh] / max(new.tokens_per_s, 1e-12))

    def _predict(self, shapes: list[LayoutShape]) -> list[Prediction]:
        """Predictions are a pure function of the shape while the workload estimate holds, so each
        shape is predicted once per estimate; measurements correct them in `refit`."""
        new = [s for s in dict.fromkeys(shapes) if s not in self._preds]
        if new:
            k, s = self.k, self.setting
            got = predict_shapes(new, s.perf_for, s.engine, self.workload.stats, self.batch, s.devices_per_node,
                                 reps=self.reps, tol=k.predict_tol, grid_points=k.predict_grid_points, shares=self._shares)
            self._preds.update(zip(new, got))
        return [self._preds[s] for s in shapes]

    def _measure(self, obs: Observation) -> None:
        """Feed the refit with the tokens the current shape generated since the last tick, if the
        shape did not change and the pipeline was full at both ends (in a batch's tail, throughput
        says more about demand than about the layout)."""
        t, shape, tokens, m = obs.t, obs.shape, obs.tokens_generated, self._mark
        full = False
        if m is not None and t > m[0]:
            # "full": the time-averaged number of trajectories in flight is near the most this run has
            # had (the staleness gate, not the layout, sets that level), so shapes are compared at the
            # same demand, not in a batch's tail
            self._avg_active = avg = (obs.active_integral - m[5]) / (t - m[0])
            self._max_active = max(self._max_active, avg)
            cap = self.admission.cap if self.admission is not None else None  # (a cap lowers the level)
            full = avg >= self.k.full_pipeline_share * min(self._max_active, cap or math.inf)
        if m is not None and full and m[1] == shape and m[3] == self._changes and _valid(shape):
            pred = self._predict([shape])[0]
            period = pred.completion_s / (self.setting.staleness + 1)  # one batch's share of the pipeline
            self.refit.span_s = self.k.refit_span_batches * period
            self.refit.half_life_s = self.k.refit_half_life_batches * period
            self.refit.observe(shape, tokens - m[2], t - m[0], pred.tokens_per_s)
        self._steady = m is not None and m[1] == shape and m[3] == self._changes  # (no switch, lend or return)
        self._mark = (t, shape, tokens, self._changes, full, obs.active_integral)

    # ------------------------------------------------------------------ deciding
    def decide(self, obs: Observation, why: str) -> Effects:
        self._estimate(obs)
        workers, free = self._workers(obs), self._usable_free(obs)
        nodes, idle_elastic = {d.id: d.node for d in obs.devices}, any(d.pool is Pool.ELASTIC for d in free)
        sizes = Counter([nodes.get(d, ("w", w.id)) for w in workers for d in w.devices] + [d.node for d in free])
        tps = [tp for tp in self._tps() if max(sizes.values(), default=0) >= tp]
        if not tps:
            return Effects()
        cur = obs.shape
        cur_s = self.refit.corrected(cur, self._predict([cur])[0].completion_s) if _valid(cur) else math.inf
        ranked = [x for x in self._rank(list(sizes.values()), tps, cur) if x[0].fits(sizes.values())]
        if self.admission is not None and self.admission.cap is not None:  # the current one at its cap, too
            cur_s = min([cur_s, *(p.completion_s for x, p in ranked if x == cur)])
        best_shape, best_pred = ranked[0]
        mode, undo = "", self._undo(why, cur, cur_s) if not free else None
        if undo is not None:
            mode, (best_shape, best_pred) = "undo", undo
        elif best_shape == cur and not free:
            explore = self._explore(obs.t, why, ranked, cur, cur_s)
            if explore is None:
                return self._effects(obs, why, ranked, cur, cur_s, None, "keep: the current layout is the best")
            mode, (best_shape, best_pred) = "explore", explore
        plan_fn = plan_transition if self.cfg.incremental else plan_full_restart
        try:
            costs = self.costs  # a start on an elastic device is priced as a cold start
            if idle_elastic:
                costs = replace(costs, start_s=max(costs.start_s, self.setting.cold_start_s))
            plan = plan_fn(workers, free, best_shape, costs, device_nodes=nodes)
        except ValueError as e:
            return self._effects(obs, why, ranked, cur, cur_s, None, f"infeasible: {e}")
        window = self._window(obs, free)
        ok, reason, gain, cost = self._gate(obs.t, why, mode, cur, best_shape, best_pred, cur_s, plan, window, idle_elastic)
        eff = self._effects(obs, why, ranked, cur, cur_s, plan if ok else None, reason, best_shape, best_pred, gain, cost)
        if ok:
            self.last_switch = obs.t
            self._changes += 1
            self._trial = (cur, best_shape) if mode == "explore" else None
            eff.actions += plan_actions(plan)
        return eff

    def _rank(self, sizes: list[int], tps: list[int], cur: LayoutShape) -> list[tuple[LayoutShape, Prediction]]:
        """Every candidate shape for the devices per node `sizes`, each tp on the devices it can use
        (`selector.budgets`), best first, by the predictions as corrected by measurements."""
        s = self.setting
        pd = self.adapt_pd and self.cfg.adapt_pd  # the `adapt_pd: false` ablation: colocated, tp still chosen
        groups = [(n, {tp: s.perf_for(tp) for tp in group}, None) for n, group in budgets(sizes, tps).items()]
        extra = [] if self.adapt_pd or not self.cfg.side_tp else [self.cfg.side_tp]  # a baseline's fixed side tp
        models = fitting_models(s.perf_for, [*tps, *extra])  # a larger tp on whole groups, a smaller one on the rest:
        if side := side_shapes(sizes, list(models), main=None if self.adapt_pd else tps):
            groups.append((0, models, side))

        def at(b: BatchState, shapes=None, current=cur if _valid(cur) else None) -> dict[LayoutShape, Prediction]:
            out = {}
            for n, perfs, mine in groups:
                if shapes is not None or mine is not None:
                    only = mine if shapes is None else [x for x in shapes if bool(x.n_side) == (mine is not None)]
                else:
                    only = None if pd and n >= 2 * min(perfs) else [LayoutShape.colocated(n // tp, tp) for tp in perfs]
                with suppress(ResourceError):  # (no shape of these tps fits in memory)
                    out.update((x[0], x[1]) for x in select(
                        n, perfs, s.engine, self.workload.stats, b, current=current, shapes=only,
                        devices_per_node=s.devices_per_node, per_role=self.cfg.per_role_tp,
                        memo=self._scored.setdefault(b.size, {}), shares=self._shares).ranked)
            return out
        raw = at(self.batch)
        if self.admission is not None and self.admission.cap is not None:  # thrashing: the best few, and the
            # current one, each at the cap it would settle at
            top = [*sorted(raw, key=lambda x: raw[x].completion_s)[:6], *([cur] if cur in raw else [])]
            for c in self.admission.caps():
                if c != self.batch.size:
                    for x, p in at(replace(self.batch, n_fresh=c, queued=self.pipeline - c), top, None).items():
                        raw[x] = min(raw[x], p, key=lambda q: q.completion_s)
        return sorted(((x, replace(p, completion_s=self.refit.corrected(x, p.completion_s))) for x, p in raw.items()),
                      key=lambda x: x[1].completion_s)

    def _gate(self, t: float, why: str, mode: str, cur: LayoutShape, best: LayoutShape, best_pred: Prediction,
              cur_s: float, plan: Plan, window: float, idle_elastic: bool) -> tuple[bool, str, float | None, float | None]:
        """Whether to carry out `plan`: (ok, reason, predicted gain s, cost s). `mode`: "explore" (a
        near-tie tried once), "undo" (back from a losing exploration: only the dwell applies) or ""."""
        if mode == "undo":
            since = math.inf if self.last_switch is None else t - self.last_switch
            ok = since >= self.gate.min_dwell_s
            reason = (f"undo: {cur} was explored and measured {cur_s:.3g} s per batch, slower than "
                      f"{best_pred.completion_s:.3g} s on {best}, the layout it left: back to it, not explored again"
                      if ok else f"dwell: undoing the exploration of {cur} waits, {since:.3g} s since the last "
                                 f"switch < {self.gate.min_dwell_s:g} s")
            return ok, reason, cur_s - best_pred.completion_s, plan.makespan_s
        if mode == "explore":
            ok = plan.makespan_s < self.k.explore_cost_share * min(window, self.cfg.horizon_s)
            reason = (f"explore: {best} was never measured and is predicted within {self.k.explore_band:.0%} "
                      f"of {cur}; trying it costs {plan.makespan_s:.3g} s"
                      if ok else f"keep: exploring {best} would cost {plan.makespan_s:.3g} s")
            if ok:
                self.explored.add(best)
            return ok, reason, None, plan.makespan_s
        if not (self.cost_model and self.cfg.cost_aware):
            return True, "switch: no cost model", None, plan.makespan_s
        # Gain over the work the window holds (several batches), against a one-off transition.
        horizon, m, scale_out = min(window, self.cfg.horizon_s), plan.makespan_s, plan.n_stops + plan.n_flips == 0
        r = best_pred.completion_s / cur_s if math.isfinite(cur_s) else 0.0
        # A pure scale-out (only starts) disturbs no running worker: the current layout serves on while the new
        # workers start, and what it costs is their stops once their devices go. Otherwise the transition's
        # makespan is lost to the work and paid as its cost (migrations, flips, draining workers).
        cand_h, cost = (m + (horizon - m) * r, plan.n_starts * self.costs.stop_s) if scale_out else (horizon * r + m, m)
        cand_h = cand_h if r else 0.0  # (nothing serves now: any layout gains the whole horizon)
        # A re-estimate, or lent devices back (unless what is left cannot serve, or elastic devices that came
        # during the lend wait idle: a budget change judged now): a streak, so noise cannot flap the layout.
        if why == "periodic" or (why == RETURNED and _valid(cur) and not idle_elastic):
            v = self.gate.decide(t, horizon, cand_h, cost, window, self.last_switch, candidate=best)
        else:  # the budget itself changed (devices came or go): a fact, not noise; a scale-out needs no band
            v = (self.scale_out_gate if scale_out else self.gate).evaluate(t, horizon, cand_h, cost, window, None)
        return v.switch, v.reason, v.gain_s, v.cost_s

    def _explore(self, t: float, why: str, ranked, cur: LayoutShape, cur_s: float):
        """A near-tie the model cannot settle: once the current shape is measured and has served its
        dwell, try the best never-measured shape predicted within `explore_band` of it (each at most
        once), so a measurement rather than the model's last few percent decides."""
        if (why != "periodic" or not self.cost_model or self.lent or not self.refit.measured(cur)
                or (self.last_switch is not None and t - self.last_switch < 2 * self.cfg.min_dwell_s)):
            return None
        for shape, pred in ranked[1:4]:
            if (shape not in self.explored and not self.refit.measured(shape)
                    and pred.completion_s <= cur_s * (1 + self.k.explore_band)):
                return shape, pred
        return None

    def _undo(self, why: str, cur: LayoutShape, cur_s: float) -> tuple[LayoutShape, Prediction] | None:
        """After an exploration: once the explored shape is measured (on a periodic tick), the shape it
        left with its measured prediction if that is faster, to go back to; else None. The trial ends
        when the explored shape is judged no slower, or at the controller's next switch (see `decide`)."""
        if self._trial is None:
            return None
        left, tried = self._trial
        if why != "periodic" or cur != tried or not self.refit.measured(cur):  # (e.g. devices lent meanwhile)
            return None
        pred = self._predict([left])[0]
        left_s = self.refit.corrected(left, pred.completion_s)
        if not left_s < cur_s:
            self._trial = None  # the exploration did not lose: it stays
            return None
        return left, replace(pred, completion_s=left_s)

    def _effects(self, obs: Observation, why: str, ranked, cur: LayoutShape, cur_s: float, plan: Plan | None,
                 reason: str, best: LayoutShape | None = None, best_pred: Prediction | None = None,
                 gain: float | None = None, cost: float | None = None) -> Effects:
        d = Decision(
            t=obs.t, trigger=why, kind="layout", switch=plan is not None, reason=reason,
            rule=reason.split(":", 1)[0], current=str(cur), current_pred_s=cur_s,
            candidates=tuple((str(s), round(p.completion_s, 3), p.bottleneck) for s, p in ranked[:5]),
            chosen=str(best) if best is not None else str(cur),
            chosen_pred_s=best_pred.completion_s if best_pred else None,
            plan=None if plan is None else dict(starts=plan.n_starts, stops=plan.n_stops, flips=plan.n_flips,
                                                migrated=plan.n_migrated, makespan_s=round(plan.makespan_s, 3)),
            gain_s=gain, cost_s=cost, estimate=self.workload.summary())
        return Effects(decisions=[d])
