"""A prefix a peer holds (`EmulatedEngine.submit(have=, source=)`): pulled when the request is admitted,
as much of it as the peer still holds then; and `touch`, which keeps a session the longest.

Checked by hand-computed step counts on `tests.engine.test_emulated.Rig` (constant step time DT).
"""
from __future__ import annotations

import pytest

from pearl.types import Role
from tests.engine.test_emulated import DT, Rig, fresh


@pytest.mark.parametrize("still_held, prefilled, done", [
    (1500, 1000 + 500, 0.10 + 5 * DT),  # the peer kept it: only the 500 new tokens are prefilled
    (0, 1000 + 2000, 0.10 + 20 * DT),  # evicted while the turn waited: the whole context again
])
def test_the_pull_gets_what_the_peer_holds_at_admission_not_at_submit(still_held, prefilled, done):
    # One sequence at a time, 100 tokens a step: X prefills for 10 steps while R waits behind it.
    rig = Rig(role=Role.PREFILL, max_num_seqs=1, max_batched_tokens=100)
    peer = [1500]  # what the peer holds of R's session
    calls: list[float] = []

    def source() -> int:
        calls.append(rig.eng.seg_t0)
        return peer[0]

    r = fresh(2, 2000, 1, "S")
    rig.run([(0.0, fresh(1, 1000, 1, "X")), (0.001, r, {"have": 1500, "source": source})], until=0.05)
    assert calls == []  # not asked at submit: R has not been admitted yet
    peer[0] = still_held
    rig.run()
    assert len(calls) == 1 and calls[0] == pytest.approx(0.10)  # asked once, when X's prefill ended
    assert rig.eng.tokens_prefilled == prefilled
    assert rig.done[2] == pytest.approx(done)


def test_a_prefix_known_to_be_held_needs_no_source():
    rig = Rig(role=Role.PREFILL, max_batched_tokens=100)
    rig.run([(0.0, fresh(1, 2000, 1, "S"), {"have": 1500})])
    assert rig.eng.tokens_prefilled == 500 and rig.done[1] == pytest.approx(5 * DT)


def test_evicting_a_waiting_turns_own_prefix_keeps_the_peers_part():
    # KV 3000 (watermark 30), one sequence at a time, 100 tokens a step.
    rig = Rig(role=Role.PREFILL, kv=3000, max_num_seqs=1, max_batched_tokens=100)
    rig.run([(0.0, fresh(1, 300, 1, "S"))])  # S's first turn: 300 tokens retained here (3 steps)
    assert dict(rig.eng.idle) == {"S": 300}
    r = fresh(4, 2000, 1, "S")  # S's next turn: a peer holds 1500 of its 2000 tokens
    rig.run([(1.0, fresh(2, 1000, 1, "X")),  # running, 10 steps
             (1.001, fresh(3, 2900, 1, "H")),  # waits ahead of R
             (1.002, r, {"have": 1500, "source": lambda: 1500})])  # R waits, holding S's 300 here
    # X ends at 1.10; admitting H (2900 + 30) evicts X's retained 1000, then the newest queued
    # prefix, R's 300. R still pulls the peer's 1500 when it is admitted after H (29 steps): it
    # prefills 500 tokens, not 2000.
    assert rig.eng.tokens_prefilled == 300 + 1000 + 2900 + 500
    assert rig.done[4] == pytest.approx(1.10 + 29 * DT + 5 * DT)


def test_a_touched_session_is_evicted_last():
    rig = Rig(kv=1000)
    rig.run([(0.0, fresh(1, 300, 1, "A")), (1.0, fresh(2, 300, 1, "B"))])
    rig.eng.touch("A")  # A is now the most recently used
    rig.eng.touch("nobody")  # (a session not held here: nothing to do)
    rig.run([(2.0, fresh(3, 350, 100, "C"))])  # outgrows the cache: one idle session goes
    assert rig.eng.evictions == 1 and "A" in rig.eng.idle and "B" not in rig.eng.idle
