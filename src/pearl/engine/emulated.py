"""The emulated engine: real scheduling state, step times from the performance model.

The policy of `pearl.engine.scheduler.Scheduler`, with the differences listed below, fast-forwarded: a
*segment* is a run of k identical steps that ends at the next internal event (a prefill finishing, a
decode finishing, the KV cache filling up). Decoding requests are stored lazily (join step, context at
join, finish step) so a segment costs O(log n), not O(batch). The engine never touches the clock: the
simulator passes `t` in and schedules `segment_end` at `self.end_t`.

Where this differs from Scheduler and why
-----------------------------------------
This engine does not call `Scheduler`. Speed: `benchmarks/sim_speed.py` simulates 7.6 million engine
steps per virtual hour (48 engines), in about 2 s; one `schedule()` per step costs 16 µs at 4 decodes
(the run's mean) to 300 µs at 128, i.e. minutes per virtual hour, far from >= 1000x real time.
Results: the points marked DIFFERS below would change every simulated result (the golden runs must
stay byte-identical). `tests/engine/test_parity.py` checks the points marked SAME against Scheduler.
- Step composition, SAME: each decode adds one token, then prefill chunks FIFO fill the rest of the
  budget; a token is sampled in the step a request's KV reaches its context. (Scheduler skips decodes
  past the budget, this engine never does: they differ only if max_num_seqs > max_batched_tokens.)
- Chunked-prefill budget, SAME: decode + prefill tokens <= max_batched_tokens in every step; planned
  here as a FIFO fluid over a segment that ends when the head prefill completes, which gives the chunks
  of step-wise scheduling, the leftover of its last step included (to the next *admitted* prefill).
- Admission order, SAME: one FIFO queue, the head blocks those behind it (no overtaking), preempted
  requests go back to its front; at most max_num_seqs requests decode or prefill.
- Admission timing, DIFFERS: Scheduler admits in every step that has budget left after the decodes and
  running prefills; here only when a segment is planned, while the admitted prefill work is below
  max_batched_tokens (decodes not deducted). Why: a segment's admissions are decided once, when it is
  planned; handing a long prefill's last-step leftover to a queued request would take one more segment
  boundary per long prefill and change the simulated results (a known gap: the xfail parity tests).
  Effect: that leftover is lost, and a prefill may reserve its KV a few steps before its first chunk.
- KV granularity, DIFFERS: Scheduler counts blocks of block_size tokens; here tokens (under one block
  per sequence apart). Why: a segment's decode KV must grow linearly with its steps.
- KV reservation, SAME rule (a prefill reserves its whole context at admission, a decode grows one token
  a step) with two DIFFERENCES: a watermark at admission (16 tokens per running decode + 1% of capacity;
  why: no thrash, a request just preempted is not readmitted to be preempted again), and a decode's KV
  is counted as its context length (num_tokens, what fast-forward tracks as ctx_base + B·step), i.e.
  including the position its next step computes, so KV runs out one step earlier here than in
  Scheduler, which grows each decode just before its step.
- Idle-session eviction, SAME: retained sessions go least recently used first, before any preemption,
  never the one being grown. DIFFERS: if that is not enough, the prefixes retained by *queued* requests
  go too (newest first; they then compute from 0); Scheduler never evicts them (they are active). Why:
  otherwise prefixes held by queued turns can starve the queue's head with nothing running to free KV
  (in TorchEngine that is an error: the engine reports it is stuck).
- Preemption, SAME victim in the common case, the newest: Scheduler preempts the last admitted running
  request (possibly a prefill, or the decode that cannot grow; never a request running alone); here
  the decode that joined decoding last, even alone (prefills are never victims: their KV is reserved).
  Prefills complete FIFO, so join order is admission order, except for imported KV (joins at once). SAME
  after: its KV is freed, it restarts from 0 computed tokens at the queue's front, the older keep theirs.
  The trigger differs: per decode (oldest first) in Scheduler, here when free KV cannot cover one step
  of all decodes.
- Prefix reuse, SAME: a turn of a session retained here computes only what lies beyond
  min(held, context - 1). TorchEngine first cuts the session to the prefix its token ids share; here a
  turn always extends its session (no ids). Here only: `have` tokens from a peer, and `kv_ready`.
- Roles, SAME: no role rule in Scheduler (it only records the role); prefill-role requests are
  `prefill_only` and finish with the token sampled at the end of prefill; preempted requests recompute
  where they are. DIFFERS for imported KV (decode role, migration): Scheduler admits the request through
  its prefill path (a one-token chunk, counted as prefill, gated by the budget); here it joins the
  decodes at admission, ungated, and finishes at once if nothing is left to generate (Scheduler runs
  one more step). Why: the step-time model prices it as the decode it is. The prefill role's budget
  here ignores decodes (it has none unless given imported KV).
- Leaving: finish SAME (the session's context - 1 tokens are retained idle, most recently used); abort
  DIFFERS: here the request's KV is always dropped (the simulator carries KV explicitly), while
  Scheduler may retain it (`TorchEngine.abort(keep_kv=True)`).
- Step time (not a policy): priced once per segment, at its mean decode context and its mean prefill
  attention (`pearl.engine.chunks.prefill_attn`: a prompt longer than a step's budget attends to a
  prefix that grows by a chunk each step). Until 2026-12-07 every step was priced at the first
  step's attention, which under-priced a 27k-token recompute's attention 2.7x and made swe's
  batches up to 25% short.
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

    def requests(self) -> list[Request]:
        return [d.req for d in self.dec.values()] + list(self.pre) + list(self.waiting)

    # ------------------------------------------------------------------ inputs
    def submit(self, req: Request, t: float, kv_ready: bool = False, have: int = 0) -> None:
        """Queue a turn. Its KV may already be here: a retained session (prefix reuse), `have` tokens
        fetched from a peer, or, with `kv_ready`, all of it (imported after prefill / migration)."""
        self.sync(t)
        req.arrival_t = t
        held = self.idle.pop(req.session, 0)
        self.idle_tokens -= held
        # KV held here while queued (a retained prefix, imported KV); a prefix fetched from a peer
        # (`have`) is pulled in only when the request is admitted, so it holds no memory yet.
        # Imported KV (kv_ready) likewise lands on admission: until then only the part of the context
        # this worker retained is in its memory (pull-based hand-off: no worker is over-committed).
        here = min(held, req.num_tokens - 1)
        req.num_computed = req.num_tokens - 1 if kv_ready else max(here, min(have, req.num_tokens - 1))
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
                    r.num_computed = 0
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
