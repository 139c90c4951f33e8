"""Roofline step times against numbers worked out by hand (derivations in the comments)."""
import time

import pytest

from pearl.errors import ResourceError, UnknownNameError
from dataclasses import replace

from pearl.perf import PerfCoeffs, PerfModel, get_hardware, get_model

H100 = get_hardware("h100")
Q8 = get_model("qwen3-8b")
MOE = get_model("qwen3-30b-a3b")
EMBED_8B = 151936 * 4096  # 0.6223B params per vocab matrix
# Round coefficients for the hand derivations below (the catalogue's fitted ones are checked in
# test_published.py): mfu 0.5, bw_eff 0.8, 4 ms per step, a ring all-reduce at 5 us per hop (10 us per
# all-reduce at tp=2), KV and experts read at the weight rate.
HAND = PerfCoeffs(mfu=0.5, bw_eff=0.8, step_overhead_s=0.004, allreduce="ring", allreduce_latency_s=5e-6, kv_eff=1.0,
                  expert_eff=1.0)


@pytest.fixture
def pm():
    return PerfModel(Q8, H100, coeffs=HAND)


def test_kv_bytes(pm):
    assert pm.kv_bytes_per_token == 147_456 == 2 * 36 * 8 * 128 * 2


def test_decode_batch64_ctx4096(pm):
    # Bytes: weights except the input-embedding table (a gather) = (8.1907B - 0.6223B)·2 = 15.137 GB;
    # KV read 64·4096·147456 = 38.655 GB; KV written + embedding rows ~10 MB. Total 53.80 GB over
    # 3.35e12·0.8 = 2.68e12 B/s = 20.07 ms. FLOPs ~1.12e12 over 4.945e14 = 2.3 ms (memory-bound).
    # + 4 ms overhead = 24.07 ms.
    t = pm.decode_time(64, 64 * 4096)
    assert 0.016 <= t <= 0.025
    assert t == pytest.approx(0.02407, rel=0.01)
    flops, nbytes, comm = pm.step_work(64, 64 * 4096)
    assert nbytes == pytest.approx(53.80e9, rel=0.005) and comm == 0.0
    assert flops / (H100.peak_flops * 0.5) < nbytes / (H100.hbm_bw * 0.8)


def test_prefill_4096(pm):
    # FLOPs: body (8.1907B - 2·0.6223B = 6.946B params)·2·4096 = 5.690e13; attention
    # 4·32·128·36 · 4096·2048 (causal pairs) = 4.948e12; LM head on the last position 1.2e9.
    # 6.185e13 / (989e12·0.5) = 125.1 ms, + 4 ms = 129.1 ms. (The brief's ≈135 ms is 2·8.19B·4096 /
    # 4.945e14, which counts both vocab matrices for every token and no attention.)
    t = pm.prefill_time(4096)
    assert t == pytest.approx(0.135, rel=0.15)
    assert t == pytest.approx(0.1291, rel=0.01)
    # The same prompt after 4096 cached tokens does 4096·(4096 + 2048) pairs instead of 4096·2048.
    extra = 4 * 32 * 128 * 36 * 4096 * 4096 / (989e12 * 0.5)
    assert pm.prefill_time(4096, context_before=4096) - t == pytest.approx(extra, rel=0.01)


def test_mixed_step_is_cheaper_than_separate_steps(pm):
    dec, pre = pm.decode_time(64, 64 * 4096), pm.prefill_time(512)
    mixed = pm.step_time(64, 64 * 4096, 512, 512 * 256.0)
    assert max(dec, pre) < mixed < dec + pre  # weights are read once, one overhead
    assert pm.step_time(0, 0) == 0.0  # an empty step costs nothing


def test_sum_form_is_slower_than_max(pm):
    summed = pm.with_coeffs(replace(HAND, combine="sum"))
    assert summed.decode_time(64, 64 * 4096) > pm.decode_time(64, 64 * 4096)
    # sum: 4 + 20.07 + 2.27 ms
    assert summed.decode_time(64, 64 * 4096) == pytest.approx(0.02634, rel=0.01)


def test_moe_experts_touched():
    pm = PerfModel(MOE, H100, coeffs=HAND)
    # E·(1 - (1 - k/E)^B): B=1 -> 8 exactly; B=64 -> 128·(1 - 0.9375^64) = 128·(1 - 0.0161) = 125.9;
    # B=96 -> 128·(1 - 0.00204) = 127.74. So "all 128" (>= 127.5) needs B >= 86 under uniform routing.
    assert pm.experts_touched(1) == pytest.approx(8.0)
    assert pm.experts_touched(64) == pytest.approx(125.94, abs=0.01)
    assert pm.experts_touched(96) >= 127.5
    assert pm.experts_touched(4096) == pytest.approx(128.0)
    assert pm.experts_touched(0) == 0.0 and PerfModel(Q8, H100, coeffs=HAND).experts_touched(64) == 0.0
    # A batch-1 decode reads 8 of 128 experts: 48·8·4.72M·2 = 3.62 GB of the 58.0 GB of experts.
    _, b1, _ = pm.step_work(1, 1000)
    _, b64, _ = pm.step_work(64, 64 * 1000)
    experts = 48 * 128 * MOE.expert_params * 2
    assert b64 - b1 == pytest.approx(experts * (125.94 - 8) / 128 + 63 * (98304 * 1001 + 2048 * 2), rel=0.001)


def test_tensor_parallel(pm):
    tp2 = pm.with_tp(2)
    # All-reduce: 2 per layer · 36 layers = 72 of 4096 tokens·4096·2 B = 33.5 MB; ring at tp=2 moves
    # 2·1/2 = 1x at H100's measured NCCL bus bandwidth 370 GB/s = 90.7 us, + 2 hops · 5 us -> 72·100.7 us
    # = 7.25 ms.
    assert H100.ring_bw == 370e9
    _, _, comm = tp2.step_work(0, 0, 4096, 4096 * 2048.0)
    assert comm == pytest.approx(72 * (4096 * 4096 * 2 / 370e9 + 10e-6), rel=1e-9)
    assert comm == pytest.approx(7.25e-3, rel=0.01)
    # tp=2 prefill: 4 ms + 125.1/2 ms + 7.25 ms = 73.8 ms, vs 129.1 ms at tp=1.
    assert tp2.prefill_time(4096) == pytest.approx(0.0738, rel=0.01)
    assert tp2.prefill_time(4096) < pm.prefill_time(4096)
    # ...but it pays the all-reduces: more than half the tp=1 compute time plus overhead.
    assert tp2.prefill_time(4096) - 0.004 > (pm.prefill_time(4096) - 0.004) / 2 + 7e-3
    # A batch-1 decode still pays the 72 all-reduce latencies (0.72 ms) even though its bytes halve.
    _, _, c1 = tp2.step_work(1, 100)
    assert c1 >= 72 * 10e-6
    # tp=4: each all-reduce is a ring of 2·3 = 6 hops, so the fixed part triples: 72·30 us = 2.16 ms.
    _, _, c4 = pm.with_tp(4).step_work(1, 0)
    assert c4 == pytest.approx(72 * (6 * 5e-6 + 4096 * 2 * 1.5 / 370e9), rel=1e-9)


def test_kv_capacity(pm):
    # (80 GiB·0.9 - 16.38 GB) / 147456 = (77.31e9 - 16.38e9) / 147456 = 413,194 tokens
    assert pm.kv_capacity_tokens() == pytest.approx(413_194, abs=5)
    assert pm.with_tp(2).kv_capacity_tokens() > 2 * pm.kv_capacity_tokens()  # weights paid once
    with pytest.raises(ResourceError) as e:  # 65.5 GB of weights > 80 GiB·0.7 = 60.1 GB
        PerfModel(get_model("qwen3-32b"), H100, memory_utilization=0.7).kv_capacity_tokens()
    assert all(s in str(e.value) for s in ("qwen3-32b", "h100", "tp=1"))
    assert PerfModel(get_model("qwen3-32b"), H100, tp=2, memory_utilization=0.7).kv_capacity_tokens() > 0


def test_transfers(pm):
    # KV: 4096 tokens·147456 B = 604 MB; NVLink 900 GB/s -> 0.671 ms + 2 ms setup; RDMA 25 GB/s -> 24.2 ms.
    assert pm.kv_transfer_time(4096) == pytest.approx(0.002 + 0.000671, rel=0.01)
    assert pm.kv_transfer_time(4096, same_node=False) == pytest.approx(0.002 + 0.02416, rel=0.01)
    # Weights 16.38 GB: NVLink 18.2 ms < peer RDMA 0.655 s < disk 30 s + 8.19 s.
    assert pm.weight_transfer_time("nvlink") == pytest.approx(0.0182, rel=0.01)
    assert pm.weight_transfer_time("peer") == pytest.approx(0.655, rel=0.01)
    assert pm.weight_transfer_time("disk") == pytest.approx(38.19, rel=0.01)
    assert pm.with_tp(2).weight_transfer_time("peer") == pytest.approx(0.655 / 2, rel=0.01)
    assert pm.weight_sync_time() == pm.weight_transfer_time("peer")
    with pytest.raises(UnknownNameError, match="peer"):
        pm.weight_transfer_time("carrier-pigeon")


def test_train_step_time(pm):
    # 1M tokens: 6·(8.1907B - 0.6223B embed table) = 4.541e10 FLOP/token -> 4.541e16 over
    # 8·989e12·0.35 = 2.769e15 FLOP/s = 16.40 s. Attention at mean length 4096 adds (fwd+bwd = 3x fwd)
    # 3·4·32·128·36·2048 = 3.62e9 FLOP/token (+8%) -> 17.71 s.
    assert pm.train_step_time(1_000_000, 8) == pytest.approx(16.40, rel=0.01)
    with_attn = pm.train_step_time(1_000_000, 8, seq_len=4096)
    assert with_attn == pytest.approx(17.71, rel=0.01)


def test_step_time_is_fast():
    pm = PerfModel(MOE, H100, tp=2)
    n = 20_000
    t0 = time.perf_counter()
    for i in range(n):
        pm.step_time(64 + (i & 7), 64 * 4096, 512, 512 * 1000.0)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 20e-6  # ~0.5 us on a laptop core; 10^6 calls must stay around a second
