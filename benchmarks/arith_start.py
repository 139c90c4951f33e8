"""The start reward of a model on the built-in `arith` task: held-out prompts, greedy and sampled.

    PYTHONPATH=src python benchmarks/arith_start.py [--model smollm2-135m] [--n 64] [--max-new-tokens 32]
        [--temperature 0.8] [--samples 4] [--kwargs '{"max_value": 50}'] [--no-system]

Generates with transformers `generate` (batched, left-padded) from the same chat prompt `pearl train`
builds (system prompt + question), grades with `ArithEnv.step`, and prints the outcome counts, a few
completions, and the mean rewards last (greedy, then sampled).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch

from pearl.envs.arith import ArithEnv, heldout_seeds
from pearl.real.models import load_model


def generate(loaded, prompts: list[list[int]], max_new: int, temperature: float, seed: int) -> list[str]:
    tok = loaded.tokenizer
    pad = int(getattr(tok, "pad_token_id", tok.eos_token_id))
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=temperature, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    with torch.no_grad():
        out = loaded.hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                       pad_token_id=pad, eos_token_id=tok.eos_token_id, **kw)
    return [tok.decode(row[width:].tolist()) for row in out]


def score(env: ArithEnv, seeds: list[int], texts: list[str]) -> tuple[float, Counter]:
    total, outcomes = 0.0, Counter()
    for s, text in zip(seeds, texts):
        env.reset(s)
        res = env.step(text)
        total += res.reward
        outcomes[res.info["outcome"]] += 1
    return total / len(seeds), outcomes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--kwargs", default="{}")
    ap.add_argument("--no-system", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    env = ArithEnv(**json.loads(args.kwargs))
    loaded = load_model(args.model)
    seeds = heldout_seeds(args.n)
    prompts = []
    for s in seeds:
        msgs = [] if args.no_system else [{"role": "system", "content": env.system_prompt}]
        prompts.append(loaded.tokenizer.chat(msgs + [{"role": "user", "content": env.question(s)[0]}]))
    t0 = time.perf_counter()
    greedy_texts = generate(loaded, prompts, args.max_new_tokens, 0.0, 0)
    greedy, outcomes = score(env, seeds, greedy_texts)
    print(f"greedy: {greedy:.3f} {dict(outcomes)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    for s, text in list(zip(seeds, greedy_texts))[:4]:
        print(f"  {env.question(s)[0]!r} -> {text!r}", flush=True)
    sampled = []
    for k in range(args.samples):
        r, outcomes = score(env, seeds, generate(loaded, prompts, args.max_new_tokens, args.temperature, k + 1))
        sampled.append(r)
        print(f"sampled (T={args.temperature}) #{k}: {r:.3f} {dict(outcomes)}", flush=True)
    mean_sampled = sum(sampled) / max(1, len(sampled))
    print(f"start reward on {args.n} held-out prompts: greedy {greedy:.3f}, sampled {mean_sampled:.3f}")


if __name__ == "__main__":
    main()
