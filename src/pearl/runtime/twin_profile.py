"""`pearl profile`: the calibrated profile of this machine for a training config — the engine's step
times (`pearl.real.profiling`), the GRPO trainer's cost (`pearl.rl.trainer_profile`) and the executor
the local backend really is (`measure_shared`): the rollout workers' engine steps and the trainer's
steps run in one process, sharing its cores and its GIL, so each is slower while the other works.

`measure_shared(cfg, loaded, trainer, batch, workers)`: the run's rollout (its agent loop over N
colocated engines, one intra-op thread each, its environment on its thread pool, (η + 1) x B
trajectories in flight) and the trainer stepping on another thread at once; a factor is the wall
time of an engine step (a trainer step) taken together over the CPU time of its thread in one taken
alone — how much longer than on an idle core of its own, the reference of the profile's CPU-clock
fits. `calibrate(cfg)` measures them for 1 to
`cfg.rollout_workers` workers and stores them in the profile's trainer section (`shared`).
"""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pearl.perf.profile import Profile, save_profile
from pearl.runtime.train_config import TrainConfig

__all__ = ["calibrate", "measure_shared"]


class _Rollout:
    """pearl train's rollout thread without a trainer: `cfg`'s environment and sampling, `workers`
    colocated engines (as the run builds them), groups admitted to keep (η + 1) x B trajectories in
    flight; `step()` is one pass of the agent loop. The engines' own busy time and step counts say
    how long their steps took."""

    def __init__(self, cfg: TrainConfig, loaded: Any, workers: int):
        from pearl.envs import load_env
        from pearl.real.sampling import SamplingParams
        from pearl.runtime.agent import AgentLoop
        from pearl.runtime.engines import build_engine

        make_env = lambda: load_env(cfg.env.name, **dict(cfg.env.kwargs))  # noqa: E731
        acts, tok, allowed = make_env().allowed_actions, loaded.tokenizer, None
        if cfg.sampling.restrict_actions and acts and all(len(tok.encode(a)) == 1 for a in acts):
            allowed = tuple(tok.encode(a)[0] for a in acts)
        params = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                max_new_tokens=1 if allowed else cfg.sampling.max_new_tokens,
                                allowed_token_ids=allowed)
        engines = [build_engine(loaded, cfg.engine, "mixed", i, cfg.seed + i, 1) for i in range(workers)]
        self.agent = AgentLoop(engines, "colocated", make_env, params, cfg.group_size, cfg.env.timeout_s,
                               cfg.env.use_system_prompt, env_workers=cfg.env.workers,
                               parallel_engines=cfg.engine.parallel_steps)
        self.target = cfg.batch_size * (cfg.staleness + 1)
        self.in_flight, self.gid, self.group_size = 0, 0, cfg.group_size
        self.lock, self.wall, self.cpu, self.steps = threading.Lock(), 0.0, 0.0, 0
        for e in engines:
            e.step = self._timed(e.step)  # an instance attribute: this engine only

    def _timed(self, step: Any) -> Any:
        def timed() -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = step()
            w, c = time.perf_counter() - w0, time.thread_time() - c0
            with self.lock:
                self.wall += w
                self.cpu += c
                self.steps += 1
            return out
        return timed

    def step(self) -> None:
        while self.in_flight + self.group_size <= self.target:
            self.in_flight += self.group_size
            self.gid += 1
            self.in_flight -= self.group_size * len(self.agent.start_group(self.gid, self.gid))
        self.in_flight -= self.group_size * len(self.agent.step())

    def take(self) -> tuple[float, float]:
        """(wall s, the stepping thread's CPU s) per engine step since the last call."""
        with self.lock:
            n = max(self.steps, 1)
            out, self.wall, self.cpu, self.steps = (self.wall / n, self.cpu / n), 0.0, 0.0, 0
        return out


def _trainer_steps(trainer: Any, batch: list, n: int) -> tuple[float, float]:
    """(wall s, this thread's CPU s) per trainer step (with the weight snapshot pearl train takes)."""
    wall = cpu = 0.0
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.thread_time()
        trainer.step(batch)
        trainer.state_dict_snapshot()
        wall, cpu = wall + time.perf_counter() - w0, cpu + time.thread_time() - c0
    return wall / n, cpu / n


def measure_shared(cfg: TrainConfig, loaded: Any, trainer: Any, batch: list, workers: int,
                   trainer_threads: int = 1, steps: int = 6, alone_s: float = 1.0) -> tuple[float, ...]:
    """(engine, trainer) slowdowns with `workers` rollout workers at work (`cfg`'s agent loop and
    environment) while the trainer steps, then (engine, trainer) each running while the other waits:
    the wall seconds of a step over the CPU seconds its own thread spends in a step alone
    (`time.thread_time`: what the profile's CPU-clock fits price). Waiting for the GIL or a core
    (other processes on the machine included), and CPU time inflated by a busy sibling (shared
    caches, hyper-threads), all count."""
    ro = _Rollout(cfg, loaded, workers)
    torch.set_num_threads(1)
    t_end = time.perf_counter() + alone_s
    while time.perf_counter() < t_end - 0.6 * alone_s:  # warm-up
        ro.step()
    ro.take()
    while time.perf_counter() < t_end:
        ro.step()
    wall_e, alone_e = ro.take()
    torch.set_num_threads(trainer_threads)
    trainer.step(batch)  # warm-up
    wall_t, alone_t = _trainer_steps(trainer, batch, steps)
    stop = threading.Event()

    def spin() -> None:
        torch.set_num_threads(1)
        while not stop.is_set():
            ro.step()

    th = threading.Thread(target=spin, daemon=True)
    th.start()
    try:
        time.sleep(0.05)
        ro.take()
        together_t, _ = _trainer_steps(trainer, batch, steps)
        together_e, _ = ro.take()
    finally:
        stop.set()
        th.join()
        ro.agent.close()
    return tuple(max(w / max(c, 1e-9), 1.0) for w, c in
                 ((together_e, alone_e), (together_t, alone_t), (wall_e, alone_e), (wall_t, alone_t)))


def measure_bookkeeping(trainer: Any, batch: list, tokenizer: Any, repeats: int = 3) -> tuple[float, float]:
    """(log s, checkpoint s): the wall seconds pearl train's trainer thread spends per step on its
    logs (`RunLog.step`, `samples`, `trajectories`) and on one checkpoint of the trainer's state and
    the batch's trajectories (`save_checkpoint`), medians of `repeats`."""
    import statistics
    import tempfile

    from pearl.rl.trajectory import Group
    from pearl.runtime.checkpoint import save_checkpoint
    from pearl.runtime.observe import RunLog

    groups: dict[int, list] = {}
    for t in batch:
        groups.setdefault(t.group_id, []).append(t)
    gs = [Group(g, len(ts), 0, ts) for g, ts in groups.items()]
    m = {"step": 1, "loss": 0.0, "grad_norm": 1.0, "reward_mean": 0.5, "success_rate": 0.5, "trained": len(batch),
         "groups": list(groups), "step_s": 1.0, "elapsed_s": 1.0, "layout": "colocated"}
    logs, ckpts = [], []
    with tempfile.TemporaryDirectory() as d:
        with RunLog(Path(d) / "log") as log:
            for i in range(repeats):
                t0 = time.perf_counter()
                log.step({**m, "step": i + 1})
                log.samples(i + 1, batch, tokenizer)
                log.trajectories(i + 1, gs)
                logs.append(time.perf_counter() - t0)
        state = {"step": 1, "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                 "rollout": {"finished": [{"gid": g.gid, "trajs": [t.to_dict() for t in g.trajs]} for g in gs]}}
        for i in range(repeats):
            t0 = time.perf_counter()
            save_checkpoint(Path(d) / "run", i + 1, state)
            ckpts.append(time.perf_counter() - t0)
    return statistics.median(logs), statistics.median(ckpts)


def calibrate(cfg: TrainConfig, path: str | Path | None = None, *, clock: str = "cpu") -> Profile:
    """The profile of `cfg.model` on this machine: engine steps, the trainer's cost under
    `cfg.trainer` on batches of `cfg`'s size with the thread count a run of `cfg` gives it, and the
    shared-executor factors for 1 to `cfg.rollout_workers` local workers; saved at `path` if given."""
    from pearl.perf.profile import TrainerProfile
    from pearl.real.models import load_model
    from pearl.real.profiling import calibrate_engine
    from pearl.rl.trainer import GRPOTrainer
    from pearl.rl.trainer_profile import calibrate_trainer, synthetic_batch
    from pearl.runtime.threads import host_cores, plan_threads

    prof = calibrate_engine(cfg.model, None, clock=clock)
    loaded = load_model(cfg.model)
    tc = cfg.trainer
    pad = getattr(loaded.tokenizer, "pad_token_id", None)
    if pad is not None and "pad_token_id" not in tc.model_fields_set:
        tc = tc.model_copy(update={"pad_token_id": int(pad)})
    local = cfg.rollout_workers if cfg.backend == "local" else 0
    th = cfg.threads
    threads = plan_threads(host_cores(), local, th.trainer, th.engine, th.interop).trainer
    tr: TrainerProfile = calibrate_trainer(loaded.hf_model, tc, threads=threads, clock=clock,
                                           groups=cfg.prompts_per_step, group_size=cfg.group_size)
    shared = []
    model = copy.deepcopy(loaded.hf_model).requires_grad_(True)
    trainer = GRPOTrainer(model, tc)
    batch = synthetic_batch(6, cfg.prompts_per_step, cfg.group_size)
    if local:
        old = torch.get_num_threads()
        try:
            for n in range(1, local + 1):
                shared.append((n, *(round(f, 4) for f in measure_shared(cfg, loaded, trainer, batch, n, threads))))
        finally:
            torch.set_num_threads(old)
    trainer.step(batch)  # the optimizer's state exists, as in a run's checkpoint
    log_s, ckpt_s = measure_bookkeeping(trainer, batch, loaded.tokenizer)
    prof = replace(prof, trainer=replace(tr, shared=tuple(shared), log_s=round(log_s, 6), checkpoint_s=round(ckpt_s, 6)))
    if path is not None:
        save_profile(prof, path)
    return prof
