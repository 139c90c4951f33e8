"""Simulation results: throughput over the steady state, trainer waits, utilisation by pool,
effective decode concurrency, staleness; JSON-able and deterministic (rounded floats)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pearl.types import Pool, Role


def device_seconds(sim: Any) -> dict[str, float]:
    """Available device-seconds per pool over the run (elastic devices only while present)."""
    T = sim.clock.now
    out = {p.value: 0.0 for p in Pool}
    for d in sim.state.devices.values():
        a, b = sim.device_time.get(d.id, (0.0, None))
        out[d.pool.value] += (b if b is not None else T) - a
    return out


def usable_device_seconds(sim: Any, tp: int) -> float:
    """Rollout and elastic device-seconds that whole workers of tensor-parallel size `tp` could use: on
    each node, at each moment, its devices present rounded down to a multiple of `tp` (a worker sits on
    one node). At tp 1 it is the two pools' `device_seconds`."""
    T = sim.clock.now
    edges: dict[int, list[tuple[float, int]]] = {}
    for d in sim.state.devices.values():
        if d.pool is not Pool.TRAIN:
            a, b = sim.device_time.get(d.id, (0.0, None))
            edges.setdefault(d.node, []).extend([(a, 1), (b if b is not None else T, -1)])
    total = 0.0
    for ev in edges.values():
        n, last = 0, 0.0
        for t, step in sorted(ev):
            total += n // tp * tp * (t - last)
            n, last = n + step, t
    return total


def decode_worker_seconds(sim: Any) -> float:
    T = sim.clock.now
    return sum(((e.stopped_t if e.stopped_t is not None else T) - e.started_t)
               for e in sim.all_engines if e.role is not Role.PREFILL)


def _r(x: float, nd: int = 4) -> float:
    return float(round(x, nd))


def _steady(done: list[dict]) -> tuple[float, float, float]:
    """(window s, trajectories/s, tokens/s) of the steady state: from the end of the first training step
    to the end of the last one. If that is shorter than the first step took, the run never reached one:
    batches in flight from the start finish in a burst after it (a layout too slow for the run), so the
    whole run is the window."""
    if len(done) < 2:
        return 0.0, 0.0, 0.0
    t0, t1 = done[0]["t_end"], done[-1]["t_end"]
    kept, t0 = (done[1:], t0) if t1 - t0 >= t0 else (done, 0.0)
    span = max(t1 - t0, 1e-9)
    return span, sum(s["trajectories"] for s in kept) / span, sum(s["tokens"] for s in kept) / span


def collect(sim: Any) -> dict[str, Any]:
    """The result of a finished `pearl.runtime.sim.Simulator` run."""
    T = max(sim.clock.now, 1e-9)
    steps = sim.steps
    done = [s for s in steps if s["t_end"] <= T]
    span, thr, tok_thr = _steady(done)
    # utilisation by pool (device-seconds) and by role (worker-seconds of engine busy time)
    busy: dict[str, float] = {p.value: 0.0 for p in Pool}
    by_role: dict[str, float] = {r.value: 0.0 for r in Role}
    decode_batch_s, decode_workers_s = 0.0, 0.0
    for eng in sim.all_engines:
        pool = sim.state.devices[eng.devices[0]].pool.value
        busy[pool] += eng.busy_s * len(eng.devices)
        by_role[eng.role.value] += eng.busy_s * len(eng.devices)
        decode_batch_s += eng.decode_batch_s
    avail = device_seconds(sim)
    busy[Pool.TRAIN.value] += sum(s["train_s"] for s in done) * len(sim.train_devices)
    util = {p: _r(busy[p] / avail[p]) if avail.get(p) else 0.0 for p in busy}
    decode_workers_s = decode_worker_seconds(sim)
    rollout_s = [b - a for a, b in zip(sim.batch_ready_t, sim.batch_ready_t[1:])]
    return {
        "scenario": sim.cfg.name,
        "policy": sim.driver.name,
        "seed": sim.cfg.seed,
        "virtual_s": _r(T, 3),
        "train_steps": len(done),
        "throughput": {"trajectories_per_s": _r(thr, 6), "tokens_per_s": _r(tok_thr, 2),
                       "steady_state_s": _r(span, 3)},
        "trained_trajectories": sim.trained_trajs,
        "discarded_stale": sim.discarded,
        "admitted_trajectories": sim.next_traj,
        "trainer": {"wait_for_devices_s": _r(sim.trainer_device_wait, 3),
                    "wait_for_batch_s": _r(sum(s["trainer_idle_s"] for s in done[1:]), 3),
                    "max_device_wait_s": _r(max((s["device_wait_s"] for s in done), default=0.0), 4)},
        "per_step": [{k: (_r(v, 3) if isinstance(v, float) else v) for k, v in s.items()} for s in done],
        "rollout_s_per_step": [_r(x, 3) for x in rollout_s],
        "utilisation": {"by_pool": util, "busy_device_s_by_role": {k: _r(v, 2) for k, v in by_role.items()}},
        "decode_concurrency": {
            "per_decode_worker": _r(decode_batch_s / decode_workers_s, 3) if decode_workers_s else 0.0,
            "active_trajectories": _r(sim.active_integral / T, 3),
        },
        "gate_slot_s": _slot(done[1:]),
        "staleness_histogram": {str(k): v for k, v in sorted(sim.staleness_hist.items())},
        "reconfiguration": {"migrated_requests": sim.migrated, "recomputed_tokens": sim.recomputed_tokens,
                            "preemptions": sum(e.preemptions for e in sim.all_engines),
                            "kv_evictions": sum(e.evictions for e in sim.all_engines),
                            "switches": sum(1 for d in sim.driver.decisions if d.get("switch")),
                            "decisions": len(sim.driver.decisions)},
        "layout_final": (str(sim.state.shape()) + _by_hardware(sim)) if sim.engines else "none",
        "events": sim.clock.events_run,
        "decisions": sim.driver.decisions,
    }


def _slot(steps: list[dict[str, Any]]) -> dict[str, float]:
    """A trained trajectory's time at the staleness gate, averaged over the steady state's steps: the
    gate holds its slot while it generates, waits for its group, for the batch and the trainer's start
    (`sim_trainer.slot_split`), and trains (a running pipeline holds fewer than (η+1)·B generating)."""
    n = max(1, sum(s["trajectories"] for s in steps))
    keys = {"generating": "generating_s", "group_wait": "group_wait_s", "batch_wait": "batch_wait_s", "training": "train_s"}
    return {k: _r(sum(s[v] * s["trajectories"] for s in steps) / n, 3) for k, v in keys.items()}


def save(result: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=1, sort_keys=True))
    return p


def _by_hardware(sim: Any) -> str:
    """With rollout devices of two kinds (`cluster.rollout_mix`): which workers run on which, e.g.
    " (4P on h800; 4D on h800; 8D on h20)"; else nothing."""
    if not sim.device_hw:
        return ""
    count: Counter[tuple[str, str]] = Counter()
    for e in sim.engines.values():
        count[(sim.device_hw.get(e.devices[0], sim.cfg.cluster.hardware), e.role.value[0].upper())] += 1
    order = sorted(count, key=lambda k: (k[0] != sim.cfg.cluster.hardware, k[0], "PDM".index(k[1])))
    return " (" + "; ".join(f"{count[k]}{k[1]} on {k[0]}" for k in order) + ")"
