"""The role-aware, step-wise scheduler (continuous batching with chunked prefill).

One call to `schedule()` picks the next engine step: decodes first (one token each), then prefill
chunks FIFO within the token budget. KV admission: a request is admitted only when its whole prompt
fits (idle sessions are evicted LRU first); if a decode cannot grow, the newest running request (the
last admitted, possibly the decode itself, never one already in the step's batch) is preempted and
recomputed later from 0 computed tokens. Roles: `mixed` does both; `prefill` only prefills (its
requests are `prefill_only`); `decode` decodes imported requests and recomputes preempted ones.

The real engine drives this one step at a time. The emulated engine (the simulator's) does not call
it: it fast-forwards many identical steps at once and follows most of these rules, not all; its
differences are listed in docs/engines.md ("The emulated engine against `Scheduler`"), and
`tests/engine/test_parity.py` checks the shared ones against this class.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pearl.engine.request import Request, RequestStatus
from pearl.kv.blocks import BlockManager
from pearl.types import Role


@dataclass(slots=True)
class ScheduledBatch:
    items: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens this step)
    n_decode: int = 0
    decode_context: int = 0  # Σ context of decoding requests
    prefill_tokens: int = 0
    prefill_attn: float = 0.0  # Σ l·(c + l/2) over prefill chunks

    def samples(self) -> list[Request]:
        """Requests that get a sampled token after this step (their KV reaches num_tokens)."""
        return [r for r, n in self.items if r.num_computed + n == r.num_tokens]


class Scheduler:
    def __init__(self, role: Role, blocks: BlockManager, max_num_seqs: int = 256,
                 max_batched_tokens: int = 8192):
        self.role = role
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self.evictions = 0  # idle sessions whose KV was evicted to make room

    # ------------------------------------------------------------------ queue changes
    def add(self, req: Request) -> None:
        """Queue a request; a session whose KV this engine retains only computes the new tokens."""
        held = self.blocks.held(req.session)
        if held:
            keep = min(held, req.num_tokens - 1)
            self.blocks.truncate(req.session, keep)
            self.blocks.set_active(req.session)
            req.num_computed = keep
        else:
            req.num_computed = 0
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def finish(self, req: Request, retain: bool = True) -> None:
        """The request is done: keep its session's KV for the next turn (idle, evictable) or free it."""
        self._remove(req)
        req.status = RequestStatus.FINISHED
        self._leave(req, retain)

    def abort(self, req: Request, release: bool = True) -> Request:
        """Take a request out (migration, revocation). Its generated tokens stay on the request; unless
        `release`, its computed KV is retained like a finished turn's."""
        self._remove(req)
        req.status = RequestStatus.ABORTED
        self._leave(req, not release)
        return req

    def _leave(self, req: Request, retain: bool) -> None:
        """Retain exactly the computed KV (idle, evictable; a prefill's unused reservation is freed)."""
        if retain and req.num_computed > 0:
            self.blocks.truncate(req.session, req.num_computed)
            self.blocks.set_idle(req.session)
        else:
            self.blocks.release(req.session)

    def _remove(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> ScheduledBatch | None:
        batch = ScheduledBatch()
        budget = self.max_batched_tokens
        # 1. decodes, oldest first; when KV cannot grow, preempt the newest running request, which
        #    may be this one (never an older one: it may already be in this step's batch). A request
        #    running alone is not preempted: its own blocks would only come back to it.
        for req in list(self.running):
            if req.status is not RequestStatus.RUNNING or not req.decoding:
                continue
            while (not self._room(req.session, req.num_computed + 1) and len(self.running) > 1
                   and req.status is RequestStatus.RUNNING):
                self._preempt(self.running[-1])
            if (req.status is not RequestStatus.RUNNING or budget < 1
                    or not self._room(req.session, req.num_computed + 1)):
                continue
            self.evictions += len(self.blocks.grow(req.session, req.num_computed + 1))
            batch.items.append((req, 1))
            batch.n_decode += 1
            batch.decode_context += req.num_tokens
            budget -= 1
        # 2. prefill chunks: running (partially prefilled) first, then admit waiting FIFO
        for req in self.running:
            if budget <= 0:
                break
            if req.decoding or req.pending <= 0:
                continue
            budget = self._add_chunk(batch, req, budget)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if not self._room(req.session, req.num_tokens):
                break  # FIFO: do not let later requests overtake (no starvation)
            self.waiting.popleft()
            self.evictions += len(self.blocks.grow(req.session, req.num_tokens))  # reserve the whole prompt
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            budget = self._add_chunk(batch, req, budget)
        return batch if batch.items else None

    def _add_chunk(self, batch: ScheduledBatch, req: Request, budget: int) -> int:
        n = min(req.pending, budget)
        batch.items.append((req, n))
        batch.prefill_tokens += n
        batch.prefill_attn += n * (req.num_computed + n / 2)
        return budget - n

    def step_done(self, batch: ScheduledBatch) -> None:
        """Account for a step that ran (sampled tokens were already appended by the engine)."""
        for req, n in batch.items:
            req.num_computed += n

    # ------------------------------------------------------------------ making room
    def _room(self, session: str, tokens: int) -> bool:
        """Whether `session` can hold `tokens`: idle sessions are evicted first (`BlockManager.grow`),
        then the prefixes that queued requests hold, newest first (they then compute from 0, as in the
        emulated engine). Without the second, prefixes pinned by queued requests could leave a lone
        running decode, or the queue's head, no room and nothing to preempt: a stuck engine."""
        if self.blocks.can_grow(session, tokens):
            return True
        for r in reversed(self.waiting):
            if r.session != session and r.num_computed > 0 and self.blocks.held(r.session):
                self.blocks.release(r.session)
                r.num_computed = 0
                self.evictions += 1
                if self.blocks.can_grow(session, tokens):
                    return True
        return False

    # ------------------------------------------------------------------ preemption
    def _preempt(self, req: Request) -> None:
        """Recompute preemption: free the KV, requeue at the front with all its tokens as prompt."""
        self.running.remove(req)
        self.blocks.release(req.session)
        req.num_computed = 0
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        self.preemptions += 1
