"""Two cores for rollout: one engine with two intra-op threads (tp 2) or two engines with one each?
Measured on the agent loop of `pearl train` (no trainer in the way) for a decode-heavy turn shape
(short observations, 24-token responses) and a prefill-heavy one (long observations, 1-token
responses), against the prediction of the controller's own models (calibrated at 1 and 2 threads as
`pearl train` calibrates them; the selector ranks the two shapes for the same batch). Prints, per turn
shape, trajectories/s of 1 engine on 1 thread, of tp 2 and of 2 engines, which is faster measured and
predicted, and last the measured ratio of the better to the worse, per shape.

    .venv/bin/python benchmarks/real_tp_choice.py [--model smollm2-135m] [--trajectories 8]
"""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from pearl.control.predictor import BatchState, WorkloadStats  # noqa: E402
from pearl.control.selector import select  # noqa: E402
from pearl.envs import StepResult  # noqa: E402
from pearl.real.models import load_model  # noqa: E402
from pearl.runtime.real_layout import _perf_model  # noqa: E402
from pearl.runtime.train_config import load_train_config  # noqa: E402
from pearl.types import LayoutShape  # noqa: E402
from pearl.workloads import TrajectorySpec  # noqa: E402
from rollout_workers import rollout  # noqa: E402

FILLER = "the ice creaks. "
# name: (observation characters, response tokens, turns)
SHAPES = {"decode-heavy": (40, 24, 4), "prefill-heavy": (800, 1, 3)}


def observation(obs_chars: int) -> str:
    return (FILLER * (obs_chars // len(FILLER) + 1))[:obs_chars]


def env_class(obs_chars: int, turns: int) -> type:
    text = observation(obs_chars)

    class Env:
        system_prompt, allowed_actions, max_turns = "Keep walking.", [], turns

        def reset(self, seed: int) -> str:
            self.t = 0
            return text

        def step(self, _: str) -> StepResult:
            self.t += 1
            return StepResult(text, 0.0, self.t >= turns, {})

    return Env


def on_thread(threads: int, fn, *args):
    """Runs `fn` on a fresh thread with `threads` intra-op threads (as the rollout thread does)."""
    out: list = []

    def body() -> None:
        torch.set_num_threads(threads)
        out.append(fn(*args))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out[0]


def predicted(models: dict, loaded, obs_chars: int, resp: int, turns: int, n: int) -> dict[str, float]:
    tok = loaded.tokenizer
    text = observation(obs_chars)
    prompt = len(tok.chat([{"role": "system", "content": "Keep walking."}, {"role": "user", "content": text}]))
    obs = len(tok.chat([{"role": "user", "content": text}]))
    spec = TrajectorySpec(0, 0, prompt, (resp,) * turns, (obs,) * (turns - 1), (0.0,) * turns)
    from pearl.config import EngineConfig

    sel = select(2, models, EngineConfig(tp=1, max_num_seqs=64), WorkloadStats.from_samples([spec]),
                 BatchState.fresh(n), shapes=[LayoutShape.colocated(2, 1), LayoutShape.colocated(1, 2)],
                 devices_per_node=2)
    return {str(shp): pred.completion_s for shp, pred, _, _ in sel.ranked}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--trajectories", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_train_config(None, {"model": a.model, "env": {"name": "calculator"}})
    loaded = load_model(a.model)
    (m1, src1), (m2, src2) = _perf_model(cfg, loaded, 1), on_thread(1, lambda: _perf_model(cfg, loaded, 2))
    models = {1: m1, 2: m2}
    print(f"controller's models: 1 thread: {src1}; 2 threads: {src2}", flush=True)
    ratios = []
    for name, (obs, resp, turns) in SHAPES.items():
        env = env_class(obs, turns)
        on_thread(1, rollout, loaded, 1, 1, 2, env, resp)  # warm-up
        one, tp2, two = (on_thread(th, rollout, loaded, workers, 1, a.trajectories, env, resp)
                         for th, workers in ((1, 1), (2, 1), (1, 2)))
        pred = predicted(models, loaded, obs, resp, turns, a.trajectories)
        p_tp2, p_two = pred["colocated×1@tp2"], pred["colocated×2"]
        best = "tp 2" if tp2 > two else "2 engines"
        pbest = "tp 2" if p_tp2 < p_two else "2 engines"
        m_tp2, m_two = a.trajectories / tp2, a.trajectories / two
        print(f"{name} ({obs}-char observations, {resp}-token responses, {turns} turns, {a.trajectories} trajectories): "
              f"1 thread {one:.3f}/s; tp 2 {tp2:.3f}/s ({tp2 / one:.2f}x); 2 engines {two:.3f}/s ({two / one:.2f}x); "
              f"measured best {best} ({m_tp2:.2f} s vs {m_two:.2f} s); predicted {p_tp2:.2f} s vs {p_two:.2f} s: "
              f"best {pbest} ({'agrees' if best == pbest else 'DISAGREES'})", flush=True)
        ratios.append(f"{name} {best} {max(tp2, two) / min(tp2, two):.2f}x")
    print(f"{a.model}: better of tp 2 / 2 engines over the other: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
