"""The virtual-time simulator of a whole asynchronous agentic-RL cluster.

Owns the virtual clock, the emulated engines, the agent loops, the emulated trainer and the metrics;
decisions (which layout, when to borrow, how to absorb elastic devices) come from the controller
(`pearl.control.policies.make_controller`), driven through `pearl.runtime.sim_control.SimControl`,
which observes this simulator and acts through its actuators (`start_worker`, `stop_worker`,
`set_role`, `ClusterState.lend`/`reclaim`), recorded in the one `ClusterState`.
"""
from __future__ import annotations

import random
from collections import Counter, deque

from pearl.config import ScenarioConfig
from pearl.control.staleness import StalenessGate
from pearl.control.state import ClusterState
from pearl.errors import ConfigError
from pearl.engine.emulated import EmulatedEngine
from pearl.engine.request import Request
from pearl.engine.router import Candidates, pick_decode, pick_prefill
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfCoeffs, PerfModel
from pearl.runtime.clock import VirtualClock
from pearl.runtime.elastic import trace
from pearl.runtime.results import collect
from pearl.runtime.sim_balance import SimBalance
from pearl.runtime.sim_control import SimControl
from pearl.types import Pool, Role, WorkerPhase
from pearl.rl.trajectory import Group
from pearl.runtime.sim_records import SimTrajectory
from pearl.runtime.sim_trainer import SimTrainer, twin_coeffs, twin_workload
from pearl.workloads import TrajectorySpec, Workload

FINISHED_KEPT = 512  # recent finished trajectories an observation shows the controller


class Simulator(SimTrainer, SimBalance):
    def __init__(self, cfg: ScenarioConfig):
        self.cfg = cfg
        self.clock = VirtualClock()
        self.model = get_model(cfg.model)
        self.hw = get_hardware(cfg.cluster.hardware)
        self.perf = PerfModel(self.model, self.hw, tp=cfg.engine.tp, coeffs=twin_coeffs(cfg.twin),
                              memory_utilization=cfg.engine.memory_utilization, kv_capacity=cfg.engine.kv_capacity_tokens)
        self._perfs: dict[tuple[int, str | None], PerfModel] = {(cfg.engine.tp, None): self.perf}
        self.device_hw: dict[int, str] = {}  # rollout device -> hardware, where not cluster.hardware
        self.workload = twin_workload(cfg.twin) or Workload(cfg.workload, cfg.seed)
        cap = cfg.engine.kv_capacity_tokens
        if cap is not None and cap < self.workload.max_context:  # (else the longest would wait forever)
            raise ConfigError(f"engine.kv_capacity_tokens ({cap}) is below the workload's longest context "
                              f"({self.workload.max_context} tokens): raise it, or lower workload.max_context")
        rl = cfg.rl
        self.batch_trajs = rl.prompts_per_batch * rl.group_size
        self.gate = StalenessGate(self.batch_trajs, rl.staleness, rl.max_concurrent_trajectories)
        self.state = ClusterState(check=False)
        self.engines: dict[int, EmulatedEngine] = {}  # worker id -> engine (live workers only)
        self.parked: list[tuple[SimTrajectory, Request]] = []  # waiting for any worker to serve
        self._serving_cache: dict[tuple[Role, ...], list[EmulatedEngine]] = {}
        self.route_rng = random.Random(cfg.seed)  # power-of-two-choices routing, deterministic
        self.all_engines: list[EmulatedEngine] = []  # every engine ever started (metrics)
        self.device_time: dict[int, list[float]] = {}  # device -> [joined at, left at] (elastic)
        self.version = 0
        self.control = SimControl(self)
        self._build_cluster()
        # rollout bookkeeping
        self.next_group = 0
        self.next_traj = 0
        self.next_rid = 0
        self.groups: dict[int, Group] = {}
        self.ready: list[Group] = []
        self.active = 0
        self.active_integral = 0.0
        self._last_t = 0.0
        # trainer
        self.trainer_busy = False
        self.trainer_idle_since = 0.0
        self.steps: list[dict] = []
        self.batch_ready_t: list[float] = []
        self.staleness_hist: Counter[int] = Counter()
        self.trained_trajs = 0
        self.trained_tokens = 0
        self.discarded = 0
        self.trainer_device_wait = 0.0
        self.migrated = 0
        self.rebalanced = 0  # trajectories moved onto a worker that joined mid-batch (sim_balance)
        self.inflight: dict[str, SimTrajectory] = {}  # admitted, not finished
        self.recomputed_tokens = 0
        self.finished_recent: deque[TrajectorySpec] = deque(maxlen=FINISHED_KEPT)  # what the controller learns from
        self.finished_count = 0

    # ------------------------------------------------------------------ cluster
    def _build_cluster(self) -> None:
        c, st = self.cfg.cluster, self.state
        node = 0
        self.rollout_devices = []
        for i in range(c.rollout_devices):
            self.rollout_devices.append(st.add_device(0.0, Pool.ROLLOUT, node=i // c.devices_per_node))
        rest = list(self.rollout_devices)  # cluster.rollout_mix: the last devices, in the order given
        for name, k in reversed(list(c.rollout_mix.items())):
            try:
                other = get_hardware(name) is not self.hw  # (the cluster's own kind needs no entry)
            except ConfigError as e:
                raise ConfigError(f"cluster.rollout_mix: {e}") from None
            self.device_hw.update((d, name) for d in rest[-k:] if other)
            rest = rest[:-k]
        node = -(-c.rollout_devices // c.devices_per_node)
        self.train_devices = [st.add_device(0.0, Pool.TRAIN, node=node + i // c.devices_per_node)
                              for i in range(c.train_devices)]
        self.next_node = node + -(-c.train_devices // c.devices_per_node)

    def perf_for(self, tp: int, hardware: str | None = None) -> PerfModel:
        """The worker model at tp `tp` on `hardware` (None: cluster.hardware); ResourceError if it won't fit."""
        pm, p = self._perfs.get((tp, hardware)), self.perf
        if pm is None:  # another kind: the catalogue's efficiencies for it (a twin's fit its own hardware)
            pm = self._perfs[(tp, hardware)] = p.with_tp(tp) if hardware is None else PerfModel(
                self.model, get_hardware(hardware), tp, PerfCoeffs(), p.memory_utilization, p.kv_capacity)
            pm.kv_capacity_tokens()
        return pm

    def perf_on(self, devices: tuple[int, ...]) -> PerfModel:
        """The model of a worker on these devices (one kind of hardware: it runs at one rate)."""
        kinds = {self.device_hw.get(d) for d in devices}
        if len(kinds) > 1:
            both = " and ".join(sorted(k or self.cfg.cluster.hardware for k in kinds))
            raise ConfigError(f"cluster.rollout_mix: a worker of the layout spans {both} devices; change the mix or the layout")
        return self.perf_for(len(devices), kinds.pop())

    def node_of(self, dev: int) -> int:
        return self.state.devices[dev].node

    def handoff_s(self, src: EmulatedEngine, dst: EmulatedEngine, tokens: int) -> float:
        """KV of `tokens` tokens from `src` to `dst`: each rank sends its shard over its own link, so
        the side with fewer ranks (the smaller tp) sets the pace (as the predictor assumes); between
        two kinds of hardware (`cluster.rollout_mix`), the slower link."""
        same = self.node_of(src.devices[0]) == self.node_of(dst.devices[0])
        n = min(len(src.devices), len(dst.devices))
        return max(self.perf_for(n, hw).kv_transfer_time(max(tokens, 0), same) for hw in {src.hw, dst.hw})

    def start_worker(self, devices: tuple[int, ...], role: Role, load_s: float = 0.0) -> EmulatedEngine:
        t = self.clock.now
        wid = self.state.start_worker(t, devices, role, self.version)
        pm = self.perf_on(devices)
        eng = EmulatedEngine(wid, role, self.shared_step_time(pm.step_time), pm.kv_capacity_tokens(), self.cfg.engine.max_num_seqs,
                             self.cfg.engine.max_batched_tokens, self._on_done, self.version)
        eng.devices, eng.pm, eng.hw = devices, pm, self.device_hw.get(devices[0])  # its model, and its kind if another
        eng.rate = pm.decode_speed()  # (the router weighs workers by it: another kind, or another tp)
        eng.on_plan = self._on_plan
        self.set_accepting(eng, False)
        self.engines[wid] = eng
        self.all_engines.append(eng)
        eng.started_t, eng.stopped_t = t, None
        if load_s <= 0:
            self._worker_ready(eng)
        else:
            self.clock.at(t + load_s, self._worker_ready, eng)
        return eng

    def _worker_ready(self, eng: EmulatedEngine) -> None:
        if self.state.workers[eng.wid].phase is WorkerPhase.LOADING:
            self.state.worker_ready(self.clock.now, eng.wid)
            self.set_accepting(eng, True)
            eng.version = self.version
            parked, self.parked = self.parked, []
            for tr, r in parked:
                self._submit(tr, r, self.clock.now)
            self.rebalanced += self._rebalance(eng)  # it takes its share of the trajectories in flight

    def stop_worker(self, eng: EmulatedEngine, migrate: bool = True) -> None:
        """Stop a worker; its in-flight requests move (KV migration) or resume elsewhere (recompute)."""
        t = self.clock.now
        self.set_accepting(eng, False)
        reqs = eng.abort_all(t)
        self.engines.pop(eng.wid, None)
        eng.stopped_t = t
        if self.state.workers[eng.wid].phase is not WorkerPhase.STOPPED:
            self.state.stop_worker(t, eng.wid)
        for r in reqs:
            self._relocate(r, eng, migrate)

    def set_role(self, eng: EmulatedEngine, role: Role, flip_s: float = 0.05) -> None:
        """Flip a worker's role with its weights resident; decodes leave a worker that becomes prefill."""
        t = self.clock.now
        if role is Role.PREFILL:
            eng.sync(t)
            for r in [d.req for d in eng.dec.values()]:
                eng.abort(r, t)
                self._relocate(r, eng, migrate=True)
            for r in list(eng.pre) + list(eng.waiting):
                r.prefill_only = True  # queued turns now hand their KV to a decode worker
        eng.role = role
        self._serving_cache.clear()
        self.state.set_role(t, eng.wid, role)
        eng.pause(t, t + flip_s)

    def _relocate(self, r: Request, src: EmulatedEngine, migrate: bool) -> None:
        """Token-level resume: the request keeps the tokens it generated; with KV (migrate) or without."""
        tr: SimTrajectory = r.meta
        t = self.clock.now
        if tr.home is src:
            tr.home = None
        if tr.pre_home is src:
            tr.pre_home = None
        if r.prefill_only:  # a prefill that had not finished: just prefill it elsewhere
            self._submit(tr, r, t)
            return
        dst = self._decode_target(tr)
        if not (migrate and r.num_generated > 0) or dst is None:
            self._recompute(tr, r, dst=dst)
            return
        tr.migrations += 1
        self.migrated += 1
        delay = self.handoff_s(src, dst, r.num_tokens)
        dst.incoming_tokens += r.num_tokens
        self.clock.at(t + delay, self._arrive_decode, tr, r, dst)

    def _recompute(self, tr: SimTrajectory, r: Request, park: bool = False,
                   dst: EmulatedEngine | None = None) -> None:
        """Resume a request from its tokens alone (its KV is gone): the context is prefilled again. If no
        worker serves right now (e.g. all restart at a new tensor-parallel size), or `park`, it waits,
        parked, for the next worker that becomes ready."""
        r.prefill_only = False
        r.num_computed = 0
        tr.recomputes += 1
        self.recomputed_tokens += r.num_tokens
        if dst is None and not park:
            dst = self._decode_target(tr)
        if dst is None:
            self.parked.append((tr, r))
            return
        tr.home = dst
        tr.min_version = min(tr.min_version, dst.version)
        dst.submit(r, self.clock.now)

    # ------------------------------------------------------------------ engines by role
    def set_accepting(self, eng: EmulatedEngine, flag: bool) -> None:
        eng.accepting = flag
        self._serving_cache.clear()

    def serving(self, *roles: Role) -> list[EmulatedEngine]:
        """Workers taking new turns, by role (cached: routing asks for every turn)."""
        got = self._serving_cache.get(roles)
        if got is None:
            got = self._serving_cache[roles] = Candidates(e for e in self.engines.values() if e.accepting and e.role in roles)
        return got

    def _decode_target(self, tr: SimTrajectory) -> EmulatedEngine | None:
        cands = self.serving(Role.DECODE, Role.MIXED) or self.serving(Role.PREFILL)
        return pick_decode(cands, tr.id, tr.home, self.route_rng) if cands else None

    # ------------------------------------------------------------------ rollout
    def _admit(self) -> None:
        n, rl_prompts = self.cfg.rl.group_size, self.cfg.rl.prompts_per_batch  # batch = admission order
        while self.gate.capacity(self.version) >= n:
            g = Group(self.next_group, n)
            self.groups[g.gid] = g
            prompt = self.workload.group_prompt_tokens(g.gid)
            for _ in range(n):
                spec = self.workload.trajectory(self.next_traj, g.gid, prompt, step=g.gid // rl_prompts)
                tr = SimTrajectory(spec, f"t{self.next_traj}", self.clock.now, ctx=spec.prompt_tokens)
                self.next_traj += 1
                self.inflight[tr.id] = tr
                self._start_turn(tr)
            self.gate.on_start(n)
            self._count_active(+n)
            self.next_group += 1

    def _count_active(self, d: int) -> None:
        t = self.clock.now
        self.active_integral += self.active * (t - self._last_t)
        self._last_t = t
        self.active += d

    def _start_turn(self, tr: SimTrajectory) -> None:
        tr.in_env = False
        k = tr.turn
        self.next_rid += 1
        r = tr.req = Request(self.next_rid, tr.id, tr.ctx, tr.spec.responses[k], meta=tr)
        self._submit(tr, r, self.clock.now)

    def _submit(self, tr: SimTrajectory, r: Request, t: float) -> None:
        prefill = self.serving(Role.PREFILL)
        decode = self.serving(Role.DECODE)
        if prefill and decode:
            r.prefill_only = True
            eng = pick_prefill(prefill, tr.id, tr.pre_home, self.cfg.engine.max_batched_tokens, self.route_rng)
            tr.pre_home = eng
            # The context lives on the decode worker: fetch it rather than recompute it.
            held, home = eng.holds(tr.id), tr.home
            peer = home.holds(tr.id) if home is not None and home.accepting else 0
            if peer > held and peer > 0:
                delay = self.handoff_s(home, eng, peer - held)
                if delay < eng.pm.prefill_time(peer - held, held):
                    home.touch(tr.id)  # `_fetched` has it pulled at admission: the last to evict until then
                    self.clock.at(t + delay, self._fetched, eng, r, peer)
                    return
        else:
            r.prefill_only = False
            eng = self._decode_target(tr)
            if eng is None:
                self._recompute(tr, r)
                return
            tr.home = eng
        tr.min_version = min(tr.min_version, eng.version)  # conservative: no token of the turn is older
        eng.submit(r, t)

    def _fetched(self, eng: EmulatedEngine, r: Request, have: int) -> None:
        tr: SimTrajectory = r.meta
        if not eng.accepting:
            self._submit(tr, r, self.clock.now)
            return
        tr.min_version = min(tr.min_version, eng.version)
        eng.submit(r, self.clock.now, have=have, source=lambda h=tr.home: h.holds(tr.id) if h.accepting else 0)

    def _on_done(self, eng: EmulatedEngine, r: Request, t: float) -> None:
        tr: SimTrajectory = r.meta
        tr.min_version = min(tr.min_version, eng.version)
        if r.prefill_only and r.num_generated < r.max_new_tokens:  # hand the KV to a decode worker (a
            # turn whose only token came with its prefill ends here, as in the real engine: no hand-off)
            r.prefill_only = False
            cands = self.serving(Role.DECODE) or self.serving(Role.MIXED)
            if not cands:  # no decode-capable worker: wait for one
                self._recompute(tr, r, park=True)
                return
            dst = pick_decode(cands, tr.id, tr.home, self.route_rng)
            missing = r.num_tokens - 1 - dst.holds(tr.id)
            dst.incoming_tokens += r.num_tokens
            self.clock.at(t + self.handoff_s(eng, dst, missing), self._arrive_decode, tr, r, dst)
            return
        tr.generated += r.num_generated
        tr.ctx = r.num_tokens
        tr.turn += 1
        if tr.turn >= tr.spec.turns:
            self.clock.at(t + self.env_wait(t, tr.spec.env_latency[-1]), self._finish_trajectory, tr)  # final reward
            return
        tr.in_env = True
        self.clock.at(t + self.env_wait(t, tr.spec.env_latency[tr.turn - 1]), self._env_done, tr)

    def _arrive_decode(self, tr: SimTrajectory, r: Request, dst: EmulatedEngine) -> None:
        dst.incoming_tokens = max(0, dst.incoming_tokens - r.num_tokens)
        if not dst.accepting:  # the target left while the KV was in flight: resume by recompute
            self._recompute(tr, r)
            return
        tr.home = dst
        tr.min_version = min(tr.min_version, dst.version)
        dst.submit(r, self.clock.now, kv_ready=True)

    def _env_done(self, tr: SimTrajectory) -> None:
        tr.ctx += tr.spec.observations[tr.turn - 1]
        self._start_turn(tr)

    def _finish_trajectory(self, tr: SimTrajectory) -> None:
        tr.t_end = self.clock.now
        tr.in_env = False
        self.inflight.pop(tr.id, None)
        self.finished_recent.append(tr.spec)  # as it ran: the simulator's trajectories run their spec exactly
        self.finished_count += 1
        for e in (tr.home, tr.pre_home):
            if e is not None:
                e.drop_session(tr.id)
        self._count_active(-1)
        self.gate.on_finish(1)
        g = self.groups[tr.spec.group]
        g.trajs.append(tr)
        if len(g.trajs) == g.size:
            del self.groups[g.gid]
            self.ready.append(g)
            self._maybe_train()
        self._admit()

    # ------------------------------------------------------------------ running
    def _on_plan(self, eng: EmulatedEngine) -> None:
        """An engine planned a new segment: queue its end (entries of older plans are ignored)."""
        self.clock.at(eng.end_t, self._segment_end, eng, eng.gen)

    def _segment_end(self, eng: EmulatedEngine, gen: int) -> None:
        if gen == eng.gen and eng.wid in self.engines:
            eng.segment_end(self.clock.now)

    def _done(self) -> bool:
        m = self.cfg.max_train_steps
        return m is not None and len(self.steps) >= m and not self.trainer_busy

    def run(self) -> dict:
        self.driver = self.control.setup()
        for b in trace(self.cfg.cluster.elastic, self.cfg.duration_s, self.cfg.seed):
            self.clock.at(b.t_add, self.control.elastic_add, b)
        self._admit()
        self.clock.run(self.cfg.duration_s, stop=self._done if self.cfg.max_train_steps is not None else None)
        self._count_active(0)
        return collect(self)


def simulator_for(cfg: ScenarioConfig, path: object, overridden: bool = False) -> Simulator:
    """`Simulator(cfg)`, its checks that need the workload built (e.g. the KV pool against the longest
    context) reported as a ConfigError naming the scenario file `path` as load_config names it."""
    try:
        return Simulator(cfg)
    except ConfigError as e:
        raise ConfigError(f"{path}{' (with overrides)' if overridden else ''}: {e}") from None
