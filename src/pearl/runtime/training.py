"""`pearl train` from the command line's point of view: the run directory, checkpoints and resume,
the saved policy, clean stops on SIGINT / SIGTERM, and the summary.

`run_training(config, overrides, output, console, resume=None, overwrite=False)`:

- **Run directory**: `--out DIR`, else `out_dir:` from the config, else `runs/<name>-<date>-<time>`
  (a new one per run). A directory that already holds files is refused unless `overwrite` (it is
  then emptied) — a rerun never wipes an earlier run's metrics by accident. The resolved config is
  saved as `config.yaml`.
- **Checkpoints** (`pearl.runtime.checkpoint`) every `checkpoint_every` steps and at the end:
  trainer weights and optimizer, policy version, RNG states, the staleness gate, the step history,
  finished-but-untrained groups with their tokens, the groups in flight (their prompt ids: they are
  started again from their prompts on resume), the controller's decisions. `resume=RUN_DIR` loads the
  newest whole checkpoint of that run (its `config.yaml`, with `overrides` on top, e.g. more
  steps) and continues: the trainer takes groups in prompt-id order, so every step trains the same
  prompts as an uninterrupted run would, none is skipped and none is trained twice.
- **Policy** in Hugging Face format every `save_policy_every` steps (`policy-<step>`) and at the end
  (`policy`).
- **Stops**: SIGINT / SIGTERM ask for a clean stop: the current step finishes, a checkpoint and
  summary.json are written, and `RunInterrupted` carries exit code 130 / 143. A second SIGINT ends
  the process at once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console
from rich.markup import escape

from pearl.config import read_yaml
from pearl.errors import ConfigError, PearlError
from pearl.rl.trajectory import Group, Trajectory
from pearl.runtime.checkpoint import latest_checkpoint, rng_state, save_checkpoint, save_policy, set_rng_state
from pearl.runtime.observe import RunLog
from pearl.runtime.trace import cluster_spans
from pearl.runtime.real import Run
from pearl.runtime.threads import set_interop_threads
from pearl.runtime.train_config import TrainConfig, load_train_config, parse_train_config

__all__ = ["RunInterrupted", "run_training", "summarize"]

SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}


class RunInterrupted(PearlError):
    """A signal stopped the run cleanly (checkpoint and summary written)."""

    def __init__(self, sig: str, message: str):
        super().__init__(message)
        self.exit_code = SIGNAL_EXIT.get(sig, 130)


# ---------------------------------------------------------------- run directory
def _run_dir(cfg: TrainConfig, output: Path | None, overwrite: bool) -> Path:
    if output is None and cfg.out_dir is None:
        base = Path("runs") / f"{cfg.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        out, i = base, 1
        while out.exists():
            out, i = base.with_name(f"{base.name}-{i}"), i + 1
    else:
        out = Path(output or cfg.out_dir)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"run directory {out} is a file")
        if out.exists() and any(out.iterdir()):
            if not overwrite:
                raise ConfigError(f"run directory {out} already holds a run; pass --overwrite to replace it "
                                  f"or --resume {out} to continue it")
            shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run directory {out} cannot be written: {e.strerror or e}") from None
    return out


def _resume_config(run_dir: Path, overrides: dict[str, Any]) -> TrainConfig:
    from pearl.config import deep_merge

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a pearl train run directory)")
    data = deep_merge(read_yaml(path), overrides)
    return parse_train_config(data, str(path) + (" (with overrides)" if overrides else ""))


# ---------------------------------------------------------------- checkpoint state
def snapshot(run: Run, step: int) -> dict[str, Any]:
    """Everything a resumed run needs, taken between two trainer steps."""
    tr = run.trainer
    with run.lock:
        rollout = {"gate_accepted": run.gate.accepted, "counts": dict(run.counts),
                   "fail_reasons": dict(run.fail_reasons), "next_gid": run.next_gid,
                   "next_train_gid": run.next_train_gid, "admitted": run.admitted,
                   "finished": [{"gid": g.gid, "seed": g.seed, "trajs": [t.to_dict() for t in g.trajs]}
                                for g in run.finished.values()],
                   "open": sorted(run.open.items()) + list(run.readmit)}
    return {"step": step, "version": tr.version, "model": tr.model.state_dict(),
            "optimizer": tr.optimizer.state_dict(), "rng": rng_state(), "history": list(run.history),
            "trained_staleness": list(run.trained_staleness), "rollout": rollout,
            "decisions": list(run.control.driver.decisions) if run.control else []}


def restore(run: Run, state: dict[str, Any]) -> None:
    """Put a fresh `Run` where the checkpoint left off (before its threads start)."""
    tr, ro = run.trainer, state["rollout"]
    tr.model.load_state_dict(state["model"])
    tr.optimizer.load_state_dict(state["optimizer"])
    tr.version = state["version"]
    set_rng_state(state["rng"])
    run.history, run.trained_staleness = list(state["history"]), list(state["trained_staleness"])
    run.start_step = run.steps_done = state["step"]
    run.start_step += 1
    run.gate.accepted = ro["gate_accepted"]
    run.counts.update(ro["counts"])
    run.fail_reasons = dict(ro["fail_reasons"])
    run.next_gid, run.next_train_gid = ro["next_gid"], ro["next_train_gid"]
    run.finished = {g["gid"]: Group(g["gid"], len(g["trajs"]), g["seed"], [Trajectory.from_dict(t) for t in g["trajs"]])
                    for g in ro["finished"]}
    run.readmit = [tuple(x) for x in ro["open"]]  # in flight at the checkpoint: start again from the prompt
    run.admitted = ro["admitted"] - len(run.readmit) * run.cfg.group_size
    if run.control is not None:
        run.control.driver.decisions[:0] = state["decisions"]
    run.agent.offer_weights(tr.state_dict_snapshot(), tr.version)  # the engines serve the restored policy


# ---------------------------------------------------------------- signals
class _Signals:
    """SIGINT / SIGTERM ask `run` for a clean stop; a second SIGINT ends the process at once."""

    def __init__(self, run: Run, console: Console):
        self.run, self.console = run, console
        self.old: dict[int, Any] = {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.run.stop_requested and signum == signal.SIGINT:
            os._exit(130)  # the second Ctrl-C: no more waiting
        self.run.stop_requested = name
        self.console.print(f"{name}: stopping after the current step (checkpoint and summary follow; "
                           f"Ctrl-C again to abort at once)", highlight=False, soft_wrap=True)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self.old.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------- the run
def summarize(history: list[dict[str, Any]], run: Run, wall_s: float) -> dict[str, Any]:
    rewards = [m["reward_mean"] for m in history if m["reward_mean"] is not None]
    k = min(5, len(rewards))

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    st = run.trained_staleness
    return {"name": run.cfg.name, "model": run.cfg.model, "env": run.cfg.env.name, "layout": run.layout,
            "steps": len(history), "final_version": run.trainer.version, "wall_s": round(wall_s, 2),
            "stopped_by": run.stop_requested,
            "reward_first5": mean(rewards[:k]), "reward_last5": mean(rewards[-k:]) if k else None,
            "success_last5": mean([m["success_rate"] for m in history[-5:] if m["success_rate"] is not None]),
            "trajectories": dict(run.counts), "failure_reasons": dict(run.fail_reasons),
            "trajectories_admitted": run.admitted, "trajectories_unfinished": run.unfinished(),
            "staleness_eta": run.cfg.staleness, "staleness_max": max(st, default=0),
            "staleness_mean": mean([float(x) for x in st]) or 0.0, "layout_decision": run.layout_decision,
            "trainer_device_wait_max_s": round(max(run.device_waits, default=0.0), 4),
            **dict(zip(("trainer_busy_s", "trainer_cpu_s"), (round(x, 4) for x in getattr(run, "trainer_time", (0, 0))))),
            "controller": run.control.summary(),
            "decisions": run.control.driver.decisions if run.control else [],
            **run.agent.engine_stats()}


def _time_trainer(run: Run) -> None:
    """Sum the wall and the trainer thread's CPU seconds of every GRPO step into `run.trainer_time`
    (summary.json: trainer_busy_s / trainer_cpu_s; their ratio is how much the shared process slowed
    it, which the digital twin reads)."""
    step, run.trainer_time = run.trainer.step, [0.0, 0.0]

    def timed(batch: Any) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return step(batch)
        finally:
            run.trainer_time[0] += time.perf_counter() - w0
            run.trainer_time[1] += time.thread_time() - c0

    run.trainer.step = timed


class _Saver:
    """Checkpoints and policies on the trainer thread, after each step that is due."""

    def __init__(self, run: Run, out_dir: Path):
        self.run, self.out_dir, self.last = run, out_dir, None

    def __call__(self, step: int) -> None:
        cfg = self.run.cfg
        if step % cfg.checkpoint_every == 0:
            self.checkpoint(step)
        if cfg.save_policy_every and step % cfg.save_policy_every == 0:
            save_policy(self.run.trainer.model, self.run.loaded.tokenizer, self.out_dir / f"policy-{step:06d}")

    def checkpoint(self, step: int) -> None:
        if step > 0 and step != self.last:
            save_checkpoint(self.out_dir, step, snapshot(self.run, step), self.run.cfg.keep_checkpoints)
            self.last = step


def _start(config_path: Path | None, overrides: dict[str, Any], output: Path | None, resume: Path | None,
           overwrite: bool) -> tuple[TrainConfig, Path, dict[str, Any] | None]:
    """The config, the run directory and the checkpoint state to resume from (if any)."""
    if resume is None:
        cfg = load_train_config(config_path, overrides)
        out_dir = _run_dir(cfg, output, overwrite)
        (out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return cfg, out_dir, None
    if config_path is not None or output is not None:
        raise ConfigError("--resume continues a run with its saved config and directory: drop CONFIG and --out")
    cfg = _resume_config(Path(resume), overrides)
    got = latest_checkpoint(Path(resume))
    if got is None:
        raise ConfigError(f"--resume {resume}: no whole checkpoint there to continue from")
    path, state = got
    if state["step"] > cfg.max_steps:
        raise ConfigError(f"--resume {resume}: its checkpoint is at step {state['step']}, past max_steps "
                          f"{cfg.max_steps}; raise it (--set max_steps=N) to train further")
    # at max_steps exactly (killed after its last checkpoint): nothing to train, the summary and the
    # policy are written
    lines = [json.dumps(m) for m in state["history"]]  # steps after the checkpoint are trained again
    (Path(resume) / "metrics.jsonl").write_text("".join(x + "\n" for x in lines))
    return cfg, Path(resume), state


def _join(run: Run, threads: list[threading.Thread]) -> None:
    try:
        while threads[1].is_alive():  # a timed join: signal handlers run in between
            threads[1].join(timeout=0.2)
    finally:
        run.stop.set()
        threads[0].join(timeout=30)


def run_training(config_path: Path | None, overrides: dict[str, Any] | None, output: Path | None,
                 console: Console | None = None, resume: Path | None = None,
                 overwrite: bool = False) -> dict[str, Any]:
    """Run `pearl train`; returns the summary (also saved as summary.json in the run directory)."""
    console = console or Console()
    cfg, out_dir, state = _start(config_path, overrides or {}, output, resume, overwrite)
    torch.set_num_threads(1)
    set_interop_threads(cfg.threads.interop or 1)
    t0 = time.perf_counter()
    run = Run(cfg, console, out_dir)
    _time_trainer(run)
    run.log = RunLog(out_dir, resume=state is not None)
    saver = _Saver(run, out_dir)
    run.on_step = saver
    if state is not None:
        restore(run, state)
        saver.last = state["step"]
        console.print(f"resumed {out_dir} at step {state['step']} (policy v{state['version']})", highlight=False)
    console.print(f"[bold]pearl train[/] {cfg.name}: model {cfg.model}, env {cfg.env.name}, "
                  f"{cfg.max_steps} steps × {cfg.prompts_per_step}×{cfg.group_size} trajectories, "
                  f"η={cfg.staleness}, layout {run.layout} → {out_dir}", highlight=False, soft_wrap=True)
    console.print(f"{run.threads.describe()}; dtype trainer {cfg.trainer.dtype}, engines {cfg.engine.dtype}",
                  highlight=False, soft_wrap=True)
    d = run.layout_decision
    console.print(f"layout {d['requested']} → {d['chosen']}: " + escape(d["reason"])
                  + (escape(f" [{d['perf_model']}]") if "perf_model" in d else ""), highlight=False, soft_wrap=True)
    threads = [threading.Thread(target=run.rollout, name="pearl-rollout", daemon=True),
               threading.Thread(target=run.train, name="pearl-trainer", daemon=True)]
    try:
        with _Signals(run, console):
            for t in threads:
                t.start()
            _join(run, threads)
        _close_log(run)
        summary = summarize(run.history, run, time.perf_counter() - t0)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        if run.error is not None:
            raise run.error
        saver.checkpoint(run.steps_done)
        if not run.stop_requested:
            save_policy(run.trainer.model, run.loaded.tokenizer, out_dir / "policy")
    finally:
        run.agent.close()
        if run.backend is not None:  # Ray actors (and Ray itself, if this run started it)
            run.backend.close()
    _report(console, summary, run, out_dir)
    if run.counts["failed"] and not run.counts["ok"] + run.counts["skipped"] and not run.stop_requested:
        why = _top_reason(run)[0]
        raise PearlError(f"no trajectory was trained: all {run.counts['failed']} failed, most often with: {why}")
    if run.stop_requested:
        raise RunInterrupted(run.stop_requested, f"stopped by {run.stop_requested} after step {run.steps_done}; "
                                                 f"checkpoint and summary saved; continue with "
                                                 f"pearl train --resume {out_dir}")
    return summary


def _close_log(run: Run) -> None:
    """The trace's worker role spans (from the run's cluster timeline) and controller decisions, then
    trace.json, TensorBoard and the JSONL files are closed."""
    if run.control is not None:
        cluster_spans(run.control.state.timeline(), run.now(), run.log)
        for d in run.control.driver.decisions:
            run.log.instant(f"{d['rule']}", d["t"], "controller", {"reason": d["reason"], "switch": d["switch"]})
    run.log.close()


def _report(console: Console, summary: dict[str, Any], run: Run, out_dir: Path) -> None:
    f5, l5, c = summary["reward_first5"], summary["reward_last5"], run.counts
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    console.print(f"[bold]done[/] in {summary['wall_s']:.1f} s: reward first-5 {fmt(f5)} → last-5 {fmt(l5)}; "
                  f"trajectories ok/failed/stale/skipped {c['ok']}/{c['failed']}/{c['stale']}/{c['skipped']}; "
                  f"max staleness {summary['staleness_max']} (η={run.cfg.staleness}); saved {out_dir}",
                  highlight=False, soft_wrap=True)
    if c["failed"]:
        why, n = _top_reason(run)
        console.print(f"[yellow]{c['failed']} trajectories failed[/]; most often ({n}): {escape(why)} "
                      f"(all reasons: summary.json failure_reasons)", highlight=False, soft_wrap=True)


def _top_reason(run: Run) -> tuple[str, int]:
    """The most common failure reason of the run and how many trajectories failed with it."""
    return max(run.fail_reasons.items(), key=lambda kv: kv[1])
