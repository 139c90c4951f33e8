"""How `pearl train` sets Ray up: a local instance sized to the host, refused at once when the run's
actors cannot fit it; `--address` joining a cluster started by hand with `ray start` (no resource
arguments); and that cluster's token authentication refusing a driver without its token.

The head node is started here with `ray start --head --block` (a child of the test, stopped by
SIGTERM to that child alone: `ray stop` would stop every Ray on the machine), on 127.0.0.1 only."""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pearl.errors import PearlError

pytest.importorskip("transformers")
ray = pytest.importorskip("ray")
pytest.importorskip("ray._private.authentication.authentication_token_setup",
                    reason="this Ray has no token authentication (Ray >= 2.52)")

ROOT = Path(__file__).resolve().parents[2]
RAY_BIN = Path(sys.executable).parent / "ray"
FAST = {"prompts_per_step": 1, "group_size": 2, "backend": "ray", "rollout_workers": 1, "max_steps": 1,
        "layout": "colocated"}


def _env(**extra: str) -> dict[str, str]:
    """This environment without any RAY_* setting, the project on the path. Plain Ray processes get
    Ray's single-node switch, which keeps 127.0.0.1 as it is (`pearl train` sets it itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT / "src"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **extra)
    return env


def _pearl_env(**extra: str) -> dict[str, str]:
    env = _env(**extra)
    del env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_more_workers_than_cpus_fail_at_once_with_one_line(tmp_path, monkeypatch, capsys):
    from pearl import cli

    n = len(os.sched_getaffinity(0)) + 1
    made, real_remote = [], ray.remote

    def remote(*args, **kwargs):  # records what becomes a Ray actor or task (Ray makes some of its own)
        if args:
            return real_remote(*args, **kwargs)
        return lambda target: made.append(target.__name__) or real_remote(**kwargs)(target)

    monkeypatch.setattr(ray, "remote", remote)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--out", str(tmp_path / "run"), "--set", "backend=ray", "--set", f"rollout_workers={n}",
                  "--set", "layout=colocated"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0, err
    assert err.startswith(f"error: rollout_workers {n} need {n} CPUs on the Ray cluster; it has {n - 1} available")
    assert "EngineWorker" not in made, "no actor may be created (nor waited for) when they cannot fit"
    assert took < 60 and not ray.is_initialized()


def test_address_joins_without_resource_arguments(monkeypatch):
    """The call itself: Ray refuses num_cpus & co. with an address, so none may be passed."""
    from pearl.runtime import ray_backend
    from pearl.runtime.train_config import parse_train_config

    seen = {}

    def init(**kwargs):
        seen.update(kwargs)
        raise ConnectionError("no cluster here")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_backend.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_backend.ray, "init", init)
    cfg = parse_train_config({"backend": "ray", "ray_address": "10.0.0.7:6379"})
    with pytest.raises(PearlError) as e:
        ray_backend.RayBackend(cfg, None, ["colocated"])
    assert set(seen) == {"address", "log_to_driver", "runtime_env"} and seen["address"] == "10.0.0.7:6379"
    assert seen["runtime_env"] == {"py_modules": [str(ROOT / "src" / "pearl")]}
    assert str(e.value) == "could not join the Ray cluster at 10.0.0.7:6379 (ConnectionError: no cluster here)"


def test_borrow_with_ray_address_in_the_environment_is_refused_before_joining(monkeypatch):
    """`policy.borrow` lends the trainer's core to actors on its host: with RAY_ADDRESS set (the config's
    ray_address is refused by the config itself) the backend refuses before it connects to anything."""
    from pearl.runtime import ray_backend
    from pearl.runtime.train_config import parse_train_config

    def init(**kwargs):
        raise AssertionError("ray.init must not be called")

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    monkeypatch.setattr(ray_backend.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_backend.ray, "init", init)
    cfg = parse_train_config({"backend": "ray", "policy": {"borrow": True}})
    assert cfg.host_workers == 0  # (actors of a joined cluster are not this host's)
    with pytest.raises(PearlError) as e:
        ray_backend.RayBackend(cfg, None, ["colocated"])
    assert str(e.value).startswith("policy.borrow on backend ray lends the trainer's core to Ray actors on this "
                                   "host: it needs the local Ray instance, not the cluster at '10.0.0.7:6379'")


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A one-node Ray cluster on 127.0.0.1 with token authentication, started by hand: (address, token)."""
    logs = tmp_path_factory.mktemp("head")
    token, port = secrets.token_hex(32), _free_port()
    tmp = Path("/tmp") / f"pearl-ray-{os.getpid()}"  # short: Ray's socket paths must fit 107 bytes
    cmd = [str(RAY_BIN), "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1",
           "--num-cpus", "1", "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(tmp)]
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    env.pop("PYTHONPATH")  # like a second machine: its workers get pearl from the driver (runtime_env py_modules)
    with open(logs / "head.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, cwd=tmp_path_factory.getbasetemp(),
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in (logs / "head.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (logs / "head.log").read_text()[-2000:]
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", token
    finally:
        proc.terminate()  # `ray start --block` stops its node's processes on SIGTERM
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, nothing else
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _cluster(address: str, token: str) -> dict:
    """Jobs (driver pids), nodes and free CPUs of the cluster, seen by a driver with the token."""
    code = ("import json, sys, ray\nray.init(address=sys.argv[1], log_to_driver=False)\n"
            "print(json.dumps({'pids': [j['DriverPid'] for j in ray._private.state.jobs()], "
            "'nodes': [n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']], "
            "'cpu': ray.available_resources().get('CPU', 0)}))")
    r = subprocess.run([sys.executable, "-c", code, address], env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run(args: list[str], env: dict[str, str], timeout: float = 240) -> tuple[subprocess.Popen, str]:
    """Run this Python with `args`: the process (pid, returncode) and its stderr."""
    p = subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    return p, err


def _train(address: str, out: Path, env: dict[str, str], timeout: float = 240) -> tuple[subprocess.Popen, str]:
    sets = [x for k, v in FAST.items() if k != "backend" for x in ("--set", f"{k}={v}")]
    return _run(["-m", "pearl.cli", "train", "--address", address, "--out", str(out), *sets], env, timeout)


def test_address_joins_a_cluster_started_by_hand_and_trains(head, tmp_path):
    address, token = head
    p, err = _train(address, tmp_path / "run", _pearl_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token))
    assert p.returncode == 0, err[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 1 and "[ray]" in s["layout"] and s["ray_workers_lost"] == 0
    seen = _cluster(address, token)
    assert p.pid in seen["pids"], "the run was a driver of this cluster (it did not start its own Ray)"
    assert seen["nodes"] == ["127.0.0.1"] and seen["cpu"] == 1  # its actor is gone with it


def test_token_auth_refuses_a_driver_without_the_token(head, tmp_path):
    address, token = head
    fast_fail = {"RAY_gcs_server_port_wait_time_s": "2"}  # Ray retries a refused connection ~20 s by default
    wrong = _pearl_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), **fast_fail)
    p, err = _train(address, tmp_path / "run", wrong, timeout=120)
    last = err.strip().splitlines()[-1]  # (the lines above it are Ray's own log)
    assert p.returncode == 2 and last.startswith(f"error: the Ray cluster at {address} refused this driver "
                                                 "(AuthenticationError"), err[-3000:]
    assert "RAY_AUTH_MODE=token" in last and not (tmp_path / "run" / "summary.json").exists()
    # A plain Ray driver with no token at all (and none in its home) is refused too, before it runs anything.
    marker = tmp_path / "ran"
    code = ("import sys, ray\nray.init(address=sys.argv[1], log_to_driver=False)\n"
            "ray.get(ray.remote(lambda: open(sys.argv[2], 'w').close()).remote())")
    home = tmp_path / "home"
    home.mkdir()
    q, qerr = _run(["-c", code, address, str(marker)], _env(HOME=str(home), **fast_fail), timeout=120)
    assert q.returncode != 0 and "AuthenticationError" in qerr and not marker.exists(), qerr[-2000:]
    seen = _cluster(address, token)  # neither became a driver, a node, or a user of a CPU
    assert {p.pid, q.pid}.isdisjoint(seen["pids"]) and seen["nodes"] == ["127.0.0.1"] and seen["cpu"] == 1
