"""Observability: RunLog's files (metrics.jsonl, samples.jsonl, TensorBoard, trace.json) also from two
threads at once; the simulator's Chrome trace (`sim_trace`, `pearl simulate --trace`); `pearl report`
on a train run directory and on a simulation result; one-line errors for a missing or empty run."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pearl.errors import ConfigError
from pearl.report import load_run, write_report
from pearl.rl.trajectory import Trajectory
from pearl.runtime.observe import RunLog
from pearl.runtime.trace import cluster_spans, sim_trace, timeline_rows

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def pearl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pearl.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def check_trace(doc: dict) -> dict[tuple[int, int], list[dict]]:
    """Assert the Chrome trace-event schema; returns each thread's X events. Also asserts that the
    spans of one thread (one worker, device, trainer) do not overlap."""
    assert set(doc) == {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] == "ms"
    named, threads = set(), {}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "i", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"), e
            assert isinstance(e["args"], dict)
            if e["name"] == "thread_name":
                named.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            threads.setdefault((e["pid"], e["tid"]), []).append(e)
        else:
            assert e["s"] in ("t", "p", "g"), e
    for key, spans in threads.items():
        assert key in named, f"thread {key} has no thread_name"
        spans = sorted(spans, key=lambda e: e["ts"])
        for a, b in zip(spans, spans[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, f"overlap on {key}: {a} / {b}"
    return threads


def _traj(i: int) -> Trajectory:
    t = Trajectory(f"t{i}", group_id=i // 2, sample_index=i % 2)
    t.append_prompt([1, 2, 3])
    t.append_model([4, 5], [-0.1, -0.2], [0, 1])
    t.append_env([6])
    t.append_model([7], [-0.3], 1)
    t.add_reward(0.5 * i)
    t.finish()
    return t


class Tok:
    def decode(self, ids):
        return " ".join(f"<{i}>" for i in ids)


# ------------------------------------------------------------------------------------------ RunLog
def test_runlog_files_from_two_threads(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = RunLog(tmp_path / "run")
    n = 40

    def rollout():
        for i in range(n):
            log.span("mixed" if i % 2 else "decode", "role", i * 0.1, i * 0.1 + 0.09, "worker 1", {"i": i})
            log.instant("layout: keep", i * 0.1 + 0.05, "controller", {"reason": "keep", "x": float("nan")})

    def trainer():
        for i in range(1, n + 1):
            log.span(f"step {i}", "train", i * 0.2, i * 0.2 + 0.15, "trainer")
            log.step({"step": i, "reward_mean": i / n, "loss": float("nan"), "layout": "colocated×1",
                      "ok": True, "nested": {"a": 1.5}})
            log.samples(i, [_traj(j) for j in range(6)], Tok(), k=2)

    threads = [threading.Thread(target=rollout), threading.Thread(target=trainer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError):
        log.step({"step": 99})
    out = tmp_path / "run"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, n + 1))
    assert rows[0]["loss"] is None and rows[0]["nested"] == {"a": 1.5}  # NaN -> null: valid JSON
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * n
    s = samples[1]
    assert s["step"] == 1 and s["id"] == "t1" and s["group_id"] == 0 and s["reward"] == 0.5
    assert s["token_ids"] == [1, 2, 3, 4, 5, 6, 7] and s["loss_mask"] == [0, 0, 0, 1, 1, 0, 1]
    assert s["versions"] == [-1, -1, -1, 0, 1, -1, 1] and s["rewards"] == [0.5]
    assert s["text"] == "<1> <2> <3> <4> <5> <6> <7>"
    assert [g["model"] for g in s["segments"]] == [False, True, False, True]
    assert s["segments"][1]["text"] == "<4> <5>"
    threads_ = check_trace(json.loads((out / "trace.json").read_text()))
    assert sorted(len(v) for v in threads_.values()) == [n, n]
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"reward_mean", "nested/a"} <= set(tags) and "loss" not in tags and "ok" not in tags
    assert [e.step for e in acc.Scalars("reward_mean")] == list(range(1, n + 1))


def test_runlog_without_tensorboard_and_bad_span(tmp_path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.samples(1, [_traj(0)], None)
        with pytest.raises(ValueError, match="ends"):
            log.span("x", "role", 2.0, 1.0, "worker 0")
    assert not (tmp_path / "tensorboard").exists()
    assert json.loads((tmp_path / "samples.jsonl").read_text())["text"] is None
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"] == []


def test_runlog_takes_role_spans_from_a_cluster_state(tmp_path):
    from pearl.control.state import ClusterState
    from pearl.types import Pool, Role

    st = ClusterState()
    devs = [st.add_device(0.0, Pool.ROLLOUT) for _ in range(2)]
    w0, w1 = (st.start_worker(0.0, (d,), Role.MIXED, 0) for d in devs)
    st.worker_ready(0.5, w0)
    st.worker_ready(0.5, w1)
    st.set_role(2.0, w0, Role.PREFILL)
    st.set_role(2.0, w1, Role.DECODE)
    st.stop_worker(3.0, w1)
    with RunLog(tmp_path, tensorboard=False) as log:
        cluster_spans(st.timeline(), 4.0, log)
    doc = json.loads((tmp_path / "trace.json").read_text())
    check_trace(doc)
    rows = dict(timeline_rows(doc))
    assert [s for _, _, s, _ in rows["device 0"]] == ["loading", "mixed", "prefill"]
    assert [s for _, _, s, _ in rows["device 1"]] == ["loading", "mixed", "decode", "idle"]


# ------------------------------------------------------------------------------------------ sim traces
def _fake_sim(events: list[dict], steps: list[dict], decisions: list[dict], end: float):
    return SimpleNamespace(state=SimpleNamespace(timeline=lambda: events), steps=steps, clock=SimpleNamespace(now=end),
                           driver=SimpleNamespace(decisions=decisions, name="pearl"), cfg=SimpleNamespace(name="x"))


def test_sim_trace_follows_roles_leases_and_removals():
    ev = [dict(t=0.0, kind="device_added", dev=0, pool="rollout"), dict(t=0.0, kind="device_added", dev=1, pool="train"),
          dict(t=0.0, kind="device_added", dev=2, pool="elastic"),
          dict(t=0.0, kind="worker_started", worker=0, devices=[0], role="mixed", version=0),
          dict(t=0.0, kind="worker_ready", worker=0), dict(t=1.0, kind="lent", dev=1, deadline=9.0),
          dict(t=1.0, kind="worker_started", worker=1, devices=[1], role="decode", version=0),
          dict(t=1.5, kind="worker_started", worker=2, devices=[2], role="mixed", version=0),
          dict(t=2.0, kind="worker_ready", worker=1), dict(t=2.5, kind="worker_ready", worker=2),
          dict(t=3.0, kind="role_set", worker=0, role="prefill"), dict(t=3.5, kind="notice", dev=2, at=5.0),
          dict(t=4.0, kind="worker_stopped", worker=1, devices=[1]), dict(t=4.0, kind="reclaimed", dev=1),
          dict(t=4.0, kind="training_set", devs=[1], training=True),
          dict(t=5.0, kind="device_removed", dev=2, abrupt=False, worker=2),
          dict(t=5.0, kind="worker_stopped", worker=2, devices=[2]),
          dict(t=6.0, kind="training_set", devs=[1], training=False)]
    steps = [dict(step=1, t_ready=3.8, t_start=4.0, t_end=6.0, trajectories=8, tokens=100, max_staleness=0,
                  train_s=2.0)]
    dec = [dict(t=3.0, kind="layout", rule="switch", switch=True, reason="faster")]
    doc = sim_trace(_fake_sim(ev, steps, dec, end=7.0))
    check_trace(doc)
    rows = dict(timeline_rows(doc))
    assert [(s, lent) for _, _, s, lent in rows["device 1"]] == [
        ("idle", False), ("loading", True), ("decode", True), ("training", False), ("idle", False)]
    assert [s for _, _, s, _ in rows["device 0"]] == ["mixed", "prefill"]
    assert rows["device 0"][-1][0] + rows["device 0"][-1][1] == pytest.approx(7.0)
    assert [s for _, _, s, _ in rows["device 2"]] == ["idle", "loading", "mixed"]  # nothing after removal
    assert rows["device 2"][-1][0] + rows["device 2"][-1][1] == pytest.approx(5.0)
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] != "M"]
    assert {"step 1", "wait for devices", "layout: switch", "revocation notice", "device removed"} <= set(names)


def test_sim_trace_of_a_real_simulation_lends_and_does_not_overlap():
    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.sim import Simulator

    cfg = load_config(ROOT / "scenarios/s3-math-tool-qwen3-30b-a3b.yaml", ScenarioConfig,
                      {"duration_s": 1200, "policy": {"name": "pearl"}})
    sim = Simulator(cfg)
    sim.run()
    doc = json.loads(json.dumps(sim_trace(sim)))
    check_trace(doc)
    rows = dict(timeline_rows(doc))
    assert len(rows) == 32 and any(lent for _, _, _, lent in rows["device 16"])
    evs = doc["traceEvents"]
    assert sum(e["ph"] == "X" and e["cat"] == "train" for e in evs) == len([s for s in sim.steps if s["t_start"] <= 1200])
    assert sum(e["ph"] == "i" and "rule" in e.get("args", {}) for e in evs) == len(sim.driver.decisions)


# ------------------------------------------------------------------------------------------ pearl report
@pytest.fixture(scope="module")
def sim_result(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    scen = d / "s.yaml"
    scen.write_text("name: tiny\nduration_s: 300\ncluster: {rollout_devices: 2, train_devices: 1}\n"
                    "workload: {profile: game}\nrl: {prompts_per_batch: 2, group_size: 4}\n")
    r = pearl("simulate", str(scen), "--policy", "pearl", "--out", str(d / "r.json"), "--trace", str(d / "r-trace.json"))
    assert r.returncode == 0, r.stderr
    return d / "r.json"


def test_simulate_writes_a_schema_valid_trace(sim_result):
    doc = json.loads((sim_result.parent / "r-trace.json").read_text())
    threads = check_trace(doc)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"device 0", "device 1", "device 2", "worker 0", "trainer"} <= names
    res = json.loads(sim_result.read_text())
    assert sum(len(v) for v in threads.values()) > res["train_steps"]


def test_report_on_a_simulation(sim_result, tmp_path):
    page = write_report(sim_result, tmp_path / "rep")
    html = page.read_text()
    for name in ("throughput.png", "staleness.png", "utilisation.png", "timeline.png"):
        assert (tmp_path / "rep" / name).read_bytes()[:8] == PNG
        assert f'src="{name}"' in html
    assert not (tmp_path / "rep" / "reward.png").exists() and "a simulation has no rewards" in html
    assert "tiny" in html and "<table>" in html


def _train_dir(d: Path, trace: bool = True) -> Path:
    d.mkdir(parents=True)
    rows = [{"step": i, "version": i, "reward_mean": 0.1 * i, "reward_std": 0.05, "success_rate": 0.1 * (i > 3),
             "staleness_mean": min(i - 1, 1) * 0.8, "staleness_max": min(i - 1, 1), "trained": 32,
             "wait_for_batch_s": 0.1, "step_s": 0.5 + 0.1 * (i % 2), "elapsed_s": 0.55 * i,
             "trajectories_per_s": 60.0 + i, "tokens_per_s": 2e4 + 100 * i, "layout": "1P:1D"} for i in range(1, 7)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"name": "synthetic", "wall_s": 3.3, "engine_busy_s": 4.0,
                                                "staleness_eta": 1, "trajectories": {"ok": 192, "failed": 0,
                                                                                     "stale": 0}}))
    if trace:
        with RunLog(d / "tl", tensorboard=False) as log:
            for w, roles in ((0, ["prefill", "idle", "prefill"]), (1, ["decode", "mixed", "decode"])):
                for i, role in enumerate(roles):
                    log.span(role, "role", i * 1.1, i * 1.1 + 1.1, f"worker {w}")
            for i in range(1, 7):
                log.span(f"step {i}", "train", i * 0.55 - 0.4, i * 0.55, "trainer")
            log.instant("layout: switch", 1.1, "controller", {"switch": True})
        (d / "tl" / "trace.json").rename(d / "trace.json")
    return d


def test_report_on_a_train_run(tmp_path):
    d = _train_dir(tmp_path / "run")
    page = write_report(d)
    assert page == d / "report.html"
    html = page.read_text()
    for name in ("reward.png", "throughput.png", "staleness.png", "utilisation.png", "timeline.png"):
        assert (d / name).read_bytes()[:8] == PNG
        assert f'src="{name}"' in html
    assert "synthetic" in html
    rows = dict(timeline_rows(load_run(d)["trace"]))
    assert list(rows) == ["worker 0", "worker 1", "trainer"]


def test_report_without_a_trace_skips_the_timeline(tmp_path):
    d = _train_dir(tmp_path / "run", trace=False)
    html = write_report(d, tmp_path / "out").read_text()
    assert (tmp_path / "out" / "reward.png").exists() and not (tmp_path / "out" / "timeline.png").exists()
    assert "no role timeline plot" in html


def test_report_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no metrics.jsonl"):
        write_report(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        write_report(tmp_path)
    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a pearl simulate result"):
        write_report(tmp_path / "r.json")
    r = pearl("report", str(tmp_path / "missing"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not exist" in lines[0], r.stderr


def test_trajectories_jsonl_records_every_trajectorys_shape(tmp_path):
    from pearl.rl.trajectory import Group

    trajs = [_traj(i) for i in range(4)]
    trajs[0].info["env_s"] = [0.01, 0.02]
    with RunLog(tmp_path, tensorboard=False) as log:
        log.trajectories(3, [Group(0, 2, 0, trajs[:2]), Group(1, 2, 0, trajs[2:])])
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and [r["group"] for r in rows] == [0, 0, 1, 1] and rows[3]["sample"] == 1
    r = rows[0]
    assert (r["step"], r["ok"], r["prompt"], r["responses"], r["observations"]) == (3, True, 3, [2, 1], [1])
    assert r["env_s"] == [0.01, 0.02] and rows[1]["env_s"] == [] and rows[3]["reward"] == 1.5
