"""Profile the real GRPO trainer: time a few steps on synthetic batches of different token counts and
row lengths and fit seconds = fixed_s + per_token_s x tokens + per_pair_s x attention pairs
(`pearl.perf.profile.TrainerProfile`), the trainer's part of the profile `pearl profile` writes.
Short rows alone cannot fit the pairs term: a long-context workload (600-token observations, 5k-token
rows) trains at ~420 us/token on the tiny model where 230-token rows take ~43 us/token, so three small
batches of long rows (`LONG`) are timed too.

A synthetic batch is `groups` GRPO groups of `group_size` rows; each group's rows share one prompt and
alternate rewards 0 and 1 (so every row has a non-zero advantage and is trained); rows have `turns`
model turns of `response_tokens` each with `observation_tokens` between them, the number of turns
varying over the rows of a batch (so micro-batches are padded as in a real run). A step is timed
with the weight snapshot that `pearl train` hands the engines after it. The tokens of a step are
`pearl.perf.profile.trainer_work` of its rows, the same count the simulator prices.

Each step is timed on the wall clock and on this process's CPU clock (`time.process_time`); with one
intra-op thread the CPU clock is what the step would take on an idle core (robust on a busy machine).
"""
from __future__ import annotations

import copy
import random
import statistics
import time
from typing import Any, Sequence

import torch

from pearl.perf.profile import TrainerProfile, fit_trainer, trainer_work
from pearl.rl.trainer import GRPOTrainer, TrainerConfig
from pearl.rl.trajectory import Trajectory

__all__ = ["synthetic_batch", "measure_trainer", "calibrate_trainer"]

# Long rows: (groups, rows per group, turns, observation tokens): ~1k- to ~4k-token rows, few of them
# (about 15 s more of calibration on the tiny model)
LONG = ((1, 4, 4, 300), (1, 2, 4, 800), (1, 2, 5, 1000))


def synthetic_batch(turns: int, groups: int, group_size: int, prompt_tokens: int = 48, response_tokens: int = 1,
                    observation_tokens: int = 24, vocab: int = 256, seed: int = 0) -> list[Trajectory]:
    """`groups` x `group_size` finished trajectories; row i of a group has 1 + (i mod `turns`) turns...
    up to `turns` (so a batch holds several lengths), rewards alternate 0 / 1 within a group."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    out = []
    for g in range(groups):
        prompt = tok(prompt_tokens)
        for i in range(group_size):
            t = Trajectory(id=f"s{g}-{i}", group_id=g, sample_index=i)
            t.append_prompt(prompt)
            k = max(1, turns - (i % 2) * (turns // 2))  # two lengths per group: turns and about half
            for j in range(k):
                t.append_model(tok(response_tokens), [-1.0] * response_tokens, 0)
                if j + 1 < k:
                    t.append_env(tok(observation_tokens))
            t.add_reward(float(i % 2 == (g % 2)))
            t.finish()
            out.append(t)
    return out


def batch_work(batch: Sequence[Trajectory], cfg: TrainerConfig) -> tuple[int, float]:
    """`trainer_work` (tokens, attention pairs) of a batch whose rows all have a non-zero advantage."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for t in batch:
        groups.setdefault(t.group_id, []).append((t.prompt_length, len(t)))
    return trainer_work(list(groups.values()), cfg.micro_batch_size, cfg.share_prompt)


def measure_trainer(model: Any, cfg: TrainerConfig, groups: int = 2, group_size: int = 16,
                    turn_counts: Sequence[int] = (1, 3, 6, 10), repeats: int = 3, vocab: int = 256,
                    response_tokens: int = 1, observation_tokens: int = 24,
                    allowed_token_ids: Sequence[int] | None = None,
                    long: Sequence[tuple[int, int, int, int]] = LONG) -> list[tuple[int, float, float, float]]:
    """(tokens, attention pairs, wall s, CPU s) per batch: the median of `repeats` timed steps after
    one untimed step, on a private copy of `model` (the caller's weights are not changed). Batches:
    `groups` x `group_size` rows of each of `turn_counts`, then the long-row batches `long`."""
    m = copy.deepcopy(model)
    m.requires_grad_(True)
    trainer = GRPOTrainer(m, cfg, allowed_token_ids=allowed_token_ids)
    out = []
    shapes = [(groups, group_size, k, observation_tokens) for k in turn_counts] + list(long)
    for g, n, k, obs in shapes:
        batch = synthetic_batch(k, g, n, response_tokens=response_tokens, observation_tokens=obs, vocab=vocab, seed=k)
        trainer.step(batch)  # warm-up: allocator, autograd graph shapes
        walls, cpus = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            trainer.step(batch)
            trainer.state_dict_snapshot()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        out.append((*batch_work(batch, cfg), statistics.median(walls), statistics.median(cpus)))
    return out


def calibrate_trainer(model: Any, cfg: TrainerConfig, threads: int = 1, clock: str = "cpu",
                      **kw: Any) -> TrainerProfile:
    """Measure `model` under trainer settings `cfg` with `threads` intra-op threads and fit the
    profile. The CPU clock is used only with one thread (with more it sums the threads' time)."""
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be cpu or wall, got {clock!r}")
    clock = "wall" if threads > 1 else clock
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = measure_trainer(model, cfg, **kw)
    finally:
        torch.set_num_threads(old)
    samples = [(tok, pairs, cpu if clock == "cpu" else wall) for tok, pairs, wall, cpu in rows]
    return fit_trainer(samples, clock=clock, micro_batch_size=cfg.micro_batch_size,
                       share_prompt=cfg.share_prompt, threads=threads)
