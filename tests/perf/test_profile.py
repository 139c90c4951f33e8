"""Saved performance profiles: round trip and refusal of corrupt files."""
import json
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from pearl.errors import ConfigError
from pearl.perf import PROFILE_VERSION, PerfCoeffs, Profile, load_profile, save_profile
from pearl.perf.calibrate import Calibration

WHEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.fixture
def profile():
    cal = Calibration(PerfCoeffs(mfu=0.41, bw_eff=0.77, step_overhead_s=0.0032), 200, 4e-4, 0.03, 80, 120)
    return Profile.from_calibration(cal, "qwen3-8b", "h100", 2, fitted_at=WHEN)


def test_round_trip(tmp_path, profile):
    path = save_profile(profile, tmp_path / "sub" / "p.json")
    back = load_profile(path)
    assert back == profile
    raw = json.loads(path.read_text())
    assert raw["version"] == PROFILE_VERSION and raw["fitted_at"] == "2025-01-02T03:04:05+00:00"
    assert raw["n_samples"] == 200 and raw["rmse"] == 4e-4 and raw["coeffs"]["mfu"] == 0.41
    pm = back.perf_model()
    assert pm.tp == 2 and pm.coeffs.mfu == 0.41 and pm.hw.name == "h100"
    assert not (tmp_path / "sub" / "p.json.tmp").exists()


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(version=99), "version"),
    (lambda d: d.pop("hardware"), "hardware"),
    (lambda d: d.update(tp="two"), "tp"),
    (lambda d: d.update(tp=0), "tp"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["coeffs"].update(speed=2.0), "coeffs.speed"),
    (lambda d: d["coeffs"].update(mfu="high"), "coeffs.mfu"),
    (lambda d: d["coeffs"].update(mfu=-0.5), "coeffs"),
    (lambda d: d["coeffs"].update(combine="min"), "coeffs"),
    (lambda d: d["coeffs"].update(kv_eff=1.5), "kv_eff"),
    (lambda d: d["coeffs"].update(seq_overhead_s=-1e-4), "seq_overhead_s"),
    (lambda d: d.update(fitted_at="yesterday"), "fitted_at"),
])
def test_wrong_fields_are_config_errors(tmp_path, profile, mutate, match):
    d = profile.to_dict()
    mutate(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=match):
        load_profile(path)


def test_corrupt_or_missing_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"version": 1, "model": ')
    with pytest.raises(ConfigError, match="JSON"):
        load_profile(path)
    path.write_text("[1, 2, 3]")
    with pytest.raises(ConfigError, match="object"):
        load_profile(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_profile(tmp_path / "absent.json")


def test_profile_carries_the_new_coefficients(tmp_path, profile):
    from dataclasses import replace
    p2 = replace(profile, coeffs=replace(profile.coeffs, kv_eff=0.6, seq_overhead_s=5e-5, combine="per_op"))
    path = tmp_path / "p.json"
    save_profile(p2, path)
    got = load_profile(path).perf_model(memory_utilization=0.9).coeffs
    assert (got.kv_eff, got.seq_overhead_s, got.combine) == (0.6, 5e-5, "per_op")


def test_the_trainer_cost_round_trips_and_old_profiles_still_load(tmp_path, profile):
    from pearl.perf.profile import TrainerProfile

    old = save_profile(profile, tmp_path / "old.json")  # a profile as written before the trainer was measured
    raw = json.loads(old.read_text())
    assert "trainer" not in raw and load_profile(old).trainer is None
    tr = TrainerProfile(0.012, 2.8e-5, 4, 0.001, clock="cpu", micro_batch_size=32, threads=1,
                        shared=((1, 3.6, 1.9, 1.2, 1.1), (2, 4.0, 2.2)))  # 3 numbers: alone = 1
    p = replace(profile, trainer=tr)
    back = load_profile(save_profile(p, tmp_path / "new.json"))
    assert back == p and back.trainer.step_time(1000) == pytest.approx(0.012 + 0.028)
    assert back.trainer.shared_factors(2) == (4.0, 2.2, 1.0, 1.0) and back.trainer.shared_factors(3)[0] == 4.0
    assert back.trainer.shared_factors(1) == (3.6, 1.9, 1.2, 1.1)
    assert replace(tr, shared=()).shared_factors(1) == (1.0, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.pop("per_token_s"), "trainer.per_token_s"),
    (lambda t: t.update(fixed_s="fast"), "trainer.fixed_s"),
    (lambda t: t.update(fixed_s=-1.0), "trainer.fixed_s"),
    (lambda t: t.update(speed=1), "trainer.speed"),
    (lambda t: t.update(clock="sundial"), "clock must be cpu or wall"),
    (lambda t: t.update(shared=[[0, 1.0, 1.0]]), "trainer.shared"),
    (lambda t: t.update(shared=[[1, 2.0]]), "trainer.shared"),
])
def test_a_bad_trainer_section_is_one_line(tmp_path, profile, mutate, match):
    from pearl.perf.profile import TrainerProfile

    d = replace(profile, trainer=TrainerProfile(0.01, 1e-5, 3, 0.0)).to_dict()
    mutate(d["trainer"])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=match) as e:
        load_profile(path)
    assert "\n" not in str(e.value)


def test_trainer_tokens_counts_shared_prompts_once_and_pads_micro_batches():
    from pearl.perf.profile import fit_trainer, trainer_tokens

    g = [(10, 30), (10, 50)]  # one group: prompt 10 once, then two rows padded to 50
    assert trainer_tokens([g], 32, share_prompt=True) == 10 + 2 * 40
    assert trainer_tokens([g], 32, share_prompt=False) == 2 * 50
    assert trainer_tokens([g, [(10, 20)]], 1, share_prompt=True) == 30 + 50 + 20  # one row per micro-batch
    fit = fit_trainer([(100, 0.02), (1100, 0.12), (2100, 0.22)])
    assert fit.fixed_s == pytest.approx(0.01) and fit.per_token_s == pytest.approx(1e-4)


def test_the_trainer_fit_has_an_attention_term_that_long_rows_need():
    """Rows of a long-context workload cost more per token (the tiny model: ~43 us/token at 230-token
    rows, ~420 at 4.5k): a step is fixed + per token + per causal attention pair, fitted on both."""
    from pearl.perf.profile import TrainerProfile, fit_trainer, trainer_work

    g = [(10, 30), (10, 50)]  # prompt 10 once (10²/2 pairs), then two rows padded to 50
    assert trainer_work([g], 32) == (90, 10 * 10 / 2 + 2 * (50 * 50 - 10 * 10) / 2)
    assert trainer_work([g], 32, share_prompt=False) == (100, 2 * 50 * 50 / 2)
    true = TrainerProfile(0.03, 2e-5, 0, 0.0, per_pair_s=1.5e-7)
    rows = [(l, n) for l, n in ((230, 32), (1200, 4), (3000, 2), (4500, 2))]  # (row length, rows)
    samples = [(*trainer_work([[(40, l)] * n], 32), 0.0) for l, n in rows]
    samples = [(t, p, true.step_time(t, p)) for t, p, _ in samples]
    fit = fit_trainer(samples)
    assert fit.per_pair_s == pytest.approx(1.5e-7, rel=1e-6) and fit.per_token_s == pytest.approx(2e-5, rel=1e-6)
    linear = fit_trainer([(t, y) for t, _, y in samples])  # the old fit, without the pairs
    long_t, long_p = trainer_work([[(40, 4500)] * 8], 32)
    assert linear.step_time(long_t) < 0.8 * fit.step_time(long_t, long_p)  # what it missed
