"""`Trajectory`: the one record that carries an agent episode from rollout to the trainer.

A trajectory is a single flat token sequence (prompt, then alternating model responses and
environment observations) with four lists kept aligned, one entry per token:

- `token_ids`   the tokens, in order;
- `loss_mask`   1 for tokens the model generated (trained on), 0 for prompt / environment tokens;
- `logprobs`    the *behaviour* log-prob of each model token (the engine's, at sampling time);
                0.0 for masked tokens;
- `versions`    the policy version each model token was sampled with; -1 for masked tokens.

Token-in/token-out: the engine's token ids are stored as they are, never re-tokenised from text,
so the trainer scores exactly the tokens that were sampled. Per-token versions (not one version per
trajectory) let a trajectory continue across a weight update or a migration to a worker with
newer weights and still be corrected token by token.

The only way to grow the lists is the `append_*` methods, which validate their input and raise
`ValueError` on misuse; so the lists can never drift apart. This module imports no torch, so the
simulator and the controller can use it too. `to_dict` / `from_dict` (and the JSONL helpers) save
rollouts so that the rollout and training halves can be tested and replayed apart.
"""
from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Sequence

SCHEMA = 1  # bump when the saved format changes
# Engines in low precision may report log-probs a hair above 0; anything clearly positive is a bug.
_LOGPROB_SLACK = 1e-3


class Status(str, Enum):
    RUNNING = "running"  # still being collected
    OK = "ok"  # finished; usable for training
    FAILED = "failed"  # the environment (or the engine) failed; `reason` says why


def _tokens(tokens: Iterable[Any]) -> list[int]:
    out = []
    for t in tokens:
        if isinstance(t, bool) or isinstance(t, float):
            raise ValueError(f"token ids must be integers, got {t!r}")
        try:
            v = operator.index(t)  # accepts int, numpy ints, 0-d integer tensors
        except TypeError:
            raise ValueError(f"token ids must be integers, got {t!r}") from None
        if v < 0:
            raise ValueError(f"token ids must be >= 0, got {v}")
        out.append(v)
    return out


def _logprobs(values: Iterable[Any]) -> list[float]:
    out = []
    for x in values:
        v = float(x)
        if not math.isfinite(v) or v > _LOGPROB_SLACK:
            raise ValueError(f"log-probs must be finite and <= 0, got {v!r}")
        out.append(min(v, 0.0))
    return out


@dataclass
class Trajectory:
    id: str
    group_id: int  # the prompt index: GRPO normalises rewards within a group
    sample_index: int = 0  # which of the group's samples this is
    start_version: int = 0  # the policy version when the trajectory was admitted
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # one per environment step (or just one)
    turns: int = 0  # model turns so far
    status: Status = Status.RUNNING
    reason: str | None = None  # why it failed
    info: dict[str, Any] = field(default_factory=dict)  # JSON-able extras (env name, seed, ...)

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        self._check()

    # ------------------------------------------------------------ growing
    def append_prompt(self, tokens: Sequence[int]) -> None:
        """The initial prompt (system prompt + first observation, chat-formatted)."""
        self._open()
        if self.num_model_tokens:
            raise ValueError(f"trajectory {self.id}: append_prompt after a model turn; use append_env")
        self._extend(_tokens(tokens), 0, None, None)

    def append_model(self, tokens: Sequence[int], logprobs: Sequence[float],
                     version: int | Sequence[int]) -> None:
        """One model response: its tokens, their behaviour log-probs and the policy version, either
        one for the whole response or one per token (an engine may load new weights mid-response)."""
        self._open()
        toks, lps = _tokens(tokens), _logprobs(logprobs)
        if not toks:
            raise ValueError(f"trajectory {self.id}: a model turn needs at least one token")
        if len(toks) != len(lps):
            raise ValueError(f"trajectory {self.id}: {len(toks)} tokens but {len(lps)} log-probs")
        vs = [version] * len(toks) if isinstance(version, int) else list(version)
        if len(vs) != len(toks):
            raise ValueError(f"trajectory {self.id}: {len(toks)} tokens but {len(vs)} versions")
        for v in vs:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"trajectory {self.id}: version must be an int >= 0, got {v!r}")
        if not self.token_ids:
            # Every model token is scored from the logits of the token before it.
            raise ValueError(f"trajectory {self.id}: a model turn needs a prompt before it")
        self._extend(toks, 1, lps, vs)
        self.turns += 1

    def append_env(self, tokens: Sequence[int]) -> None:
        """Tokens the model did not generate after the prompt: observations, chat-template glue."""
        self._open()
        if not self.token_ids:
            raise ValueError(f"trajectory {self.id}: append_env before the prompt; use append_prompt")
        self._extend(_tokens(tokens), 0, None, None)

    def add_reward(self, reward: float) -> None:
        r = float(reward)
        if not math.isfinite(r):
            raise ValueError(f"trajectory {self.id}: reward must be finite, got {reward!r}")
        self.rewards.append(r)

    def finish(self) -> None:
        self._open()
        if not self.num_model_tokens:
            raise ValueError(f"trajectory {self.id}: finished without any model token")
        self.status = Status.OK

    def fail(self, reason: str) -> None:
        """Mark as failed; allowed at any time (also after `finish`, e.g. a late verifier error)."""
        self.status = Status.FAILED
        self.reason = " ".join(str(reason).split()) or "unknown"

    # ------------------------------------------------------------ reading
    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def reward(self) -> float:
        """The episode return: GRPO's scalar reward for this sample."""
        return float(sum(self.rewards))

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def prompt_length(self) -> int:
        """Tokens before the first model token (the whole sequence if there is none)."""
        try:
            return self.loss_mask.index(1)
        except ValueError:
            return len(self.loss_mask)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def min_version(self) -> int:
        """The oldest policy version among the model tokens (`start_version` if there are none)."""
        vs = [v for v in self.versions if v >= 0]
        return min(vs) if vs else self.start_version

    def staleness(self, trainer_version: int) -> int:
        """How many versions the oldest model token lags the trainer (what η bounds)."""
        return trainer_version - self.min_version

    # ------------------------------------------------------------ saving and replaying
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "id": self.id, "group_id": self.group_id,
            "sample_index": self.sample_index, "start_version": self.start_version,
            "token_ids": list(self.token_ids), "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs), "versions": list(self.versions),
            "rewards": list(self.rewards), "turns": self.turns, "status": self.status.value,
            "reason": self.reason, "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        """Rebuild (and re-validate) a trajectory saved by `to_dict`."""
        d = dict(data)
        schema = d.pop("schema", SCHEMA)
        if schema != SCHEMA:
            raise ValueError(f"trajectory schema {schema!r} is not supported (expected {SCHEMA})")
        names = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"trajectory: unknown keys {unknown}")
        missing = sorted({"id", "group_id"} - set(d))
        if missing:
            raise ValueError(f"trajectory: missing keys {missing}")
        for k in ("token_ids", "loss_mask", "versions"):
            if k in d:
                d[k] = _tokens(d[k]) if k == "token_ids" else [int(v) for v in d[k]]
        if "logprobs" in d:
            d["logprobs"] = [float(v) for v in d["logprobs"]]
        if "rewards" in d:
            d["rewards"] = [float(v) for v in d["rewards"]]
        try:
            d["status"] = Status(d.get("status", Status.RUNNING))
        except ValueError:
            raise ValueError(f"trajectory: unknown status {d.get('status')!r}") from None
        return cls(**d)

    # ------------------------------------------------------------ internals
    def _open(self) -> None:
        if self.status is not Status.RUNNING:
            raise ValueError(f"trajectory {self.id} is {self.status.value}; it cannot grow any more")

    def _extend(self, toks: list[int], mask: int, lps: list[float] | None,
                versions: list[int] | None) -> None:
        self.token_ids.extend(toks)
        self.loss_mask.extend([mask] * len(toks))
        self.logprobs.extend(lps if lps is not None else [0.0] * len(toks))
        self.versions.extend(versions if versions is not None else [-1] * len(toks))

    def _check(self) -> None:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"trajectory {self.id}: {name} has {len(getattr(self, name))} "
                                 f"entries but token_ids has {n}")
        for i, (m, lp, v) in enumerate(zip(self.loss_mask, self.logprobs, self.versions)):
            if m not in (0, 1):
                raise ValueError(f"trajectory {self.id}: loss_mask[{i}] = {m!r}, expected 0 or 1")
            if m == 0 and (lp != 0.0 or v != -1):
                raise ValueError(f"trajectory {self.id}: masked token {i} must have logprob 0.0 "
                                 f"and version -1 (got {lp!r}, {v!r})")
            if m == 1 and (v < 0 or not math.isfinite(lp) or lp > _LOGPROB_SLACK):
                raise ValueError(f"trajectory {self.id}: model token {i} has version {v!r}, "
                                 f"logprob {lp!r}")
        if self.loss_mask and self.loss_mask[0] == 1:
            raise ValueError(f"trajectory {self.id}: the first token cannot be a model token")
        if self.status is Status.FAILED and not self.reason:
            raise ValueError(f"trajectory {self.id}: a failed trajectory needs a reason")
        if not all(math.isfinite(r) for r in self.rewards):
            raise ValueError(f"trajectory {self.id}: rewards must be finite")


def save_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write one JSON object per line; returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), separators=(",", ":")) + "\n")
            n += 1
    return n


def load_jsonl(path: str | Path) -> list[Trajectory]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(Trajectory.from_dict(json.loads(line)))
                except (ValueError, TypeError) as err:
                    raise ValueError(f"{path}:{i}: {err}") from None
    return out


@dataclass(eq=False)
class Group:
    """One prompt's trajectories (a GRPO group) on their way to the trainer, in the simulator and the
    real runtime alike: `trajs` holds the members (finished ones, in the simulator; all, in the agent
    loop), `pending` how many are still running."""

    gid: int
    size: int
    seed: int = 0
    trajs: list[Any] = field(default_factory=list)
    pending: int = 0

    @property
    def min_version(self) -> int:
        """The oldest policy version among the members' tokens."""
        return min(t.min_version for t in self.trajs)
