"""How `pearl train` sizes and lays out its rollout before the run: the memory check, the engine's
performance model on hardware "cpu" (a saved profile, a quick calibration, or the defaults), the
workload's turn shape probed from the environment, the controller's `ControlSetting`, and the
initial layout (`choose_layout`)."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from pearl.control.controller import ControlSetting
from pearl.control.predictor import WorkloadStats
from pearl.errors import ResourceError
from pearl.runtime.train_config import TrainConfig

# Trainer copy: fp32 weights + grads + two AdamW moments; each engine holds one more fp32 copy.
TRAINER_BYTES_PER_PARAM = 16
ENGINE_BYTES_PER_PARAM = 4


def available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not block the run


def model_params(name: str) -> int:
    from pearl.perf.models import get_model

    return get_model(name).params_total


def check_memory(name: str, workers: int, available: int | None = None) -> int:
    """Bytes the run needs; ResourceError when it exceeds the available memory (before loading)."""
    need = model_params(name) * (TRAINER_BYTES_PER_PARAM + workers * ENGINE_BYTES_PER_PARAM)
    avail = available_memory() if available is None else available
    if need > avail:
        raise ResourceError(f"model {name!r} needs about {need / 2**30:.1f} GiB for training plus {workers} "
                            f"engine copies, but only {avail / 2**30:.1f} GiB of memory is available")
    return need


def _perf_model(cfg: TrainConfig, loaded: Any, threads: int = 1) -> tuple[Any, str]:
    """PerfModel of the engine on hardware "cpu" at tp `threads` (its intra-op threads): a saved
    profile (tp 1), else a quick calibration (a reduced sweep, a few seconds at most), else the default
    coefficients. Returns (model, where from)."""
    import torch

    from pearl.perf.hardware import get_hardware
    from pearl.perf.profile import load_profile
    from pearl.perf.roofline import PerfModel
    from pearl.real.profiling import fit_profile, measure_steps, model_shape

    shape = model_shape(loaded.config, cfg.model)
    if cfg.profile and threads == 1:
        prof = load_profile(cfg.profile)  # missing or bad file -> one-line ConfigError
        return prof.perf_model(shape), f"profile {cfg.profile}"
    t0, was = time.perf_counter(), torch.get_num_threads()
    try:
        from pearl.real.engine import TorchEngine

        eng = TorchEngine(loaded, num_threads=threads, seed=cfg.seed)
        big = model_params(cfg.model) > 50_000_000
        samples = measure_steps(eng, decode_batches=(1, 4) if big else (1, 4, 16),
                                contexts=(16, 64) if big else (32, 128), prefill_chunks=(16, 64),
                                decode_steps=2 if big else 3, repeats=1 if big else 2, warmup=not big)
        prof, _ = fit_profile(samples, shape, "cpu", max_rel_error=0.5, tp=threads)
        return prof.perf_model(shape), f"calibrated on {len(samples)} step shapes in {time.perf_counter() - t0:.1f} s"
    except Exception as err:  # a refused fit (or anything else) must not stop the run: use the defaults
        return PerfModel(shape, get_hardware("cpu"), threads), f"default coefficients (calibration failed: {err})"
    finally:
        torch.set_num_threads(was)  # (torch's count is process-wide)


def probe_workload(cfg: TrainConfig, loaded: Any, probe: Any, max_new_tokens: int) -> tuple[WorkloadStats, dict]:
    """The environment's typical trajectory (prompt, turns, observation and response lengths, one
    step's latency) as workload statistics for the controller, and the same numbers as a dict."""
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
    info = {"prompt_tokens": prompt, "response_tokens": max_new_tokens, "observation_tokens": observation,
            "turns": turns, "env_latency_s": round(env_s, 6), "batch": cfg.batch_size * (cfg.staleness + 1)}
    return WorkloadStats.from_samples([spec]), info


def control_setting(cfg: TrainConfig, loaded: Any, stats: WorkloadStats,
                    threads: Any = None) -> tuple[ControlSetting, str]:
    """The controller's view of this run's set-up: one "device" per rollout worker (tp 1), the engine's
    performance model (calibrated when there is a layout to choose), the probed workload. On local
    torch engines with borrowing or two rollout workers, a worker on two devices (tp 2: its own and
    the trainer's, or both rollout cores) too, calibrated at the threads of both (`threads`: the run's
    `ThreadPlan`; 1 + 1 without one). Returns it with where the performance model came from."""
    from pearl.config import EngineConfig
    from pearl.perf.hardware import get_hardware
    from pearl.perf.roofline import PerfModel
    from pearl.real.profiling import model_shape

    # On torch engines a worker on two devices is one engine with the threads of both (tp 2 is intra-op
    # threads, no heads sharded). Borrowing: a lent core can be a second thread of a live worker
    # (`Resize`), weighed against a new worker on it (local engines only: a Ray actor takes seconds to
    # start, so on Ray the lent core is a second thread of an actor on this host, or not lent). Two local
    # rollout workers: one engine on both cores against two engines, with `policy.tps: [1, 2]`
    # (`benchmarks/real_tp_choice.py`: which wins depends on the turn shape).
    local = cfg.backend == "local" and cfg.engine.kind == "torch"
    resize = cfg.policy.borrow and cfg.engine.kind == "torch"
    threads_tp = resize or (local and cfg.rollout_workers == 2 and 2 in (cfg.policy.tps or (1, 2)))
    if cfg.rollout_workers >= 2 or cfg.profile or resize:
        pm, source = _perf_model(cfg, loaded)
    else:
        pm, source = PerfModel(model_shape(loaded.config, cfg.model), get_hardware("cpu")), \
            "default coefficients (1 rollout worker: a single possible layout)"
    models = {1: pm.with_kv_capacity(cfg.engine.kv_capacity_tokens)}  # the engines' KV pool, not the host's
    # On a thread of its own, which ends: after the main thread had run a two-thread OpenMP team, the
    # rollout thread's two-thread steps took 174 ms instead of 130 ms (SmolLM2 calculator, measured).
    if threads_tp:
        got: list = []
        n = threads.engine + (threads.trainer if resize else threads.engine) if threads is not None else 2
        th = threading.Thread(target=lambda: got.append(_perf_model(cfg, loaded, n)), name="pearl-calibrate")
        th.start()
        th.join()
        pm2, src2 = got[0]
        models[2], source = pm2.with_kv_capacity(cfg.engine.kv_capacity_tokens), f"{source}; {n} threads: {src2}"

    def perf_for(tp: int) -> PerfModel:
        if tp not in models:
            raise ResourceError(f"pearl train runs tensor-parallel size {' or '.join(map(str, models))} only "
                                f"(asked for {tp})")
        return models[tp]

    engine = EngineConfig(tp=1, max_num_seqs=cfg.engine.max_num_seqs, max_batched_tokens=cfg.engine.max_batched_tokens)
    setting = ControlSetting(perf_for=perf_for, engine=engine, stats=stats, batch_size=cfg.batch_size,
                             staleness=cfg.staleness, devices_per_node=cfg.rollout_workers,
                             num_kv_heads=0 if threads_tp else pm.model.num_kv_heads, group_size=cfg.group_size, live_resize=resize,
                             lend_starts=cfg.backend == "local")  # a Ray actor starts in seconds, a lend lasts less
    return setting, source


def choose_layout(cfg: TrainConfig, setting: ControlSetting, workload: dict, source: str) -> dict[str, Any]:
    """The initial rollout layout: `cfg.layout` unless it is "auto"; then, with N >= 2 workers, the
    selector's pick between colocated and 1P:(N-1)D on the controller's own setting (the controller
    may move on from there during the run). Returns the decision: requested, chosen, reason, ranked
    (top 3, predicted seconds), the perf model's source and the probed workload."""
    from pearl.control.predictor import BatchState
    from pearl.control.selector import select
    from pearl.types import LayoutShape, Mode

    n = cfg.rollout_workers
    if cfg.layout != "auto":
        return {"requested": cfg.layout, "chosen": cfg.layout, "reason": f"layout {cfg.layout!r} set in the config",
                "ranked": []}
    if cfg.engine.kind == "vllm":
        return {"requested": "auto", "chosen": "colocated", "ranked": [],
                "reason": "engine.kind vllm: mixed workers only (no KV connector for a P:D hand-off on CPU)"}
    if n < 2:
        return {"requested": "auto", "chosen": "colocated",
                "reason": "1 rollout worker: colocated is the only layout (P:D needs rollout_workers >= 2)",
                "ranked": []}
    batch = BatchState.fresh(cfg.batch_size * (cfg.staleness + 1))
    shapes = [LayoutShape.colocated(n, 1), LayoutShape.disaggregated(1, n - 1, 1)]
    sel = select(n, setting.perf_for, setting.engine, setting.stats, batch, shapes=shapes)
    chosen = "colocated" if sel.best.mode is Mode.COLOCATED else "1P:1D"
    preds = ", ".join(f"{shp} {pred.completion_s * 1e3:.0f} ms" for shp, pred, _, _ in sel.ranked)
    reason = f"{sel.reason} [per window of {batch.size} trajectories: {preds}]"
    return {"requested": "auto", "chosen": chosen, "shape": str(sel.best), "reason": reason,
            "ranked": [{"layout": str(shp), "predicted_s": round(pred.completion_s, 4), "score_s": round(score, 4),
                        "bottleneck": pred.bottleneck} for shp, pred, _, score in sel.ranked[:3]],
            "perf_model": source, "workload": workload}
