"""Pins of the roofline's prefill KV-read term against numbers worked out by hand from the model's shape:
a prefill chunk of l new tokens after c cached ones reads the KV of all c + l tokens."""
import pytest

from pearl.perf import PerfCoeffs, PerfModel, get_hardware, get_model

H100 = get_hardware("h100")
Q8 = get_model("qwen3-8b")

# Qwen3-8B: 36 layers, hidden 4096, 32 query heads, 8 KV heads of dim 128, FFN 12288, vocab 151936, bf16.
# KV per token: K and V × 36 layers × 8 KV heads × 128 dims × 2 bytes.
KV_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # = 147 456 B
# Written per new token: its embedding row (4096 × 2 B, a gather) and its own KV.
WRITE_PER_TOKEN = 4096 * 2 + KV_PER_TOKEN  # = 155 648 B
# Weights read every step, all but the input embedding table (a gather): per layer Q, O (4096 × 4096
# each), K, V (4096 × 1024 each), two RMSNorms (4096 each), gate/up/down (3 × 4096 × 12288); then the
# LM head (151936 × 4096) and the final norm (4096); 2 bytes each.
PER_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 4096 + 3 * 4096 * 12288  # = 192 946 176
WEIGHT_BYTES = (36 * PER_LAYER + 151936 * 4096 + 4096) * 2  # = 15 136 792 576 B
# Round coefficients: 80% of 3.35 TB/s of HBM, KV read at the weight rate, 4 ms of overhead per step
# (the catalogue's fitted ones are checked in test_published.py).
BYTE_RATE = 3.35e12 * 0.8
OVERHEAD_S = 0.004
HAND = PerfCoeffs(mfu=0.5, bw_eff=0.8, step_overhead_s=OVERHEAD_S, kv_eff=1.0)


@pytest.fixture
def pm():
    return PerfModel(Q8, H100, coeffs=HAND)


def prefill_bytes(pm, tokens, cached):
    return pm.step_work(0, 0, tokens, tokens * (cached + tokens / 2))[1]


def test_hand_numbers_match_the_catalogue(pm):
    assert pm.kv_bytes_per_token == KV_PER_TOKEN == 147_456
    assert WEIGHT_BYTES == 15_136_792_576


def test_prefill_chunk_reads_the_cached_prefix_kv(pm):
    # 1000 new tokens after 50 000 cached ones vs after none: the same tokens are written and the same
    # weights read; the only extra traffic is the prefix's KV: 50 000 × 147 456 B = 7.3728 GB.
    extra = prefill_bytes(pm, 1000, 50_000) - prefill_bytes(pm, 1000, 0)
    assert extra == pytest.approx(50_000 * KV_PER_TOKEN, rel=1e-12)
    assert extra == pytest.approx(7.3728e9, rel=1e-12)


def test_prefill_chunk_reads_its_own_kv(pm):
    # With no cache, a 1000-token chunk vs a one-token decode step with no context (the same weights):
    # 999 more tokens written (999 × 155 648 B) and the chunk's own 1000 tokens of KV read
    # (1000 × 147 456 B): 155 492 352 + 147 456 000 = 302 948 352 B.
    extra = prefill_bytes(pm, 1000, 0) - pm.step_work(1, 0)[1]
    assert extra == pytest.approx(999 * WRITE_PER_TOKEN + 1000 * KV_PER_TOKEN, rel=1e-12)
    assert extra == pytest.approx(302_948_352, rel=1e-12)


def test_short_chunk_after_a_long_prefix_is_memory_bound_on_the_kv_read(pm):
    # 16 new tokens after 100 000 cached ones. Bytes: weights 15.137 GB + 16 × 155 648 B written
    # + (100 000 + 16) × 147 456 B of KV read = 14.748 GB: 29.887 GB over 2.68 TB/s = 11.15 ms.
    # FLOPs: body 2 × 6.946e9 × 16 = 2.2e11, attention 4·32·128·36 × 16·100 008 = 9.4e11, LM head
    # 1.2e9: 1.17e12 over 989e12 × 0.5 = 2.4 ms, so the step is memory-bound. + 4 ms overhead.
    nbytes = WEIGHT_BYTES + 16 * WRITE_PER_TOKEN + (100_000 + 16) * KV_PER_TOKEN
    assert nbytes == 29_887_242_240
    flops, got, _ = pm.step_work(0, 0, 16, 16 * (100_000 + 8))
    assert got == pytest.approx(nbytes, rel=1e-12)
    assert flops / (989e12 * 0.5) < 0.003 < nbytes / BYTE_RATE  # memory-bound
    t = pm.prefill_time(16, context_before=100_000)
    assert t == pytest.approx(OVERHEAD_S + nbytes / BYTE_RATE, rel=1e-9)
    assert t == pytest.approx(0.015151, rel=1e-4)
    # With no prefix it is still memory-bound, so the prefix costs exactly its KV read:
    # 100 000 × 147 456 B / 2.68 TB/s = 5.502 ms.
    assert t - pm.prefill_time(16) == pytest.approx(100_000 * KV_PER_TOKEN / BYTE_RATE, rel=1e-9)
    assert t - pm.prefill_time(16) == pytest.approx(0.0055021, rel=1e-4)
