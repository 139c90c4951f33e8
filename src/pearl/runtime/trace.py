"""Chrome trace-event files (open them in Perfetto, https://ui.perfetto.dev, or chrome://tracing).

`Trace` builds one: "X" complete events (`span`), "i" instants (`instant`) and the "M" metadata that
names processes and threads, with `ts`/`dur` in microseconds. A *track* is a string such as
"worker 3", "device 0", "trainer" or "controller"; each track is one thread, and tracks that differ
only in a trailing number share a process ("worker 0" and "worker 3" are threads of "worker").
`to_dict()` is the file: `{"traceEvents": [...], "displayTimeUnit": "ms"}`.

Conventions that `pearl report` reads (its role timeline):

- a span with `cat="role"` on a "device N" or "worker N" track says what that device or worker was
  doing; its name is one of `STATES` (a role, or loading, training, idle, lent); `args["lent"]` is
  True on a lent train device serving rollout;
- a span with `cat="train"` on the "trainer" track is one training step.

`cluster_spans(timeline, end_s, sink)` turns a `ClusterState` event log into those role spans;
`sim_trace(sim)` builds the trace of a finished `pearl.runtime.sim.Simulator` from its cluster event
log (`sim.state.timeline()`), its training steps (`sim.steps`) and its controller's decisions
(`sim.driver.decisions`). `pearl simulate --trace PATH` writes it. `Trace` is not thread-safe:
`pearl.runtime.observe.RunLog` wraps it with a lock. `tracks`, `timeline_rows` and `state_shares`
read a trace back (for `pearl report`).
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["ROLE_CAT", "STATES", "TRAIN_CAT", "Trace", "cluster_spans", "sim_trace", "state_shares", "timeline_rows",
           "track_group", "tracks"]

ROLE_CAT = "role"
TRAIN_CAT = "train"
# What a device or worker can be doing, as span names of the role timeline.
STATES = ("prefill", "decode", "mixed", "loading", "training", "idle", "lent")

_NUMBERED = re.compile(r"^(.*?)\s*(\d+)$")


def track_group(track: str) -> tuple[str, int | None]:
    """("worker", 3) for "worker 3"; ("trainer", None) for "trainer"."""
    m = _NUMBERED.match(track)
    if m and m.group(1):
        return m.group(1), int(m.group(2))
    return track, None


def _us(t_s: float) -> float:
    return round(float(t_s) * 1e6, 3)


class Trace:
    """A Chrome trace under construction (times in seconds in, microseconds out)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._tids: dict[str, tuple[int, int]] = {}
        self._meta: list[dict[str, Any]] = []

    def _where(self, track: str) -> tuple[int, int]:
        got = self._tids.get(track)
        if got is not None:
            return got
        group, num = track_group(str(track))
        pid = self._pids.get(group)
        if pid is None:
            pid = self._pids[group] = len(self._pids) + 1
            self._meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": group}},
                           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                            "args": {"sort_index": pid}}]
        tid = sum(1 for p, _ in self._tids.values() if p == pid) + 1
        got = self._tids[track] = (pid, tid)
        self._meta += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": str(track)}},
                       {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": num if num is not None else tid}}]
        return got

    def span(self, name: str, cat: str, start_s: float, end_s: float, track: str,
             args: dict[str, Any] | None = None) -> None:
        """A complete ("X") event on `track` from `start_s` to `end_s` (seconds; end >= start)."""
        if not end_s >= start_s:
            raise ValueError(f"span {name!r} on {track!r} ends ({end_s}) before it starts ({start_s})")
        pid, tid = self._where(track)
        ev = {"ph": "X", "name": str(name), "cat": str(cat), "ts": _us(start_s),
              "dur": round(_us(end_s) - _us(start_s), 3), "pid": pid, "tid": tid}
        if args:
            ev["args"] = dict(args)
        self.events.append(ev)

    def instant(self, name: str, t_s: float, track: str, args: dict[str, Any] | None = None) -> None:
        """An instant ("i", thread scope) on `track` at `t_s` seconds."""
        pid, tid = self._where(track)
        ev = {"ph": "i", "s": "t", "name": str(name), "cat": "instant", "ts": _us(t_s), "pid": pid, "tid": tid}
        if args:
            ev["args"] = dict(args)
        self.events.append(ev)

    def to_dict(self) -> dict[str, Any]:
        return {"traceEvents": self._meta + self.events, "displayTimeUnit": "ms"}


class _Open:
    """One open span per track; switching a track closes its span (zero-length spans are dropped)."""

    def __init__(self, trace: Any):
        self.trace = trace
        self.open: dict[str, tuple[str, float, dict[str, Any]]] = {}

    def switch(self, track: str, t: float, name: str | None, args: dict[str, Any] | None = None) -> None:
        prev = self.open.pop(track, None)
        if prev is not None and t > prev[1]:
            self.trace.span(prev[0], ROLE_CAT, prev[1], t, track, prev[2])
        if name is not None:
            self.open[track] = (name, t, dict(args or {}))

    def close_all(self, t: float) -> None:
        for track in list(self.open):
            self.switch(track, max(t, self.open[track][1]), None)


class _Roles:
    """Device and worker tracks from the cluster event log."""

    def __init__(self, trace: Any):
        self.spans = _Open(trace)
        self.trace = trace
        self.lent: set[int] = set()
        self.gone: set[int] = set()
        self.pool: dict[int, str] = {}
        self.worker_role: dict[int, str] = {}
        self.worker_devs: dict[int, list[int]] = {}

    def _idle(self, dev: int) -> str:
        return "lent" if dev in self.lent else "idle"

    def _devices(self, t: float, devs: list[int], name: str | None, wid: int | None = None) -> None:
        for d in devs:
            if d in self.gone:
                continue
            args: dict[str, Any] = {"pool": self.pool.get(d, "?")}
            if wid is not None:
                args["worker"] = wid
            if d in self.lent:
                args["lent"] = True
            self.spans.switch(f"device {d}", t, name, args)

    def _role(self, t: float, wid: int, name: str) -> None:
        devs = self.worker_devs[wid]
        self.spans.switch(f"worker {wid}", t, name, {"devices": devs})
        self._devices(t, devs, name, wid)

    def apply(self, e: dict[str, Any]) -> None:
        t, kind = e["t"], e["kind"]
        if kind == "device_added":
            self.pool[e["dev"]] = e["pool"]
            self._devices(t, [e["dev"]], "idle")
        elif kind == "training_set":
            self._devices(t, list(e["devs"]), "training" if e["training"] else "idle")
        elif kind == "lent":
            self.lent.add(e["dev"])
            self._devices(t, [e["dev"]], "lent")
        elif kind == "reclaimed":
            self.lent.discard(e["dev"])
            self._devices(t, [e["dev"]], "idle")
        elif kind == "worker_started":
            self.worker_role[e["worker"]], self.worker_devs[e["worker"]] = e["role"], list(e["devices"])
            self._role(t, e["worker"], "loading")
        elif kind in ("worker_ready", "role_set"):
            if kind == "role_set":
                self.worker_role[e["worker"]] = e["role"]
            self._role(t, e["worker"], self.worker_role[e["worker"]])
        elif kind == "worker_resized":  # a lent device joins a live worker, or leaves it
            wid, devs = e["worker"], list(e["devices"])
            for d in set(self.worker_devs[wid]) - set(devs):
                self._devices(t, [d], self._idle(d))
            self.worker_devs[wid] = devs
            self._role(t, wid, self.worker_role[wid])
        elif kind == "worker_stopped":
            self.spans.switch(f"worker {e['worker']}", t, None)
            for d in e["devices"]:
                self._devices(t, [d], self._idle(d))
        elif kind == "device_removed":
            self._devices(t, [e["dev"]], None)
            self.gone.add(e["dev"])
            self.trace.instant("device removed", t, f"device {e['dev']}", {"abrupt": e.get("abrupt")})
        elif kind == "notice":
            self.trace.instant("revocation notice", t, f"device {e['dev']}", {"at": e["at"]})


def cluster_spans(events: list[dict[str, Any]], end_s: float, sink: Any) -> None:
    """Role spans ("device N" and "worker N" tracks, `cat="role"`) from a `ClusterState.timeline()`,
    written to `sink` (a `Trace`, or a `pearl.runtime.observe.RunLog`: anything with `span` and
    `instant`); spans still open at `end_s` end there. `pearl train` can pass its controller's
    `RealControl.state.timeline()` and clock time before closing its RunLog."""
    roles = _Roles(sink)
    for e in events:
        roles.apply(e)
    roles.spans.close_all(end_s)


def sim_trace(sim: Any) -> dict[str, Any]:
    """The Chrome trace of a finished simulator run: device and worker roles over time, the trainer's
    steps (and its waits for lent devices), the controller's decisions as instants."""
    trace = Trace()
    end = float(sim.clock.now)
    cluster_spans(sim.state.timeline(), end, trace)
    for s in sim.steps:
        if s["t_start"] > s["t_ready"]:
            trace.span("wait for devices", "wait", s["t_ready"], min(s["t_start"], end), "trainer")
        if s["t_start"] <= end:
            trace.span(f"step {s['step']}", TRAIN_CAT, s["t_start"], min(s["t_end"], end), "trainer",
                       {k: s[k] for k in ("trajectories", "tokens", "max_staleness", "train_s")})
    for d in sim.driver.decisions:
        trace.instant(f"{d.get('kind', 'decision')}: {d.get('rule', '?')}", d["t"], "controller", d)
    return trace.to_dict()


# ------------------------------------------------------------------ reading a trace back (pearl report)
def tracks(trace: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """(track name -> its X events, track name -> its instant events) of a Chrome trace."""
    names: dict[tuple[int, int], str] = {}
    evs = trace.get("traceEvents", [])
    for e in evs:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name"))
    spans: dict[str, list[dict[str, Any]]] = {}
    instants: dict[str, list[dict[str, Any]]] = {}
    for e in evs:
        if e.get("ph") in ("X", "i"):
            name = names.get((e.get("pid"), e.get("tid")), f"{e.get('pid')}/{e.get('tid')}")
            (spans if e["ph"] == "X" else instants).setdefault(name, []).append(e)
    return spans, instants


def timeline_rows(trace: dict[str, Any]) -> list[tuple[str, list[tuple[float, float, str, bool]]]]:
    """Rows of (start s, duration s, state, lent): devices if the trace has them, else workers; then
    the trainer's steps (as "training") when no device row shows training."""
    spans, _ = tracks(trace)
    role = {k: [e for e in v if e.get("cat") == ROLE_CAT] for k, v in spans.items()}
    role = {k: v for k, v in role.items() if v}
    if any(track_group(k)[0] == "device" for k in role):
        role = {k: v for k, v in role.items() if track_group(k)[0] == "device"}
    key = lambda k: (track_group(k)[0], track_group(k)[1] or 0)  # noqa: E731
    rows = [(k, [(e["ts"] / 1e6, e["dur"] / 1e6, e["name"], bool(e.get("args", {}).get("lent")))
                 for e in role[k]]) for k in sorted(role, key=key)]
    train = [e for e in spans.get("trainer", []) if e.get("cat") == TRAIN_CAT]
    if train and not any(s == "training" for _, r in rows for _, _, s, _ in r):
        rows.append(("trainer", [(e["ts"] / 1e6, e["dur"] / 1e6, "training", False) for e in train]))
    return rows


def state_shares(rows: list[tuple[str, list[tuple[float, float, str, bool]]]]) -> dict[str, float]:
    """The fraction of all the rows' span time spent in each state (time no span covers is left out)."""
    tot: dict[str, float] = {}
    for _, spans in rows:
        for _, dur, state, _ in spans:
            tot[state] = tot.get(state, 0.0) + dur
    s = sum(tot.values())
    return {k: v / s for k, v in sorted(tot.items(), key=lambda kv: _order(kv[0]))} if s > 0 else {}


def _order(state: str) -> int:
    return STATES.index(state) if state in STATES else len(STATES)
