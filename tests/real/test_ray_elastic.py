"""Elastic devices in `pearl train`: an availability trace (in the config) adds a device on schedule,
the controller starts a worker on it, and the device is revoked with notice (requests migrate with
their KV) or without (they resume from their tokens); with `backend: ray`, a Ray node started mid-run
with `--resources '{"pearl_elastic": 1}'` is detected, offered, used, and its leaving is a
revocation (drained first: a notice); a node without the cluster's token is refused and nothing is scheduled on it. Every run:
trained + failed + stale + unfinished = admitted."""
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from pearl.errors import ConfigError
from pearl.runtime.train_config import load_train_config
from pearl.runtime.training import run_training

pytest.importorskip("transformers")

BASE = {"prompts_per_step": 2, "group_size": 4, "rollout_workers": 1, "layout": "colocated",
        "policy": {"decision_interval_s": 0.5, "min_dwell_s": 1.0, "elastic": True}}


def _trace(tmp_path, t_add, t_remove, notice):
    path = tmp_path / "trace.csv"
    path.write_text(f"t_add,t_remove,count,notice_s\n{t_add},{t_remove},1,{'' if notice is None else notice}\n")
    return {"trace": {"kind": "csv", "csv": str(path)}}


def _books(s):
    c = s["trajectories"]
    assert c["ok"] + c["failed"] + c["stale"] + s["trajectories_unfinished"] == s["trajectories_admitted"], s
    assert c["ok"] + c["failed"] + c["stale"] == s["steps"] * BASE["prompts_per_step"] * BASE["group_size"]


def _elastic_run(tmp_path, notice, **over):
    out = tmp_path / "run"
    s = run_training(None, {**BASE, "elastic": _trace(tmp_path, *notice), **over}, out,
                     Console(file=open("/dev/null", "w")))
    c = s["controller"]
    want = ["added", "notice", "removed"] if notice[2] is not None else ["added", "removed"]
    assert [e["event"] for e in c["elastic"]] == want, c["elastic"]
    arrived = [d for d in s["decisions"] if d["trigger"] == "1 elastic devices arrived"]
    assert arrived and arrived[0]["switch"] and arrived[0]["chosen"] == "colocated×2", s["decisions"]
    assert c["workers_started"] == 2 and c["layout_final"] == "colocated×1"  # back to the one worker
    assert s["trajectories"]["failed"] == 0
    _books(s)
    return s


@pytest.mark.parametrize("notice", [pytest.param(2.0, id="notice"),
                                    pytest.param(None, id="abrupt", marks=pytest.mark.slow)])
def test_local_trace_device_is_used_then_revoked(tmp_path, notice):
    # the device comes at 0.5 s and goes at 3 s of the run, which takes well over 3 s (80 steps: 30,
    # 0.1 s each on a quiet core, ended before the device left in 1 of 2 suite runs on 2026-12-05)
    s = _elastic_run(tmp_path, (0.5, 3, notice), max_steps=80)
    if notice is None:
        assert s["controller"]["elastic"][-1]["abrupt"] is True


@pytest.mark.slow
def test_ray_trace_device_gets_an_actor_that_serves_then_leaves_with_notice(tmp_path):
    pytest.importorskip("ray")
    # an actor starts in 10-40 s on this shared machine: the device stays 50 s, notice 10 s before;
    # 600 steps (a step takes 0.1-1 s) outlast it (250 ended before it left, 3 of 3 on 2026-12-05)
    s = _elastic_run(tmp_path, (1, 50, 10), max_steps=600, backend="ray")
    assert s["ray_workers_started_mid_run"] == 1 and s["ray_workers_lost"] == 0


def test_elastic_config_needs_a_source_and_ray_nodes_need_ray():
    with pytest.raises(ConfigError) as e:
        load_train_config(None, {"policy": {"elastic": True}})
    assert "elastic" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_train_config(None, {"policy": {"elastic": True}, "elastic": {"ray_nodes": True}})
    assert "backend: ray" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_train_config(None, {"elastic": {"ray_nodes": True}, "backend": "ray"})
    assert "policy.elastic: true" in str(e.value)


# ---------------------------------------------------------------- real Ray nodes (a head started by hand)
from tests.real.test_ray_setup import RAY_BIN, ROOT, _env, _pearl_env, head  # noqa: E402,F401 - the fixture

NODE_QUERY = ("import json, sys, ray\nray.init(address=sys.argv[1], log_to_driver=False)\n"
              "print(json.dumps({'nodes': sum(n['Alive'] for n in ray.nodes()), "
              "'elastic': ray.cluster_resources().get('pearl_elastic', 0)}))")


def _nodes(address, token):
    r = subprocess.run([sys.executable, "-c", NODE_QUERY, address], env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# `ray start --address` refuses to join unless Ray's multi-node switch is on, and with it on Ray
# replaces 127.0.0.1 by this machine's outward address. This launcher turns the switch on for the
# join check only and keeps 127.0.0.1 as given; the node's own processes inherit the switch off
# (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in `_env`), so every one of them uses 127.0.0.1.
LOOPBACK_NODE = ("import sys\nfrom ray._private import ray_constants as rc, services\n"
                 "rc.ENABLE_RAY_CLUSTER = True\nservices.resolve_ip_for_localhost = lambda host: host\n"
                 "from ray.scripts.scripts import main\nsys.argv = ['ray', *sys.argv[1:]]\nmain()")


# Waits until a rollout actor of the run (any namespace) named pearl-rollout-<idx>-* answers.
ACTOR_UP = ("import sys, time, ray\nray.init(address=sys.argv[1], log_to_driver=False)\n"
            "deadline = time.monotonic() + float(sys.argv[3])\nwhile time.monotonic() < deadline:\n"
            "    for a in ray.util.list_named_actors(all_namespaces=True):\n"
            "        if a['name'].startswith('pearl-rollout-' + sys.argv[2] + '-'):\n"
            "            try:\n"
            "                ray.get(ray.get_actor(a['name'], namespace=a['namespace']).ready.remote(), timeout=5)\n"
            "                print('up'); sys.exit(0)\n"
            "            except Exception:\n                pass\n"
            "    time.sleep(0.5)\nsys.exit(1)")


def _start_node(address, env, log):
    """A second raylet on this machine (127.0.0.1 only) offering one `pearl_elastic` unit, no CPUs."""
    cmd = [sys.executable, "-c", LOOPBACK_NODE, "start", "--address", address, "--block", "--node-ip-address",
           "127.0.0.1", "--num-cpus", "0", "--resources", '{"pearl_elastic": 1}', "--object-store-memory",
           str(200 << 20), "--disable-usage-stats"]
    return subprocess.Popen(cmd, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


def _listening(proc):
    """The addresses the node's processes (descendants of `proc`) listen on."""
    psutil = pytest.importorskip("psutil")
    pids = {proc.pid} | {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    return {c.laddr.ip for c in psutil.net_connections("tcp") if c.pid in pids and c.status == psutil.CONN_LISTEN}


def _stop_node(proc):
    proc.terminate()  # `ray start --block` stops its own node's processes on SIGTERM
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, nothing else
        proc.wait()


def _kill_tree(proc):
    """SIGKILL `ray start` and every process under it (raylet, its workers): a node that vanishes
    without the drain Ray runs on SIGTERM."""
    psutil = pytest.importorskip("psutil")
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def _wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_node_without_the_token_is_refused_and_gets_nothing(head, tmp_path):  # noqa: F811 - the imported fixture
    address, token = head
    # a token, but not the cluster's: the head refuses it (no token at all is refused by `ray start` itself)
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_gcs_server_port_wait_time_s="2")
    with open(tmp_path / "node.log", "w") as log:
        node = _start_node(address, env, log)
    try:
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        seen = _nodes(address, token)
        log = (tmp_path / "node.log").read_text()
        assert seen == {"nodes": 1, "elastic": 0}, (seen, log[-2000:])
        assert node.returncode not in (None, 0) and "uthentication" in log, log[-2000:]
    finally:
        if node.poll() is None:
            _stop_node(node)
    # the same node with the token joins (so the token, nothing else, kept it out), on 127.0.0.1 only
    with open(tmp_path / "node-ok.log", "w") as log:
        node = _start_node(address, _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token), log)
    try:
        _wait_for(lambda: _nodes(address, token) == {"nodes": 2, "elastic": 1}, 90,
                  "the node with the token did not join")
        hosts = _listening(node)
        assert hosts and hosts <= {"127.0.0.1", "::ffff:127.0.0.1"}, hosts
    finally:
        _stop_node(node)


# The elastic node's id, seen by a driver with the token.
NODE_ID = ("import sys, ray\nray.init(address=sys.argv[1], log_to_driver=False)\n"
           "print([n['NodeID'] for n in ray.nodes() if n['Alive'] and n['Resources'].get('pearl_elastic')][0])")


def _drain(address, token, seconds):
    """`ray drain-node` on the elastic node, as Ray's autoscaler does before it preempts one."""
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    nid = subprocess.run([sys.executable, "-c", NODE_ID, address], env=env, capture_output=True, text=True,
                         timeout=120).stdout.strip().splitlines()[-1]
    r = subprocess.run([str(RAY_BIN), "drain-node", "--address", address, "--node-id", nid, "--reason",
                        "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice (test)",
                        "--deadline-remaining-seconds", str(seconds)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# What NodeWatch reads from a live cluster while the elastic node, busy with an actor (an idle node
# being drained just exits), is drained with a deadline: its id in both, the deadline ~30 s away.
WATCH_QUERY = """
import json, subprocess, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from pearl.runtime.ray_elastic import draining_nodes, elastic_nodes

@ray.remote(num_cpus=0, resources={"pearl_elastic": 1})
class Busy:
    def node(self):
        return ray.get_runtime_context().get_node_id()

busy = Busy.remote()  # held: an actor without a handle is gone, and an idle node drains at once
nid = ray.get(busy.node.remote(), timeout=120)
before = elastic_nodes()
subprocess.run([sys.argv[2], "drain-node", "--address", sys.argv[1], "--node-id", nid, "--reason",
                "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice (test)",
                "--deadline-remaining-seconds", "30"], check=True)
seen = {}
for _ in range(50):
    seen = draining_nodes()
    if nid in seen:
        break
    time.sleep(0.1)
print(json.dumps({"node": nid, "before": before, "draining": {k: (v - time.time() if v else v) for k, v in seen.items()},
                  "alive": nid in elastic_nodes()}))
"""


def test_a_drained_node_is_seen_with_its_deadline(head, tmp_path):  # noqa: F811 - the imported fixture
    """The cluster-side half of a drain notice (the run-side half: test_node_watch.py, and the slow
    run below): `ray drain-node` with a deadline shows in `draining_nodes()` for that node."""
    address, token = head
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    with open(tmp_path / "node.log", "w") as log:
        node = _start_node(address, env, log)
    try:
        _wait_for(lambda: _nodes(address, token)["elastic"] == 1, 90, "the node never joined")
        r = subprocess.run([sys.executable, "-c", WATCH_QUERY, address, str(RAY_BIN)], env=env, capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        nid = seen["node"]
        assert seen["before"] == {nid: 1} and seen["alive"], seen
        assert 20 < seen["draining"][nid] <= 30, seen
    finally:
        _stop_node(node)


@pytest.mark.slow
@pytest.mark.parametrize("leaves", ["killed", "stopped", "drained"])
def test_a_ray_node_joining_and_leaving_mid_run_is_used_then_revoked(head, tmp_path, leaves):  # noqa: F811 - the imported fixture
    """The node is killed (SIGKILL of its processes: a revocation without notice, its turns resume from
    their tokens), stopped (SIGTERM: Ray drains the node for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S = 1 s
    before it goes, which the run sees as a notice with a 1 s deadline), or drained first (`ray
    drain-node` with a 20 s deadline: a notice, the turns in flight move off it with their KV) and then
    stopped."""
    address, token = head
    out = tmp_path / "run"
    # without its cost model PEARL takes every elastic device as it comes: this test is about the node's life, not the
    # gate's (which rightly keeps a second worker out of this trainer-bound run: an actor's start costs
    # more than the 0.2% it is predicted to gain)
    sets = {"max_steps": 250, "prompts_per_step": 2, "group_size": 4, "rollout_workers": 1, "layout": "colocated",
            "policy.cost_aware": "false", "policy.decision_interval_s": 0.5, "policy.min_dwell_s": 1.0,
            "policy.elastic": "true",
            "elastic.ray_nodes": "true", "elastic.poll_s": 0.5}
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    # the node leaves 1 s after its SIGTERM (Ray drains a node 30 s by default)
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="1")
    with open(tmp_path / "train.log", "w") as tlog:
        run = subprocess.Popen([sys.executable, "-m", "pearl.cli", "train", "--address", address, "--out", str(out),
                                *args], env=_pearl_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token), cwd=ROOT,
                               stdout=tlog, stderr=subprocess.STDOUT)
    node = None
    try:
        metrics = out / "metrics.jsonl"
        steps = lambda: len(metrics.read_text().splitlines()) if metrics.exists() else 0  # noqa: E731
        _wait_for(lambda: steps() >= 1 or run.poll() is not None, 240, "no first step")
        with open(tmp_path / "node.log", "w") as log:
            node = _start_node(address, env, log)
        _wait_for(lambda: _nodes(address, token)["elastic"] == 1, 90, "the elastic node never joined")
        # the controller starts worker 1 there: wait until it answers, then let it serve a few steps
        up = subprocess.run([sys.executable, "-c", ACTOR_UP, address, "1", "240"], capture_output=True, text=True,
                            env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token), timeout=300)
        assert up.returncode == 0, ("worker 1 never came up on the node", up.stderr[-2000:])
        s0 = steps()
        _wait_for(lambda: steps() >= s0 + 5 or run.poll() is not None, 240, "the run stalled with the node")
        if leaves == "drained":
            _drain(address, token, 20)
            s0 = steps()
            _wait_for(lambda: steps() >= s0 + 3 or run.poll() is not None, 240, "the run stalled after the drain")
        if leaves == "killed":
            _kill_tree(node)
        else:
            _stop_node(node)
        node = None
        assert run.poll() is None, "the run ended before the node left"
        assert run.wait(timeout=400) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if node is not None:
            _stop_node(node)
        if run.poll() is None:
            run.kill()
    s = json.loads((out / "summary.json").read_text())
    ev = s["controller"]["elastic"]
    if leaves == "killed":
        assert [e["event"] for e in ev] == ["added", "removed"] and ev[1]["abrupt"] is True, ev
    elif leaves == "stopped":  # Ray's own drain on SIGTERM, 1 s: a short notice, then a removal with notice
        assert [e["event"] for e in ev] == ["added", "notice", "removed"] and ev[2]["abrupt"] is False, ev
        assert ev[1]["at"] - ev[1]["t"] <= 2, ev
    else:  # the notice came from the drain, 20 s before its deadline; the turns on the node moved off
        assert [e["event"] for e in ev] == ["added", "notice", "removed"] and ev[2]["abrupt"] is False, ev
        assert 15 < ev[1]["at"] - ev[1]["t"] <= 20, ev
        assert any(d["trigger"].startswith("revocation notice") for d in s["decisions"]), [d["trigger"] for d in s["decisions"]]
    assert any(d["trigger"] == "1 elastic devices arrived" and d["switch"] for d in s["decisions"])
    assert s["ray_workers_started_mid_run"] >= 1  # it served, then went: lost, or retired at the notice
    assert s["ray_workers_lost"] >= 1 if leaves == "killed" else s["ray_workers_lost"] == 0, s["ray_workers_lost"]
    # (a worker started on the node as it left may die too: then it is started again elsewhere)
    assert s["controller"]["workers_started"] >= 2 and s["steps"] == 250
    _books(s)
