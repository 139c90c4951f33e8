"""The Ray backend of `pearl train` (`backend: ray`): every rollout worker is a Ray actor
(`pearl.runtime.ray_worker`), driven by `RayAgentLoop` (`pearl.runtime.ray_loop`) and, like the local
backend, by the controller through `RealControl`.

`RayBackend` joins the Ray cluster at `ray_address` (or RAY_ADDRESS) with no resource arguments,
shipping this package to its nodes, or starts a local instance: this host's CPUs, 127.0.0.1 only,
token authentication. It refuses at once actors the cluster's free CPUs cannot host (`ResourceError`)
and waits a bounded time for the first ones. `start_worker` starts one more actor without waiting
(the loop lets it serve once it answers): on one CPU slot (`num_cpus=1`), or on one `pearl_elastic`
unit of a given elastic node (node affinity, not soft). Each actor is named
`pearl-rollout-<i>-<run>`, so operators and tests can find it with `ray.get_actor`. `close` stops the
actors and disconnects only what it connected.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from pearl.errors import PearlError, ResourceError
from pearl.runtime.ray_loop import RayAgentLoop
from pearl.runtime.ray_worker import EngineProxy, EngineWorker, ray

READY_TIMEOUT_S = 180.0  # actor start (process spawn + torch import + model build) on a busy 2-core box
ELASTIC = "pearl_elastic"  # the custom resource an elastic node offers (`ray start --resources`)
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
PEARL_DIR = Path(__file__).resolve().parents[1]  # the package, shipped to a joined cluster's nodes


def token_auth() -> bool:
    """Token auth (Ray >= 2.52) for the local instance we start: RAY_AUTH_MODE=token for us and its
    processes; a token where Ray looks (RAY_AUTH_TOKEN, file RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token),
    else one generated into that file, mode 0600. False where this Ray has no token auth."""
    try:
        from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")  # Ray caches its config: re-read RAY_AUTH_MODE (as Ray's own ray.init does)
    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(generate_new_authentication_token())
        loader.reset_cache()
    return True


def init_local(num_cpus: int | None = None) -> None:
    """Start a local Ray instance on 127.0.0.1 only, with token authentication: what `pearl train`
    does without an address (sized from this host's CPUs); tests start theirs with it too. Its
    workers run at the driver's priority: Ray nices them (15) by default, as background work, but
    here they are the rollout engines, and the trainer thread in the driver would starve them of the
    cores they share (an actor took minutes to start, and a lent core's return waited on a niced one,
    while other processes loaded both cores)."""
    from ray._private import ray_constants as rc

    multi, rc.ENABLE_RAY_CLUSTER = rc.ENABLE_RAY_CLUSTER, False  # keep 127.0.0.1 (see RayBackend._connect)
    try:
        token_auth()
        ray.init(num_cpus=num_cpus or len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1", _system_config={"worker_niceness": 0})
    finally:
        rc.ENABLE_RAY_CLUSTER = multi


class RayBackend:
    """Joins or starts Ray (unless connected) and one `EngineWorker` actor per worker; `close` undoes both."""

    def __init__(self, cfg: Any, loaded: Any, roles: list[str], num_cpus: float = 1.0):
        if ray is None:
            raise PearlError("backend 'ray' needs the ray package (pip install ray); or set backend: local")
        self.started = False
        self.actors: list[Any] = []
        self.address = cfg.ray_cluster
        if self.address and cfg.policy.borrow:  # (ray_address itself: refused by the config)
            from pearl.runtime.train_config import borrow_needs_local_ray

            raise PearlError(borrow_needs_local_ray(self.address))
        if not ray.is_initialized():
            self._connect()
        try:
            self._check_resources(len(roles), num_cpus)
            self.cfg, self.tokenizer, self.num_cpus = cfg, loaded.tokenizer, num_cpus
            self.weights = ray.put({k: v.detach().cpu() for k, v in loaded.hf_model.state_dict().items()})
            es = cfg.engine
            self.settings = {"max_num_seqs": es.max_num_seqs, "max_batched_tokens": es.max_batched_tokens,
                             "kv_capacity_tokens": es.kv_capacity_tokens, "dtype": es.dtype,
                             "num_threads": cfg.threads.engine or 1}  # one thread each unless configured
            self.cls = ray.remote(max_restarts=0)(EngineWorker)
            self.run_id = uuid.uuid4().hex[:8]
            self.engines = [self.start_worker(role, i) for i, role in enumerate(roles)]
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def start_worker(self, role: str, idx: int, latest: tuple[Any, int] | None = None,
                     node: str | None = None) -> EngineProxy:
        """One more actor, not waited for: on a CPU slot, or on one `pearl_elastic` unit of `node`
        (a Ray node id). It loads `latest` (ref, version) if given, else the initial weights."""
        ref, version = latest if latest is not None else (self.weights, 0)
        opts: dict[str, Any] = {"name": f"pearl-rollout-{idx}-{self.run_id}", "num_cpus": self.num_cpus}
        if node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts.update(num_cpus=0, resources={ELASTIC: 1},
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        actor = self.cls.options(**opts).remote(self.cfg.model, ref, role, self.settings, self.cfg.seed + idx,
                                                idx, version)
        self.actors.append(actor)
        return EngineProxy(actor, self.tokenizer, role, idx, version, ready_ref=actor.ready.remote(),
                           threads=self.settings["num_threads"])

    def _connect(self) -> None:
        """Join the cluster at `self.address`, no resource arguments; else start a local instance."""
        from ray._private import ray_constants as rc

        # Ray turns 127.0.0.1 into the host's outward address (`resolve_ip_for_localhost`) unless its
        # single-node switch is off: off while a local instance starts, all its processes use 127.0.0.1.
        addr, multi = self.address, rc.ENABLE_RAY_CLUSTER
        rc.ENABLE_RAY_CLUSTER = multi and bool(addr) and addr.rsplit(":", 1)[0] not in LOOPBACK
        try:
            if addr:  # the joined cluster authenticates as it was started (see README, "Ray: ...")
                ray.init(address=addr, log_to_driver=False, runtime_env={"py_modules": [str(PEARL_DIR)]})
            else:
                init_local()
        except Exception as err:  # noqa: BLE001 - any start failure is the user's environment
            root = err.__cause__ or err  # a refused token: an AuthenticationError in the cause or in its text
            if addr and any(w in f"{err!r} {root!r}" for w in ("AuthenticationError", "InvalidAuthToken")):
                raise PearlError(f"the Ray cluster at {addr} refused this driver (AuthenticationError: no token or a "
                                 "wrong one); set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN, "
                                 "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token") from None
            msg = f"{type(root).__name__}: {(str(root).strip().splitlines() or [''])[0]}".rstrip(": ")
            raise PearlError(f"could not join the Ray cluster at {addr} ({msg})" if addr else
                             f"Ray failed to start ({msg}); set backend: local to train without Ray") from None
        finally:
            rc.ENABLE_RAY_CLUSTER = multi
        self.started = True
        if not addr and (ip := ray.util.get_node_ip_address()) != "127.0.0.1":  # never run reachable by accident
            self.close()
            raise PearlError(f"Ray started its local instance on {ip}, not 127.0.0.1; set backend: local")

    def _check_resources(self, n: int, per: float) -> None:
        """Refuse at once (not after READY_TIMEOUT_S) actors that the cluster's free CPUs cannot host."""
        need, have = n * per, ray.available_resources().get("CPU", 0.0)
        if have < need:
            of = f" (of {t:g})" if (t := ray.cluster_resources().get("CPU", 0.0)) != have else ""
            raise ResourceError(f"rollout_workers {n} need {need:g} CPUs on the Ray cluster; it has {have:g} "
                                f"available{of}; lower rollout_workers, add Ray nodes, or set backend: local")

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        refs = [e.ready_ref for e in self.engines]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        if pending:
            raise PearlError(f"{len(pending)} of {len(refs)} Ray rollout workers did not start within "
                             f"{READY_TIMEOUT_S:.0f} s (each needs 1 CPU in the cluster); or set backend: local")
        try:
            for e in self.engines:
                e.version, e.pid = ray.get(e.ready_ref)
                e.ready_ref = None
        except Exception as err:  # noqa: BLE001
            msg = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            raise PearlError(f"a Ray rollout worker failed to start: {msg}") from None
        self.start_s = time.monotonic() - t0

    def close(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self.started and ray.is_initialized():
            ray.shutdown()
        self.started = False


__all__ = ["ELASTIC", "EngineProxy", "EngineWorker", "RayAgentLoop", "RayBackend", "init_local", "token_auth"]
