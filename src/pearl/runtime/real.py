"""The real runtime of `pearl train`: torch engines, environments and a GRPO trainer on the wall clock.

`run_training(config_path, overrides, output, console)`:

1. loads the config (default: the packaged `pearl/data/train_default.yaml`), checks names, checks
   that the model fits in memory (`ResourceError` otherwise), builds the trainer's copy and the
   engines' copies of the model, the environment factory and the `AgentLoop`;
2. runs rollout and training concurrently on two threads. The rollout thread admits groups through
   the `StalenessGate` (the simulator's admission rule: at most (η + v + 1)·B trajectories started by
   version v), steps the engines and hands completed groups to the trainer; the trainer thread takes
   `prompts_per_step` groups, discards trajectories staler than η (counted, slots returned to the
   gate), trains, bumps the version and offers the snapshot to the engines;
3. logs every step live (rich), appends it to `metrics.jsonl` and ends with `summary.json`.

`layout: auto` (the default): with two or more rollout workers, `choose_layout` asks the controller's
selector (`pearl.control.selector.select`, as the simulator's PEARL policy does) whether colocated or
1P:(N-1)D finishes a fresh staleness window of trajectories first, on a PerfModel of this model on
hardware "cpu" (coefficients from `profile:` if given, else a quick calibration of the real engine, else
the defaults) and the env's typical turn shape. One worker is always colocated. The decision and its
reason are printed at the start and saved as `layout_decision` in summary.json.

Every trajectory is counted exactly once as trained (ok), failed (with its reason) or stale.
"""
from __future__ import annotations

import copy
import importlib.resources
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape

from pearl.config import deep_merge, read_yaml
from pearl.control.staleness import StalenessGate
from pearl.errors import ResourceError
from pearl.real.train_config import TrainConfig, check_names, parse_train_config

# Trainer copy: fp32 weights + grads + two AdamW moments; each engine holds one more fp32 copy.
TRAINER_BYTES_PER_PARAM = 16
ENGINE_BYTES_PER_PARAM = 4
KNOWN_PARAMS = {"smollm2-135m": 134_515_008}


def default_config_text() -> str:
    return (importlib.resources.files("pearl") / "data" / "train_default.yaml").read_text()


def load_train_config(config_path: Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    import yaml

    if config_path is None:
        data, what = yaml.safe_load(default_config_text()) or {}, "train config (default)"
    else:
        data, what = read_yaml(config_path), str(config_path)
    if overrides:
        data = deep_merge(data, overrides)
    cfg = parse_train_config(data, what)
    check_names(cfg)
    return cfg


def available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not block the run


def model_params(name: str) -> int:
    if name == "tiny":
        from pearl.real.models import model_numbers, tiny_config

        return model_numbers(tiny_config()).params
    return KNOWN_PARAMS.get(name, 0)


def check_memory(name: str, workers: int, available: int | None = None) -> int:
    """Bytes the run needs; ResourceError when it exceeds the available memory (before loading)."""
    need = model_params(name) * (TRAINER_BYTES_PER_PARAM + workers * ENGINE_BYTES_PER_PARAM)
    avail = available_memory() if available is None else available
    if need > avail:
        raise ResourceError(f"model {name!r} needs about {need / 2**30:.1f} GiB for training plus {workers} "
                            f"engine copies, but only {avail / 2**30:.1f} GiB of memory is available")
    return need


def _perf_model(cfg: TrainConfig, loaded: Any) -> tuple[Any, str]:
    """PerfModel of the engine on hardware "cpu": a saved profile, else a quick calibration (a reduced
    sweep, a few seconds at most), else the default coefficients. Returns (model, where from)."""
    from pearl.perf.hardware import get_hardware
    from pearl.perf.profile import load_profile
    from pearl.perf.roofline import PerfModel
    from pearl.real.profiling import fit_profile, measure_steps, model_shape

    shape = model_shape(loaded.config, cfg.model)
    if cfg.profile:
        prof = load_profile(cfg.profile)  # missing or bad file -> one-line ConfigError
        return prof.perf_model(shape), f"profile {cfg.profile}"
    t0 = time.perf_counter()
    try:
        from pearl.real.engine import TorchEngine

        eng = TorchEngine(loaded, num_threads=1, seed=cfg.seed)
        big = model_params(cfg.model) > 50_000_000
        samples = measure_steps(eng, decode_batches=(1, 4) if big else (1, 4, 16),
                                contexts=(16, 64) if big else (32, 128), prefill_chunks=(16, 64),
                                decode_steps=2 if big else 3, repeats=1 if big else 2, warmup=not big)
        prof, _ = fit_profile(samples, shape, "cpu", max_rel_error=0.5)
        return prof.perf_model(shape), f"calibrated on {len(samples)} step shapes in {time.perf_counter() - t0:.1f} s"
    except Exception as err:  # a refused fit (or anything else) must not stop the run: use the defaults
        return PerfModel(shape, get_hardware("cpu")), f"default coefficients (calibration failed: {err})"


def choose_layout(cfg: TrainConfig, loaded: Any, probe: Any, max_new_tokens: int) -> dict[str, Any]:
    """The rollout layout of this run: `cfg.layout` unless it is "auto"; then, with N >= 2 workers, the
    selector's pick between colocated and 1P:(N-1)D (the layouts the runtime runs). Returns the
    decision: requested, chosen, reason, ranked (top 3, predicted seconds) and the perf model's source."""
    n = cfg.rollout_workers
    if cfg.layout != "auto":
        return {"requested": cfg.layout, "chosen": cfg.layout, "reason": f"layout {cfg.layout!r} set in the config",
                "ranked": []}
    if n < 2:
        return {"requested": "auto", "chosen": "colocated",
                "reason": "1 rollout worker: colocated is the only layout (P:D needs rollout_workers >= 2)",
                "ranked": []}
    from pearl.config import EngineConfig
    from pearl.control.predictor import BatchState, WorkloadStats
    from pearl.control.selector import select
    from pearl.types import LayoutShape, Mode
    from pearl.workloads import TrajectorySpec

    tok = loaded.tokenizer
    obs = probe.reset(cfg.seed)
    msgs = []
    system = getattr(probe, "system_prompt", "")
    if cfg.env.use_system_prompt and system:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": obs})
    prompt = len(tok.chat(msgs))
    observation = len(tok.chat([{"role": "user", "content": obs}]))  # a later turn's observation, as a turn
    t0 = time.perf_counter()
    try:  # one env step: the environment's latency per turn
        acts = probe.allowed_actions
        probe.step(acts[0] if acts else "")
    except Exception:
        pass
    env_s = time.perf_counter() - t0
    turns = max(1, int(getattr(probe, "max_turns", 8) or 8))
    spec = TrajectorySpec(0, 0, prompt, (max_new_tokens,) * turns, (observation,) * (turns - 1), (env_s,) * turns)
    stats = WorkloadStats.from_samples([spec])
    batch = BatchState.fresh(cfg.prompts_per_step * cfg.group_size * (cfg.staleness + 1))
    pm, source = _perf_model(cfg, loaded)
    engine = EngineConfig(tp=1, max_num_seqs=cfg.engine.max_num_seqs, max_batched_tokens=cfg.engine.max_batched_tokens)
    shapes = [LayoutShape.colocated(n, 1), LayoutShape.disaggregated(1, n - 1, 1)]
    sel = select(n, {1: pm}, engine, stats, batch, shapes=shapes)
    chosen = "colocated" if sel.best.mode is Mode.COLOCATED else "1P:1D"
    preds = ", ".join(f"{shp} {pred.completion_s * 1e3:.0f} ms" for shp, pred, _, _ in sel.ranked)
    reason = f"{sel.reason} [per window of {batch.size} trajectories: {preds}]"
    return {"requested": "auto", "chosen": chosen, "shape": str(sel.best), "reason": reason,
            "ranked": [{"layout": str(shp), "predicted_s": round(pred.completion_s, 4), "score_s": round(score, 4),
                        "bottleneck": pred.bottleneck} for shp, pred, _, score in sel.ranked[:3]],
            "perf_model": source,
            "workload": {"prompt_tokens": prompt, "response_tokens": max_new_tokens, "observation_tokens": observation,
                         "turns": turns, "env_latency_s": round(env_s, 6), "batch": batch.size}}


def _success(t: Any) -> bool:
    info = t.info
    return bool(info.get("success")) or info.get("outcome") in ("goal", "correct", "solved") or t.reward >= 1.0


class Run:
    """The state shared by the rollout and trainer threads (guarded by `lock`)."""

    def __init__(self, cfg: TrainConfig, console: Console, out_dir: Path):
        from pearl.envs import load_env
        from pearl.real.engine import TorchEngine
        from pearl.real.models import load_model
        from pearl.real.sampling import SamplingParams
        from pearl.rl.trainer import GRPOTrainer
        from pearl.runtime.agent import AgentLoop

        self.cfg, self.console, self.out_dir = cfg, console, out_dir
        env_kwargs = dict(cfg.env.kwargs)
        probe = load_env(cfg.env.name, **env_kwargs)  # bad kwargs -> ConfigError before any model work
        check_memory(cfg.model, cfg.rollout_workers)
        torch.manual_seed(cfg.seed)
        loaded = load_model(cfg.model)
        tok = loaded.tokenizer
        allowed = None
        acts = probe.allowed_actions
        if cfg.sampling.restrict_actions and acts:
            ids = [tok.encode(a) for a in acts]
            if all(len(i) == 1 for i in ids):  # one token per action: sample exactly one token a turn
                allowed = tuple(i[0] for i in ids)
        self.sampling = SamplingParams(
            temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
            max_new_tokens=1 if allowed else cfg.sampling.max_new_tokens, allowed_token_ids=allowed)
        self.layout_decision = choose_layout(cfg, loaded, probe, self.sampling.max_new_tokens)
        cfg = self.cfg = cfg.model_copy(update={"layout": self.layout_decision["chosen"]})
        es = cfg.engine
        roles = (["prefill"] + ["decode"] * (cfg.rollout_workers - 1)) if cfg.layout == "1P:1D" \
            else ["mixed"] * cfg.rollout_workers
        self.backend: Any = None
        if cfg.backend == "local":
            self.engines = [TorchEngine(loaded, r, max_num_seqs=es.max_num_seqs,
                                        max_batched_tokens=es.max_batched_tokens,
                                        kv_capacity_tokens=es.kv_capacity_tokens, seed=cfg.seed + i, wid=i)
                            for i, r in enumerate(roles)]
        model = copy.deepcopy(loaded.hf_model)
        model.requires_grad_(True)
        tc = cfg.trainer
        if getattr(tok, "pad_token_id", None) is not None and "pad_token_id" not in tc.model_fields_set:
            tc = tc.model_copy(update={"pad_token_id": int(tok.pad_token_id)})
        self.trainer = GRPOTrainer(model, tc, allowed_token_ids=list(allowed) if allowed else None)
        loop_cls = AgentLoop
        if cfg.backend == "ray":  # last, so nothing after it can fail and leave Ray actors behind
            from pearl.runtime.ray_backend import RayAgentLoop, RayBackend

            self.backend = RayBackend(cfg, loaded, roles)
            self.engines, loop_cls = self.backend.engines, RayAgentLoop
        self.agent = loop_cls(self.engines, cfg.layout, lambda: load_env(cfg.env.name, **env_kwargs),
                               self.sampling, cfg.group_size, cfg.env.timeout_s, cfg.env.use_system_prompt)
        self.layout = f"{cfg.layout} ({'+'.join(roles)})" + (" [ray]" if self.backend else "")
        self.gate = StalenessGate(cfg.batch_size, cfg.staleness)
        self.groups: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.counts = {"ok": 0, "failed": 0, "stale": 0}
        self.admitted = 0  # trajectories started; = counts + unfinished() when the run ends
        self.fail_reasons: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []
        self.trained_staleness: list[int] = []

    # ------------------------------------------------------------ rollout thread
    def rollout(self) -> None:
        torch.set_num_threads(1)
        gid = 0
        try:
            while not self.stop.is_set():
                with self.lock:
                    # Admit by the version the engines will stamp on the tokens: they apply a new
                    # snapshot between steps, so they can lag the trainer, and a gate on the
                    # trainer's version would admit trajectories that are already too stale.
                    self.agent.apply_weights()  # between engine steps: a pending snapshot lands now
                    while self.gate.capacity(self.agent.version) >= self.cfg.group_size:
                        self.gate.on_start(self.cfg.group_size)
                        self.admitted += self.cfg.group_size
                        # GRPO groups share an env seed; seeds advance so the env's map set is covered.
                        for g in self.agent.start_group(gid, self.cfg.seed * 100_003 + gid):
                            self._group_done(g)
                        gid += 1
                if not self.agent.has_work():
                    time.sleep(0.002)  # gate closed: wait for the trainer to bump the version
                    continue
                for g in self.agent.step():
                    with self.lock:
                        self._group_done(g)
        except BaseException as err:  # surfaced by the main thread
            self.error = err
            self.stop.set()

    def _group_done(self, g: Any) -> None:
        ok = sum(t.ok for t in g.trajs)
        self.gate.on_finish(ok, accepted=True)
        self.gate.on_finish(len(g.trajs) - ok, accepted=False)  # failed: slots come back
        self.groups.put(g)

    def unfinished(self) -> int:
        """Trajectories admitted but not counted when the run stopped: groups queued for the trainer and
        groups with a member still in flight (finished members of those groups included)."""
        open_groups = {id(ep.group): ep.group for ep in self.agent.episodes.values()}
        return sum(len(g.trajs) for g in open_groups.values()) + self.groups.qsize() * self.cfg.group_size

    # ------------------------------------------------------------ trainer thread
    def train(self) -> None:
        torch.set_num_threads(1)
        cfg = self.cfg
        t_start = last = time.perf_counter()
        tok_last = 0
        try:
            for step in range(1, cfg.max_steps + 1):
                batch, stale, failed = [], 0, []
                t_wait = time.perf_counter()
                taken = 0
                while taken < cfg.prompts_per_step:
                    try:
                        g = self.groups.get(timeout=0.1)
                    except queue.Empty:
                        if self.stop.is_set():
                            return
                        continue
                    taken += 1
                    for t in g.trajs:
                        if not t.ok:
                            failed.append(t)
                        elif t.staleness(self.trainer.version) > cfg.staleness:
                            stale += 1
                        else:
                            batch.append(t)
                wait_s = time.perf_counter() - t_wait
                with self.lock:
                    if stale:
                        self.gate.on_discard(stale)
                    self.counts["stale"] += stale
                    self.counts["failed"] += len(failed)
                    self.counts["ok"] += len(batch)
                    for t in failed:
                        self.fail_reasons[t.reason or "unknown"] = self.fail_reasons.get(t.reason or "unknown", 0) + 1
                    self.trained_staleness += [t.staleness(self.trainer.version) for t in batch]
                m: dict[str, Any] = {"step": step}
                if batch:
                    tm = self.trainer.step(batch)
                    m.update({k: tm[k] for k in ("version", "loss", "grad_norm", "clip_fraction", "reward_mean",
                                                 "reward_std", "staleness_mean", "staleness_max")})
                    m["success_rate"] = sum(map(_success, batch)) / len(batch)
                    self.agent.offer_weights(self.trainer.state_dict_snapshot(), self.trainer.version)
                else:  # every trajectory failed or was stale: no update, the run goes on
                    m.update({"version": self.trainer.version, "reward_mean": None, "success_rate": None})
                now = time.perf_counter()
                gen = self.agent.tokens_generated + self.agent.tokens_env
                m.update({"trained": len(batch), "failed": len(failed), "stale": stale,
                          "max_traj_staleness": max((t.staleness(self.trainer.version - (1 if batch else 0))
                                                     for t in batch), default=0),
                          "wait_for_batch_s": round(wait_s, 4), "step_s": round(now - last, 4),
                          "elapsed_s": round(now - t_start, 3),
                          "trajectories_per_s": (len(batch) + len(failed) + stale) / max(now - last, 1e-9),
                          "tokens_per_s": (gen - tok_last) / max(now - last, 1e-9), "layout": self.layout,
                          "failure_reasons": sorted({t.reason for t in failed})[:3]})
                last, tok_last = now, gen
                self.history.append(m)
                with open(self.out_dir / cfg.metrics_file, "a") as f:
                    f.write(json.dumps(m) + "\n")
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    self._log(m)
        except BaseException as err:
            self.error = err
        finally:
            self.stop.set()

    def _log(self, m: dict[str, Any]) -> None:
        r = "   -  " if m["reward_mean"] is None else f"{m['reward_mean']:.3f}"
        s = "  -  " if m["success_rate"] is None else f"{m['success_rate']:.2f}"
        self.console.print(
            f"step {m['step']:>4}/{self.cfg.max_steps}  v{m['version']:<4} reward {r}  success {s}  "
            f"ok/fail/stale {m['trained']}/{m['failed']}/{m['stale']}  "
            f"{m['trajectories_per_s']:.1f} traj/s  {m['tokens_per_s']:.0f} tok/s  "
            f"staleness≤{m['max_traj_staleness']}  " + escape(f"[{m['layout']}]"), highlight=False)


def summarize(history: list[dict[str, Any]], run: Run, wall_s: float) -> dict[str, Any]:
    rewards = [m["reward_mean"] for m in history if m["reward_mean"] is not None]
    k = min(5, len(rewards))

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    st = run.trained_staleness
    return {"name": run.cfg.name, "model": run.cfg.model, "env": run.cfg.env.name, "layout": run.layout,
            "steps": len(history), "final_version": run.trainer.version, "wall_s": round(wall_s, 2),
            "reward_first5": mean(rewards[:k]), "reward_last5": mean(rewards[-k:]) if k else None,
            "success_last5": mean([m["success_rate"] for m in history[-5:] if m["success_rate"] is not None]),
            "trajectories": dict(run.counts), "failure_reasons": dict(run.fail_reasons),
            "trajectories_admitted": run.admitted, "trajectories_unfinished": run.unfinished(),
            "staleness_eta": run.cfg.staleness, "staleness_max": max(st, default=0),
            "staleness_mean": mean([float(x) for x in st]) or 0.0, "layout_decision": run.layout_decision,
            **run.agent.engine_stats()}


def run_training(config_path: Path | None, overrides: dict[str, Any] | None, output: Path | None,
                 console: Console | None = None) -> dict[str, Any]:
    """Run `pearl train`; returns the summary (also saved as summary.json in the run directory)."""
    console = console or Console()
    cfg = load_train_config(config_path, overrides or {})
    out_dir = Path(output or cfg.out_dir or Path("runs") / f"train-{cfg.name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / cfg.metrics_file).write_text("")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    run = Run(cfg, console, out_dir)
    console.print(f"[bold]pearl train[/] {cfg.name}: model {cfg.model}, env {cfg.env.name}, "
                  f"{cfg.max_steps} steps × {cfg.prompts_per_step}×{cfg.group_size} trajectories, "
                  f"η={cfg.staleness}, layout {run.layout} → {out_dir}", highlight=False)
    d = run.layout_decision
    console.print(f"layout {d['requested']} → {d['chosen']}: " + escape(d["reason"])
                  + (escape(f" [{d['perf_model']}]") if "perf_model" in d else ""), highlight=False)
    threads = [threading.Thread(target=run.rollout, name="pearl-rollout", daemon=True),
               threading.Thread(target=run.train, name="pearl-trainer", daemon=True)]
    for t in threads:
        t.start()
    try:
        try:
            threads[1].join()
        finally:
            run.stop.set()
            threads[0].join(timeout=30)
        if run.error is not None:
            raise run.error
        summary = summarize(run.history, run, time.perf_counter() - t0)
    finally:
        if run.backend is not None:  # Ray actors (and Ray itself, if this run started it)
            run.backend.close()
    (out_dir / cfg.summary_file).write_text(json.dumps(summary, indent=1))
    f5, l5 = summary["reward_first5"], summary["reward_last5"]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    console.print(f"[bold]done[/] in {summary['wall_s']:.1f} s: reward first-5 {fmt(f5)} → last-5 {fmt(l5)}; "
                  f"trajectories ok/failed/stale {run.counts['ok']}/{run.counts['failed']}/{run.counts['stale']}; "
                  f"max staleness {summary['staleness_max']} (η={cfg.staleness}); saved {out_dir}", highlight=False)
    return summary
