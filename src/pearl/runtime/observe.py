"""What a `pearl train` run leaves behind to be looked at: `RunLog`.

    log = RunLog(out_dir, tensorboard=True)
    log.step({"step": 3, "reward_mean": 0.4, ...})          # metrics.jsonl + TensorBoard scalars
    log.samples(3, trajectories, tokenizer, k=4)            # samples.jsonl
    log.span("decode", "role", t0, t1, "worker 1")          # trace.json: a complete event
    log.instant("layout: switch", t, "controller", {...})   # trace.json: an instant
    log.close()                                             # writes trace.json, closes TensorBoard

Files in `out_dir` (created if missing; a new `RunLog` starts metrics.jsonl and samples.jsonl empty):

- `metrics.jsonl`: one JSON object per `step` call, as given (non-finite floats become null, so
  every line is valid JSON);
- `samples.jsonl`: up to `k` trajectories per `samples` call: `Trajectory.to_dict()` (ids, token ids,
  loss mask, behaviour log-probs, per-token policy versions, rewards, status) plus `step`, `reward`
  (the episode return), `text` (all tokens decoded) and `segments` (the text cut where the loss mask
  changes: `{"model": bool, "text": str}`, so prompts/observations and model turns read apart);
- `trajectories.jsonl`: one row per trajectory of every group the trainer took (`trajectories`):
  `step`, `group`, `sample`, `ok`, `reward`, and its shape — `prompt` (tokens before the first model
  token), `responses` (tokens of each model turn), `observations` (tokens between two model turns) and
  `env_s` (seconds each environment step took, as waited); what `pearl.runtime.twin` replays;
- `tensorboard/`: event files (`torch.utils.tensorboard.SummaryWriter`) with one scalar per numeric
  field of each `step` call (nested dicts flattened as `outer/inner`; booleans and strings skipped),
  at global step `metrics["step"]` (else the call count);
- `trace.json`, written by `close`: a Chrome trace (see `pearl.runtime.trace`; open it in Perfetto).
  Times passed to `span`/`instant` are seconds on any common origin (e.g. the controller's
  `WallClock.now`). Tracks "worker N" with `cat="role"` spans named by role, and "trainer" with
  `cat="train"` spans, are what `pearl report` draws as the role timeline;
  `pearl.runtime.trace.cluster_spans(control.state.timeline(), end_s, log)` writes such role spans
  for every worker and device slot from the controller's `ClusterState`.

Every method may be called from several threads at once (the rollout and trainer threads both do):
one lock serialises them. `close` is idempotent; calls after it raise `RuntimeError`.
"""
from __future__ import annotations

import itertools
import json
import math
import threading
import warnings
from pathlib import Path
from typing import Any

from pearl.runtime.trace import Trace

__all__ = ["RunLog", "shape"]


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats -> None, tuples -> lists, unknown objects -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


def _scalars(metrics: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    out = []
    for k, v in metrics.items():
        if isinstance(v, dict):
            out += _scalars(v, f"{prefix}{k}/")
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append((f"{prefix}{k}", float(v)))
    return out


def shape(loss_mask: list[int]) -> dict[str, Any]:
    """A trajectory's shape from its loss mask: `prompt` (tokens before the first model token),
    `responses` (each run of model tokens), `observations` (the non-model runs between two of them)."""
    runs = [(m, sum(1 for _ in g)) for m, g in itertools.groupby(loss_mask)]
    prompt = runs[0][1] if runs and runs[0][0] == 0 else 0
    first = next((i for i, (m, _) in enumerate(runs) if m == 1), len(runs))
    resp = [n for m, n in runs if m == 1]
    obs = [n for m, n in runs[first:] if m == 0][:max(len(resp) - 1, 0)]
    return {"prompt": prompt, "responses": resp, "observations": obs}


def _decode(tokenizer: Any, ids: list[int]) -> str | None:
    if tokenizer is None or not ids:
        return None if tokenizer is None else ""
    return str(tokenizer.decode(ids))


def _segments(tokenizer: Any, ids: list[int], mask: list[int]) -> list[dict[str, Any]]:
    """The token ids cut where the loss mask changes, each run decoded."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append({"model": bool(mask[start]), "text": _decode(tokenizer, ids[start:i])})
            start = i
    return out


class RunLog:
    """Metrics, sample trajectories, TensorBoard scalars and a Chrome trace of one run."""

    def __init__(self, out_dir: Path, tensorboard: bool = True, resume: bool = False):
        """`resume`: continue a run's files (a resumed run keeps its metrics and samples so far)."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.samples_path = self.out_dir / "samples.jsonl"
        self.trace_path = self.out_dir / "trace.json"
        self.trajectories_path = self.out_dir / "trajectories.jsonl"
        for p in (self.metrics_path, self.trajectories_path):
            if not resume or not p.exists():
                p.write_text("")
        if not resume or not self.samples_path.exists():
            self.samples_path.write_text("")
        self._lock = threading.Lock()
        self._trace = Trace()
        self._steps = 0
        self._closed = False
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:  # tensorboard is a dependency; a broken install only loses the scalars
                warnings.warn(f"RunLog: no TensorBoard scalars ({err})", stacklevel=2)
            else:
                self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"RunLog for {self.out_dir} is closed")

    def step(self, metrics: dict) -> None:
        """Append `metrics` to metrics.jsonl and write its numeric fields as TensorBoard scalars."""
        line = json.dumps(_clean(metrics))
        with self._lock:
            self._check_open()
            self._steps += 1
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            if self._tb is not None:
                step = metrics.get("step")
                gstep = int(step) if isinstance(step, int) and not isinstance(step, bool) else self._steps
                for tag, v in _scalars(metrics):
                    self._tb.add_scalar(tag, v, global_step=gstep)

    def samples(self, step: int, trajectories: list, tokenizer: Any, k: int = 4) -> None:
        """Append the first `k` of `trajectories` (objects with `to_dict()`, e.g. `Trajectory`) to
        samples.jsonl with their decoded text; `tokenizer` may be None (then no text)."""
        rows = []
        for t in list(trajectories)[:max(0, k)]:
            d = t.to_dict()
            ids, mask = list(d.get("token_ids", [])), list(d.get("loss_mask", []))
            d.update(step=step, reward=float(sum(d.get("rewards", []))), text=_decode(tokenizer, ids),
                     segments=_segments(tokenizer, ids, mask) if len(mask) == len(ids) else [])
            rows.append(json.dumps(_clean(d)))
        with self._lock:
            self._check_open()
            if rows:
                with open(self.samples_path, "a", encoding="utf-8") as f:
                    f.write("".join(r + "\n" for r in rows))

    def trajectories(self, step: int, groups: list) -> None:
        """Append one row per trajectory of `groups` (`Group`s of `Trajectory`s) to trajectories.jsonl."""
        rows = [json.dumps(_clean({"step": step, "group": t.group_id, "sample": t.sample_index, "ok": t.ok,
                                   "reward": t.reward, **shape(t.loss_mask), "env_s": t.info.get("env_s", [])}))
                for g in groups for t in g.trajs]
        with self._lock:
            self._check_open()
            with open(self.trajectories_path, "a", encoding="utf-8") as f:
                f.write("".join(r + "\n" for r in rows))

    def span(self, name: str, cat: str, start_s: float, end_s: float, track: str,
             args: dict | None = None) -> None:
        """A complete event on `track` (one trace thread per track) from `start_s` to `end_s` seconds."""
        with self._lock:
            self._check_open()
            self._trace.span(name, cat, start_s, end_s, track, _clean(args) if args else None)

    def instant(self, name: str, t_s: float, track: str, args: dict | None = None) -> None:
        """An instant event on `track` at `t_s` seconds (e.g. a controller decision)."""
        with self._lock:
            self._check_open()
            self._trace.instant(name, t_s, track, _clean(args) if args else None)

    def close(self) -> None:
        """Write trace.json and close TensorBoard (a second call does nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.trace_path.write_text(json.dumps(self._trace.to_dict()))
            if self._tb is not None:
                self._tb.close()
                self._tb = None

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
