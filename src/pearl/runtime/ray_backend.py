"""The Ray backend of `pearl train` (`backend: ray`): every rollout worker is a Ray actor.

- `EngineWorker` is the actor: it holds one `TorchEngine` built from the model name plus the driver's
  initial weights, so a worker may live on any machine of the Ray cluster.
- `EngineProxy` stands in for a `TorchEngine` in the driver: the same methods the agent loop calls,
  each a `.remote()` call + `ray.get`. The tokenizer and the weights' version are kept locally, so the
  hot path (has_work, version) costs no round trip.
- `RayAgentLoop` is the unchanged `AgentLoop` plus what a distributed loop needs: engines step
  concurrently, a weight snapshot is `ray.put` once and its ref sent to every actor, and a worker
  that dies (`RayActorError`) loses no trajectory: each of its in-flight trajectories is resubmitted
  from its collected tokens to a live worker (its partial turn is resampled), or failed with a reason
  when none can take it. Both are counted in the summary.
- `RayBackend` joins the Ray cluster at `ray_address` (or RAY_ADDRESS) with no resource arguments,
  shipping this package to its nodes, or starts a local instance: this host's CPUs, 127.0.0.1 only,
  token authentication. It refuses at once actors the cluster's free CPUs cannot host (`ResourceError`)
  and waits a bounded time for the others; `close` disconnects only what it connected.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from pearl.errors import PearlError, ResourceError
from pearl.runtime.agent import AgentLoop, Episode, Group

try:
    import ray
    from ray.exceptions import RayActorError
except ImportError:  # pragma: no cover - ray is an optional dependency
    ray = None
    RayActorError = RuntimeError  # type: ignore[misc,assignment]

READY_TIMEOUT_S = 180.0  # actor start (process spawn + torch import + model build) on a busy 2-core box
FORWARDED = frozenset({"holds", "kv_used", "load", "export_kv", "import_kv", "abort", "migrate_out"})
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
PEARL_DIR = Path(__file__).resolve().parents[1]  # the package, shipped to a joined cluster's nodes


class EngineWorker:
    """A Ray actor holding one TorchEngine; its methods mirror the engine's (plus `step` reports has_work)."""

    def __init__(self, model_name: str, weights: dict | None, role: str, settings: dict[str, Any],
                 seed: int, wid: int):
        from pearl.real.engine import TorchEngine
        from pearl.real.models import load_model

        loaded = load_model(model_name)
        if weights is not None:  # the driver's weights win over the catalogue's (a fine-tuned start)
            loaded.hf_model.load_state_dict(weights)
        self.engine = TorchEngine(loaded, role, seed=seed, wid=wid, **settings)

    def ready(self) -> int:
        return self.engine.version

    def add_request(self, token_ids: list[int], params: Any, session: str | None, rid: Any, kv: Any) -> bool:
        self.engine.add_request(token_ids, params, session=session, rid=rid, kv=kv)
        return self.engine.has_work()

    def submit(self, req: Any, params: Any, kv: Any = None) -> bool:
        self.engine.submit(req, params, kv=kv)
        return self.engine.has_work()

    def step(self) -> tuple[list[Any], bool]:
        return self.engine.step(), self.engine.has_work()

    def update_weights(self, state_dict: dict, version: int) -> int:
        self.engine.update_weights(state_dict, version)
        return version

    def drop_if_held(self, session: str) -> None:
        # Sent without waiting for a reply, so it must never raise on a session that is not here.
        if self.engine.holds(session):
            self.engine.drop_session(session)

    def stats(self) -> Any:
        return self.engine.stats

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Any other engine method (export_kv, import_kv, migrate_out/in, abort, holds, kv_used, load)."""
        out = getattr(self.engine, name)
        return out(*args, **kwargs) if callable(out) else out


class EngineProxy:
    """A TorchEngine look-alike in the driver that forwards to an `EngineWorker` actor."""

    def __init__(self, actor: Any, tokenizer: Any, role: str, wid: int, version: int = 0):
        self.actor, self.tokenizer, self.role, self.wid = actor, tokenizer, role, wid
        self.version = version  # of the last weights pushed: tokens sampled from now on carry it
        self._has_work = False  # refreshed by every submit and step, so has_work() needs no round trip

    def add_request(self, token_ids: Any, params: Any = None, *, session: str | None = None, rid: Any = None,
                    kv: Any = None) -> None:
        self._has_work = ray.get(self.actor.add_request.remote(list(token_ids), params, session, rid, kv))

    def submit(self, req: Any, params: Any, kv: Any = None) -> None:
        self._has_work = ray.get(self.actor.submit.remote(req, params, kv))

    def has_work(self) -> bool:
        return self._has_work

    def step(self) -> list[Any]:
        return self.finish_step(self.actor.step.remote())

    def finish_step(self, ref: Any) -> list[Any]:
        outs, self._has_work = ray.get(ref)
        return outs

    def update_weights(self, state_dict: Any, version: int) -> None:
        """`state_dict` may be an ObjectRef (put once, shared by all actors) or a dict."""
        ray.get(self.actor.update_weights.remote(state_dict, version))
        self.version = version

    def drop_session(self, session: str) -> None:
        self.actor.drop_if_held.remote(session)  # actor calls run in submission order: no wait needed

    def __getattr__(self, name: str) -> Any:
        """The other engine methods the loop calls, each a call on the actor (`EngineWorker.call`)."""
        if name not in FORWARDED:
            raise AttributeError(name)
        return lambda *args, **kwargs: ray.get(self.actor.call.remote(name, *args, **kwargs))

    def migrate_in(self, m: Any) -> Any:
        req = ray.get(self.actor.call.remote("migrate_in", m))
        self._has_work = True
        return req

    @property
    def stats(self) -> Any:
        return ray.get(self.actor.stats.remote())


class RayAgentLoop(AgentLoop):
    """`AgentLoop` over `EngineProxy`s: concurrent engine steps, shared weight refs, worker-loss recovery."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.dead: set[int] = set()
        self.where: dict[str, int] = {}  # trajectory id -> engine running its current request
        self._recovered: list[Group] = []  # groups completed by failing trajectories during a recovery
        self.workers_lost = 0
        self.resubmitted = 0
        self.failed_worker_lost = 0
        self._last_stats: dict[int, Any] = {}

    @property
    def version(self) -> int:
        return max(e.version for e in self.engines)  # engine 0 may be dead; live ones share the version

    def live(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self.dead]

    # ------------------------------------------------------------ weights
    def apply_weights(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        if pending is None:
            return
        sd, version = pending
        ref = ray.put(sd)  # one copy in the object store, shared by every actor (and machine)
        calls = {i: self.engines[i].actor.update_weights.remote(ref, version) for i in self.live()}
        for i, c in calls.items():
            try:
                ray.get(c)
                self.engines[i].version = version
            except RayActorError:
                self._lost(i)

    # ------------------------------------------------------------ placement
    def _pick_engine(self) -> int:
        live = self.live()
        if self.layout == "1P:1D":
            if 0 in self.dead:
                raise PearlError("the Ray prefill worker died; the 1P:1D run cannot admit new trajectories")
            return 0
        if not live:
            raise PearlError("every Ray rollout worker died; the run cannot go on")
        self._rr += 1
        return live[self._rr % len(live)]

    def _submit(self, ep: Episode, kv: Any = None, engine: int | None = None) -> None:
        idx = ep.engine if engine is None else engine
        self.where[ep.traj.id] = idx  # before the call: if the worker is dead, recovery moves this one too
        if idx in self.dead:
            self._recover(ep, idx)
            return
        try:
            super()._submit(ep, kv, engine)
        except RayActorError:
            self._lost(idx)

    def _drop(self, tid: str) -> None:
        self.where.pop(tid, None)
        for i in self.live():
            self.engines[i].drop_session(tid)  # fire-and-forget; the actor ignores sessions it lacks

    # ------------------------------------------------------------ one pass
    def has_work(self) -> bool:
        return bool(self._recovered) or any(self.engines[i].has_work() for i in self.live())

    def step(self) -> list[Group]:
        """Apply pending weights, step every live engine with work concurrently, advance the episodes."""
        self.apply_weights()
        done, self._recovered = self._recovered, []
        refs = {i: self.engines[i].actor.step.remote() for i in self.live() if self.engines[i].has_work()}
        for i, ref in refs.items():
            if i in self.dead:  # died while an earlier engine's outputs were handled
                continue
            try:
                outs = self.engines[i].finish_step(ref)
            except RayActorError:
                self._lost(i)
                continue
            for out in outs:
                done += self._on_output(i, out)
        done += self._recovered
        self._recovered = []
        return done

    def _on_output(self, idx: int, out: Any) -> list[Group]:
        if out.finish_reason != "prefill":
            return super()._on_output(idx, out)
        # 1P:1D hand-off: to a live decode worker (the base loop's hash target may be dead).
        tid = out.req.session
        decoders = [i for i in self.live() if i != 0]
        if not decoders:
            return self._fail(self.episodes[tid], "every Ray decode worker died")
        target = decoders[hash(tid) % len(decoders)]
        self.where[tid] = target
        try:
            self.engines[target].submit(out.req, self.params, kv=out.kv)
        except RayActorError:
            self._lost(target)  # recovery re-prefills it on worker 0 from the collected tokens
        return []

    # ------------------------------------------------------------ worker loss
    def _lost(self, idx: int) -> None:
        """Worker `idx` died: recover every trajectory whose current request it held."""
        if idx in self.dead:
            return
        self.dead.add(idx)
        self.workers_lost += 1
        for tid in [t for t, w in self.where.items() if w == idx]:
            ep = self.episodes.get(tid)
            if ep is not None and self.where.get(tid) == idx:
                self._recover(ep, idx)

    def _recover(self, ep: Episode, idx: int) -> None:
        """Resubmit the episode's current turn from its collected tokens (the turn's partial output was
        on the dead worker), or fail it with the reason when no live worker can take it."""
        live = self.live()
        if self.layout == "1P:1D":
            target = 0 if 0 in live else None  # only the prefill worker starts a turn
        else:
            target = live[(hash(ep.traj.id) + self.resubmitted) % len(live)] if live else None
        if target is None:
            self.failed_worker_lost += 1
            self._recovered += self._fail(ep, f"ray worker {idx} died and no live worker could take the trajectory")
            return
        self.resubmitted += 1
        ep.engine = target
        self._submit(ep)

    def engine_stats(self) -> dict[str, float]:
        s = []
        for i in range(len(self.engines)):
            if i not in self.dead:
                try:
                    self._last_stats[i] = self.engines[i].stats
                except RayActorError:
                    self._lost(i)
            if i in self._last_stats:
                s.append(self._last_stats[i])
        return {"engine_busy_s": sum(x.busy_s for x in s), "engine_steps": sum(x.steps for x in s),
                "tokens_prefilled": sum(x.tokens_prefilled for x in s),
                "tokens_decoded": sum(x.tokens_decoded for x in s),
                "tokens_reused": sum(x.tokens_reused for x in s),
                "ray_workers_lost": self.workers_lost, "ray_trajectories_resubmitted": self.resubmitted,
                "ray_trajectories_failed_worker_lost": self.failed_worker_lost}


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


class RayBackend:
    """Joins or starts Ray (unless connected) and one `EngineWorker` actor per worker; `close` undoes both."""

    def __init__(self, cfg: Any, loaded: Any, roles: list[str], num_cpus: float = 1.0):
        if ray is None:
            raise PearlError("backend 'ray' needs the ray package (pip install ray); or set backend: local")
        self.started = False
        self.actors: list[Any] = []
        self.address = getattr(cfg, "ray_address", None) or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            self._connect()
        try:
            self._check_resources(len(roles), num_cpus)
            weights = ray.put({k: v.detach().cpu() for k, v in loaded.hf_model.state_dict().items()})
            es = cfg.engine
            settings = {"max_num_seqs": es.max_num_seqs, "max_batched_tokens": es.max_batched_tokens,
                        "kv_capacity_tokens": es.kv_capacity_tokens, "dtype": es.dtype,
                        "num_threads": cfg.threads.engine or 1}  # one thread each unless configured
            cls = ray.remote(num_cpus=num_cpus, max_restarts=0)(EngineWorker)
            # Named (pearl-rollout-<i>-<run>) so operators and tests can find a worker with ray.get_actor.
            run = uuid.uuid4().hex[:8]
            self.actors = [cls.options(name=f"pearl-rollout-{i}-{run}").remote(
                cfg.model, weights, role, settings, cfg.seed + i, i) for i, role in enumerate(roles)]
            self._wait_ready()
            self.engines = [EngineProxy(a, loaded.tokenizer, r, i) for i, (a, r) in enumerate(zip(self.actors, roles))]
        except BaseException:
            self.close()
            raise

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
                token_auth()
                ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False,
                         _node_ip_address="127.0.0.1")
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
        refs = [a.ready.remote() for a in self.actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        if pending:
            raise PearlError(f"{len(pending)} of {len(refs)} Ray rollout workers did not start within "
                             f"{READY_TIMEOUT_S:.0f} s (each needs 1 CPU in the cluster); or set backend: local")
        try:
            ray.get(ready)
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


__all__ = ["EngineProxy", "EngineWorker", "RayAgentLoop", "RayBackend"]
