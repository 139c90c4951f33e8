"""A rollout worker of the Ray backend: the `EngineWorker` actor and its driver-side `EngineProxy`.

- `EngineWorker` holds one `TorchEngine` built from the model name plus weights (the driver's initial
  ones, or the newest snapshot's object-store ref with its version for a worker started mid-run), so a
  worker may live on any machine of the Ray cluster. One torch thread: it is placed on one CPU slot
  (`num_cpus=1`, or one `pearl_elastic` unit on an elastic node); two while it holds the trainer's
  lent core (`set_threads`).
- `EngineProxy` stands in for a `TorchEngine` in the driver: the same methods the agent loop calls,
  each a `.remote()` call + `ray.get`. It keeps locally what the hot path reads (role, weights'
  version, has_work) and which sessions have a request on the worker now (`sessions`), so a worker
  that dies is known to have taken exactly those turns with it. Setting `num_threads` resizes the
  actor (borrowing: the trainer's lent core as a second torch thread of an actor on its host).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from pearl.types import Role

try:
    import ray
    from ray.exceptions import ActorUnschedulableError, RayActorError

    # The worker is gone: its process died, its node left, or (placed on a node that left) it never ran.
    WorkerGone: tuple[type[BaseException], ...] = (RayActorError, ActorUnschedulableError)
except ImportError:  # pragma: no cover - ray is an optional dependency
    ray = None
    WorkerGone = (RuntimeError,)

__all__ = ["EngineProxy", "EngineWorker", "WorkerGone", "ray"]


class EngineWorker:
    """A Ray actor holding one TorchEngine; its methods mirror the engine's (plus `step` reports has_work)."""

    def __init__(self, model_name: str, weights: dict | None, role: str, settings: dict[str, Any],
                 seed: int, wid: int, version: int = 0):
        from pearl.real.engine import TorchEngine
        from pearl.real.models import load_model

        loaded = load_model(model_name)
        if weights is not None and version == 0:  # the driver's weights win over the catalogue's
            loaded.hf_model.load_state_dict(weights)
        # settings carry num_threads (the thread plan's engine threads, one unless configured): one CPU slot each.
        self.engine = TorchEngine(loaded, role, seed=seed, wid=wid, **settings)
        if weights is not None and version > 0:  # a worker started mid-run serves the newest snapshot
            self.engine.update_weights(weights, version)

    def ready(self) -> tuple[int, int]:
        """(weights version, process id): the pid lets operators and fault tests find the process."""
        return self.engine.version, os.getpid()

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

    def set_threads(self, n: int) -> None:
        """Compute with `n` torch threads from the next step (the trainer's lent core joins, or leaves)."""
        self.engine.num_threads = n

    def drop_if_held(self, session: str) -> None:
        # Sent without waiting for a reply, so it must never raise on a session that is not here.
        if self.engine.holds(session):
            self.engine.drop_session(session)

    def probe(self) -> tuple[int, int, Any]:
        """(load, KV tokens used, stats without the per-step log) in one round trip, for the controller."""
        return self.engine.load(), self.engine.kv_used(), dataclasses.replace(self.engine.stats, step_log=[])

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Any other engine method (requests, migrate_out/in, abort, set_role, holds, ...)."""
        out = getattr(self.engine, name)
        return out(*args, **kwargs) if callable(out) else out


class EngineProxy:
    """A TorchEngine look-alike in the driver that forwards to an `EngineWorker` actor."""

    def __init__(self, actor: Any, tokenizer: Any, role: str, wid: int, version: int = 0, ready_ref: Any = None,
                 threads: int = 1):
        self.actor, self.tokenizer, self.role, self.wid = actor, tokenizer, Role(role), wid
        self._threads = threads  # the actor's torch threads (`num_threads`)
        self.version = version  # of the last weights pushed: tokens sampled from now on carry it
        self.ready_ref = ready_ref  # pending while the actor starts (None: ready)
        self.pid: int | None = None
        self.sessions: set[str] = set()  # sessions with a request on the worker now
        self._has_work = False  # refreshed by every submit and step, so has_work() needs no round trip
        self._probe: tuple[int, int, Any] | None = None  # last (load, kv_used, stats) seen
        self._probe_t = -1.0

    @property
    def ready(self) -> bool:
        return self.ready_ref is None

    def add_request(self, token_ids: Any, params: Any = None, *, session: str | None = None, rid: Any = None,
                    kv: Any = None) -> None:
        self._has_work = ray.get(self.actor.add_request.remote(list(token_ids), params, session, rid, kv))
        self.sessions.add(session)

    def submit(self, req: Any, params: Any, kv: Any = None) -> None:
        self._has_work = ray.get(self.actor.submit.remote(req, params, kv))
        self.sessions.add(req.session)

    def has_work(self) -> bool:
        return self._has_work

    def step(self) -> list[Any]:
        return self.finish_step(self.actor.step.remote())

    def finish_step(self, ref: Any) -> list[Any]:
        outs, self._has_work = ray.get(ref)
        for o in outs:
            self.sessions.discard(o.req.session)
        return outs

    def update_weights(self, state_dict: Any, version: int) -> None:
        """`state_dict` may be an ObjectRef (put once, shared by all actors) or a dict."""
        ray.get(self.actor.update_weights.remote(state_dict, version))
        self.version = version

    @property
    def num_threads(self) -> int:
        return self._threads

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        """Sent without waiting: it holds from the actor's next step (an actor runs its calls in order,
        and it is not stepping now: the loop resizes between steps). A dead actor's next step finds it."""
        self._threads = n
        if self.actor is not None:
            self.actor.set_threads.remote(n)

    def drop_session(self, session: str) -> None:
        self.sessions.discard(session)
        self.actor.drop_if_held.remote(session)  # actor calls run in submission order: no wait needed

    def _call(self, name: str, *args: Any) -> Any:
        return ray.get(self.actor.call.remote(name, *args))

    def requests(self) -> list[Any]:
        return self._call("requests")

    def holds(self, session: str) -> bool:
        return self._call("holds", session)

    def migrate_out(self, rid: Any) -> Any:
        m = self._call("migrate_out", rid)
        self.sessions.discard(m.req.session)
        return m

    def abort(self, rid: Any) -> Any:
        out = self._call("abort", rid)
        self.sessions.discard(out.req.session)
        return out

    def migrate_in(self, m: Any) -> Any:
        req = self._call("migrate_in", m)
        self.sessions.add(m.req.session)
        self._has_work = True
        return req

    def set_role(self, role: Role | str) -> None:
        self._call("set_role", Role(role))
        self.role = Role(role)

    def _probed(self) -> tuple[int, int, Any]:
        """Load, KV use and stats (one round trip serves one observation: reused for 50 ms); a worker
        that cannot answer (dead, or still starting) reports its last."""
        if self.ready and self.actor is not None and time.monotonic() - self._probe_t > 0.05:
            try:
                self._probe = ray.get(self.actor.probe.remote())
                self._probe_t = time.monotonic()
            except WorkerGone:
                pass
        return self._probe or (0, 0, None)

    def load(self) -> int:
        return self._probed()[0]

    def kv_used(self) -> int:
        return self._probed()[1]

    @property
    def stats(self) -> Any:
        from pearl.real.engine import EngineStats

        s = self._probed()[2]
        return s if s is not None else EngineStats()

    def close(self) -> None:
        """Stop the actor (its CPU slot is free again); the last stats stay readable."""
        if self.actor is not None:
            self._probe_t = -1.0
            self._probed()  # the final stats
            try:
                ray.kill(self.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self.actor = None
