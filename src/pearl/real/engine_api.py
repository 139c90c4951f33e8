"""What the runtime and the controller need from a rollout engine: `RolloutEngine`.

Two implementations: `pearl.real.engine.TorchEngine` (our engine: every capability) and
`pearl.real.vllm_engine.VLLMEngine` (vLLM, imported lazily: mixed role only, no KV hand-off). The
agent loop (`pearl.runtime.agent.AgentLoop`) and the real runtime's actuators
(`pearl.runtime.real_control.RealControl`) depend on this protocol only.

The contract, in the terms of one RL rollout:
- token-in/token-out: `add_request(token_ids, params, session=, rid=)` queues one turn of a
  trajectory (`session` = trajectory id; an engine may reuse the KV of the session's earlier turns);
  `submit(req, params, kv)` continues a `Request` that may carry tokens generated elsewhere;
- `step()` runs one engine step and returns the requests that left it as `Output`s: the generated
  tokens with their log-probs (of the distribution actually sampled from) and the weights' version
  each token was sampled under, and a finish reason (eos, stop, length, prefill hand-off, abort);
- `abort(rid)` takes a request out keeping its generated tokens (resubmit it anywhere to continue);
- a role (`mixed`, `prefill`, `decode`) and `set_role`; `roles` says which an engine can serve;
- KV export/import for a hand-off or migration where `supports_kv_transfer` (else `migrate_out`
  returns the request without KV and the context is prefilled again where it lands);
- `update_weights(state_dict, version)`: Hugging Face names, all or some, in place;
- `kv_used()` / `kv_capacity`, `load()` (requests queued or running), `stats` (`EngineStats`);
- `close()`: release what the engine holds (processes, memory) once it is stopped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

from pearl.engine.request import Request
from pearl.types import Role


@dataclass
class Output:
    """A request that left the engine. `req` is the live Request (token_ids = prompt + generated).

    Tokens are never trimmed: a response that ends on a stop string or eos keeps the token that ended
    it, because token-in/token-out RL trains on exactly the sampled tokens."""

    req: Request
    finish_reason: str  # "eos" | "stop" | "length" | "prefill" (hand-off) | "abort"
    kv: Any = None  # prefill role: the prompt's KV (a `KVBlob`) for the decode engine
    stop: str | None = None  # the stop string that matched

    @property
    def rid(self) -> Any:
        return self.req.rid

    @property
    def prompt_len(self) -> int:
        return self.req.num_tokens - self.req.num_generated

    @property
    def token_ids(self) -> list[int]:
        """The generated tokens (all of them, including any generated before a hand-off or migration)."""
        return list(self.req.token_ids[self.prompt_len:]) if self.req.token_ids else []

    @property
    def logprobs(self) -> list[float]:
        return list(self.req.logprobs)

    @property
    def versions(self) -> list[int]:
        return list(self.req.versions)


@dataclass
class Migration:
    """Everything needed to continue a request on another engine; `kv` is None when no KV had been
    computed yet or the engine cannot export it (the context is then prefilled again)."""

    req: Request
    params: Any  # pearl.real.sampling.SamplingParams
    kv: Any  # a KVBlob or None


@dataclass
class EngineStats:
    steps: int = 0
    tokens_prefilled: int = 0
    tokens_decoded: int = 0
    tokens_reused: int = 0  # context tokens whose KV was already here at submit (prefix reuse, import)
    busy_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the stepping thread in those steps (busy_s / cpu_s: waits for cores, GIL)
    finished: int = 0
    aborted: int = 0
    evictions: int = 0  # sessions whose retained KV was evicted to make room (their next turn recomputes)
    kv_imports_dropped: int = 0  # KV handed in (hand-off, migration) with no room for it: recomputed here
    step_log: list[tuple[int, int, int, float]] = field(default_factory=list)  # (n_decode, ctx, prefill, s)
    steps_by_threads: dict[int, int] = field(default_factory=dict)  # torch threads -> steps computed with them


@runtime_checkable
class RolloutEngine(Protocol):
    """A rollout engine as the agent loop and the controller use it (see the module docstring)."""

    wid: int
    role: Role
    roles: tuple[Role, ...]  # the roles it can serve
    supports_kv_transfer: bool  # export_kv / import_kv / migration with KV
    tokenizer: Any  # pearl.real.models.Tokenizer
    stats: EngineStats

    @property
    def version(self) -> int: ...

    @property
    def kv_capacity(self) -> int: ...

    def kv_used(self) -> int: ...

    def load(self) -> int: ...

    def holds(self, session: str) -> int: ...

    def requests(self) -> list[Request]: ...

    def has_work(self) -> bool: ...

    def add_request(self, token_ids: Iterable[int], params: Any = None, *, session: str | None = None,
                    rid: Any = None, kv: Any = None) -> Request: ...

    def submit(self, req: Request, params: Any, kv: Any = None) -> None: ...

    def step(self) -> list[Output]: ...

    def abort(self, rid: Any, keep_kv: bool = False) -> Output: ...

    def migrate_out(self, rid: Any) -> Migration: ...

    def migrate_in(self, m: Migration) -> Request: ...

    def export_kv(self, session: str) -> Any: ...

    def import_kv(self, session: str, blob: Any) -> None: ...

    def drop_session(self, session: str) -> None: ...

    def set_role(self, role: Role | str) -> None: ...

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None: ...

    def close(self) -> None: ...


__all__ = ["EngineStats", "Migration", "Output", "RolloutEngine"]
