"""`pearl train` with `backend: ray` (each rollout worker a Ray actor): a short run completes within η
on a local instance that listens on 127.0.0.1 only, and a worker killed mid-run loses no trajectory
(each is trained, failed, stale or still unfinished)."""
import json
import threading
import time

import pytest
from rich.console import Console

from pearl.runtime.training import run_training

pytest.importorskip("transformers")
ray = pytest.importorskip("ray")

FAST = {"prompts_per_step": 2, "group_size": 4, "backend": "ray", "rollout_workers": 2}


def _run(tmp_path, **over):
    return run_training(None, {**FAST, **over}, tmp_path, Console(file=open("/dev/null", "w")))


def _accounted(s):
    c = s["trajectories"]
    assert c["ok"] + c["failed"] + c["stale"] == s["steps"] * FAST["prompts_per_step"] * FAST["group_size"]
    assert c["ok"] + c["failed"] + c["stale"] + s["trajectories_unfinished"] == s["trajectories_admitted"], s


def _listening_hosts(seen: set[str], metrics) -> None:
    """Once the run has trained a step: the addresses its Ray processes (our descendants) listen on."""
    psutil = pytest.importorskip("psutil")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.05)
    pids = {p.pid for p in psutil.Process().children(recursive=True)}
    seen.update(c.laddr.ip for c in psutil.net_connections("tcp") if c.pid in pids and c.status == psutil.CONN_LISTEN)


def test_ray_two_steps_complete_within_eta(tmp_path):
    assert not ray.is_initialized()
    hosts: set[str] = set()
    t = threading.Thread(target=_listening_hosts, args=(hosts, tmp_path / "metrics.jsonl"), daemon=True)
    t.start()
    s = _run(tmp_path, max_steps=2, staleness=1)
    t.join(timeout=5)
    # The local instance pearl started listens on loopback only (GCS, raylet, workers): never reachable.
    assert hosts and hosts <= {"127.0.0.1", "::ffff:127.0.0.1"}, hosts
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert s["final_version"] == 2 and s["staleness_max"] <= 1 and "[ray]" in s["layout"]
    assert all(m.get("staleness_max", 0) <= 1 for m in lines)
    assert s["ray_workers_lost"] == 0 and s["engine_steps"] > 0
    _accounted(s)
    assert not ray.is_initialized()  # the run started Ray, so it stopped it


def test_ray_worker_killed_mid_run_loses_no_trajectory(tmp_path):
    from pearl.runtime.ray_backend import init_local

    init_local(num_cpus=2)  # 127.0.0.1 only, token auth
    try:
        killed, done = [], threading.Event()

        def kill_worker_1():
            # After the first trainer step the rollout is in full flow: kill worker 1 then (never once
            # the run has ended: it would find nothing to kill and must not touch Ray any more).
            metrics = tmp_path / "metrics.jsonl"
            while not done.wait(0.01):
                if not (metrics.exists() and metrics.read_text().strip()):
                    continue
                names = [a["name"] if isinstance(a, dict) else a for a in ray.util.list_named_actors()]
                w1 = [n for n in names if n.startswith("pearl-rollout-1-")]
                if w1:
                    ray.kill(ray.get_actor(w1[0]))
                    killed.append(w1[0])
                    return

        t = threading.Thread(target=kill_worker_1, daemon=True)
        t.start()
        try:
            s = _run(tmp_path, max_steps=4)
        finally:
            done.set()
            t.join(timeout=30)
        assert killed, "worker 1 was never killed"
        assert s["steps"] == 4 and s["final_version"] >= 1
        assert s["ray_workers_lost"] == 1
        # Whatever it had in flight (possibly nothing, if the gate was closed at that moment) was moved
        # to worker 0 or failed with a reason, never dropped: the books balance.
        assert s["ray_trajectories_resubmitted"] >= 0 and s["ray_trajectories_failed_worker_lost"] >= 0
        _accounted(s)
        assert ray.is_initialized()  # Ray was already running: the run leaves it up
    finally:
        ray.shutdown()


def test_ray_that_will_not_start_is_a_one_line_error(tmp_path, monkeypatch):
    from pearl.errors import PearlError
    from pearl.runtime import ray_backend

    def boom(**kwargs):
        raise RuntimeError("no raylet\nsecond line")

    monkeypatch.setattr(ray_backend.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_backend.ray, "init", boom)
    with pytest.raises(PearlError) as e:
        _run(tmp_path, max_steps=1)
    assert "backend: local" in str(e.value) and "no raylet" in str(e.value) and "\n" not in str(e.value)
