"""Profiling the real engine: recorded step shapes match the scheduler's batches, a small sweep
calibrates (positive, physical coefficients), and the fitted model predicts held-out measured steps
within a loose bound (CPU timing is noisy: behaviour, not tight timings)."""
from __future__ import annotations

import statistics

import pytest
import torch

from pearl.perf.hardware import get_hardware
from pearl.perf.profile import load_profile
from pearl.perf.roofline import PerfModel
from pearl.real.engine import TorchEngine
from pearl.real.models import load_model
from pearl.real.profiling import (StepRecorder, fit_profile, measure_steps, median_samples, model_shape,
                                  sweep, warm_up)
from pearl.real.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


def test_recorder_sees_each_step_and_detaches(tiny):
    eng = TorchEngine(tiny, max_batched_tokens=64, log_steps=True)
    with StepRecorder(eng) as rec:
        eng.add_request(list(range(100)), SamplingParams(max_new_tokens=3, ignore_eos=True), session="a")
        while eng.has_work():
            rec.step()
    assert "schedule" not in eng.scheduler.__dict__  # the hook is gone
    shapes = [(r.n_decode, r.decode_context, r.prefill_tokens) for r in rec.records]
    assert shapes == [(n, c, p) for n, c, p, _ in eng.stats.step_log]
    assert [r.prefill_tokens for r in rec.records] == [64, 36, 0, 0]
    assert rec.records[0].prefill_attn == 64 * 32 and rec.records[1].prefill_attn == 36 * (64 + 18)
    assert all(r.wall_s > 0 and r.cpu_s >= 0 for r in rec.records)


def test_calibrate_and_predict_held_out_steps(tiny, tmp_path):
    eng = TorchEngine(tiny, max_batched_tokens=256, num_threads=1)
    warm_up(eng)
    kw = dict(decode_batches=(1, 8), contexts=(32, 192), prefill_chunks=(16, 96))
    with StepRecorder(eng) as rec:
        for _ in range(3):
            sweep(rec, **kw)
    assert not eng.has_work()
    samples = median_samples(rec.records, "cpu")
    shape = model_shape(tiny.config, "tiny")
    train, held = samples[0::2], samples[1::2]
    profile, cal = fit_profile(train, shape, "cpu", max_rel_error=0.5)
    c = profile.coeffs
    assert c.combine == "sum" and 0 < c.mfu <= 1 and 0 < c.bw_eff <= 1 and c.step_overhead_s >= 0
    assert profile.hardware == "cpu" and profile.tp == 1 and profile.n_samples == len(train)
    pm = PerfModel(shape, get_hardware("cpu"), 1, c)
    rel = [abs(pm.step_time(s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn) / s.seconds - 1)
           for s in held]
    assert statistics.median(rel) < 0.5
    # predicting the sum over all held-out steps is what a rollout needs: tighter than per step
    pred = sum(pm.step_time(s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn) for s in held)
    assert abs(pred / sum(s.seconds for s in held) - 1) < 0.5
    # round trip through the profile file
    from pearl.perf.profile import save_profile
    assert load_profile(save_profile(profile, tmp_path / "tiny.json")).coeffs == c


def test_measure_steps_mixes_step_kinds(tiny):
    eng = TorchEngine(tiny, max_batched_tokens=128)
    samples = measure_steps(eng, decode_batches=(2,), contexts=(24,), prefill_chunks=(8,), decode_steps=2,
                            clock="cpu", warmup=False, repeats=1)
    kinds = {(s.n_decode > 0, s.prefill_tokens > 0) for s in samples}
    assert kinds == {(True, False), (False, True), (True, True)}
    assert all(s.seconds >= 0 for s in samples)
