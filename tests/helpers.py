"""Helpers shared by test modules."""
from __future__ import annotations

import contextlib
import signal


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


def default_cpu_profile(path) -> str:
    """A saved tiny-model profile with the cpu hardware's default coefficients, for tests that assert a
    controller decision on a real run: with it the prediction does not rest on a calibration taken while
    other tests load the machine (under CI's load 1P:1D's predicted loss once fell under the "clear"
    band, and the streak it then needed outlasted the ~1.5 s run: 2026-12-05)."""
    from pearl.perf.hardware import get_hardware
    from pearl.perf.profile import Profile, save_profile
    from pearl.perf.roofline import PerfCoeffs

    coeffs = PerfCoeffs().resolved(get_hardware("cpu"))
    return str(save_profile(Profile("tiny", "cpu", 1, coeffs, "2026-12-06T00:00:00+00:00", 0, 0.0), path))
