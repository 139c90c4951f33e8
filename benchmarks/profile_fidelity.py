"""Profile fidelity: can the simulator's step-time model be trusted on this machine?

1. Calibrate: time a sweep of real `TorchEngine` steps (decode batches, context lengths, prefill chunks;
   `pearl.real.profiling`) and fit the roofline coefficients (hardware "cpu", tp 1, combine "sum").
2. Measure: run a real multi-turn rollout batch (default 16 sessions x 3 turns; prompt, response and
   observation lengths vary per session and turn; eos ignored so every response has its planned length;
   environment latency 0: a session's next turn is submitted the moment its previous one ends, on the
   same session, so only the new tokens are prefilled) and time it.
3. Predict: replay the same requests through the `EmulatedEngine` (the same scheduling policy, step times
   from the calibrated `PerfModel.step_time`), so the difference is the step-time model. As a diagnostic,
   also sum the calibrated model over the shapes of the steps the real rollout actually ran.
4. Print predicted vs measured and the error; the figure is the LAST line.

Both clocks are reported: wall (`perf_counter`) and this process's CPU time (`process_time`; with one
intra-op thread it is the wall time on an idle core, so it is the fair figure on a busy machine).
`--clock` picks the one in the last line (default auto: wall on an idle machine, else CPU). Goal: within 15%. About 20-60 s on two cores.
Usage: PYTHONPATH=src python benchmarks/profile_fidelity.py [--model tiny] [--sessions 16] [--turns 3]
       [--clock wall|cpu] [--profile out.json]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from pearl.engine.emulated import EmulatedEngine  # noqa: E402
from pearl.engine.request import Request  # noqa: E402
from pearl.perf.hardware import get_hardware  # noqa: E402
from pearl.perf.profile import save_profile  # noqa: E402
from pearl.perf.roofline import PerfModel  # noqa: E402
from pearl.real.engine import TorchEngine  # noqa: E402
from pearl.real.models import load_model  # noqa: E402
from pearl.real.profiling import StepRecorder, fit_profile, model_shape, sweep, warm_up  # noqa: E402
from pearl.real.sampling import SamplingParams  # noqa: E402
from pearl.types import Role  # noqa: E402

MAX_NUM_SEQS, MAX_BATCHED_TOKENS = 32, 512


@dataclass(frozen=True)
class Session:
    prompt: list[int]
    responses: list[int]  # tokens generated per turn
    observations: list[list[int]]  # the environment's reply after each turn but the last


def make_batch(n: int, turns: int, seed: int = 0) -> list[Session]:
    rng = random.Random(seed)
    tok = lambda k: [rng.randint(0, 255) for _ in range(k)]  # noqa: E731
    return [Session(tok(rng.randint(32, 256)), [rng.randint(8, 64) for _ in range(turns)],
                    [tok(rng.randint(8, 64)) for _ in range(turns - 1)]) for _ in range(n)]


def _params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, stop_token_ids=())


def run_real(engine: TorchEngine, batch: list[Session]) -> tuple[float, float, StepRecorder]:
    """Run the batch on the real engine; (wall s, CPU s, the recorder holding its steps)."""
    rec = StepRecorder(engine)
    turn = {}
    w0, c0 = time.perf_counter(), time.process_time()
    for i, s in enumerate(batch):
        engine.add_request(s.prompt, _params(s.responses[0]), session=f"s{i}")
        turn[f"s{i}"] = 0
    left = len(batch)
    while left:
        for o in rec.step():
            sess = o.req.session
            i, k = int(sess[1:]), turn[sess]
            if k + 1 < len(batch[i].responses):
                turn[sess] = k + 1
                engine.add_request(list(o.req.token_ids) + batch[i].observations[k],
                                   _params(batch[i].responses[k + 1]), session=sess)
            else:
                left -= 1
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rec.detach()
    for i in range(len(batch)):
        engine.drop_session(f"s{i}")
    return wall, cpu, rec


def run_emulated(pm: PerfModel, batch: list[Session], kv_capacity: int) -> float:
    """Replay the batch through the EmulatedEngine driven by `pm.step_time`; the completion time."""
    later: list[tuple[float, Request]] = []
    done = {"t": 0.0}
    rids = iter(range(10**9))

    def on_done(eng: EmulatedEngine, req: Request, t: float) -> None:
        i, k = req.meta
        done["t"] = max(done["t"], t)
        if k + 1 < len(batch[i].responses):
            ctx = req.num_tokens + len(batch[i].observations[k])
            later.append((t, Request(next(rids), req.session, ctx, batch[i].responses[k + 1], meta=(i, k + 1))))

    eng = EmulatedEngine(0, Role.MIXED, pm.step_time, kv_capacity, MAX_NUM_SEQS, MAX_BATCHED_TOKENS, on_done)
    for i, s in enumerate(batch):
        eng.submit(Request(next(rids), f"s{i}", len(s.prompt), s.responses[0], meta=(i, 0)), 0.0)
    while True:
        while later:  # follow-up turns are submitted after the engine call returns (as the simulator does)
            t, req = later.pop(0)
            eng.submit(req, t)
        if eng.end_t == math.inf:
            return done["t"]
        eng.segment_end(eng.end_t)


def err(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="clock of the last line; auto: wall unless other processes took the cores "
                         "(rollout wall time > 1.15 x its CPU time), then cpu")
    ap.add_argument("--profile", default=None, help="save the calibrated profile JSON here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rollouts", type=int, default=5, help="real rollout runs (median taken)")
    ap.add_argument("--repeats", type=int, default=5, help="sweeps; each step shape timed by its median")
    args = ap.parse_args()
    torch.set_num_threads(1)

    t_load = time.perf_counter()
    loaded = load_model(args.model)
    engine = TorchEngine(loaded, max_num_seqs=MAX_NUM_SEQS, max_batched_tokens=MAX_BATCHED_TOKENS, num_threads=1)
    shape = model_shape(loaded.config, args.model)
    print(f"model {args.model}: loaded in {time.perf_counter() - t_load:.1f} s; {shape.num_layers} layers, "
          f"hidden {shape.hidden}, vocab {shape.vocab}")

    # 1. calibrate
    warm_up(engine)
    t0 = time.perf_counter()
    with StepRecorder(engine) as rec:
        for _ in range(args.repeats):
            sweep(rec, seed=args.seed)
    profiles = {}
    for clock in ("wall", "cpu"):
        # A loose gate: on a shared machine the wall clock is noisy; the fit's error is printed.
        prof, cal = fit_profile(rec.median_samples(clock), shape, "cpu", max_rel_error=0.5)
        profiles[clock] = prof
        c = prof.coeffs
        print(f"calibration ({clock}): {cal.n_samples} steps in {time.perf_counter() - t0:.1f} s; mfu {c.mfu:.3g}, "
              f"bw_eff {c.bw_eff:.3g}, overhead {c.step_overhead_s * 1e3:.3g} ms; fit rel RMS {cal.rel_rmse:.1%}")
    if args.profile:
        print(f"profile (cpu clock) saved to {save_profile(profiles['cpu'], args.profile)}")

    # 2. measure a real rollout batch (run `--rollouts` times; each clock's figure is the median run)
    batch = make_batch(args.sessions, args.turns, args.seed + 1)
    runs = [run_real(engine, batch) for _ in range(args.rollouts)]
    measured = {"wall": statistics.median(r[0] for r in runs), "cpu": statistics.median(r[1] for r in runs)}
    rrec = runs[0][2]
    gen = sum(sum(s.responses) for s in batch)
    print(f"rollout: {args.sessions} sessions x {args.turns} turns, {gen} tokens generated in "
          f"{len(rrec.records)} steps; median of {args.rollouts} runs: wall {measured['wall']:.3f} s "
          f"(runs {', '.join(f'{r[0]:.3f}' for r in runs)}), CPU {measured['cpu']:.3f} s")

    # 3. predict
    hw = get_hardware("cpu")
    result = {}
    for clock in ("wall", "cpu"):
        pm = PerfModel(shape, hw, 1, profiles[clock].coeffs)
        pred = run_emulated(pm, batch, engine.kv_capacity)
        same = sum(pm.step_time(r.n_decode, r.decode_context, r.prefill_tokens, r.prefill_attn)
                   for r in rrec.records)
        steps_sum = statistics.median(sum(r.wall_s if clock == "wall" else r.cpu_s for r in run[2].records)
                                      for run in runs)
        result[clock] = pred
        print(f"[{clock}] emulated replay {pred:.3f} s; model over the real steps {same:.3f} s "
              f"(their measured sum, median run {steps_sum:.3f} s, {err(same, steps_sum):+.1f}%); measured {measured[clock]:.3f} s")
    clock = args.clock
    busy = measured["wall"] / measured["cpu"]
    if clock == "auto":
        clock = "wall" if busy <= 1.15 else "cpu"
        print(f"clock: {clock} (rollout wall/CPU = {busy:.2f}; above 1.15 other processes shared the cores, "
              f"and the wall time measures them, not this engine)")
    other = "cpu" if clock == "wall" else "wall"
    for c in (other, clock):
        e = err(result[c], measured[c])
        print(f"profile fidelity ({c} clock): predicted {result[c]:.3f} s vs measured "
              f"{measured[c]:.3f} s, error {e:+.1f}% ({'within' if abs(e) <= 15 else 'OUTSIDE'} 15%)")

if __name__ == "__main__":
    main()
