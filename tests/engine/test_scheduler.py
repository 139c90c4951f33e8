"""The step-wise Scheduler on its own (no torch): the token budget of a step and the preemption victim.

Each test drives `schedule()` / `step_done()` by hand, sampling a token for every request the batch
completes (as the real engine does), and checks the block accounting after every step.
"""
from __future__ import annotations

from pearl.engine.request import Request, RequestStatus
from pearl.engine.scheduler import ScheduledBatch, Scheduler
from pearl.kv.blocks import BlockManager
from pearl.types import Role


def run_step(s: Scheduler) -> ScheduledBatch | None:
    batch = s.schedule()
    if batch is not None:
        sampled = batch.samples()
        for r in sampled:
            r.append_token()
        s.step_done(batch)
        for r in sampled:
            if r.done_generating:
                s.finish(r)
    s.blocks.check()
    return batch


def prefill_sizes(batch: ScheduledBatch) -> list[int]:
    return [n for r, n in batch.items if not (n == 1 and r.decoding)]


# ------------------------------------------------------------------ token budget
def test_a_long_prompt_is_prefilled_in_budget_sized_chunks():
    s = Scheduler(Role.MIXED, BlockManager(10_000, 16), max_batched_tokens=1024)
    r = Request(1, "a", 3000, 5)
    s.add(r)
    chunks = []
    while r.num_generated == 0:
        batch = run_step(s)
        assert batch.n_decode + batch.prefill_tokens <= 1024
        chunks.append(batch.prefill_tokens)
    assert chunks == [1024, 1024, 952]  # exactly 3 steps
    assert r.num_computed == 3000 and r.num_tokens == 3001 and r.decoding


def test_decodes_and_prefill_chunks_share_the_budget():
    s = Scheduler(Role.MIXED, BlockManager(10_000, 16), max_batched_tokens=1024)
    d1, d2 = Request(1, "d1", 10, 50), Request(2, "d2", 10, 50)
    s.add(d1)
    s.add(d2)
    run_step(s)  # both prompts in one step; from now on both decode
    assert d1.decoding and d2.decoding
    r = Request(3, "a", 3000, 5)
    s.add(r)
    steps = []
    while r.num_generated == 0:
        batch = run_step(s)
        assert batch.n_decode == 2 and batch.n_decode + batch.prefill_tokens <= 1024
        steps.append(batch.prefill_tokens)
    assert steps == [1022, 1022, 956]  # 3 steps: the decodes take 2 tokens of each step's budget


# ------------------------------------------------------------------ preemption
def _two_decoding(num_blocks: int, p1: int, p2: int) -> tuple[Scheduler, Request, Request]:
    """Two requests admitted in this order and prefilled in one step; both decode from then on."""
    s = Scheduler(Role.MIXED, BlockManager(num_blocks, 16), max_batched_tokens=1024)
    old, new = Request(1, "old", p1, 100), Request(2, "new", p2, 100)
    s.add(old)
    s.add(new)
    run_step(s)
    assert old.decoding and new.decoding and s.running == [old, new]
    return s, old, new


def _assert_new_preempted(s: Scheduler, old: Request, new: Request) -> None:
    assert s.preemptions == 1
    assert s.running == [old] and list(s.waiting) == [new]
    assert new.status is RequestStatus.WAITING and new.num_computed == 0  # recomputed from scratch
    assert s.blocks.held("new") == 0 and "new" not in s.blocks.tokens
    assert s.blocks.held("old") == old.num_computed == old.num_tokens - 1  # the older keeps its KV


def test_the_older_request_cannot_grow_the_later_admitted_one_is_preempted():
    # 4 blocks of 16: "old" (32 tokens) and "new" (20) hold 2 + 2. After the prefill step "old" holds
    # 33 tokens and needs a third block: none is free, so "new" (admitted later) is preempted.
    s, old, new = _two_decoding(4, 32, 20)
    batch = run_step(s)
    assert [r for r, _ in batch.items] == [old]
    _assert_new_preempted(s, old, new)


def test_the_later_request_cannot_grow_it_is_preempted_not_the_older_one():
    # 5 blocks: both hold 2; the free block goes to "old" (oldest first) and "new", which also needs a
    # third block, is preempted itself; "old", already scheduled in this step, keeps its KV.
    s, old, new = _two_decoding(5, 32, 32)
    batch = run_step(s)
    assert [r for r, _ in batch.items] == [old]
    _assert_new_preempted(s, old, new)


def test_a_preempted_request_is_recomputed_first_and_completes():
    # 10 blocks: both decode until the cache is full, "new" is preempted, "old" finishes (131 tokens,
    # 9 blocks, retained idle) and is evicted when "new" is admitted again with its whole context.
    s, old, new = _two_decoding(10, 32, 32)
    for _ in range(1000):
        if not s.has_work():
            break
        assert run_step(s) is not None
    assert s.preemptions >= 1
    for r in (old, new):
        assert r.status is RequestStatus.FINISHED and r.num_generated == 100


# ------------------------------------------------------------------ leaving
def test_abort_keeping_kv_retains_exactly_the_computed_tokens():
    s = Scheduler(Role.MIXED, BlockManager(100, 16), max_batched_tokens=100)
    r = Request(1, "a", 250, 5)
    s.add(r)
    run_step(s)  # admission reserved all 250 tokens; 100 are computed
    assert s.blocks.held("a") == 250 and r.num_computed == 100
    s.abort(r, release=False)
    s.blocks.check()
    assert s.blocks.held("a") == 100 and "a" in s.blocks.idle  # retained, evictable
    again = Request(1, "a", 250, 5)
    s.add(again)
    assert again.num_computed == 100 and "a" not in s.blocks.idle
    s.abort(again)  # released
    assert s.blocks.held("a") == 0 and s.blocks.used_blocks == 0


def test_prefixes_held_by_queued_requests_give_way_so_the_engine_never_sticks():
    """Queued requests that found their session's KV retained pin it; when a lone running decode (or
    the queue's head) then has no room, those prefixes are evicted, newest first (they compute from
    0), as the emulated engine does. Before, the engine stopped with "needs KV for N tokens but the
    engine holds M" although M was far larger than N."""
    s = Scheduler(Role.MIXED, BlockManager(12, 16), max_batched_tokens=512)  # 192 tokens
    for sid in ("b", "c"):  # two sessions finish a turn and keep 64 tokens each (8 blocks)
        r = Request(0, sid, 64, 1)
        s.add(r)
        while s.has_work():
            run_step(s)
    lone = Request(1, "a", 60, 100)  # 4 blocks: all that is left; it must grow to 160 tokens
    s.add(lone)
    run_step(s)
    nxt_b, nxt_c = Request(2, "b", 80, 5), Request(3, "c", 80, 5)  # next turns: their prefixes are pinned
    s.add(nxt_b)
    s.add(nxt_c)
    assert nxt_b.num_computed == 64 and nxt_c.num_computed == 64
    for _ in range(2000):
        if not s.has_work():
            break
        assert run_step(s) is not None, "stuck: nothing scheduled with work queued"
    assert all(r.status is RequestStatus.FINISHED for r in (lone, nxt_b, nxt_c))
    assert s.evictions >= 1
