"""`dataset`: single-turn tasks from data files, graded by a plain Python reward function.

    env:
      name: dataset
      kwargs:
        path: examples/arith.jsonl          # JSONL (one JSON object a line) or Parquet (needs pyarrow)
        reward: examples/arith_reward.py:exact_match   # or an importable 'package.module:function'
        prompt_field: prompt                # the column holding the user message (default "prompt")
        fields: [answer]                    # the columns passed to the reward (default: every column)
        system_prompt: ""                   # optional

One row is one prompt: `reset(seed)` poses row `seed % rows` (so a run with `seed: 0` walks the file in
order, one row per GRPO group), the model answers once, and `step` returns

    reward(completion: str, **fields) -> float

called with the completion's text and the row's `fields` as keyword arguments (a function that takes
`**row` may ignore the ones it does not need). Relative paths are relative to the working directory.

Problems are one-line `ConfigError`s when the environment is built (before any model loads): a
missing or unreadable file, a bad JSONL line, a missing column, a reward that cannot be imported or
that does not accept the row's fields. A reward that raises, or returns something that is not a
finite number (a bool counts as 0 or 1), fails that trajectory with the reason (`TaskError`); the run goes on.
"""
from __future__ import annotations

import inspect
import json
import math
import numbers
import threading
from pathlib import Path
from typing import Any, Callable

from pearl.envs.base import BaseEnv, StepResult, TaskError
from pearl.envs.loader import import_object
from pearl.errors import ConfigError, one_line

_CACHE: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
_LOCK = threading.Lock()


def load_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet file, read once per (file, size, mtime)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"data {path!r}: no such file")
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _read(p, path)
        return _CACHE[key]


def _read(p: Path, label: str) -> list[dict[str, Any]]:
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = _read_jsonl(p, label)
    elif suffix in (".parquet", ".pq"):
        rows = _read_parquet(p, label)
    else:
        raise ConfigError(f"data {label!r}: unknown format {suffix or '(no suffix)'!r}; use .jsonl or .parquet")
    if not rows:
        raise ConfigError(f"data {label!r}: the file has no rows")
    return rows


def _read_jsonl(p: Path, label: str) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"data {label!r}: cannot read ({type(err).__name__}: {one_line(str(err))})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"data {label!r} line {n}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"data {label!r} line {n}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _read_parquet(p: Path, label: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"data {label!r}: reading Parquet needs pyarrow (pip install 'pearl-rl[data]')") from None
    try:
        return pq.read_table(p).to_pylist()
    except Exception as err:  # pyarrow raises its own ArrowInvalid / OSError for a bad file
        raise ConfigError(f"data {label!r}: cannot read Parquet ({type(err).__name__}: {one_line(str(err))})") from None


def load_reward(spec: str) -> Callable[..., Any]:
    """The function 'package.module:function' or 'path/to/file.py:function' names."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"reward: expected 'package.module:function' or 'file.py:function', got {spec!r}")
    fn = import_object(spec.strip(), f"reward {spec.strip()!r}", "function")
    if not callable(fn):
        raise ConfigError(f"reward {spec!r}: is a {type(fn).__name__}, not a function")
    return fn


class DatasetEnv(BaseEnv):
    """One row, one question, one answer graded by the reward function (see the module docstring)."""

    name = "dataset"
    max_turns = 1
    allowed_actions = None
    reward_range = (-math.inf, math.inf)  # the user's function decides

    def __init__(self, path: str, reward: str, prompt_field: str = "prompt", fields: list[str] | None = None,
                 system_prompt: str = ""):
        if not isinstance(system_prompt, str):
            raise ConfigError(f"system_prompt: expected a string, got {type(system_prompt).__name__}")
        self.rows = load_rows(path)
        self.path, self.reward_spec, self.prompt_field = path, reward, prompt_field
        self.fields = self._check_fields(prompt_field, fields)
        self.reward_fn = load_reward(reward)
        self._check_signature()
        self.system_prompt = system_prompt
        self.row: dict[str, Any] | None = None

    def _check_fields(self, prompt_field: str, fields: list[str] | None) -> list[str] | None:
        cols = list(self.rows[0])
        wanted = [prompt_field] + list(fields or [])
        for i, row in enumerate(self.rows):
            missing = [f for f in wanted if f not in row]
            if missing:
                where = f"row {i + 1} has" if i else "has"
                raise ConfigError(f"data {self.path!r}: {where} no column {missing[0]!r}; "
                                  f"columns: {', '.join(map(str, cols))}")
            if not isinstance(row[prompt_field], str) or not row[prompt_field]:
                raise ConfigError(f"data {self.path!r}: row {i + 1}: column {prompt_field!r} must be a "
                                  f"non-empty string, got {row[prompt_field]!r}")
        return None if fields is None else list(fields)

    def _check_signature(self) -> None:
        try:
            sig = inspect.signature(self.reward_fn)
        except (TypeError, ValueError):  # a builtin without a signature: trust it
            return
        try:
            sig.bind("", **self.reward_args(self.rows[0]))
        except TypeError as err:
            raise ConfigError(f"reward {self.reward_spec!r}: does not accept (completion, "
                              f"{', '.join(self.reward_args(self.rows[0]))}): {one_line(str(err))}") from None

    def reward_args(self, row: dict[str, Any]) -> dict[str, Any]:
        return dict(row) if self.fields is None else {f: row[f] for f in self.fields}

    def reset(self, seed: int) -> str:
        self.row = self.rows[seed % len(self.rows)]
        return self.row[self.prompt_field]

    def step(self, model_text: str) -> StepResult:
        if self.row is None:
            raise RuntimeError("step after the episode ended; call reset")
        row, self.row = self.row, None
        spec = self.reward_spec
        try:
            value = self.reward_fn(model_text, **self.reward_args(row))
        except Exception as err:
            raise TaskError(f"reward {spec} raised {type(err).__name__}: {one_line(str(err))}") from err
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise TaskError(f"reward {spec} returned {value!r}, expected a finite number")
        reward = float(value)
        return StepResult(None, reward, True, {"outcome": "correct" if reward >= 1.0 else "graded"})
