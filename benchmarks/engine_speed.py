"""How fast is the real engine? Two measurements, each against a baseline run in the same process.

1. Decode throughput at a fixed batch: `TorchEngine.generate` vs transformers `generate` (greedy, KV
   cache on), same prompts, same number of new tokens (eos ignored). Tokens/s = batch × new tokens /
   wall time, prefill included for both.
2. A multi-turn agentic workload (16 sessions × 3 turns, response and observation lengths varying per
   turn, environment latency 0): continuous batching — each session's next turn is submitted the moment
   its previous one ends, on the same session, so only the new tokens are prefilled — vs static batching
   with transformers `generate` (one padded batch per turn, every row runs to the batch's longest
   response, each turn re-prefills its whole context). A third line runs our engine with turn barriers
   and no prefix reuse, to show how much of the gain is the policy rather than the kernels.
3. The same multi-turn workload with continuous batching on the vLLM engine (`VLLMEngine`, in this
   process) vs on ours, for smollm2-135m, when vllm is importable (`make setup-vllm`); else it says so.

Times are process CPU seconds (see `clock`), so keep --threads 1 for a fair figure on a shared machine.
Usage: python benchmarks/engine_speed.py [--models tiny,smollm2-135m] [--threads 1] [--vllm-only]
The figure (the ratios) is printed last. About 1-2 minutes on two cores.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from pearl.errors import ResourceError  # noqa: E402
from pearl.real.engine import TorchEngine  # noqa: E402
from pearl.real.models import LoadedModel, load_model  # noqa: E402
from pearl.real.sampling import SamplingParams  # noqa: E402


def clock() -> float:
    """This process's CPU seconds. Other jobs share these cores; with one intra-op thread, CPU time is
    what the wall time would be on an idle core, so both sides are timed fairly however busy it is."""
    return time.process_time()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def hf_generate(lm: LoadedModel, contexts: list[list[int]], n: int) -> list[list[int]]:
    """A static batch through transformers: left-padded, every row decodes n tokens."""
    pad = lm.tokenizer.pad_token_id
    width = max(len(c) for c in contexts)
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    with torch.inference_mode():
        out = lm.hf_model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                   eos_token_id=None, pad_token_id=pad)
    return out[:, width:].tolist()


def equal_length_prompts(lm: LoadedModel, batch: int) -> list[list[int]]:
    tok = lm.tokenizer
    ps = [tok.chat([{"role": "user", "content": f"Task {i}: list three facts about the number {17 * i + 3}."}])
          for i in range(batch)]
    n = min(len(p) for p in ps)
    return [p[:n] for p in ps]


def bench_decode(lm: LoadedModel, batch: int, new_tokens: int, reps: int) -> tuple[float, float]:
    """Best of `reps` interleaved runs per side: other processes share these cores, and the best run
    is the one least disturbed by them."""
    prompts = equal_length_prompts(lm, batch)
    hf_generate(lm, prompts[:2], 2)  # warm-up: first calls pay one-off costs
    engine = TorchEngine(lm, max_num_seqs=batch, max_batched_tokens=2048, retain_sessions=False)
    engine.generate(prompts[:2], greedy(2))
    ours_s = hf_s = float("inf")
    for _ in range(reps):
        t = clock()
        hf_generate(lm, prompts, new_tokens)
        hf_s = min(hf_s, clock() - t)
        t = clock()
        engine.generate(prompts, greedy(new_tokens))
        ours_s = min(ours_s, clock() - t)
    return batch * new_tokens / ours_s, batch * new_tokens / hf_s


# ---------------------------------------------------------------- the multi-turn workload
def workload(lm: LoadedModel, sessions: int, turns: int, max_resp: int, seed: int = 0) -> list[dict]:
    """Per session: a first prompt, then per turn a response length and the observation that follows."""
    rng = random.Random(seed)
    tok = lm.tokenizer
    out = []
    for s in range(sessions):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(rng.randint(3, 30)))
        first = tok.chat([{"role": "user", "content": f"Session {s}: {words}"}])
        lengths = [n for n in (4, 8, 16, 32, 64) if n <= max_resp]
        resp = [rng.choice(lengths) for _ in range(turns)]  # long-tailed response lengths
        obs = [tok.chat([{"role": "user", "content": "observation " + "x" * rng.randint(1, 40)}])
               for _ in range(turns)]
        out.append({"first": first, "resp": resp, "obs": obs})
    return out


def run_continuous(lm: LoadedModel, wl: list[dict], max_num_seqs: int, engine: Any = None) -> tuple[float, int]:
    """The multi-turn workload with continuous batching on `engine` (any `RolloutEngine`; default ours)."""
    engine = engine or TorchEngine(lm, max_num_seqs=max_num_seqs, max_batched_tokens=512)
    turn = {i: 0 for i in range(len(wl))}
    rid_of = {}
    t = clock()
    for i, s in enumerate(wl):
        rid_of[engine.add_request(s["first"], greedy(s["resp"][0]), session=f"s{i}").rid] = i
    tokens = 0
    while engine.has_work():
        for o in engine.step():
            i = rid_of.pop(o.rid)
            tokens += len(o.token_ids)
            turn[i] += 1
            if turn[i] < len(wl[i]["resp"]):  # the environment answers at once; the next turn starts now
                ctx = o.req.token_ids + wl[i]["obs"][turn[i] - 1]
                rid_of[engine.add_request(ctx, greedy(wl[i]["resp"][turn[i]]), session=f"s{i}").rid] = i
    return clock() - t, tokens


def run_static(lm: LoadedModel, wl: list[dict], use_hf: bool) -> tuple[float, int]:
    """One batch per turn; the next turn starts when the whole batch is done. HF: padded rows run to the
    longest response; ours (turn barriers): rows leave when done but nothing overlaps turns or is reused."""
    ctx = [list(s["first"]) for s in wl]
    tokens = 0
    t = clock()
    for k in range(len(wl[0]["resp"])):
        lens = [s["resp"][k] for s in wl]
        if use_hf:
            outs = hf_generate(lm, ctx, max(lens))
            gen = [o[:n] for o, n in zip(outs, lens)]
        else:
            engine = TorchEngine(lm, max_num_seqs=len(wl), max_batched_tokens=512, retain_sessions=False)
            gen = [o.token_ids for o in engine.generate(ctx, [greedy(n) for n in lens])]
        tokens += sum(len(g) for g in gen)
        ctx = [c + g + s["obs"][k] for c, g, s in zip(ctx, gen, wl)]
    return clock() - t, tokens


def compare_vllm(lm: LoadedModel, wl: list[dict]) -> list[str]:
    """Multi-turn, continuous batching: the vLLM engine vs ours on the same workload (best of 2 runs
    each, interleaved; vLLM warmed up by a first run it is not timed on)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print(f"[{lm.spec.name}] vLLM comparison skipped: vllm is not importable (make setup-vllm)")
        return [f"{lm.spec.name}: vLLM vs ours not measured (vllm is not importable)"]
    from pearl.real.vllm_engine import VLLMEngine

    t = time.perf_counter()
    vl = VLLMEngine.from_loaded(lm, max_num_seqs=len(wl), max_batched_tokens=512, kv_capacity_tokens=8192)
    print(f"[{lm.spec.name}] vLLM engine loaded in {time.perf_counter() - t:.1f} s wall")
    run_continuous(lm, wl[:2], len(wl), vl)  # warm-up
    ours_s = vllm_s = float("inf")
    for _ in range(2):
        s, n = run_continuous(lm, wl, len(wl))
        ours_s = min(ours_s, s)
        s, nv = run_continuous(lm, wl, len(wl), vl)
        vllm_s = min(vllm_s, s)
    vl.close()
    print(f"[{lm.spec.name}] multi-turn on vLLM, {len(wl)} sessions: vLLM {nv / vllm_s:8.1f} tok/s ({vllm_s:.2f} s, "
          f"{nv} tokens)   ours {n / ours_s:8.1f} tok/s ({ours_s:.2f} s, {n} tokens)")
    return [f"{lm.spec.name}: multi-turn continuous batching, vLLM/ours = {(nv / vllm_s) / (n / ours_s):.2f}x tok/s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both sides use the same)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--big-sessions", type=int, default=8, help="sessions for models other than tiny (time)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--vllm-only", action="store_true", help="only the vLLM vs ours comparison")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM comparison")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), times in process CPU seconds; decode batch "
          f"{args.batch}; multi-turn {args.turns} turns, env latency 0")
    figure = []
    for name in args.models.split(","):
        try:
            lm = load_model(name)
        except ResourceError as err:
            print(f"[{name}] skipped: {err}")
            continue
        big = name != "tiny"  # a real model costs ~100x more per token on CPU: a smaller workload
        if big and not args.no_vllm:
            figure += compare_vllm(lm, workload(lm, args.big_sessions, args.turns, 32))
        if args.vllm_only:
            continue
        ratios = []
        for batch in [args.batch] if big else [args.batch, 4 * args.batch]:
            ours, hf = bench_decode(lm, batch, args.new_tokens // 2 if big else args.new_tokens, 2 if big else 3)
            ratios.append(f"{ours / hf:.2f}x at batch {batch}")
            print(f"[{name}] decode, batch {batch:3d}: ours {ours:8.1f} tok/s   transformers generate {hf:8.1f} tok/s")
        wl = workload(lm, args.big_sessions if big else args.sessions, args.turns, 32 if big else 64)
        cont_s, n = run_continuous(lm, wl, len(wl))
        bar_s, _ = run_static(lm, wl, use_hf=False)
        hf_s, _ = run_static(lm, wl, use_hf=True)
        print(f"[{name}] multi-turn, {len(wl)} sessions, {n} response tokens: continuous {n / cont_s:8.1f} tok/s ({cont_s:.2f} s)   "
              f"static HF generate {n / hf_s:8.1f} tok/s ({hf_s:.2f} s)   "
              f"ours with turn barriers, no reuse {n / bar_s:8.1f} tok/s ({bar_s:.2f} s)")
        figure.append(f"{name}: decode ours/HF = {', '.join(ratios)} (target >= 1.0); multi-turn continuous/static = "
                      f"{hf_s / cont_s:.2f}x (goal >= 1.5; vs our own engine with turn barriers {bar_s / cont_s:.2f}x)")
    print("\n== figure ==")
    for line in figure:
        print(line)


if __name__ == "__main__":
    main()
