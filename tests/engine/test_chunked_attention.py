"""A prompt longer than a step's token budget is prefilled in chunks, and each chunk attends to the
prompt's prefix so far: its attention grows step by step. The emulated engine plans several steps as
one segment; the step time it prices must be the mean over those steps, not the first step's.

Step time here is proportional to the attention alone (token pairs), so completion times check the
attention the engine priced against a sum computed by hand, chunk by chunk.
"""
from __future__ import annotations

import pytest

from pearl.engine.chunks import prefill_attn
from pearl.engine.emulated import EmulatedEngine
from pearl.engine.request import Request
from pearl.types import Role

PER_PAIR = 1e-9  # seconds per attended token pair
BUDGET = 8192


def run(prompts: list[int], role: Role = Role.PREFILL) -> dict[int, float]:
    """Prefill `prompts` (all arriving at t=0, in order) on one engine; completion time per request."""
    done: dict[int, float] = {}
    eng = EmulatedEngine(0, role, lambda B, ctx, chunk, attn: 1e-6 + PER_PAIR * attn, 10**9, 256, BUDGET,
                         lambda e, r, t: done.__setitem__(r.rid, t))
    for i, n in enumerate(prompts, 1):
        r = Request(i, f"s{i}", n, 1)
        r.prefill_only = role is Role.PREFILL
        eng.submit(r, 0.0)
    while eng.end_t != float("inf"):
        eng.segment_end(eng.end_t)
    return done


def by_hand(prompts: list[int]) -> list[float]:
    """Step by step: each step takes up to BUDGET tokens of one prompt, each token attending to its
    prompt's prefix so far. A prompt behind one that fills the step waits for it (the engine admits a
    prefill only while the admitted ones hold less than a step's budget), so they go one at a time."""
    done_at, t = [], 0.0
    for n in prompts:
        computed = 0
        while computed < n:
            take = min(BUDGET, n - computed)
            t += 1e-6 + PER_PAIR * take * (computed + take / 2)
            computed += take
        done_at.append(t)
    return done_at


def test_a_long_prompt_costs_the_attention_of_every_chunk():
    # 4 chunks: 8192 · (4096 + 12288 + 20480 + 28672) pairs = 0.537 s; the first chunk's four times: 0.134 s
    done = run([4 * BUDGET])
    assert done[1] == pytest.approx(by_hand([4 * BUDGET])[0], rel=1e-6)
    assert done[1] == pytest.approx(BUDGET * (4096 + 12288 + 20480 + 28672) * PER_PAIR, rel=1e-3)


def test_the_prompts_behind_a_long_one_are_priced_from_their_own_prefix():
    prompts = [20_000, 10_000, 3_000]
    done = run(prompts)
    assert [done[i + 1] for i in range(3)] == pytest.approx(by_hand(prompts), rel=1e-6)


def test_a_mixed_worker_prices_its_chunks_the_same_way():
    # no decodes running, so a mixed worker's budget is the whole step's too
    done = run([3 * BUDGET + 100], role=Role.MIXED)
    assert done[1] == pytest.approx(by_hand([3 * BUDGET + 100])[0], rel=1e-6)


def test_the_mean_over_a_segment_counts_the_prompts_admitted_behind_the_head():
    # A head of 24,000 tokens (4,000 already computed: 20,000 to go) and a prompt of 6,000 behind it,
    # both admitted: 3 steps of 8192, the head filling two and ending in the third, where the second
    # prompt takes the rest of the step. Priced by hand, step by step.
    head, nxt = Request(1, "a", 24_000, 1), Request(2, "b", 6_000, 1)
    head.num_computed = 4_000
    steps = [BUDGET * (4_000 + BUDGET / 2), BUDGET * (4_000 + BUDGET + BUDGET / 2)]
    rest = 20_000 - 2 * BUDGET  # the head's last piece
    steps.append(rest * (4_000 + 2 * BUDGET + rest / 2) + (BUDGET - rest) * (BUDGET - rest) / 2)
    assert prefill_attn([head, nxt], BUDGET, 3) == pytest.approx(sum(steps) / 3)
    # a segment cut short (a decode ends first) averages the steps it has: the head's two
    assert prefill_attn([head, nxt], BUDGET, 2) == pytest.approx(sum(steps[:2]) / 2)
    # one step: the first step's chunk
    assert prefill_attn([head, nxt], BUDGET, 1) == pytest.approx(steps[0])
