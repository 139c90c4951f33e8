"""The real runtime of `pearl train`: torch engines, environments and a GRPO trainer on the wall clock.

`Run(cfg, console, out_dir)` (driven by `pearl.runtime.training.run_training`, which owns the run
directory, checkpoints, signals and the summary):

1. checks the environment and that the model fits in memory (`ResourceError` otherwise), builds the
   trainer's copy and the engines' copies of the model, the `AgentLoop` and the controller;
2. runs rollout and training concurrently on two threads. The rollout thread admits groups through
   the `StalenessGate` (the simulator's admission rule: at most (η + v + 1)·B trajectories started by
   version v), steps the engines and keeps finished groups; the trainer thread takes the next
   `prompts_per_step` groups in prompt-id order, discards trajectories staler than η (counted, slots
   returned to the gate), trains, bumps the version and offers the snapshot to the engines;
3. logs every step live (rich) and through `RunLog` (metrics.jsonl, samples, TensorBoard, trace).

`layout: auto` (the default): with two or more rollout workers, `choose_layout`
(`pearl.runtime.real_layout`) asks the controller's selector whether colocated or 1P:(N-1)D finishes
a fresh staleness window of trajectories first, on a PerfModel of this model on hardware "cpu"
(coefficients from `profile:` if given, else a quick calibration of the real engine, else the
defaults) and the env's typical turn shape. One worker is always colocated. The decision and its
reason are printed at the start and saved as `layout_decision` in summary.json.

During the run the same `Controller` the simulator uses ticks on the wall clock every
`policy.decision_interval_s` (`pearl.runtime.real_control.RealControl`): it measures the layout,
re-decides, and may switch roles, ratio or worker count; every decision, "keep" included, is saved
with its reason in summary.json (`decisions`); with `policy.borrow` it lends the trainer's slot (a second
thread of the live worker, or an extra worker) while the trainer waits for its batch. With `backend:
ray` the same controller drives the Ray actors; `elastic:` offers it devices from a trace or Ray nodes.

Every trajectory is counted exactly once as trained (ok), failed (with its reason), stale, or skipped
(its update had a non-finite gradient).
"""
from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape

from pearl.control.observation import TrainerIdle, TrainerNeedsDevices, TrainerObs
from pearl.control.staleness import StalenessGate
from pearl.errors import ConfigError, PearlError, one_line
from pearl.runtime.engines import build_engine
from pearl.runtime.real_layout import check_memory, choose_layout, control_setting, probe_workload
from pearl.runtime.threads import host_cores, plan_threads
from pearl.runtime.train_config import TrainConfig

__all__ = ["Run", "TrainingDiverged", "split_batch"]


class TrainingDiverged(PearlError):
    """Too many updates in a row were skipped for a non-finite loss or gradient."""

    exit_code = 1


def split_batch(groups: list[Any], trainer_version: int, eta: int) -> tuple[list[Any], int, list[Any]]:
    """A step's groups as (trainable trajectories, number discarded as staler than η, failed ones)."""
    batch, stale, failed = [], 0, []
    for g in groups:
        for t in g.trajs:
            if not t.ok:
                failed.append(t)
            elif t.staleness(trainer_version) > eta:
                stale += 1
            else:
                batch.append(t)
    return batch, stale, failed


def _success(t: Any) -> bool:
    info = t.info
    return bool(info.get("success")) or info.get("outcome") in ("goal", "correct", "solved") or t.reward >= 1.0


class Run:
    """The state shared by the rollout and trainer threads (guarded by `lock`)."""

    def __init__(self, cfg: TrainConfig, console: Console, out_dir: Path):
        from pearl.envs import load_env
        from pearl.real.models import load_model

        self.cfg, self.console, self.out_dir = cfg, console, out_dir
        env_kwargs = dict(cfg.env.kwargs)
        try:  # bad kwargs -> ConfigError before any model work
            probe = load_env(cfg.env.name, **env_kwargs)
        except PearlError:
            raise
        except Exception as err:  # an environment that cannot be built at all: the run cannot start
            raise ConfigError(f"environment {cfg.env.name!r}: its constructor raised "
                              f"{type(err).__name__}: {one_line(str(err))}") from None
        check_memory(cfg.model, cfg.rollout_workers)
        th = cfg.threads
        self.threads = plan_threads(host_cores(), cfg.host_workers, th.trainer, th.engine, th.interop)
        torch.manual_seed(cfg.seed)
        loaded = self.loaded = load_model(cfg.model)
        allowed = self._sampling(probe)
        stats, workload = probe_workload(cfg, loaded, probe, self.sampling.max_new_tokens)
        self.setting, source = control_setting(cfg, loaded, stats, self.threads)
        self.layout_decision = choose_layout(cfg, self.setting, workload, source)
        cfg = self.cfg = cfg.model_copy(update={"layout": self.layout_decision["chosen"]})
        roles = (["prefill"] + ["decode"] * (cfg.rollout_workers - 1)) if cfg.layout == "1P:1D" \
            else ["mixed"] * cfg.rollout_workers
        self.backend: Any = None
        if cfg.backend == "local":
            self.engines = [self._engine(r, i) for i, r in enumerate(roles)]
        self._trainer(allowed)
        self.gate = StalenessGate(cfg.batch_size, cfg.staleness)  # (before the loop: its controller sets the cap)
        self._loop(roles, lambda: load_env(cfg.env.name, **env_kwargs))
        self.lock = threading.Lock()
        self.finished: dict[int, Any] = {}  # gid -> finished group, not yet taken by the trainer
        self.open: dict[int, int] = {}  # gid -> env seed of every admitted group not yet finished
        self.next_gid = 0  # the next group to admit
        self.next_train_gid = 0  # the trainer takes groups in gid order (deterministic prompt ids per step)
        self.readmit: list[tuple[int, int]] = []  # groups to start again first (resumed from a checkpoint)
        self.stop = threading.Event()  # the run is over (done, failed, or stopping)
        self.stop_requested: str | None = None  # a signal asked for a clean stop after the current step
        self.error: BaseException | None = None
        self.counts = {"ok": 0, "failed": 0, "stale": 0, "skipped": 0}
        self.admitted = 0  # trajectories started; = counts + unfinished() when the run ends
        self.start_step = 1
        self.steps_done = 0
        self.on_step: Any = None  # called with the step number after each step (checkpoints)
        self.log: Any = None  # a pearl.runtime.observe.RunLog (metrics, samples, trace), set by the caller
        self._t0 = time.perf_counter()
        self.nonfinite_in_row = 0
        self.zero_grad_in_row = 0
        self.fail_reasons: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []
        self.trained_staleness: list[int] = []
        self.training = False
        self.batch_ready_t: list[float] = []  # control-clock times the trainer found a full batch
        self.device_waits: list[float] = []  # seconds the trainer waited for its lent device, per step

    def _sampling(self, probe: Any) -> tuple[int, ...] | None:
        """Sampling parameters; the env's allowed actions when each is one token (then one token a turn)."""
        from pearl.real.sampling import SamplingParams

        cfg, tok, allowed = self.cfg, self.loaded.tokenizer, None
        acts = probe.allowed_actions
        if cfg.sampling.restrict_actions and acts:
            ids = [tok.encode(a) for a in acts]
            if all(len(i) == 1 for i in ids):
                allowed = tuple(i[0] for i in ids)
        self.sampling = SamplingParams(
            temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
            max_new_tokens=1 if allowed else cfg.sampling.max_new_tokens, allowed_token_ids=allowed)
        return allowed

    def _engine(self, role: Any, i: int, share: Any = None) -> Any:
        return build_engine(self.loaded, self.cfg.engine, role, i, self.cfg.seed + i, self.threads.engine, share)

    def _trainer(self, allowed: tuple[int, ...] | None) -> None:
        from pearl.rl.trainer import GRPOTrainer

        tok = self.loaded.tokenizer
        model = copy.deepcopy(self.loaded.hf_model)
        model.requires_grad_(True)
        tc = self.cfg.trainer
        if getattr(tok, "pad_token_id", None) is not None and "pad_token_id" not in tc.model_fields_set:
            tc = tc.model_copy(update={"pad_token_id": int(tok.pad_token_id)})
        self.trainer = GRPOTrainer(model, tc, allowed_token_ids=list(allowed) if allowed else None)

    def _loop(self, roles: list[str], make_env: Any) -> None:
        """The agent loop over the engines, and the controller that drives them (local backend)."""
        from pearl.runtime.agent import AgentLoop
        from pearl.runtime.real_control import RealControl

        cfg, loop_cls = self.cfg, AgentLoop
        if cfg.backend == "ray":  # last, so nothing after it can fail and leave Ray actors behind
            from pearl.runtime.ray_backend import RayAgentLoop, RayBackend

            self.backend = RayBackend(cfg, self.loaded, roles)
            self.engines, loop_cls = self.backend.engines, RayAgentLoop
        self.agent = loop_cls(self.engines, cfg.layout, make_env, self.sampling, cfg.group_size, cfg.env.timeout_s,
                              cfg.env.use_system_prompt, env_workers=cfg.env.workers,
                              parallel_engines=cfg.engine.parallel_steps and cfg.backend == "local", seed=cfg.seed)
        self.layout = f"{cfg.layout} ({'+'.join(roles)})" + (" [ray]" if self.backend else "")

        def make_engine(role: Any, idx: int, node: str | None) -> Any:
            if self.backend is not None:  # a new actor; it pulls the newest weights from the object store
                return self.backend.start_worker(role, idx, self.agent.latest, node)
            return self._engine(role, idx, share=next((self.agent.engines[i] for i in self.agent.live()), None))

        policy = cfg.policy.model_copy(update={"tps": [1]}) if self.backend else cfg.policy  # actors: tp 1
        self.control = RealControl(self.agent, policy, self.setting, make_engine, self._trainer_obs, gate=self.gate,
                                   threads=(self.threads.engine, self.threads.trainer))
        self.control.elastic(cfg.elastic, cfg.seed)

    def _post(self, ev: Any, wait: bool) -> float:
        """A trainer event for the controller (only when borrowing is on); the seconds waited."""
        if self.control is None or not self.cfg.policy.borrow:
            return 0.0
        return self.control.post(ev, wait, self.stop)

    def now(self) -> float:
        """Seconds on the run's one clock (the controller's, when there is one): trace times."""
        return self.control.clock.now if self.control is not None else time.perf_counter() - self._t0

    def current_layout(self) -> str:
        return self.layout if self.control is None else self.control.layout_label()

    def _trainer_obs(self) -> TrainerObs:
        return TrainerObs(self.training, len(self.finished), self.cfg.prompts_per_step,
                          tuple(self.batch_ready_t[-4:]), (self.control.train_device,) if self.control else ())

    # ------------------------------------------------------------ rollout thread
    def rollout(self) -> None:
        torch.set_num_threads(self.threads.engine)
        if self.control is not None:
            self.control.begin()
        try:
            while not self.stop.is_set():
                if self.control is not None:
                    self.control.handle_events()
                    self.control.clock.run_due()  # the controller's ticks and delayed actions, between steps
                with self.lock:
                    self._admit()
                if not self.agent.has_work():
                    time.sleep(0.002)  # gate closed: wait for the trainer to bump the version
                    continue
                for g in self.agent.step():
                    with self.lock:
                        self._group_done(g)
        except BaseException as err:  # surfaced by the main thread
            self.error = err
            self.stop.set()

    def _admit(self) -> None:
        """Admit groups while the gate has room. The gate counts by the version the engines will stamp
        on the tokens: they apply a new snapshot between steps, so they can lag the trainer, and a gate
        on the trainer's version would admit trajectories that are already too stale. Groups a
        resumed run must start again come first; GRPO groups share an env seed, and seeds advance so
        the env's map set is covered."""
        self.agent.apply_weights()  # between engine steps: a pending snapshot lands now
        while self.gate.capacity(self.agent.version) >= self.cfg.group_size:
            if self.readmit:
                gid, seed = self.readmit.pop(0)
            else:
                gid, seed = self.next_gid, self.cfg.seed * 100_003 + self.next_gid
                self.next_gid += 1
            self.gate.on_start(self.cfg.group_size)
            self.admitted += self.cfg.group_size
            self.open[gid] = seed
            for g in self.agent.start_group(gid, seed):
                self._group_done(g)

    def _group_done(self, g: Any) -> None:
        ok = sum(t.ok for t in g.trajs)
        self.gate.on_finish(ok, accepted=True)
        self.gate.on_finish(len(g.trajs) - ok, accepted=False)  # failed: slots come back
        self.open.pop(g.gid, None)
        self.finished[g.gid] = g

    def unfinished(self) -> int:
        """Trajectories admitted but not counted when the run stopped: finished groups the trainer did
        not take and groups still in flight."""
        return (len(self.finished) + len(self.open)) * self.cfg.group_size

    # ------------------------------------------------------------ trainer thread
    def _take_groups(self) -> tuple[list[Any], float] | None:
        """The next `prompts_per_step` groups in gid order once all have finished (None if the run
        stops first), and the seconds waited. Taking groups in admission order makes the prompts of
        every step the same in every run and across a resume; the gate bounds how far admission runs
        ahead, so in-order taking never makes a trajectory staler than η."""
        t_wait = time.perf_counter()
        want = range(self.next_train_gid, self.next_train_gid + self.cfg.prompts_per_step)
        while True:
            with self.lock:
                if all(g in self.finished for g in want):
                    self.next_train_gid += len(want)
                    return [self.finished.pop(g) for g in want], time.perf_counter() - t_wait
            if self.stop.is_set() or self.stop_requested:
                return None
            if time.perf_counter() - t_wait > self.cfg.stall_timeout_s:  # no wait outlives its cause
                raise PearlError(f"no batch in {self.cfg.stall_timeout_s:g} s (stall_timeout_s): groups "
                                 f"{list(want)} did not finish; {len(self.open)} groups in flight")
            time.sleep(0.005)

    def _account(self, batch: list[Any], stale: int, failed: list[Any], skipped: bool) -> None:
        """Count a step's trajectories once each. Stale ones, and a batch whose update was skipped (a
        non-finite gradient), give their slots back to the gate, so admission never waits for a
        version that a skipped update did not make."""
        with self.lock:
            back = stale + (len(batch) if skipped else 0)
            if back:
                self.gate.on_discard(back)
            self.counts["stale"] += stale
            self.counts["failed"] += len(failed)
            self.counts["skipped" if skipped else "ok"] += len(batch)
            for t in failed:
                self.fail_reasons[t.reason or "unknown"] = self.fail_reasons.get(t.reason or "unknown", 0) + 1
            if not skipped:
                self.trained_staleness += [t.staleness(self.trainer.version - 1) for t in batch]

    def _update(self, batch: list[Any]) -> dict[str, Any]:
        """Train on `batch` (if any) and offer the new weights to the engines; the step's metrics."""
        if self.control is not None:
            self.batch_ready_t.append(self.control.clock.now)
        if not batch:  # every trajectory failed or was stale: no update, the run goes on
            return {"version": self.trainer.version, "reward_mean": None, "success_rate": None, "skipped": False}
        self.training = True  # busy once it asks for its device: else a tick could lend it again before the step
        self.device_waits.append(self._post(TrainerNeedsDevices(), wait=True))  # a lent device comes back
        torch.set_num_threads(self.threads.trainer)  # (process-wide; a worker on the lent core set its own)
        t0 = self.now()
        if self.control is not None:
            self.control.training(True)
        try:
            tm = self.trainer.step(batch)
        finally:
            self.training = False
            if self.control is not None:
                self.control.training(False)
            self._post(TrainerIdle(), wait=False)  # its device may be lent until the next batch
            self.log.span(f"step {self.trainer.version}", "train", t0, self.now(), "trainer",
                          {"trajectories": len(batch)})
        m = {k: tm[k] for k in ("version", "loss", "grad_norm", "clip_fraction", "reward_mean", "reward_std",
                                "staleness_mean", "staleness_max", "skipped", "ratio_mean")}
        m["success_rate"] = sum(map(_success, batch)) / len(batch)
        if not tm["skipped"]:
            self.agent.offer_weights(self.trainer.state_dict_snapshot(), self.trainer.version)
        return m

    def _watch(self, m: dict[str, Any]) -> None:
        """Divergence is reported, never a hang: `max_nonfinite_steps` skipped updates in a row end
        the run with an error; `zero_grad_warn_steps` all-zero gradients in a row print a warning."""
        cfg = self.cfg
        self.nonfinite_in_row = self.nonfinite_in_row + 1 if m.get("skipped") else 0
        if self.nonfinite_in_row >= cfg.max_nonfinite_steps:
            raise TrainingDiverged(
                f"training diverged: {self.nonfinite_in_row} updates in a row had a non-finite loss or gradient "
                f"(trainer.lr is {cfg.trainer.lr:g}; try a smaller one); the last good weights are v{self.trainer.version}")
        self.zero_grad_in_row = self.zero_grad_in_row + 1 if m.get("grad_norm") == 0.0 else 0
        if self.zero_grad_in_row == cfg.zero_grad_warn_steps:
            self.console.print(f"warning: the gradient was exactly zero for {self.zero_grad_in_row} steps in a row "
                               f"(every group's rewards agree, or the weights saturated: trainer.lr is "
                               f"{cfg.trainer.lr:g})", highlight=False, soft_wrap=True)

    def _metrics(self, step: int, m: dict[str, Any], groups: list[Any], batch: list[Any], stale: int,
                 failed: list[Any], wait_s: float, now: float) -> dict[str, Any]:
        gen = self.agent.tokens_generated + self.agent.tokens_env
        dt = max(now - self._last_t, 1e-9)
        m.update({"trained": len(batch), "failed": len(failed), "stale": stale, "groups": [g.gid for g in groups],
                  "max_traj_staleness": max((t.staleness(self.trainer.version - (1 if batch and not m["skipped"] else 0))
                                             for t in batch), default=0),
                  "wait_for_batch_s": round(wait_s, 4), "step_s": round(now - self._last_t, 4),
                  "elapsed_s": round(now - self._t_start, 3),
                  "trajectories_per_s": (len(batch) + len(failed) + stale) / dt,
                  "tokens_per_s": (gen - self._tok_last) / dt, "layout": self.current_layout(),
                  "failure_reasons": sorted({t.reason for t in failed})[:3]})
        self._last_t, self._tok_last = now, gen
        return m

    def train(self) -> None:
        cfg = self.cfg
        self._t_start = self._last_t = time.perf_counter()
        self._tok_last = 0
        try:
            for step in range(self.start_step, cfg.max_steps + 1):
                if self.stop_requested:
                    return
                got = self._take_groups()
                if got is None:
                    return
                groups, wait_s = got
                batch, stale, failed = split_batch(groups, self.trainer.version, cfg.staleness)
                m = {"step": step, **self._update(batch)}
                self._account(batch, stale, failed, m["skipped"])
                m = self._metrics(step, m, groups, batch, stale, failed, wait_s, time.perf_counter())
                self.history.append(m)
                self.log.step(m)
                self.log.samples(step, batch or groups[0].trajs, self.loaded.tokenizer)
                self.log.trajectories(step, groups)  # every trajectory's shape: the digital twin's workload
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    self._log(m)
                self.steps_done = step
                self._watch(m)
                if self.on_step is not None:
                    self.on_step(step)
        except BaseException as err:
            self.error = err
        finally:
            self.stop.set()

    def _log(self, m: dict[str, Any]) -> None:
        r = "   -  " if m["reward_mean"] is None else f"{m['reward_mean']:.3f}"
        s = "  -  " if m["success_rate"] is None else f"{m['success_rate']:.2f}"
        done = m["step"] - self.start_step + 1
        eta = m["elapsed_s"] / max(done, 1) * (self.cfg.max_steps - m["step"])
        skip = "  SKIPPED (non-finite)" if m.get("skipped") else ""
        self.console.print(  # one line per step, never wrapped mid-field (soft_wrap) when not a terminal
            f"step {m['step']:>4}/{self.cfg.max_steps}  v{m['version']:<4} reward {r}  success {s}  "
            f"ok/fail/stale {m['trained']}/{m['failed']}/{m['stale']}  "
            f"{m['trajectories_per_s']:.1f} traj/s  {m['tokens_per_s']:.0f} tok/s  "
            f"staleness≤{m['max_traj_staleness']}  ETA {eta:.0f} s  " + escape(f"[{m['layout']}]") + skip,
            highlight=False, soft_wrap=True)
