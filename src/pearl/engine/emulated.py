"""The emulated engine: real scheduling state, step times from the performance model.

The policy of `pearl.engine.scheduler.Scheduler`, with a few differences, fast-forwarded: a
*segment* is a run of k identical steps that ends at the next internal event (a prefill finishing, a
decode finishing, the KV cache filling up). Decoding requests are stored lazily (join step, context at
join, finish step) so a segment costs O(log n), not O(batch). The engine never touches the clock: the
simulator passes `t` in and schedules `segment_end` at `self.end_t`.

Where this differs from Scheduler and why (each point, SAME or DIFFERS): docs/engines.md, "The
emulated engine against `Scheduler`"; `tests/engine/test_parity.py` checks the SAME points.
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable

from pearl.engine.chunks import prefill_attn
from pearl.engine.request import Request, RequestStatus
from pearl.types import Role

INF = math.inf


class _Dec:
    __slots__ = ("req", "join", "ctx0", "finish", "alive")

    def __init__(self, req: Request, join: int, ctx0: int, finish: int):
        self.req, self.join, self.ctx0, self.finish, self.alive = req, join, ctx0, finish, True


class EmulatedEngine:
    def __init__(self, wid: int, role: Role, step_time: Callable[[int, float, int, float], float],
                 kv_capacity: int, max_num_seqs: int, max_batched_tokens: int,
                 on_done: Callable[["EmulatedEngine", Request, float], None], version: int = 0):
        self.wid, self.role = wid, role
        self.step_time = step_time
        self.kv_capacity = kv_capacity
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.on_done = on_done
        self.version = version
        self.step = 0
        self.dec: dict[Request, _Dec] = {}
        self.heap: list[tuple[int, int, _Dec]] = []
        self.ctx_base = 0  # Σ (ctx0 − join) over live decodes: context sum = ctx_base + B·step
        self.pre: deque[Request] = deque()  # admitted, prefilling (KV reserved for num_tokens)
        self.pre_reserved = 0  # Σ num_tokens of admitted prefills (their KV is reserved)
        self.pre_pending = 0  # Σ tokens still to prefill
        self.waiting: deque[Request] = deque()
        self.waiting_held = 0  # KV that queued requests already hold (retained prefix, imported KV)
        self._held: dict[Request, int] = {}
        self._pull: dict[Request, tuple[int, Callable[[], int] | None]] = {}  # prefixes a peer holds (`submit`)
        self.incoming_tokens = 0  # KV hand-offs on their way here (the router counts them as load)
        self.idle: OrderedDict[str, int] = OrderedDict()  # retained session KV, LRU first
        self.idle_tokens = 0
        self.paused_until = 0.0
        self.accepting = True
        # current segment
        self.seg_t0, self.seg_k, self.seg_dt, self.seg_chunk = 0.0, 0, 0.0, 0
        self.end_t = INF
        self.gen = 0  # bumps on every re-plan; the simulator drops heap entries of older gens
        self.on_plan: Callable[["EmulatedEngine"], None] | None = None  # told of each new segment end
        self.devices: tuple[int, ...] = ()
        self._seq = 0
        # metrics
        self.busy_s = 0.0
        self.decode_batch_s = 0.0  # ∫ decode batch size dt
        self.tokens_decoded = 0
        self.tokens_prefilled = 0
        self.preemptions = 0
        self.evictions = 0  # sessions whose KV was evicted (their next turn recomputes the context)
        self.finished = 0  # requests finished here

    # ------------------------------------------------------------------ views
    @property
    def n_decode(self) -> int:
        return len(self.dec)

    def load(self) -> int:
        return len(self.dec) + len(self.pre) + len(self.waiting)

    def kv_used(self) -> int:
        return self.ctx_base + len(self.dec) * self.step + self.pre_reserved + self.idle_tokens + self.waiting_held

    def holds(self, session: str) -> int:
        return self.idle.get(session, 0)

    def touch(self, session: str) -> None:
        """Mark a retained session used now (it is the last one eviction takes)."""
        if session in self.idle:
            self.idle.move_to_end(session)

    def requests(self) -> list[Request]:
        return [d.req for d in self.dec.values()] + list(self.pre) + list(self.waiting)

    # ------------------------------------------------------------------ inputs
    def submit(self, req: Request, t: float, kv_ready: bool = False, have: int = 0,
               source: Callable[[], int] | None = None) -> None:
        """Queue a turn. Its KV may already be here: a retained session (prefix reuse), `have` tokens
        a peer holds (`source()`: how many it still holds; None: all `have` for sure), or, with
        `kv_ready`, all of it (imported after prefill / migration)."""
        self.sync(t)
        req.arrival_t = t
        held = self.idle.pop(req.session, 0)
        self.idle_tokens -= held
        # KV held here while queued (a retained prefix, imported KV). A peer's prefix (`have`) is
        # pulled only when the request is admitted (as vLLM's KV connector loads external tokens when
        # its scheduler takes the request), so it holds no memory here yet and stays an ordinary
        # evictable session on the peer: the pull gets what the peer still holds then (`_admit`).
        # Imported KV (kv_ready) likewise lands on admission: until then only the part of the context
        # this worker retained is in its memory (pull-based hand-off: no worker is over-committed).
        here = min(held, req.num_tokens - 1)
        pull = min(have, req.num_tokens - 1)
        req.num_computed = req.num_tokens - 1 if kv_ready else max(here, pull)
        if pull > here and not kv_ready:
            self._pull[req] = (pull, source)
        req.status = RequestStatus.WAITING
        self.waiting.append(req)
        self._held[req] = here
        self.waiting_held += here
        self.plan(t)

    def drop_session(self, session: str) -> None:
        self.idle_tokens -= self.idle.pop(session, 0)

    def abort(self, req: Request, t: float) -> Request:
        """Take a request out, keeping its generated tokens (the caller migrates or resubmits it)."""
        self.sync(t)
        d = self.dec.pop(req, None)
        if d is not None:
            d.alive = False
            self.ctx_base -= d.ctx0 - d.join
            self._materialise(d)
        elif req in self.pre:
            self.pre.remove(req)
            self.pre_reserved -= req.num_tokens
            self.pre_pending -= req.pending
        elif req in self.waiting:
            self.waiting.remove(req)
            self.waiting_held -= self._held.pop(req, 0)
            self._pull.pop(req, None)
        req.status = RequestStatus.ABORTED
        self.plan(t)
        return req

    def abort_all(self, t: float) -> list[Request]:
        self.sync(t)  # first: requests that complete in the step in flight finish, not abort
        reqs = self.requests()
        for r in reqs:
            self.abort(r, t)
        self.idle.clear()
        self.idle_tokens = 0
        return reqs

    def pause(self, t: float, until: float, version: int | None = None) -> None:
        """Stall (weight update, role flip) until `until`; tokens after it carry `version`."""
        self.sync(t)
        self.paused_until = max(self.paused_until, until)
        if version is not None:
            self.version = version
        self.plan(t)

    # ------------------------------------------------------------------ progress
    def sync(self, t: float) -> None:
        """Apply the progress of the current segment up to time t (the step in flight completes)."""
        if self.seg_k == 0 or t <= self.seg_t0:
            return
        j = min(self.seg_k, math.ceil((t - self.seg_t0) / self.seg_dt - 1e-9)) if self.seg_dt > 0 else self.seg_k
        if j <= 0:
            return
        self._apply(j)
        self.seg_t0 += j * self.seg_dt
        self.seg_k -= j
        if self.seg_k == 0:
            self.end_t = INF

    def segment_end(self, t: float) -> None:
        """Called by the simulator at `end_t`."""
        self.sync(t)
        self.plan(max(t, self.seg_t0))

    def _apply(self, j: int) -> None:
        B = len(self.dec)
        dt = self.seg_dt
        self.busy_s += j * dt
        self.decode_batch_s += j * dt * B
        self.tokens_decoded += j * B
        self.step += j
        t_end = self.seg_t0 + j * dt
        # prefill progress, FIFO fluid
        left = j * self.seg_chunk
        while left > 0 and self.pre:
            r = self.pre[0]
            n = min(r.pending, left)
            r.num_computed += n
            self.pre_pending -= n
            left -= n
            self.tokens_prefilled += n
            if r.pending > 0:
                break
            self.pre.popleft()
            self.pre_reserved -= r.num_tokens
            r.num_tokens += 1  # the first token is sampled at the end of prefill
            r.num_generated += 1
            self._prefill_done(r, t_end)
        # decode completions
        heap = self.heap
        while heap and heap[0][0] <= self.step:
            _, _, d = heapq.heappop(heap)
            if not d.alive:
                continue
            d.alive = False
            del self.dec[d.req]
            self.ctx_base -= d.ctx0 - d.join
            self._materialise(d)
            self._finish(d.req, t_end)

    def _materialise(self, d: _Dec) -> None:
        n = self.step - d.join
        d.req.num_tokens = d.ctx0 + n
        d.req.num_generated += n
        d.req.num_computed = d.req.num_tokens - 1

    def _prefill_done(self, r: Request, t: float) -> None:
        if r.prefill_only or r.num_generated >= r.max_new_tokens:
            self._finish(r, t)
        else:
            self._join_decode(r)

    def _join_decode(self, r: Request) -> None:
        r.status = RequestStatus.RUNNING
        left = r.max_new_tokens - r.num_generated
        d = _Dec(r, self.step, r.num_tokens, self.step + left)
        self.dec[r] = d
        self.ctx_base += d.ctx0 - d.join
        self._seq += 1
        heapq.heappush(self.heap, (d.finish, self._seq, d))

    def _finish(self, r: Request, t: float) -> None:
        r.status = RequestStatus.FINISHED
        self.finished += 1
        # keep the session's KV for its next turn (prefix reuse), evictable
        self.idle[r.session] = r.num_tokens - 1
        self.idle_tokens += r.num_tokens - 1
        self.on_done(self, r, t)

    # ------------------------------------------------------------------ planning
    def _free(self) -> int:
        return self.kv_capacity - self.kv_used()

    def _make_room(self, need: int) -> bool:
        free = self._free()  # kept up to date below: each eviction frees exactly what it held
        while free < need and self.idle:
            _, tok = self.idle.popitem(last=False)
            self.idle_tokens -= tok
            free += tok
            self.evictions += 1
        if free < need:  # then the prefixes that queued requests hold, newest first
            for r in reversed(self.waiting):
                here = self._held.get(r, 0)
                if here:
                    self._held[r] = 0
                    self.waiting_held, free = self.waiting_held - here, free + here
                    r.num_computed = self._pull[r][0] if r in self._pull else 0  # (a peer's part stays pullable)
                    self.evictions += 1
                    if free >= need:
                        break
        return free >= need

    def _admit(self, t: float) -> None:
        while self.waiting and len(self.dec) + len(self.pre) < self.max_num_seqs:
            r = self.waiting[0]
            ready = r.pending <= 1 and r.num_generated > 0  # KV already here (imported or resumed)
            if not ready and self.pre_pending >= self.max_batched_tokens:
                break  # as vLLM: a prefill is admitted (and reserves KV) only when a step has room for it
            # A watermark keeps room for the running decodes to grow (as vLLM does), so a request just
            # preempted is not readmitted straight away only to force another preemption (thrash).
            watermark = 16 * len(self.dec) + self.kv_capacity // 100 if not ready else 0
            here = self._held.get(r, 0)
            if not self._make_room(r.num_tokens - here + watermark):
                if len(self.dec) + len(self.pre) == 0 and r.num_tokens > self.kv_capacity:
                    raise MemoryError(f"request of {r.num_tokens} tokens exceeds worker KV capacity "
                                      f"{self.kv_capacity}")
                break
            here = self._held.get(r, 0)
            self.waiting.popleft()
            self.waiting_held -= self._held.pop(r, 0)
            if r in self._pull:  # pull the peer's prefix now: what it still holds (the rest is recomputed)
                pull, source = self._pull.pop(r)
                r.num_computed = max(here, pull if source is None else min(pull, source()))
            if ready and r.num_generated >= r.max_new_tokens:  # nothing left to decode (1-token turn)
                self._finish(r, t)
            elif ready:
                self._join_decode(r)
            else:
                r.status = RequestStatus.RUNNING
                self.pre.append(r)
                self.pre_reserved += r.num_tokens
                self.pre_pending += r.pending

    def _preempt_newest(self) -> bool:
        if not self.dec:
            return False
        d = max(reversed(list(self.dec.values())), key=lambda x: x.join)  # newest; ties: last joined
        d.alive = False
        del self.dec[d.req]
        self.ctx_base -= d.ctx0 - d.join
        self._materialise(d)
        d.req.num_computed = 0
        self.preemptions += 1
        self.waiting.appendleft(d.req)
        return True

    def plan(self, t: float) -> None:
        """Plan the next segment starting at max(t, end of the step in flight, pause end)."""
        self.gen += 1
        t0 = max(t, self.seg_t0, self.paused_until)  # seg_t0: end of the last step applied
        self.seg_k = 0
        self.end_t = INF
        if self.waiting:  # (nothing to admit otherwise; the call costs more than the check)
            self._admit(t0)
        while True:
            B = len(self.dec)
            if B == 0 and not self.pre:
                return
            budget = self.max_batched_tokens - (0 if self.role is Role.PREFILL else B)
            k_p, chunk = INF, 0
            if self.pre and budget > 0:
                head = self.pre[0]
                chunk = min(budget, self.pre_pending)
                k_p = -(-head.pending // budget)
            k_d = (self.heap[0][0] - self.step) if self.heap else INF
            while self.heap and not self.heap[0][2].alive:
                heapq.heappop(self.heap)
                k_d = (self.heap[0][0] - self.step) if self.heap else INF
            grow = B  # prefills reserved their whole prompt's KV at admission; decodes grow by 1
            free = self._free()
            k_kv = free // grow if grow else INF
            k = min(k_p, k_d, k_kv)
            if k >= 1 and k != INF:
                break
            if k == INF:  # nothing can progress (budget exhausted by decodes): should not happen
                raise RuntimeError(f"engine {self.wid} cannot make progress")
            # KV full: evict idle sessions, else preempt the newest decode (recompute later)
            if not self._make_room(grow) and not self._preempt_newest():
                raise MemoryError(f"engine {self.wid}: KV cache too small for one step")
            self._admit(t0)
        k = int(k)
        ctx_mid = self.ctx_base + B * self.step + B * (k - 1) / 2
        self.seg_dt = self.step_time(B, ctx_mid, chunk, prefill_attn(self.pre, chunk, k))
        self.seg_t0, self.seg_k, self.seg_chunk = t0, k, chunk
        self.end_t = t0 + k * self.seg_dt
        if self.on_plan is not None:
            self.on_plan(self)
