"""The simulator's emulated trainer: batches from finished groups (oldest first; staler than η is
discarded), the controller asked for the trainer's devices back (`TrainerNeedsDevices`), a training
step timed by the performance model, the weight push, and the controller told the trainer idles
(`TrainerIdle`). A mixin of `pearl.runtime.sim.Simulator`: it uses the simulator's state."""
from __future__ import annotations

from typing import Any

from pearl.control.observation import TrainerIdle, TrainerNeedsDevices
from pearl.rl.trajectory import Group
from pearl.runtime.sim_records import SimTrajectory
from pearl.types import WorkerPhase

__all__ = ["SimTrainer"]


class SimTrainer:
    cfg: Any
    clock: Any
    def _maybe_train(self) -> None:
        need = self.cfg.rl.prompts_per_batch
        if self.trainer_busy or len(self.ready) < need:
            return
        t = self.clock.now
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
        dur = self.perf.train_step_time(tokens, n_dev, self.cfg.rl.train_mfu) * self.cfg.rl.train_passes
        idle = t_ready - self.trainer_idle_since
        for tr in trajs:
            self.staleness_hist[self.version - tr.min_version] += 1
        self.steps.append(dict(step=len(self.steps) + 1, t_ready=t_ready, t_start=t, t_end=t + dur,
                               train_s=dur, trainer_idle_s=idle, device_wait_s=t - t_ready,
                               trajectories=len(trajs), tokens=tokens,
                               max_staleness=max(self.version - tr.min_version for tr in trajs)))
        self.clock.at(t + dur, self._train_end, trajs)

    def _train_end(self, trajs: list[SimTrajectory]) -> None:
        t = self.clock.now
        self.trained_trajs += len(trajs)
        self.trained_tokens += sum(tr.spec.total_tokens for tr in trajs)
        self.version += 1
        self.trainer_busy = False
        self.trainer_idle_since = t
        self.state.set_training(t, self.train_devices, False)
        self.push_weights(self.version)
        self.driver.event(TrainerIdle())
        self._admit()
        self._maybe_train()

    def push_weights(self, version: int) -> None:
        """Weight push: each worker stalls for the sync and serves `version` after it."""
        t = self.clock.now
        sync = self.perf.weight_sync_time()
        for eng in list(self.engines.values()):
            eng.pause(t, t + sync, version)
            if self.state.workers[eng.wid].phase is not WorkerPhase.STOPPED:
                self.state.set_version(t, eng.wid, version)

