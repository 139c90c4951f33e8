"""A real model learns on a laptop: SmolLM2-135M-Instruct on the built-in `arith` task, held-out reward
before and after `pearl train` (bfloat16 trainer and engine, the automatic thread plan).

Trains for at most --minutes of wall time (the run's `max_steps` is sized from --steps; the script
stops the run cleanly at the step that crosses the time budget), saving the policy every --every steps.
Then scores the start model and every saved policy on --n held-out problems (`heldout_seeds`, seeds no
training run draws), greedily, with our torch engine, and grades with `ArithEnv.step`. Writes
`smollm2_learns.csv` and `smollm2_learns.png` to --out and prints the start and end held-out reward
and, last, the ratio end / start.

    PYTHONPATH=src python benchmarks/smollm2_learns.py [--minutes 15] [--lr 2e-5] [--group 8] [--prompts 2]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def heldout_reward(loaded, state_dict, seeds: list[int], max_new: int) -> float:
    """Mean greedy reward of the model (with `state_dict` loaded, if given) on `seeds`."""
    from pearl.envs.arith import ArithEnv
    from pearl.real.engine import TorchEngine
    from pearl.real.sampling import SamplingParams

    env = ArithEnv()
    # One thread, as `pearl train` gives a rollout worker: on a shared machine OpenMP threads waiting
    # at barriers for busy cores make a decode step far slower.
    eng = TorchEngine(loaded, max_num_seqs=64, max_batched_tokens=2048, num_threads=1, dtype="bfloat16")
    if state_dict is not None:
        eng.update_weights(state_dict, 1)
    tok = loaded.tokenizer
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new)
    for s in seeds:
        msgs = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": env.question(s)[0]}]
        eng.add_request(tok.chat(msgs), params, rid=s)
    texts = {}
    while eng.has_work():
        for out in eng.step():
            texts[out.rid] = tok.decode(out.token_ids)
    total = 0.0
    for s in seeds:
        env.reset(s)
        total += env.step(texts[s]).reward
    return total / len(seeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=15.0, help="wall-time budget of the training run")
    ap.add_argument("--steps", type=int, default=200, help="max_steps (the time budget usually ends it first)")
    ap.add_argument("--every", type=int, default=10, help="save (and later score) the policy every this many steps")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--n", type=int, default=64, help="held-out problems")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "smollm2_learns")
    a = ap.parse_args()

    import torch
    from rich.console import Console
    from transformers import AutoModelForCausalLM

    from pearl.envs.arith import heldout_seeds
    from pearl.real.models import load_model
    from pearl.runtime.training import run_training

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run_dir = a.out / "run"
    cfg = {"name": "smollm2-learns", "model": "smollm2-135m", "env": {"name": "arith", "use_system_prompt": True},
           "max_steps": a.steps, "prompts_per_step": a.prompts, "group_size": a.group, "staleness": 1,
           "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": a.max_new_tokens,
                        "restrict_actions": False},
           "trainer": {"lr": a.lr, "micro_batch_size": a.prompts * a.group, "max_grad_norm": 1.0},
           "dtype": "bfloat16", "engine": {"max_num_seqs": 32, "max_batched_tokens": 512, "kv_capacity_tokens": 32768},
           "rollout_workers": 1, "layout": "colocated", "seed": 0, "checkpoint_every": 1000,
           "save_policy_every": a.every}
    deadline = time.perf_counter() + a.minutes * 60
    import pearl.runtime.training as training
    from pearl.runtime.checkpoint import save_policy

    orig_saver_call = training._Saver.__call__

    def saver(self, step: int) -> None:  # stop cleanly (checkpoint + policy) once the budget is spent
        orig_saver_call(self, step)
        if time.perf_counter() > deadline and self.run.stop_requested is None:
            if step % a.every:
                save_policy(self.run.trainer.model, self.run.loaded.tokenizer, self.out_dir / f"policy-{step:06d}")
            self.run.stop_requested = "time budget"

    training._Saver.__call__ = saver
    t0 = time.perf_counter()
    try:
        run_training(ROOT / "configs" / "smollm2-arith.yaml", cfg, run_dir, Console(file=sys.stderr, width=200),
                     overwrite=True)
    except training.RunInterrupted:
        pass
    train_s = time.perf_counter() - t0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]

    loaded = load_model("smollm2-135m")
    seeds = heldout_seeds(a.n)
    points = [(0, 0.0, heldout_reward(loaded, None, seeds, a.max_new_tokens))]
    policies = sorted((int(p.name.split("-")[1]), p) for p in run_dir.glob("policy-*"))
    if (run_dir / "policy").is_dir() and lines[-1]["step"] not in dict(policies):
        policies.append((lines[-1]["step"], run_dir / "policy"))
    elapsed = {m["step"]: m["elapsed_s"] for m in lines}
    for step, path in policies:
        sd = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
        points.append((step, elapsed.get(step, float("nan")), heldout_reward(loaded, sd, seeds, a.max_new_tokens)))
        print(f"step {step:>4} ({points[-1][1]:.0f} s of training): held-out reward {points[-1][2]:.3f}", flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "smollm2_learns.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "train_elapsed_s", "heldout_reward", "train_reward_of_step"])
        train_r = {m["step"]: m["reward_mean"] for m in lines}
        for step, el, r in points:
            w.writerow([step, round(el, 1), round(r, 4), "" if train_r.get(step) is None else round(train_r[step], 4)])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([m["step"] for m in lines], [m["reward_mean"] for m in lines], alpha=0.4, label="training batch reward")
    ax.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=f"held-out greedy reward ({a.n} problems)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(f"SmolLM2-135M-Instruct on arith ({a.prompts}x{a.group}/step, lr {a.lr:g}, bf16)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out / "smollm2_learns.png", dpi=80)
    start, end = points[0][2], points[-1][2]
    print(f"started {started}; trained {lines[-1]['step']} steps in {train_s / 60:.1f} min (budget {a.minutes} min); "
          f"curve {a.out / 'smollm2_learns.png'}")
    print(f"held-out reward: start {start:.3f}, end {end:.3f} ({end - start:+.3f} absolute)")
    print(f"end / start held-out reward: {end / start:.2f}x" if start > 0 else "end / start: start is 0")


if __name__ == "__main__":
    main()
