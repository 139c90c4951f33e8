"""EmulatedEngine with a fake, constant step time: completion times, chunking, KV capacity,
preemption, abort and prefix reuse, each checked by hand-computed step counts.

`Rig` drives one engine the way the simulator does: arrivals and segment ends in time order, and the
engine's `on_done` only records (follow-up turns are submitted after the engine call returns, as the
simulator's event heap does).
"""
from __future__ import annotations

import math

import pytest

from pearl.engine.emulated import EmulatedEngine
from pearl.engine.request import Request, RequestStatus
from pearl.types import Role
from tests.helpers import deadline

DT = 0.01


class Rig:
    def __init__(self, role: Role = Role.MIXED, kv: int = 10**9, max_num_seqs: int = 256,
                 max_batched_tokens: int = 8192, dt: float = DT, follow=None):
        self.dt = dt
        self.steps: list[tuple[int, int]] = []  # (decode batch, prefill chunk) of each planned segment
        self.done: dict[int, float] = {}  # rid -> completion time
        self.order: list[int] = []
        self.follow = follow  # (req, t) -> next Request of the session or None
        self.later: list[tuple[float, Request]] = []
        self.eng = EmulatedEngine(0, role, self._step_time, kv, max_num_seqs, max_batched_tokens, self._on_done)

    def _step_time(self, B: int, ctx: float, chunk: int, attn: float) -> float:
        self.steps.append((B, chunk))
        return self.dt

    def _on_done(self, eng: EmulatedEngine, req: Request, t: float) -> None:
        self.done[req.rid] = t
        self.order.append(req.rid)
        nxt = self.follow(req, t) if self.follow else None
        if nxt is not None:
            self.later.append((t, nxt))

    def run(self, arrivals=(), until: float = math.inf) -> "Rig":
        """arrivals: (t, request[, submit kwargs]); returns when nothing is left (or at `until`)."""
        todo = sorted(arrivals, key=lambda a: a[0])
        i = 0
        while True:
            while self.later:
                t, req = self.later.pop(0)
                self.eng.submit(req, t)
            ta = todo[i][0] if i < len(todo) else math.inf
            te = self.eng.end_t
            if min(ta, te) > until or min(ta, te) == math.inf:
                return self
            if ta <= te:
                a = todo[i]
                self.eng.submit(a[1], a[0], **(a[2] if len(a) > 2 else {}))
                i += 1
            else:
                self.eng.segment_end(te)




def fresh(rid: int, prompt: int, new: int, session: str | None = None) -> Request:
    return Request(rid, session or f"s{rid}", prompt, new)


def imported(rid: int, ctx: int, decode_steps: int) -> Request:
    """A request whose prefill ran elsewhere: one token sampled, `decode_steps` still to decode."""
    r = Request(rid, f"s{rid}", ctx, 1 + decode_steps)
    r.num_generated = 1
    return r


# ------------------------------------------------------------------ timing
def test_decode_only_batch_finishes_after_k_steps():
    rig = Rig(role=Role.DECODE)
    reqs = [imported(1, 500, 5), imported(2, 900, 10), imported(3, 100, 20)]
    rig.run([(0.0, r, {"kv_ready": True}) for r in reqs])
    assert rig.done == pytest.approx({1: 5 * DT, 2: 10 * DT, 3: 20 * DT})
    assert rig.order == [1, 2, 3]
    for r, k in zip(reqs, (5, 10, 20)):
        assert r.num_generated == r.max_new_tokens and r.num_tokens == {1: 500, 2: 900, 3: 100}[r.rid] + k
    assert rig.eng.tokens_decoded == 5 + 10 + 20 and rig.eng.tokens_prefilled == 0


def test_decode_arrival_joins_at_the_next_step_boundary():
    # The step in flight when a request arrives completes first (continuous batching, no mid-step join).
    rig = Rig(role=Role.DECODE)
    rig.run([(0.0, imported(1, 100, 10), {"kv_ready": True}),
             (0.0333, imported(2, 100, 4), {"kv_ready": True})])
    assert rig.done[1] == pytest.approx(10 * DT)
    assert rig.done[2] == pytest.approx(0.04 + 4 * DT)  # arrived during step 4 (0.03-0.04)


def test_prefill_then_decode_in_a_mixed_engine():
    # 300-token prompt: one prefill step samples the first token, then 9 decode steps.
    rig = Rig()
    r = fresh(1, 300, 10)
    rig.run([(0.0, r)])
    assert rig.done[1] == pytest.approx(10 * DT)
    assert r.num_generated == 10 and r.num_tokens == 310
    assert rig.eng.tokens_prefilled == 300 and rig.eng.tokens_decoded == 9


def test_imported_request_with_nothing_left_to_decode_finishes_at_once():
    rig = Rig(role=Role.DECODE)
    with deadline(2.0):
        rig.run([(0.0, imported(1, 100, 0), {"kv_ready": True})])
    assert rig.done == {1: 0.0}


def test_engine_idle_starts_at_arrival_time():
    rig = Rig(role=Role.DECODE)
    rig.run([(0.0, imported(1, 100, 2), {"kv_ready": True}), (5.0, imported(2, 100, 3), {"kv_ready": True})])
    assert rig.done == pytest.approx({1: 2 * DT, 2: 5.0 + 3 * DT})


# ------------------------------------------------------------------ chunked prefill
def test_chunked_prefill_respects_max_batched_tokens():
    # Alone: 4096 tokens at 1024 per step = 4 steps. Next to one decode, the budget is 1023: 5 steps.
    rig = Rig(max_batched_tokens=1024)
    rig.run([(0.0, fresh(1, 4096, 1))])
    assert rig.done[1] == pytest.approx(4 * DT)
    rig = Rig(max_batched_tokens=1024)
    rig.run([(0.0, imported(1, 50, 100), {"kv_ready": True}), (0.0, fresh(2, 4096, 1))])
    assert rig.done[2] == pytest.approx(5 * DT)
    assert all(B + chunk <= 1024 for B, chunk in rig.steps), rig.steps
    assert rig.eng.tokens_prefilled == 4096


def test_prefill_role_never_decodes():
    rig = Rig(role=Role.PREFILL, max_batched_tokens=1000)
    r = fresh(1, 2500, 50)
    r.prefill_only = True
    rig.run([(0.0, r)])
    assert rig.done[1] == pytest.approx(3 * DT)  # the whole budget goes to prefill
    assert r.num_generated == 1 and rig.eng.tokens_decoded == 0


# ------------------------------------------------------------------ KV capacity
def test_idle_sessions_are_evicted_lru_before_any_preemption():
    rig = Rig(kv=1000)
    a, b, c = fresh(1, 300, 1, "A"), fresh(2, 300, 1, "B"), fresh(3, 350, 100, "C")
    rig.run([(0.0, a), (1.0, b)])
    assert list(rig.eng.idle) == ["A", "B"] and rig.eng.idle_tokens == 600
    # C fits at admission (600 + 350 <= 1000) but outgrows the cache while decoding: A (least
    # recently used) goes, B stays, nothing is preempted.
    rig.run([(2.0, c)])
    assert rig.eng.evictions == 1 and rig.eng.preemptions == 0
    assert "A" not in rig.eng.idle and "B" in rig.eng.idle
    assert c.num_generated == 100 and rig.done[3] == pytest.approx(2.0 + 100 * DT)


def test_preemption_recomputes_and_the_request_completes_with_all_its_tokens():
    rig = Rig(kv=1000)
    r1, r2 = fresh(1, 400, 300), fresh(2, 400, 300)
    rig.run([(0.0, r1), (0.005, r2)])  # r2 arrives during r1's prefill step: r2 is the newer
    assert rig.eng.preemptions >= 1
    for r in (r1, r2):
        assert r.status is RequestStatus.FINISHED
        assert r.num_generated == 300 and r.num_tokens == 700
    assert rig.eng.tokens_prefilled > 800  # the preempted context was prefilled again
    assert rig.order == [1, 2]  # the newest was preempted, the oldest finished first


def test_preemption_victim_is_the_newest_even_when_both_joined_in_the_same_step():
    rig = Rig(kv=1000)
    r1, r2 = fresh(1, 400, 300), fresh(2, 400, 300)
    rig.run([(0.0, r1), (0.0, r2)])  # both prefilled in step 1, both decode from step 2
    assert rig.order == [1, 2]


def test_kv_never_exceeds_capacity():
    rig = Rig(kv=2000, max_batched_tokens=512)
    seen: list[int] = []
    orig = rig.eng.plan

    def plan(t: float) -> None:
        orig(t)
        seen.append(rig.eng.kv_used())

    rig.eng.plan = plan  # type: ignore[method-assign]
    rig.run([(0.01 * i, fresh(i, 200 + 37 * i, 150 + 11 * i)) for i in range(1, 12)])
    assert len(rig.done) == 11 and max(seen) <= 2000


# ------------------------------------------------------------------ abort, prefix reuse, pause
def test_abort_keeps_generated_tokens_and_resumes_elsewhere():
    a = Rig(role=Role.DECODE)
    r = imported(1, 100, 100)
    a.run([(0.0, r, {"kv_ready": True})], until=0.255)
    a.eng.abort(r, 0.255)  # step 26 is in flight: it completes, then the request leaves
    assert r.status is RequestStatus.ABORTED
    assert r.num_generated == 1 + 26 and r.num_tokens == 100 + 26
    assert a.eng.load() == 0 and a.eng.kv_used() == 0
    b = Rig(role=Role.DECODE)
    b.run([(0.26, r, {"kv_ready": True})])  # migrated with its KV: 74 steps left
    assert r.num_generated == 101 and b.done[1] == pytest.approx(0.26 + 74 * DT)


def test_second_turn_prefills_only_the_new_tokens():
    def next_turn(req: Request, t: float):
        return fresh(2, req.num_tokens + 200, 5, req.session) if req.rid == 1 else None

    rig = Rig(follow=next_turn)
    rig.run([(0.0, fresh(1, 1000, 20, "S"))])
    # turn 1: 1000 prompt tokens; turn 2: the 200-token observation plus the last sampled token of turn 1
    # (whose KV was never computed)
    assert rig.eng.tokens_prefilled == 1000 + 200 + 1
    assert rig.done[2] == pytest.approx(20 * DT + 5 * DT)


def test_dropped_session_is_prefilled_again():
    def next_turn(req: Request, t: float):
        if req.rid == 1:
            rig.eng.drop_session(req.session)
            return fresh(2, req.num_tokens + 200, 5, req.session)
        return None

    rig = Rig(follow=next_turn)
    rig.run([(0.0, fresh(1, 1000, 20, "S"))])
    assert rig.eng.tokens_prefilled == 1000 + 1020 + 200


def test_pause_delays_the_next_step_and_sets_the_version():
    rig = Rig(role=Role.DECODE)
    r = imported(1, 100, 10)
    rig.run([(0.0, r, {"kv_ready": True})], until=0.045)
    rig.eng.pause(0.045, 1.0, version=3)  # step 5 finishes, then a weight push until t=1
    rig.run()
    assert rig.eng.version == 3 and rig.done[1] == pytest.approx(1.0 + 5 * DT)
