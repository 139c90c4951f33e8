"""Helpers shared by test modules."""
from __future__ import annotations

import contextlib
import signal
from dataclasses import replace

from pearl.perf.hardware import get_hardware
from pearl.perf.profile import Profile, save_profile
from pearl.perf.roofline import PerfCoeffs, PerfModel


@contextlib.contextmanager
def deadline(seconds: float):
    """Turn a hang into a TimeoutError (SIGALRM; main thread, POSIX)."""
    def expire(signum, frame):
        raise TimeoutError(f"did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def unfinished_trajectories(sim) -> set[str]:
    """Ids of the unfinished trajectories a simulator still holds (found, not counted): requests in
    engines, parked requests, and trajectories held by pending events (environment step, KV
    transfer, prefix fetch, the final reward)."""
    from pearl.engine.request import Request
    from pearl.runtime.sim_records import SimTrajectory

    ids = {r.meta.id for e in sim.engines.values() for r in e.requests()}
    ids |= {tr.id for tr, _ in sim.parked}
    for *_, args in sim.clock._heap:
        for a in args:
            if isinstance(a, SimTrajectory):
                ids.add(a.id)
            elif isinstance(a, Request):
                ids.add(a.meta.id)
    return ids


# The tiny model's engine on one thread as `calibrate_engine("tiny")` fitted it on this machine, unloaded
# (2026-12-06: 68 step shapes, rmse 0.21 ms), for tests that assert a controller decision on a real run:
# with it the prediction does not rest on a calibration taken while other tests load the machine (under
# CI's load 1P:1D's predicted loss once fell under the "clear" band, and the streak it then needed
# outlasted the ~1.5 s run: 2026-12-05).
TINY_CPU_COEFFS = PerfCoeffs(mfu=0.347, bw_eff=0.249, step_overhead_s=0.000354, seq_overhead_s=0.0, combine="sum")


def tiny_cpu_model(loaded, model_name: str, threads: int = 1, factor: float = 1.0) -> PerfModel:
    """The tiny engine's model at `threads` from TINY_CPU_COEFFS, `factor` times as efficient (compute,
    bandwidth, per-step and per-sequence overheads)."""
    from pearl.real.profiling import model_shape

    c = TINY_CPU_COEFFS
    c = replace(c, mfu=c.mfu * factor, bw_eff=min(1.0, c.bw_eff * factor), step_overhead_s=c.step_overhead_s / factor,
                seq_overhead_s=c.seq_overhead_s / factor)
    return PerfModel(model_shape(loaded.config, model_name), get_hardware("cpu"), threads, c)


def tiny_cpu_profile(path) -> str:
    """TINY_CPU_COEFFS saved as a profile (`profile:` in a train config)."""
    return str(save_profile(Profile("tiny", "cpu", 1, TINY_CPU_COEFFS, "2026-12-06T01:31:55+00:00", 68, 0.00021), path))


def tiny_perf_for(tp2_eff: float):
    """`perf_for(tp)` of the tiny model on a CPU core: tp 1, and tp 2 computing at `tp2_eff` times
    tp 1's efficiency per core (a ResourceError for any other tp)."""
    from pearl.errors import ResourceError
    from pearl.perf.models import get_model

    shape, hw = get_model("tiny"), get_hardware("cpu")
    one = PerfModel(shape, hw).with_kv_capacity(65536)
    c = one.coeffs
    models = {1: one, 2: PerfModel(shape, hw, 2, replace(c, mfu=c.mfu * tp2_eff, bw_eff=c.bw_eff * tp2_eff))
              .with_kv_capacity(65536)}

    def perf_for(tp):
        if tp not in models:
            raise ResourceError(f"no tp {tp}")
        return models[tp]
    return perf_for
