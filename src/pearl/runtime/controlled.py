"""Controller-driven policies in the simulator: PEARL, its ablations, and the elastic baselines.

This is the thin shell around the pure controller pieces in `pearl.control` (predictor, selector,
planner, switching gate, borrow planner): it turns simulator state into their inputs, records every
decision with its reason, and executes the chosen plan through the simulator's actuators.

- `pearl`: PD mode + ratio chosen by the predictor over the whole budget (rollout + elastic + lent
  train devices), incremental make-before-break plans, cost-aware switching, borrowing with timely
  return (token-level migration), elastic devices absorbed (migrate on notice, resume on loss).
  Ablation flags in `PolicyConfig`: adapt_pd, borrow, elastic, cost_aware, incremental.
- `rlboost+`: elastic devices + borrowing with migration, fixed colocated PD, no cost model.
- `roll-partial`: borrow the trainer's devices every step; give them back by aborting (recompute).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from pearl.config import PolicyConfig
from pearl.errors import ResourceError
from pearl.control.borrowing import BorrowPlanner
from pearl.control.planner import (DeviceView, StepKind, TransitionCosts, WorkerView, plan_full_restart,
                                   plan_transition)
from pearl.control.predictor import BatchState, WorkloadStats, predict_many, prepare
from pearl.control.refit import ThroughputRefit
from pearl.control.selector import select
from pearl.control.switching import SwitchGate
from pearl.runtime.policies import Policy
from pearl.types import DeviceStatus, LayoutShape, Mode, Pool, Role

if TYPE_CHECKING:
    from pearl.runtime.sim import Simulator

WAKE_S = 2.0
EXPLORE_BAND = 0.05  # predictions this close are within the model's error: measure instead  # wake an inference engine whose weights are already in the device's memory


class ControlledPolicy(Policy):
    name = "pearl"
    adapt_pd = True
    cost_model = True
    return_migrate = True

    def __init__(self, cfg: PolicyConfig):
        super().__init__(cfg)
        self.gate = SwitchGate.from_policy(cfg)
        self.scale_out_gate = SwitchGate.from_policy(cfg, hysteresis=0.0)
        # a lend must save more than twice what starting and vacating the workers costs: the model
        # does not see the slowdown of migrating their requests back
        self.borrower = BorrowPlanner.from_policy(cfg, min_gain_s=2 * (WAKE_S + 0.5))
        self.last_switch: float | None = None
        self.refit = ThroughputRefit()
        self.explored: set[LayoutShape] = set()
        self._preds: dict = {}  # LayoutShape -> Prediction (see `_predict`)
        self._max_active = 0
        self._mark: tuple | None = None  # (t, shape, generated tokens, changes) at the last tick
        self._changes = 0  # layout changes made by this policy (a measurement spans none)
        self.lent: list[int] = []

    # ------------------------------------------------------------------ hooks
    def setup(self, sim: "Simulator") -> None:
        super().setup(sim)
        self.stats = WorkloadStats.from_workload(sim.workload)
        # In async RL, (η + 1) batches are in flight: the next batch is done when that pipeline drains,
        # so that is the batch whose completion we predict (a lone batch is set by its slowest member).
        self.batch = BatchState.fresh((sim.cfg.rl.staleness + 1) * sim.batch_trajs)
        self.reps = prepare(self.stats, self.batch, 32, 8)
        self.costs = TransitionCosts(
            flip_s=0.05, migrate_request_s=sim.perf.kv_transfer_time(8192, False),
            start_s=sim.perf.weight_transfer_time("peer") + WAKE_S, stop_s=0.5)
        sim.clock.at(self.cfg.decision_interval_s, self._tick, sim)

    def _tick(self, sim: "Simulator") -> None:
        self._measure(sim)
        self.decide(sim, "periodic")
        sim.clock.at(sim.clock.now + self.cfg.decision_interval_s, self._tick, sim)

    def on_devices_added(self, sim, devs) -> None:
        if self.cfg.elastic:
            self.decide(sim, f"{len(devs)} elastic devices arrived")

    def on_notice(self, sim, devs, at) -> None:
        for eng in sim.workers_on(devs):  # move requests off before the device goes (token-level + KV)
            sim.stop_worker(eng, migrate=True)
        self.decide(sim, f"revocation notice for {len(devs)} devices at t={at:.0f}")

    def on_devices_removed(self, sim, devs) -> None:
        self.decide(sim, f"{len(devs)} elastic devices gone")

    # ------------------------------------------------------------------ the budget
    def _usable_free(self, sim: "Simulator") -> list[DeviceView]:
        out = []
        for d in sim.state.devices.values():
            if d.status is not DeviceStatus.FREE or d.notice_at is not None:
                continue
            if d.pool is Pool.ELASTIC and not self.cfg.elastic:
                continue
            transient = d.pool is not Pool.ROLLOUT
            out.append(DeviceView(d.id, d.pool, d.node, transient))
        return out

    def _workers(self, sim: "Simulator") -> list[WorkerView]:
        out = []
        for e in sim.engines.values():
            if not e.accepting and sim.state.workers[e.wid].phase.value != "loading":
                continue
            pools = {sim.state.devices[d].pool for d in e.devices}
            out.append(WorkerView(e.wid, e.devices, e.role, pools != {Pool.ROLLOUT}, e.load(),
                                  e.kv_used()))
        return out

    # ------------------------------------------------------------------ deciding
    def _tps(self, sim: "Simulator") -> list[int]:
        """Tensor-parallel sizes to consider: the configured list, or every size that fits."""
        if not self.adapt_pd:
            return [sim.cfg.engine.tp]
        want = self.cfg.tps or [tp for tp in (1, 2, 4, 8) if tp <= sim.cfg.cluster.devices_per_node
                                 and sim.model.num_kv_heads % tp == 0]
        out = []
        for tp in want:
            try:
                sim.perf_for(tp)
                out.append(tp)
            except ResourceError:
                continue
        return out or [sim.cfg.engine.tp]

    def _predict(self, sim: "Simulator", shapes: list[LayoutShape]):
        """Predictions are a pure function of the shape (the workload stats and the batch are fixed
        at setup), so each shape is predicted once per run; measurements correct them in `refit`."""
        new = [s for s in dict.fromkeys(shapes) if s not in self._preds]
        if new:
            got = predict_many(new, [sim.perf_for(s.tp) for s in new], sim.cfg.engine, self.stats, self.batch,
                               sim.cfg.cluster.devices_per_node, reps=self.reps, tol=1e-2, grid_points=48)
            self._preds.update(zip(new, got))
        return [self._preds[s] for s in shapes]

    def _measure(self, sim: "Simulator") -> None:
        """Feed the refit with the tokens the current shape generated since the last tick, if the
        shape did not change and the pipeline was full at both ends (in a batch's tail, throughput
        says more about demand than about the layout)."""
        t, shape = sim.clock.now, sim.state.shape()
        tokens = sum(e.tokens_decoded for e in sim.all_engines)
        sim._count_active(0)  # bring the integral of active trajectories up to now
        m = self._mark
        full = False
        if m is not None and t > m[0]:
            # "full": the time-averaged number of trajectories in flight is near the most this run has
            # had (the staleness gate, not the layout, sets that level), so shapes are compared at the
            # same demand, not in a batch's tail
            avg = (sim.active_integral - m[5]) / (t - m[0])
            self._max_active = max(self._max_active, avg)
            full = avg >= 0.7 * self._max_active
        if m is not None and full and m[1] == shape and m[3] == self._changes and shape.n_workers > 0 \
                and (shape.n_mixed + shape.n_decode) > 0 and (shape.mode is Mode.COLOCATED or shape.n_prefill):
            self.refit.observe(shape, tokens - m[2], t - m[0], self._predict(sim, [shape])[0].tokens_per_s)
        self._mark = (t, shape, tokens, self._changes, full, sim.active_integral)

    def decide(self, sim: "Simulator", why: str) -> None:
        t = sim.clock.now
        workers = self._workers(sim)
        free = self._usable_free(sim)
        n_devices = sum(len(w.devices) for w in workers) + len(free)
        tps = [tp for tp in self._tps(sim) if n_devices >= tp]
        if not tps:
            return
        cur = sim.state.shape()
        valid_cur = cur.n_workers > 0 and (cur.n_mixed + cur.n_decode) > 0 and \
            (cur.mode is Mode.COLOCATED or cur.n_prefill > 0)
        cur_s = self.refit.corrected(cur, self._predict(sim, [cur])[0].completion_s) if valid_cur else math.inf
        tp0 = tps[0] if len(tps) == 1 else cur.tp
        only = (None if self.adapt_pd and n_devices >= 2 * min(tps)
                else [LayoutShape.colocated(n_devices // tp0, tp0)])
        sel = select(n_devices - n_devices % min(tps), {tp: sim.perf_for(tp) for tp in tps}, sim.cfg.engine,
                     self.stats, self.batch, current=cur if valid_cur else None, shapes=only,
                     devices_per_node=sim.cfg.cluster.devices_per_node)
        # rank by the predictions as corrected by what each shape was measured to do
        ranked = sorted(((s_, replace(p_, completion_s=self.refit.corrected(s_, p_.completion_s)))
                         for s_, p_, _, _ in sel.ranked), key=lambda x: x[1].completion_s)
        best_shape, best_pred = ranked[0]
        explore = None
        if best_shape == cur and not free:
            explore = self._explore(sim, why, ranked, cur, cur_s)
            if explore is None:
                self._record(sim, why, ranked, cur, cur_s, None, "keep: the current layout is the best")
                return
            best_shape, best_pred = explore
        plan_fn = plan_transition if self.cfg.incremental else plan_full_restart
        try:
            nodes = {d: sim.node_of(d) for w in workers for d in w.devices}
            nodes.update({d.id: d.node for d in free})
            plan = plan_fn(workers, free, best_shape, self.costs, device_nodes=nodes)
        except ValueError as e:
            self._record(sim, why, ranked, cur, cur_s, None, f"infeasible: {e}")
            return
        window = self._window(sim, free)
        if explore is not None:
            ok = plan.makespan_s < 0.05 * min(window, self.cfg.horizon_s)
            reason = (f"explore: {best_shape} was never measured and is predicted within "
                      f"{EXPLORE_BAND:.0%} of {cur}; trying it costs {plan.makespan_s:.3g} s"
                      if ok else f"keep: exploring {best_shape} would cost {plan.makespan_s:.3g} s")
            if ok:
                self.explored.add(best_shape)
        elif self.cost_model and self.cfg.cost_aware:
            # Gain over the work the window holds (several batches), against a one-off transition.
            horizon = min(window, self.cfg.horizon_s)
            cand_h = horizon * best_pred.completion_s / cur_s + plan.makespan_s if math.isfinite(cur_s) else 0.0
            if why == "periodic":  # a re-estimate: demand a streak, so noise cannot flap the layout
                v = self.gate.decide(t, horizon, cand_h, plan.makespan_s, window, self.last_switch,
                                     candidate=best_shape)
            else:  # the budget itself changed (devices came or go): a fact, not noise
                # a pure scale-out (only starts) disturbs no running worker: no hysteresis band needed
                gate = self.scale_out_gate if plan.n_stops + plan.n_flips == 0 else self.gate
                v = gate.evaluate(t, horizon, cand_h, plan.makespan_s, window, None)
            ok, reason = v.switch, v.reason
        else:
            ok, reason = best_shape != cur or bool(free), "switch: no cost model"
        self._record(sim, why, ranked, cur, cur_s, plan if ok else None, reason, best_shape, best_pred)
        if ok:
            self.last_switch = t
            self._changes += 1
            self.execute(sim, plan)

    def _explore(self, sim: "Simulator", why: str, ranked, cur: LayoutShape, cur_s: float):
        """A near-tie the model cannot settle: once the current shape is measured and has served its
        dwell, try the best never-measured shape predicted within EXPLORE_BAND of it (each at most
        once), so a measurement rather than the model's last few percent decides."""
        if (why != "periodic" or not self.cost_model or self.lent or not self.refit.measured(cur)
                or (self.last_switch is not None and sim.clock.now - self.last_switch < 2 * self.cfg.min_dwell_s)):
            return None
        for shape, pred in ranked[1:4]:
            if (shape not in self.explored and not self.refit.measured(shape)
                    and pred.completion_s <= cur_s * (1 + EXPLORE_BAND)):
                return shape, pred
        return None

    def _window(self, sim: "Simulator", free: list[DeviceView]) -> float:
        """How long the budget's transient devices (lent or elastic, free or serving) should stay."""
        devs = [sim.state.devices[d.id] for d in free]
        devs += [sim.state.devices[d] for e in sim.engines.values() for d in e.devices]
        now, w = sim.clock.now, math.inf
        for d in devs:
            if d.pool is Pool.TRAIN and d.lease_deadline is not None:
                w = min(w, d.lease_deadline - now)
            elif d.pool is Pool.ELASTIC:  # expected stay ~ the median lifetime, or until the notice
                el = sim.cfg.cluster.elastic.lifetime_s
                w = min(w, (d.notice_at - now) if d.notice_at is not None else (el.median or el.value or 3600.0))
        return max(w, 0.0)

    def _record(self, sim, why, ranked, cur, cur_s, plan, reason, best=None, best_pred=None) -> None:
        sim.decisions.append(dict(
            t=round(sim.clock.now, 3), trigger=why, current=str(cur),
            current_pred_s=round(cur_s, 3) if math.isfinite(cur_s) else None,
            candidates=[[str(s), round(p.completion_s, 3), p.bottleneck] for s, p in ranked[:5]],
            chosen=str(best) if best is not None else str(cur),
            chosen_pred_s=round(best_pred.completion_s, 3) if best_pred else None,
            switch=plan is not None, reason=reason,
            plan=None if plan is None else dict(starts=plan.n_starts, stops=plan.n_stops, flips=plan.n_flips,
                                                migrated=plan.n_migrated, makespan_s=round(plan.makespan_s, 3))))

    def execute(self, sim: "Simulator", plan) -> None:
        """Run a plan make-before-break: starts and role flips now, stops once replacements load."""
        ready = [0.0] * len(plan.steps)
        for i, s in enumerate(plan.steps):
            begin = max((ready[j] for j in s.after), default=0.0)
            ready[i] = begin + s.cost_s
            eng = sim.engines.get(s.worker) if s.worker is not None else None
            if s.kind is StepKind.START:
                if begin > 0:  # on devices that a stop frees first (e.g. a tensor-parallel change)
                    sim.clock.at(sim.clock.now + begin, self._start, sim, s.devices, s.role, s.cost_s)
                else:
                    sim.start_worker(s.devices, s.role, load_s=s.cost_s)
            elif s.kind is StepKind.SET_ROLE and eng is not None:
                if begin > 0:
                    sim.clock.at(sim.clock.now + begin, self._flip, sim, eng, s.role)
                else:
                    sim.set_role(eng, s.role)
            elif s.kind is StepKind.STOP and eng is not None:
                sim.set_accepting(eng, False)  # drain: no new turns while its replacements load
                sim.clock.at(sim.clock.now + begin, self._stop, sim, eng)

    def _start(self, sim, devices, role, load_s) -> None:
        st = sim.state.devices
        if all(st[d].status is DeviceStatus.FREE and st[d].notice_at is None for d in devices):
            sim.start_worker(devices, role, load_s=load_s)

    def _flip(self, sim, eng, role) -> None:
        if eng.wid in sim.engines:
            sim.set_role(eng, role)

    def _stop(self, sim, eng) -> None:
        if eng.wid in sim.engines:
            sim.stop_worker(eng, migrate=True)

    # ------------------------------------------------------------------ borrowing
    def on_train_end(self, sim: "Simulator", t: float) -> None:
        if not self.cfg.borrow or len(sim.ready) >= sim.cfg.rl.prompts_per_batch:
            return
        gaps = [b - a for a, b in zip(sim.batch_ready_t, sim.batch_ready_t[1:])][-3:]
        if not gaps or not sim.batch_ready_t:
            return
        idle_until = sim.batch_ready_t[-1] + sum(gaps) / len(gaps)
        n = len(sim.train_devices)
        ret_cost = self.costs.stop_s + self.costs.migrate_request_s * 4
        if self.cost_model:
            gain, role = self._lend_gain(sim, n)
            v = self.borrower.should_lend(t, idle_until, n, gain, WAKE_S, ret_cost)
            sim.decisions.append(dict(t=round(t, 3), trigger="trainer idle", switch=False,
                                      borrow=v.lend, reason=v.reason))
            if not v.lend:
                return
            deadline = v.deadline
        else:
            deadline, role = max(idle_until, t + 1.0), Role.MIXED
        self._changes += 1
        sim.lend(list(sim.train_devices), deadline)
        self.lent = list(sim.train_devices)
        tp = sim.state.shape().tp if sim.engines else sim.cfg.engine.tp
        if len(self.lent) < tp:
            tp = sim.cfg.engine.tp
        for i in range(0, len(self.lent) - tp + 1, tp):
            sim.start_worker(tuple(self.lent[i:i + tp]), role, load_s=WAKE_S)
        # The lend was approved only if vacating takes less than the bound (`should_lend` refuses
        # otherwise), so the devices may serve until the batch is really ready: the return starts
        # then (`trainer_needs_devices`) and the trainer waits at most the bound. (A proactive return
        # at `v.return_start_at` would trust the predicted idle window over the event itself.)

    def _lend_gain(self, sim: "Simulator", n: int) -> tuple[float, Role]:
        """The best role for `n` lent devices and its predicted fraction of batch time saved per lent
        device per second it serves. Ties go to prefill: it holds no long-lived KV, so it is the
        cheapest to vacate."""
        cur = sim.state.shape()
        tp = cur.tp
        add = n // tp
        if cur.n_workers == 0 or (cur.n_mixed + cur.n_decode) == 0:
            return 0.0, Role.MIXED
        if cur.n_prefill and self.adapt_pd:
            options = {Role.PREFILL: LayoutShape.disaggregated(cur.n_prefill + add, cur.n_decode, tp),
                       Role.DECODE: LayoutShape.disaggregated(cur.n_prefill, cur.n_decode + add, tp)}
        else:
            options = {Role.MIXED: LayoutShape.colocated(cur.n_workers + add, tp)}
        preds = self._predict(sim, [cur, *options.values()])
        base = preds[0].completion_s
        gains = {role: (base - p.completion_s) / base for role, p in zip(options, preds[1:])}
        role = max(gains, key=lambda r: (round(gains[r], 3), r is Role.PREFILL))
        return max(0.0, gains[role]) / max(1, n), role

    def _return(self, sim: "Simulator") -> float:
        """Give the lent devices back: stop their workers (requests migrate token-level, with KV unless
        the policy recomputes). Returns how long the trainer must wait for the devices."""
        if not self.lent:
            return 0.0
        t = sim.clock.now
        wait = 0.0
        for eng in sim.workers_on(self.lent):
            n = eng.load()
            sim.stop_worker(eng, migrate=self.return_migrate)
            wait = max(wait, self.costs.stop_s + n * 0.001 + (sim.perf.kv_transfer_time(8192, True)
                                                              if self.return_migrate and n else 0.0))
        sim.reclaim(self.lent)
        self._changes += 1
        self.lent = []
        self.decide(sim, "borrowed devices returned")  # the remaining layout may need a role back
        return wait

    def trainer_needs_devices(self, sim: "Simulator", t: float) -> float:
        return self._return(sim)


class RLBoostPlus(ControlledPolicy):
    """Elastic devices + idle-trainer reuse with token-level migration; fixed colocated PD, no cost model."""

    name = "rlboost+"
    adapt_pd = False
    cost_model = False


class RollPartial(ControlledPolicy):
    """ROLL partial-GPU mode: borrow training devices every step, return them by aborting (recompute)."""

    name = "roll-partial"
    adapt_pd = False
    cost_model = False
    return_migrate = False

    def on_devices_added(self, sim, devs) -> None:  # no external elasticity
        pass

    def decide(self, sim, why) -> None:
        if why == "periodic":
            return
        super().decide(sim, why)


def make_controlled_policy(cfg: PolicyConfig) -> Policy:
    return {"pearl": ControlledPolicy, "rlboost+": RLBoostPlus, "roll-partial": RollPartial}[cfg.name](cfg)
