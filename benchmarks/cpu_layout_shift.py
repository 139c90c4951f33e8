"""Which rollout layout the selector predicts best on the CPU profile, per workload shape.

For `pearl train`'s tiny model on hardware "cpu" (the default coefficients, as the controller uses
without a calibration), 2-4 tensor-parallel-1 workers, and workload shapes from gridworld's one-token
turns to prefill-heavy (long observations) and decode-heavy (long responses) ones: the top three
layouts with their predicted completion time of a 16-trajectory window. It answers whether a workload
shift can make a correct controller switch layout in a real CPU run (docs/results.md, "Workload shift
in a real run"): the last line says how many shapes had a best layout other than colocated.

Usage: PYTHONPATH=src python benchmarks/cpu_layout_shift.py
"""
from pearl.config import EngineConfig
from pearl.control.estimate import WorkloadStats
from pearl.control.predictor import BatchState
from pearl.control.selector import select
from pearl.perf.hardware import get_hardware
from pearl.perf.roofline import PerfModel
from pearl.real.models import load_model
from pearl.real.profiling import model_shape
from pearl.types import LayoutShape, Mode
from pearl.workloads import TrajectorySpec

# (first prompt, response per turn, observation per turn, turns), tokens
SHAPES = [(40, 1, 40, 8), (40, 1, 600, 8), (40, 1, 2000, 8), (600, 32, 600, 2), (40, 32, 40, 8),
          (40, 128, 40, 4), (1000, 128, 10, 2), (2000, 256, 10, 1), (100, 512, 10, 1)]


def main() -> None:
    loaded = load_model("tiny")
    pm = PerfModel(model_shape(loaded.config, "tiny"), get_hardware("cpu"))
    engine = EngineConfig(tp=1, max_num_seqs=64, max_batched_tokens=1024)
    other = total = 0
    for n in (2, 3, 4):
        shapes = [LayoutShape.colocated(n, 1)] + [LayoutShape.disaggregated(p, n - p, 1) for p in range(1, n)]
        for prompt, resp, obs, turns in SHAPES:
            spec = TrajectorySpec(0, 0, prompt, (resp,) * turns, (obs,) * (turns - 1), (0.0,) * turns)
            sel = select(n, lambda tp: pm, engine, WorkloadStats.from_samples([spec]), BatchState.fresh(16),
                         shapes=shapes)
            top = ", ".join(f"{s} {p.completion_s:.3f} s" for s, p, _, _ in sel.ranked[:3])
            print(f"{n} workers, prompt {prompt} response {resp} observation {obs} turns {turns}: {top}")
            total += 1
            other += sel.best.mode is not Mode.COLOCATED
    print(f"shapes whose predicted best layout is not colocated: {other} of {total}")


if __name__ == "__main__":
    main()
