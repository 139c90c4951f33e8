"""The multi-turn, token-in/token-out agent loop over real rollout engines (`TorchEngine` or `VLLMEngine`,
used only through `pearl.real.engine_api.RolloutEngine`): one rollout thread; with `parallel_engines`
the engines' steps run on a thread each, their outputs handled in engine order.

`AgentLoop` owns its engines (they are single-threaded) and the episodes in flight:

- a group is `group_size` episodes of one environment seed; each episode is a `Trajectory` whose
  prompt is the chat template applied **once** (system prompt + first observation);
- each model turn is one engine request over the whole context (session = trajectory id, so the
  engine reuses the KV of earlier turns and prefills only the new tokens); its tokens are stored as
  sampled, with the engine's behaviour log-probs and per-token policy versions;
- the environment's reply is appended as masked tokens (turn-end glue + the next user turn);
- environment resets and steps run on a thread pool (`env_workers`; inline when 0), each bounded by
  its timeout; an environment that raises, times out, cannot be built, or returns an observation
  that no longer fits fails its own trajectory with the reason; the engine session is dropped either
  way. A finished group (ok or failed members) is handed back.

Routing follows the workers' roles, so the layout may change during a run: while a prefill and a
decode worker both serve, a turn starts on a prefill worker and its KV is handed to a decode worker
when the prefill ends; otherwise turns run on mixed (or decode) workers. An episode keeps its worker
while that worker serves its kind of turn (prefix reuse); new episodes go round-robin, and a worker
that joins takes its share of the episodes in flight (`pearl.runtime.agent_routing`). Workers can
be added (`add_engine`), drained, stopped (`stop_engine`: in-flight requests move with their KV or
resume elsewhere from their tokens) and given a new role (`set_role`): the real runtime's actuators
(`pearl.runtime.real_control`). Weights arrive through `offer_weights`, applied between engine steps.
"""
from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter, deque
from concurrent import futures as cf
from dataclasses import dataclass, field
from typing import Any, Callable

from pearl.envs import EnvRunner
from pearl.errors import EnvironmentFailure, ResourceError, one_line
from pearl.real.engine_api import Output, RolloutEngine
from pearl.real.sampling import SamplingParams
from pearl.runtime.agent_routing import Routing
from pearl.rl.trajectory import Group, Status, Trajectory
from pearl.types import Role
from pearl.workloads import TrajectorySpec


@dataclass
class Episode:
    traj: Trajectory
    runner: EnvRunner | None  # None: the environment could not be built
    group: Group
    engine: int  # index of the engine that starts its turns (a prefill engine under PD)
    env_s: list[float] = field(default_factory=list)  # seconds each environment step took (as waited)
    env_t0: float = 0.0


class InFlight(dict):
    """The episodes in flight by trajectory id, with ∫ (episodes in flight) dt kept as they come and go:
    the controller's time-averaged in-flight count (a sample per tick reads 0 when the tick falls
    between two batches, however full the interval was)."""

    def __init__(self) -> None:
        super().__init__()
        self._area, self._t = 0.0, time.perf_counter()

    def _advance(self) -> None:
        now = time.perf_counter()
        self._area += len(self) * (now - self._t)
        self._t = now

    def __setitem__(self, key: str, value: Any) -> None:
        self._advance()
        super().__setitem__(key, value)

    def pop(self, *args: Any) -> Any:
        self._advance()
        return super().pop(*args)

    def area(self) -> float:
        """∫ episodes in flight dt (seconds) since the loop began, brought up to now."""
        self._advance()
        return self._area


class AgentLoop(Routing):
    def __init__(self, engines: list[RolloutEngine], layout: str, make_env: Callable[[], Any],
                 sampling: SamplingParams, group_size: int, env_timeout_s: float | None,
                 use_system_prompt: bool = True, env_workers: int = 0, parallel_engines: bool = False,
                 seed: int | None = None):
        """`env_workers` > 0: environment resets and steps run on a pool of that many threads, off the
        rollout thread (one slow or hung environment delays only its own trajectory); 0: inline, in
        a fixed order (reproducible, but a slow step holds up everything). `parallel_engines`: the
        engines with work step at the same time, one thread each (torch releases the GIL in its
        kernels); their outputs are handled afterwards in engine order, so results do not depend on
        which finished first."""
        self.engines, self.layout = list(engines), layout
        self.stopped: set[int] = set()  # engine indices no longer running
        self.draining: set[int] = set()  # engine indices taking no new turns (about to stop)
        self.parked: list[tuple[Any, Any]] = []  # (request, kv) waiting for a worker to serve them
        self.waiting: list[Episode] = []  # turns that found no serving worker (mid-switch): the next takes them
        self.make_env, self.params, self.group_size = make_env, sampling, group_size
        self.seed = seed  # per-trajectory sampling seeds (`params_for`); None: each engine's own generator
        self.env_timeout_s, self.use_system_prompt = env_timeout_s, use_system_prompt
        self.tok = engines[0].tokenizer
        self.episodes = InFlight()
        self._pending_weights: tuple[dict, int] | None = None
        self._last_weights: tuple[dict, int] | None = None
        self._lock = threading.Lock()
        self._rr = 0
        self.rebalanced = 0  # episodes moved onto workers that joined mid-batch (`rebalance`)
        self._turn_end = self._glue()
        self.tokens_generated = 0
        self.tokens_env = 0
        self.finished: deque[TrajectorySpec] = deque(maxlen=512)  # as they ran: what the controller learns
        self.finished_count = 0
        self.pool = cf.ThreadPoolExecutor(env_workers, thread_name_prefix="pearl-env") if env_workers > 0 else None
        self.env_pending: dict[str, tuple[Episode, str, cf.Future]] = {}  # trajectory id -> env call in flight
        self.engine_pool = cf.ThreadPoolExecutor(thread_name_prefix="pearl-engine") if parallel_engines else None
        self._closed: list[Group] = []  # groups completed outside a call that returns them

    # ------------------------------------------------------------ weights (called from the trainer thread)
    def offer_weights(self, state_dict: dict, version: int) -> None:
        with self._lock:  # the newest snapshot wins; older ones are never loaded
            self._pending_weights = (state_dict, version)

    def apply_weights(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        if pending is not None:
            self._last_weights = pending  # for a worker that starts later with its own copy (vLLM)
            for i in self.live():
                self.engines[i].update_weights(*pending)

    @property
    def version(self) -> int:
        live = self.live()
        return self.engines[live[0] if live else 0].version

    # ------------------------------------------------------------ episodes
    def _glue(self) -> list[int]:
        """Tokens closing an assistant turn: the stop token (when the response did not sample one)
        and the template's newline; the next user turn comes from `tokenizer.chat`."""
        return list(self.tok.encode("\n"))

    def start_group(self, gid: int, seed: int) -> list[Group]:
        """Admit one group; returns the groups that completed meanwhile (this one, if every episode
        failed already at its environment's construction or reset)."""
        done: list[Group] = []
        group = Group(gid, self.group_size, seed, pending=self.group_size)
        for i in range(self.group_size):
            t = Trajectory(id=f"g{gid}-{i}", group_id=gid, sample_index=i, start_version=self.version,
                           info={"seed": seed})
            group.trajs.append(t)
            try:
                runner = EnvRunner(self.make_env(), timeout_s=self.env_timeout_s)
            except Exception as err:  # a constructor that raises fails its own trajectory only
                ep = Episode(t, None, group, -1)
                self.episodes[t.id] = ep
                done += self._fail(ep, f"environment constructor raised {type(err).__name__}: {one_line(str(err))}")
                continue
            ep = Episode(t, runner, group, self._pick_engine())
            self.episodes[t.id] = ep
            done += self._env_call(ep, "reset", seed)
        return done + self._take_closed()

    # ------------------------------------------------------------ environment calls
    def _env_call(self, ep: Episode, kind: str, arg: Any) -> list[Group]:
        """Reset or step `ep`'s environment: inline, or on the pool (the result is handled by
        `collect_env` once it is there)."""
        fn = ep.runner.reset if kind == "reset" else ep.runner.step
        ep.env_t0 = time.perf_counter()
        if self.pool is None:
            return self._env_result(ep, kind, _outcome(fn, arg))
        self.env_pending[ep.traj.id] = (ep, kind, self.pool.submit(_outcome, fn, arg))
        return []

    def collect_env(self, wait_s: float = 0.0) -> list[Group]:
        """Handle every environment call that has finished (waiting up to `wait_s` for a first one)."""
        if not self.env_pending:
            return []
        if wait_s > 0:
            cf.wait([f for *_, f in self.env_pending.values()], timeout=wait_s, return_when=cf.FIRST_COMPLETED)
        done: list[Group] = []
        for tid, (ep, kind, fut) in list(self.env_pending.items()):
            if fut.done():
                del self.env_pending[tid]
                done += self._env_result(ep, kind, fut.result())
        return done

    def _env_result(self, ep: Episode, kind: str, outcome: tuple[Any, str | None]) -> list[Group]:
        res, err = outcome
        if err is not None:
            return self._fail(ep, err)
        t = ep.traj
        if kind == "reset":
            msgs = []
            system = getattr(ep.runner.env, "system_prompt", "")
            if self.use_system_prompt and system:
                msgs.append({"role": "system", "content": system})
            msgs.append({"role": "user", "content": res})
            t.append_prompt(self.tok.chat(msgs))
            self._submit(ep)
            return self._take_closed()
        t.add_reward(res.reward)
        ep.env_s.append(time.perf_counter() - ep.env_t0)
        if res.done:
            t.info.update({k: v for k, v in res.info.items() if isinstance(v, (str, int, float, bool))})
            t.finish()
            return self._close(ep)
        toks = t.token_ids[-1:]
        glue = [] if toks and toks[-1] in self.tok.stop_token_ids else [self.tok.eos_token_id]
        nxt = glue + self._turn_end + self.tok.chat([{"role": "user", "content": res.observation}])
        t.append_env(nxt)
        self.tokens_env += len(nxt)
        self._submit(ep)
        return self._take_closed()

    def close(self) -> None:
        """End of the run: environment calls not yet started are cancelled; running ones are left to
        their timeouts (their threads do not hold the process up)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.engine_pool is not None:
            self.engine_pool.shutdown(wait=False)
        for i in self.live():  # engines that hold a process or memory outside Python (vLLM's engine core)
            close = getattr(self.engines[i], "close", None)
            if close is not None:
                close()

    def _take_closed(self) -> list[Group]:
        out, self._closed = self._closed, []
        return out

    def _submit(self, ep: Episode, kv: Any = None, engine: int | None = None) -> None:
        t = ep.traj
        if engine is None and ep.engine not in self.turn_targets():
            ep.engine = self._pick_engine()  # its worker left or changed role
            if ep.engine < 0:  # none serves (a switch stopped the only worker before starting the next)
                self.waiting.append(ep)
                return
        e = self.engines[ep.engine if engine is None else engine]
        try:
            e.add_request(t.token_ids, self.params_for(t.id), session=t.id, rid=f"{t.id}:{t.turns}", kv=kv)
        except ResourceError as err:  # e.g. an observation too large for the context: this trajectory only
            self._closed += self._fail(ep, one_line(str(err)))

    def live(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self.stopped]

    # ------------------------------------------------------------ changing the layout
    def add_engine(self, engine: Any) -> int:
        """A new worker (brought to the current weights unless it shares them); requests parked and
        turns waiting while no worker could serve them go to it."""
        if self._last_weights is not None and engine.version != self._last_weights[1]:
            engine.update_weights(*self._last_weights)
        self.engines.append(engine)
        parked, self.parked = self.parked, []
        for req, kv in parked:
            self._resubmit(req, kv)
        waiting, self.waiting = self.waiting, []
        for ep in waiting:
            if ep.traj.id in self.episodes:
                self._submit(ep)
        self.rebalanced += self.rebalance(len(self.engines) - 1)
        return len(self.engines) - 1

    def _take_out(self, i: int, migrate: bool, out: list | None = None) -> list[tuple[Any, Any]]:
        """Every request on engine `i`, out of it: (request with its tokens so far, KV or None),
        appended to `out` as each comes out (a caller that catches a failure keeps those)."""
        e, out = self.engines[i], [] if out is None else out
        for req in list(e.requests()):
            if migrate:
                m = e.migrate_out(req.rid)
                out.append((m.req, m.kv))
            else:
                out.append((e.abort(req.rid).req, None))
        return out

    def stop_engine(self, i: int, migrate: bool = True) -> int:
        """Stop worker `i`: its requests move (KV with them if `migrate`) or resume elsewhere from their
        tokens. Returns how many requests moved."""
        if i in self.stopped:
            return 0
        self.stopped.add(i)
        self.draining.discard(i)
        moved = self._take_out(i, migrate)
        for req, kv in moved:
            self._resubmit(req, kv)
        for tid in list(self.episodes):
            if self.engines[i].holds(tid):
                self.engines[i].drop_session(tid)
        close = getattr(self.engines[i], "close", None)  # a Ray proxy has none: its actor is the backend's
        if close is not None:
            close()
        return len(moved)

    def set_role(self, i: int, role: Role) -> None:
        """Give worker `i` a new role with its weights resident; its requests move out and are routed
        again (some may come back)."""
        if i in self.stopped:
            return
        moved = self._take_out(i, migrate=True)
        self.engines[i].set_role(role)
        for req, kv in moved:
            self._resubmit(req, kv)

    # ------------------------------------------------------------ one pass of the loop
    def has_work(self) -> bool:
        return bool(self.env_pending) or any(self.engines[i].has_work() for i in self.live())

    def step(self) -> list[Group]:
        """Apply pending weights, run one step on every engine with work, advance the episodes
        whose turn finished; return the groups that completed."""
        self.apply_weights()
        work = [i for i in self.live() if self.engines[i].has_work()]
        done: list[Group] = self.collect_env(0.0 if work else 0.01)  # idle engines: wait for an env a little
        if self.engine_pool is not None and len(work) > 1:
            outs = list(self.engine_pool.map(lambda i: self.engines[i].step(), work))
        else:
            outs = [self.engines[i].step() for i in work]
        for idx, got in zip(work, outs):
            for out in got:
                done += self._on_output(idx, out)
        return done

    def _on_output(self, idx: int, out: Output) -> list[Group]:
        tid = out.req.session
        ep = self.episodes[tid]
        if out.finish_reason == "prefill":  # PD hand-off: continue on a decode worker with the KV
            self._resubmit(out.req, out.kv)
            return []
        t = ep.traj
        toks = out.token_ids
        t.append_model(toks, out.logprobs, out.versions)
        self.tokens_generated += len(toks)
        return self._env_call(ep, "step", self.tok.decode(toks))

    def _drop(self, tid: str) -> None:
        """The episode ended: free its retained KV wherever it is held."""
        for i in self.live():
            if self.engines[i].holds(tid):
                self.engines[i].drop_session(tid)

    def running(self) -> tuple[tuple[TrajectorySpec, bool], ...]:
        """The episodes in flight as far as they ran (their completed turns; a turn in progress is not
        seen until the engine returns it): the workload estimate's censored observations."""
        specs = (_as_spec(ep, self.finished_count + i) for i, ep in enumerate(self.episodes.values()))
        return tuple((s, False) for s in specs if s.turns > 0)

    def _fail(self, ep: Episode, reason: str) -> list[Group]:
        ep.traj.fail(re.sub(r"^request \S+: ", "", reason))  # the trajectory is known: what went wrong
        return self._close(ep)

    def _close(self, ep: Episode) -> list[Group]:
        self._drop(ep.traj.id)
        ep.traj.info["env_s"] = [round(x, 6) for x in ep.env_s]  # measured environment steps (run records)
        if ep.traj.status is Status.OK:
            self.finished.append(_as_spec(ep, self.finished_count))
            self.finished_count += 1
        self.env_pending.pop(ep.traj.id, None)
        self.episodes.pop(ep.traj.id, None)
        ep.group.pending -= 1
        return [ep.group] if ep.group.pending == 0 else []

    def engine_stats(self) -> dict[str, float]:
        s = [e.stats for e in self.engines]
        return {"engine_busy_s": sum(x.busy_s for x in s), "engine_cpu_s": sum(getattr(x, "cpu_s", 0.0) for x in s),
                "engine_steps": sum(x.steps for x in s),
                "tokens_prefilled": sum(x.tokens_prefilled for x in s),
                "tokens_decoded": sum(x.tokens_decoded for x in s),
                "tokens_reused": sum(x.tokens_reused for x in s),
                "kv_imports_dropped": sum(getattr(x, "kv_imports_dropped", 0) for x in s),
                "engine_steps_by_threads": dict(sum((Counter(getattr(x, "steps_by_threads", {})) for x in s), Counter()))}


def _outcome(fn: Callable[[Any], Any], arg: Any) -> tuple[Any, str | None]:
    """(result, None) or (None, the failure's one-line reason): what an env call on the pool returns."""
    try:
        return fn(arg), None
    except EnvironmentFailure as err:
        return None, str(err)
    except Exception as err:  # EnvRunner wraps the env's own errors; anything else is still this trajectory's
        return None, f"environment call raised {type(err).__name__}: {one_line(str(err))}"


def _as_spec(ep: Episode, index: int) -> TrajectorySpec:
    """A finished episode as the workload estimate sees it: the prompt (the first run of non-model
    tokens), each response (a run of model tokens), each observation (the non-model tokens between
    two responses) and each environment step's measured seconds."""
    runs = [(m, sum(1 for _ in g)) for m, g in itertools.groupby(ep.traj.loss_mask)]
    prompt = runs[0][1] if runs and runs[0][0] == 0 else 0
    resp = tuple(n for m, n in runs if m == 1)
    first = next((i for i, (m, _) in enumerate(runs) if m == 1), len(runs))
    obs = tuple(n for m, n in runs[first:] if m == 0)[:max(len(resp) - 1, 0)]
    env = tuple(ep.env_s[:len(resp)]) + (0.0,) * max(len(resp) - len(ep.env_s), 0)
    return TrajectorySpec(index, ep.traj.group_id, max(prompt, 1), resp, obs, env)
