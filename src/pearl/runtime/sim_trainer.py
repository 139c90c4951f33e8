"""The simulator's emulated trainer: batches from finished groups (oldest first; staler than η is
discarded), the controller asked for the trainer's devices back (`TrainerNeedsDevices`), a training
step timed by the performance model, the weight push, and the controller told the trainer idles
(`TrainerIdle`). A mixin of `pearl.runtime.sim.Simulator`: it uses the simulator's state."""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from pearl.control.observation import TrainerIdle, TrainerNeedsDevices
from pearl.errors import ConfigError, one_line
from pearl.perf.profile import trainer_work
from pearl.perf.roofline import PerfCoeffs
from pearl.workloads import load_recorded
from pearl.rl.trajectory import Group
from pearl.runtime.sim_records import SimTrajectory
from pearl.types import WorkerPhase

__all__ = ["SimTrainer", "slot_split", "twin_coeffs", "twin_workload"]

TRAIN_PIECES = 16  # a shared executor's training step advances in this many pieces


def twin_coeffs(twin: Any) -> PerfCoeffs:
    """The engine coefficients of a twin scenario (`ScenarioConfig.twin`), else the catalogue's."""
    if twin is None or not twin.engine_coeffs:
        return PerfCoeffs()
    known = [f.name for f in fields(PerfCoeffs)]
    bad = sorted(set(twin.engine_coeffs) - set(known))
    if bad:
        raise ConfigError(f"scenario: field 'twin.engine_coeffs': unknown coefficient {bad[0]!r}; known: {', '.join(known)}")
    try:
        return PerfCoeffs(**twin.engine_coeffs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"scenario: field 'twin.engine_coeffs': {one_line(str(e))}") from None


def slot_split(batch: list[Group], t_train: float) -> dict[str, float]:
    """Where the trajectories of a batch whose training starts at `t_train` spent their slot at the
    staleness gate (it counts a trajectory from its admission until it is trained), on average:
    generating (admitted to finished), waiting for its group's slowest member, then for the batch to
    fill and the trainer (its devices) to start."""
    n = max(1, sum(len(g.trajs) for g in batch))
    ready = [(g, max(tr.t_end for tr in g.trajs)) for g in batch if g.trajs]
    return dict(generating_s=sum(tr.t_end - tr.t_start for g, _ in ready for tr in g.trajs) / n,
                group_wait_s=sum(r - tr.t_end for g, r in ready for tr in g.trajs) / n,
                batch_wait_s=sum((t_train - r) * len(g.trajs) for g, r in ready) / n)


def twin_workload(twin: Any) -> Any:
    """A twin scenario's recorded trajectories (`pearl.workloads.RecordedWorkload`), else None."""
    return load_recorded(twin.trajectories) if twin is not None and twin.trajectories else None


class SimTrainer:
    cfg: Any
    clock: Any
    next_train_gid = 0  # batch_order "admission": the next group the trainer takes

    def _take_in_order(self, need: int) -> list[Group] | None:
        """pearl train's rule (`twin.batch_order: admission`): the next `need` groups by admission
        order once every one has finished; groups staler than η are discarded, the rest trained."""
        want = range(self.next_train_gid, self.next_train_gid + need)
        ready = {g.gid: g for g in self.ready}
        if any(gid not in ready for gid in want):
            return None
        self.next_train_gid += need
        self.ready = [g for g in self.ready if g.gid not in want]
        batch = []
        for gid in want:
            g = ready[gid]
            if self.version - g.min_version > self.cfg.rl.staleness:
                self.discarded += g.size
                self.gate.on_discard(g.size)
            else:
                batch.append(g)
        return batch

    def _maybe_train(self) -> None:
        need, most = self.cfg.rl.prompts_per_batch, self.cfg.max_train_steps
        if self.trainer_busy or len(self.ready) < need or (most is not None and len(self.steps) >= most):
            return  # (a trainer-bound run would otherwise go on training past max_train_steps)
        t = self.clock.now
        if self.cfg.twin is not None and self.cfg.twin.batch_order == "admission":
            got = self._take_in_order(need)
            if not got:
                if got is not None:  # all stale: slots went back to the gate
                    self._admit()
                return
            self._start(got, t)
            return
        self.ready.sort(key=lambda g: (g.min_version, g.gid))  # oldest first: fewest discards
        batch, keep = [], []
        for g in self.ready:
            if len(batch) < need and self.version - g.min_version <= self.cfg.rl.staleness:
                batch.append(g)
            elif self.version - g.min_version > self.cfg.rl.staleness:
                self.discarded += g.size
                self.gate.on_discard(g.size)
            else:
                keep.append(g)
        self.ready = keep
        if len(batch) < need:
            self.ready.extend(batch)
            self._admit()
            return
        self._start(batch, t)

    def _start(self, batch: list[Group], t: float) -> None:
        self.batch_ready_t.append(t)
        wait_devices = self.driver.event(TrainerNeedsDevices())  # borrowed devices must come back
        self.trainer_busy = True
        self.clock.at(t + wait_devices, self._train_start, batch, t)

    def _train_start(self, batch: list[Group], t_ready: float) -> None:
        t = self.clock.now
        self.state.set_training(t, self.train_devices, True)  # raises if a lent device is still out
        self.trainer_device_wait += t - t_ready
        trajs = [tr for g in batch for tr in g.trajs]
        tokens = sum(tr.spec.total_tokens for tr in trajs)
        n_dev = len(self.train_devices)
        dur = self.train_time(trajs, tokens, n_dev) * self.cfg.rl.train_passes
        idle = t_ready - self.trainer_idle_since
        self.steps.append(dict(step=len(self.steps) + 1, t_ready=t_ready, t_start=t, t_end=t + dur,
                               train_s=dur, trainer_idle_s=idle, device_wait_s=t - t_ready,
                               trajectories=len(trajs), tokens=tokens, **slot_split(batch, t),
                               max_staleness=max(self.version - tr.min_version for tr in trajs)))
        if self.cfg.twin is None or not self.cfg.twin.shared:
            self.clock.at(t + dur, self._train_end, trajs)
        else:
            self._train_piece(trajs, dur, dur / TRAIN_PIECES)

    def _train_piece(self, trajs: list[SimTrajectory], left: float, piece: float) -> None:
        """A shared executor (`twin.shared`): the step advances in pieces, each `trainer` times slower
        when the rollout is at work as it begins (else `trainer_alone`) (any trajectory in flight: its thread steps engines or
        handles their turns; with none, the rollout thread sleeps until the gate opens); the step's
        record gets its real end."""
        if left <= 1e-12:
            t, s = self.clock.now, self.steps[-1]
            s["t_end"], s["train_s"] = t, t - s["t_start"]
            self._train_end(trajs)
            return
        busy = self.active > 0  # the rollout thread works while any trajectory is in flight
        f = self.cfg.twin.shared_factors(max(1, self._busy_engines()))[1 if busy else 3]
        d = min(piece, left)
        self.clock.at(self.clock.now + d * f, self._train_piece, trajs, left - d, piece)

    _env_batch = (-1.0, 0.0)  # (turn end, its environment wait): the twin's agent-loop batch

    def env_wait(self, t: float, latency: float) -> float:
        """A turn's environment wait. In a twin scenario the agent loop's rule: the turns an engine
        step ends are handed to their environments together and collected together (pearl train's
        rollout thread collects every finished environment step at once), so every turn ending at `t`
        waits as long as the first (the recorded seconds of a turn are as waited by that loop)."""
        if self.cfg.twin is None:
            return latency
        if self._env_batch[0] != t:
            self._env_batch = (t, latency)
        return self._env_batch[1]

    def _busy_engines(self) -> int:
        return sum(1 for e in self.engines.values() if e.end_t != float("inf"))

    def shared_step_time(self, step_time: Any) -> Any:
        """An engine's step time in a shared executor: `engine` times longer while the trainer works,
        else `engine_alone` (the factors for the engines stepping then, this one included)."""
        tw = self.cfg.twin
        if tw is None or not tw.shared:
            return step_time
        return lambda *a: step_time(*a) * tw.shared_factors(self._busy_engines() + 1)[0 if self.trainer_busy else 2]

    def train_time(self, trajs: list[SimTrajectory], tokens: int, n_dev: int) -> float:
        """One pass over a batch: the twin's calibrated trainer (`twin.trainer`: the tokens it
        computes, trajectories with a zero advantage skipped), else the roofline at `rl.train_mfu` with
        causal attention at the batch's token-weighted mean row length (sum L^2 / sum L: a row of L
        tokens holds L^2/2 pairs)."""
        tw = self.cfg.twin
        if tw is None or tw.trainer is None:
            lengths = [tr.spec.total_tokens for tr in trajs]
            seq = sum(n * n for n in lengths) / max(1, sum(lengths))
            return self.perf.train_step_time(tokens, n_dev, self.cfg.rl.train_mfu, seq_len=seq)
        c, groups = tw.trainer, {}
        for tr in trajs:
            if self.workload.trained(tr.spec):
                groups.setdefault(tr.spec.group, []).append((tr.spec.prompt_tokens, tr.spec.total_tokens))
        tokens, pairs = trainer_work(list(groups.values()), c.micro_batch_size, c.share_prompt)
        return c.fixed_s + c.per_token_s * tokens + c.per_pair_s * pairs

    def _train_end(self, trajs: list[SimTrajectory]) -> None:
        t = self.clock.now
        self.trained_trajs += len(trajs)
        self.trained_tokens += sum(tr.spec.total_tokens for tr in trajs)
        for tr in trajs:  # trained: counted with the step, as trained_trajectories is (one step at a time)
            self.staleness_hist[self.version - tr.min_version] += 1
        self.version += 1
        self.trainer_busy = False
        self.trainer_idle_since = t
        self.state.set_training(t, self.train_devices, False)
        self.push_weights(self.version)
        self.driver.event(TrainerIdle())
        self._admit()
        self._maybe_train()

    def push_weights(self, version: int) -> None:
        """Weight push: each worker stalls for its sync (each rank receives its shard: the worker's own
        tp sets the time, not the configured one) and serves `version` after it."""
        t = self.clock.now
        for eng in list(self.engines.values()):
            eng.pause(t, t + eng.pm.weight_sync_time(), version)
            if self.state.workers[eng.wid].phase is not WorkerPhase.STOPPED:
                self.state.set_version(t, eng.wid, version)

