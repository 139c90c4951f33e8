"""What every device did over a simulated run, from the cluster state's event log.

`device_roles(sim)` replays `ClusterState.events` and returns, per device, intervals labelled with
one of `LABELS`: the role of the rollout worker on it (`prefill`, `decode`, `mixed`), `starting`
(a worker loading: a cold start on an elastic device shows here), `training` (a train device during
an update), `lent` (a train device lent to rollout, serving or not), `idle`. An elastic device has
intervals only while it is present.
"""
from __future__ import annotations

from typing import Any

__all__ = ["LABELS", "device_roles"]

LABELS = ("prefill", "decode", "mixed", "starting", "training", "lent", "idle")


class _Dev:
    __slots__ = ("pool", "present", "worker", "training", "lent", "label", "since")

    def __init__(self, pool: str, t: float):
        self.pool, self.present, self.worker = pool, True, None
        self.training = self.lent = False
        self.label, self.since = "idle", t


def _label(d: _Dev, workers: dict[int, list]) -> str | None:
    if not d.present:
        return None
    if d.training:
        return "training"
    if d.worker is not None:
        _, role, loading = workers[d.worker]
        return "starting" if loading else ("lent" if d.pool == "train" else role)
    return "lent" if d.lent else "idle"


def device_roles(sim: Any) -> dict[str, Any]:
    """{"T": run length, "devices": [[id, pool], ...], "intervals": [[id, t0, t1, label], ...]}."""
    devs: dict[int, _Dev] = {}
    workers: dict[int, list] = {}  # id -> [devices, role, loading]
    out: list[list] = []

    def touch(ids, t: float) -> None:
        for i in ids:
            d = devs[i]
            new = _label(d, workers)
            if new != d.label:
                if d.label is not None and t > d.since:
                    out.append([i, round(d.since, 3), round(t, 3), d.label])
                d.label, d.since = new, t

    for ev in sim.state.events:
        t, k, x = ev.t, ev.kind, ev.data
        if k == "device_added":
            devs[x["dev"]] = _Dev(x["pool"], t)
            continue
        if k == "device_removed":
            devs[x["dev"]].present = False
            ids = [x["dev"]]
        elif k == "worker_started":
            workers[x["worker"]] = [tuple(x["devices"]), x["role"], True]
            for i in x["devices"]:
                devs[i].worker = x["worker"]
            ids = x["devices"]
        elif k in ("worker_ready", "role_set", "worker_stopped"):
            w = workers.get(x["worker"])
            if w is None:
                continue
            if k == "worker_ready":
                w[2] = False
            elif k == "role_set":
                w[1] = x["role"]
            else:
                for i in w[0]:
                    if devs[i].worker == x["worker"]:
                        devs[i].worker = None
            ids = list(w[0])
        elif k in ("lent", "reclaimed"):
            devs[x["dev"]].lent = k == "lent"
            ids = [x["dev"]]
        elif k == "training_set":
            for i in x["devs"]:
                devs[i].training = bool(x["training"])
            ids = x["devs"]
        else:
            continue
        touch(ids, t)
    T = sim.clock.now
    for i, d in devs.items():
        if d.label is not None and T > d.since:
            out.append([i, round(d.since, 3), round(T, 3), d.label])
    return {"T": round(T, 3), "devices": [[i, d.pool] for i, d in devs.items()], "intervals": out}
