"""`pearl profile`: the calibrated profile of this machine for a training config — the engine's step
times (`pearl.real.profiling`), the GRPO trainer's cost (`pearl.rl.trainer_profile`) and the executor
the local backend really is (`measure_shared`): the rollout workers' engine steps and the trainer's
steps run in one process, sharing its cores and its GIL, so each is slower while the other works.

`measure_shared(loaded, trainer_cfg, workers)`: N engines, each stepping on a thread of its own (one
intra-op thread each, as `pearl train` runs them) a steady load of short turns, and the trainer
stepping on another, first each alone and then all together; the factors are the wall-time ratios
(together / alone) of an engine step and of a trainer step. `calibrate(cfg)` measures them for 1 to
`cfg.rollout_workers` workers and stores them in the profile's trainer section (`shared`).
"""
from __future__ import annotations

import copy
import random
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pearl.perf.profile import Profile, save_profile
from pearl.runtime.train_config import TrainConfig

__all__ = ["calibrate", "measure_shared"]


class _Load:
    """One engine kept busy with `batch` sessions of short turns (a 48-token prompt, then 24-token
    observations, `new` tokens a turn), as an agentic rollout keeps it."""

    def __init__(self, engine: Any, batch: int = 16, new: int = 1, seed: int = 0):
        from pearl.real.sampling import SamplingParams

        self.engine, self.rng, self.times = engine, random.Random(seed), []
        self.params = SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True, stop_token_ids=())
        self.ctx = {f"l{seed}-{i}": self._toks(48) for i in range(batch)}
        for s, ids in self.ctx.items():
            engine.add_request(ids, self.params, session=s)

    def _toks(self, n: int) -> list[int]:
        return [self.rng.randrange(256) for _ in range(n)]

    def step(self) -> None:
        t0 = time.perf_counter()
        outs = self.engine.step()
        self.times.append(time.perf_counter() - t0)
        for o in outs:
            s = o.req.session
            ids = list(o.req.token_ids) + self._toks(24)
            if len(ids) > 1500:  # keep contexts short: start the session again
                self.engine.drop_session(s)
                ids = self._toks(48)
            self.engine.add_request(ids, self.params, session=s)


def _trainer_steps(trainer: Any, batch: list, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        trainer.step(batch)
        trainer.state_dict_snapshot()
        out.append(time.perf_counter() - t0)
    return out


def measure_shared(loaded: Any, trainer: Any, batch: list, workers: int, trainer_threads: int = 1,
                   steps: int = 3) -> tuple[float, float]:
    """(engine slowdown, trainer slowdown) with `workers` engines and the trainer running at once."""
    from pearl.real.engine import TorchEngine

    loads = [_Load(TorchEngine(loaded, num_threads=1, seed=i), seed=i) for i in range(workers)]
    torch.set_num_threads(trainer_threads)
    trainer.step(batch)  # warm-up
    for ld in loads:
        for _ in range(5):
            ld.step()
        ld.times.clear()
    for _ in range(20):  # alone: one engine (they are alike)
        loads[0].step()
    alone_e = statistics.median(loads[0].times)
    alone_t = statistics.median(_trainer_steps(trainer, batch, steps))
    for ld in loads:
        ld.times.clear()
    stop = threading.Event()

    def spin(ld: _Load) -> None:
        torch.set_num_threads(1)
        while not stop.is_set():
            ld.step()

    threads = [threading.Thread(target=spin, args=(ld,), daemon=True) for ld in loads]
    for th in threads:
        th.start()
    try:
        time.sleep(0.05)
        together_t = statistics.median(_trainer_steps(trainer, batch, steps))
    finally:
        stop.set()
        for th in threads:
            th.join()
    together_e = statistics.median(t for ld in loads for t in ld.times)
    return max(together_e / alone_e, 1.0), max(together_t / alone_t, 1.0)


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
    if local:
        model = copy.deepcopy(loaded.hf_model).requires_grad_(True)
        trainer = GRPOTrainer(model, tc)
        batch = synthetic_batch(6, cfg.prompts_per_step, cfg.group_size)
        old = torch.get_num_threads()
        try:
            for n in range(1, local + 1):
                e, t = measure_shared(loaded, trainer, batch, n, threads)
                shared.append((n, round(e, 4), round(t, 4)))
        finally:
            torch.set_num_threads(old)
    prof = replace(prof, trainer=replace(tr, shared=tuple(shared)))
    if path is not None:
        save_profile(prof, path)
    return prof
