"""Per-request state shared by the emulated and the real engine.

"Everything is a chunk": a request holds `num_tokens` tokens of context (prompt + generated) of which
`num_computed` have KV on the engine. Each step it contributes up to `num_tokens - num_computed`
tokens; when its KV reaches `num_tokens` a token is sampled and appended, so a decoding request
contributes exactly one token per step. One request is one turn of a trajectory (`session`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class RequestStatus(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class Request:
    rid: int
    session: str
    num_tokens: int  # context length: prompt (all earlier turns included) + tokens generated so far
    max_new_tokens: int
    num_computed: int = 0
    num_generated: int = 0
    prefill_only: bool = False  # prefill role: done once the prompt's KV exists and one token is sampled
    status: RequestStatus = RequestStatus.WAITING
    arrival_t: float = 0.0
    token_ids: list[int] | None = None  # real engine only
    logprobs: list[float] = field(default_factory=list)  # real engine: one per generated token
    versions: list[int] = field(default_factory=list)  # real engine: policy version per generated token
    meta: Any = None  # the runtime's handle (trajectory, sampling params, ...)

    @property
    def pending(self) -> int:
        """Tokens whose KV is still to compute (1 while decoding)."""
        return self.num_tokens - self.num_computed

    @property
    def decoding(self) -> bool:
        return self.num_generated > 0 and self.pending == 1

    @property
    def done_generating(self) -> bool:
        return self.num_generated >= self.max_new_tokens or (self.prefill_only and self.num_generated >= 1)

    def append_token(self, token: int | None = None, logprob: float = 0.0, version: int = 0) -> None:
        self.num_tokens += 1
        self.num_generated += 1
        if self.token_ids is not None and token is not None:
            self.token_ids.append(token)
            self.logprobs.append(logprob)
            self.versions.append(version)
