"""Calibration: recover known coefficients from synthetic steps, refuse impossible fits."""
import random

import pytest

from pearl.errors import CalibrationError
from pearl.perf import ModelShape, PerfCoeffs, PerfModel, StepSample, calibrate, fit, get_hardware, get_model

H100 = get_hardware("h100")
Q8 = get_model("qwen3-8b")
TRUE = PerfCoeffs(mfu=0.42, bw_eff=0.71, step_overhead_s=0.0031, combine="max")  # the form a GPU calibration fits


def synthetic(pm: PerfModel, n: int = 120, seed: int = 0, noise: float = 0.0, kinds=("decode", "prefill", "mixed")):
    """Steps timed by `pm` itself: decode batches, prefill chunks after some cached context, and mixed
    (chunked-prefill) steps, with optional multiplicative noise."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        b = rng.randint(1, 256) if kind != "prefill" else 0
        ctx = sum(rng.randint(100, 16000) for _ in range(b))
        p = rng.randint(64, 8192) if kind != "decode" else 0
        attn = p * (rng.randint(0, 16000) + p / 2) if p else 0.0
        t = pm.step_time(b, ctx, p, attn) * (1 + rng.gauss(0, noise))
        out.append(StepSample(b, ctx, p, attn, t))
    return out


def assert_close(got: PerfCoeffs, want: PerfCoeffs, rel: float):
    assert got.mfu == pytest.approx(want.mfu, rel=rel)
    assert got.bw_eff == pytest.approx(want.bw_eff, rel=rel)
    assert got.step_overhead_s == pytest.approx(want.step_overhead_s, rel=rel)


@pytest.mark.parametrize("model,hw,tp", [("qwen3-8b", "h100", 1), ("qwen3-30b-a3b", "h800", 2),
                                         ("qwen3-32b", "h20", 4)])
def test_recovers_known_coefficients(model, hw, tp):
    m, h = get_model(model), get_hardware(hw)
    samples = synthetic(PerfModel(m, h, tp, TRUE))
    cal = fit(samples, m, h, tp)
    assert_close(cal.coeffs, TRUE, 0.02)
    assert cal.rel_rmse < 1e-3
    assert cal.compute_bound >= 5 and cal.memory_bound >= 5  # both sides of the roofline were seen


def test_recovers_additive_form_on_cpu():
    small = ModelShape("small", num_layers=4, hidden=256, num_q_heads=4, num_kv_heads=2, head_dim=64, ffn=1024,
                      vocab=4096)
    cpu = get_hardware("cpu")
    want = PerfCoeffs(mfu=0.3, bw_eff=0.5, step_overhead_s=0.0005, combine="sum")
    rng = random.Random(1)
    pm = PerfModel(small, cpu, coeffs=want)
    samples = []
    for i in range(40):
        b, p = rng.randint(0, 16), rng.randint(0, 512) if i % 2 else 0
        b = b or 1
        ctx = b * rng.randint(16, 1024)
        attn = p * (rng.randint(0, 512) + p / 2)
        samples.append(StepSample(b, ctx, p, attn, pm.step_time(b, ctx, p, attn)))
    got = calibrate(samples, small, cpu, combine="sum")
    assert got.combine == "sum"
    assert_close(got, want, 0.02)


def sweep_like(pm: PerfModel, seed: int = 0, noise: float = 0.0):
    """Steps shaped like the real engine's calibration sweep (`pearl.real.profiling.sweep`): decode
    batches 1-4 at contexts of 20-70 tokens, prefills of 16-256 tokens, mixed steps."""
    rng, out = random.Random(seed), []
    for b in (0, 1, 2, 4):
        for ctx in (20, 45, 70):
            for p in (0, 16, 64) if b else (16, 64, 256):
                attn = p * (ctx + p / 2) if p else 0.0
                t = pm.step_time(b, b * ctx, p, attn) * (1 + rng.gauss(0, noise))
                out.append(StepSample(b, b * ctx, p, attn, t))
    return out


def test_sum_form_fits_a_per_sequence_cost_and_holds_bw_eff_when_weights_dominate():
    """SmolLM2 on one core: every step reads the same ~0.5 GB of weights, so the memory time cannot be
    told from the fixed overhead (the 3-term fit said -680 ms of overhead and was refused); decode
    costs ~9 ms per extra sequence. The fit holds bw_eff at its prior and finds the rest."""
    cpu, smol = get_hardware("cpu"), get_model("smollm2-135m")
    truth = PerfCoeffs(mfu=1.2, bw_eff=cpu.bw_eff, step_overhead_s=0.003, seq_overhead_s=0.009, combine="sum")
    cal = fit(sweep_like(PerfModel(smol, cpu, 1, truth)), smol, cpu, combine="sum")
    assert cal.held == ("bw_eff",)
    assert cal.coeffs.seq_overhead_s == pytest.approx(0.009, rel=0.02)
    assert cal.coeffs.step_overhead_s == pytest.approx(0.003, rel=0.02)
    assert cal.coeffs.mfu == pytest.approx(1.2, rel=0.02)
    noisy = fit(sweep_like(PerfModel(smol, cpu, 1, truth), seed=2, noise=0.02), smol, cpu, combine="sum")
    assert noisy.coeffs.seq_overhead_s == pytest.approx(0.009, rel=0.2) and noisy.rel_rmse < 0.04


def test_sum_form_fits_bw_eff_or_the_per_sequence_cost_never_both():
    """Where the memory time varies with the batch, so does the sequence count: bw_eff is fitted and the
    per-sequence cost kept at its prior; a per-sequence cost the steps do not show is not invented."""
    small = ModelShape("small", num_layers=4, hidden=256, num_q_heads=4, num_kv_heads=2, head_dim=64, ffn=1024,
                       vocab=4096)
    cpu = get_hardware("cpu")
    want = PerfCoeffs(mfu=0.3, bw_eff=0.5, step_overhead_s=0.0005, seq_overhead_s=0.0002, combine="sum")
    cal = fit(synthetic(PerfModel(small, cpu, coeffs=want), n=60), small, cpu, combine="sum",
              base=PerfCoeffs(seq_overhead_s=0.0002))
    assert cal.held == ("seq_overhead_s",) and cal.coeffs.seq_overhead_s == 0.0002
    assert_close(cal.coeffs, want, 0.02)
    # weights dominate, and the steps cost nothing per sequence (or less: noise): 0, not negative
    smol = get_model("smollm2-135m")
    none = PerfModel(smol, cpu, 1, PerfCoeffs(mfu=1.2, bw_eff=cpu.bw_eff, step_overhead_s=0.003, combine="sum"))
    assert fit(sweep_like(none), smol, cpu, combine="sum").coeffs.seq_overhead_s < 1e-9
    faster = [StepSample(s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn,
                         s.seconds - 1e-3 * s.n_decode) for s in sweep_like(none)]
    assert fit(faster, smol, cpu, combine="sum", max_rel_error=0.5).coeffs.seq_overhead_s == 0.0


def test_noisy_samples_still_close():
    samples = synthetic(PerfModel(Q8, H100, 1, TRUE), n=300, noise=0.02, seed=3)
    cal = fit(samples, Q8, H100)
    assert_close(cal.coeffs, TRUE, 0.05)
    assert 0.01 < cal.rel_rmse < 0.04  # the 2% noise, not more


def test_decode_only_keeps_prior_mfu():
    # Decode never reaches the compute roof, so mfu is only bounded from below: keep the prior.
    samples = synthetic(PerfModel(Q8, H100, 1, TRUE), kinds=("decode",))
    got = calibrate(samples, Q8, H100, base=PerfCoeffs(mfu=0.5))
    assert got.bw_eff == pytest.approx(TRUE.bw_eff, rel=0.02)
    assert got.step_overhead_s == pytest.approx(TRUE.step_overhead_s, rel=0.02)
    assert got.mfu == 0.5


@pytest.mark.parametrize("bad,field", [(dict(mfu=1.6), "mfu"), (dict(bw_eff=1.4), "bw_eff")])
def test_refuses_faster_than_hardware(bad, field):
    samples = synthetic(PerfModel(Q8, H100, 1, PerfCoeffs(**{**dict(mfu=0.4, bw_eff=0.7), **bad})))
    with pytest.raises(CalibrationError, match=rf"{field} = .* > 1"):
        calibrate(samples, Q8, H100)


def test_a_rough_peak_may_be_beaten_by_the_fit():
    """The "cpu" entry's peak is a guess: a core faster than it fits with mfu > 1 (a refused fit fell
    back to default coefficients on this machine), and predicts the steps it was fitted on."""
    cpu = get_hardware("cpu")
    assert cpu.rough and not H100.rough
    truth = PerfModel(Q8, cpu, 1, PerfCoeffs(mfu=1.3, bw_eff=0.7, step_overhead_s=0.002, combine="sum"))
    samples = synthetic(truth)
    got = calibrate(samples, Q8, cpu, combine="sum")
    assert got.mfu == pytest.approx(1.3, rel=0.02)


def test_refuses_negative_overhead():
    # Steps timed with 0 overhead, then 6 ms knocked off each: the fit needs overhead = -6 ms.
    for combine in ("max", "sum"):
        pm = PerfModel(Q8, H100, 1, PerfCoeffs(step_overhead_s=0.0, combine=combine))
        shifted = [StepSample(s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn, s.seconds - 0.006)
                   for s in synthetic(pm) if s.seconds > 0.02]
        with pytest.raises(CalibrationError, match="negative"):
            calibrate(shifted, Q8, H100, combine=combine)


def test_refuses_bad_inputs_and_bad_fits():
    good = synthetic(PerfModel(Q8, H100, 1, TRUE))
    with pytest.raises(CalibrationError, match="too few"):
        calibrate(good[:3], Q8, H100)
    with pytest.raises(CalibrationError, match="non-positive"):
        calibrate(good[:10] + [StepSample(8, 800, 0, 0.0, 0.0)], Q8, H100)
    with pytest.raises(CalibrationError, match="no tokens"):
        calibrate(good[:10] + [StepSample(0, 0, 0, 0.0, 0.01)], Q8, H100)
    # Durations unrelated to the work (random between 1 ms and 2 s) cannot be explained.
    rng = random.Random(7)
    junk = [StepSample(s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn, 10 ** rng.uniform(-3, 0.3))
            for s in good]
    with pytest.raises(CalibrationError):
        calibrate(junk, Q8, H100)
    with pytest.raises(CalibrationError, match="combine"):
        calibrate(good, Q8, H100, combine="min")

