"""The online refit: measured throughput corrects a layout's predictions."""
import pytest

from pearl.control.refit import ThroughputRefit


def test_unknown_shapes_use_the_latest_measurement_and_known_ones_their_own():
    r = ThroughputRefit(min_samples=2)
    assert r.factor("A") == 1.0  # nothing measured yet
    r.observe("A", tokens=500, seconds=10, predicted_tokens_per_s=100)  # half the predicted speed
    assert r.factor("A") == 1.0  # one sample is not a measurement yet
    r.observe("A", tokens=500, seconds=10, predicted_tokens_per_s=100)
    assert r.factor("B") == pytest.approx(0.5)  # B borrows A's ratio: the common error
    r.observe("B", tokens=2000, seconds=10, predicted_tokens_per_s=100)
    assert r.factor("B") == pytest.approx(0.5)  # B's first interval alone does not count
    r.observe("B", tokens=2000, seconds=10, predicted_tokens_per_s=100)
    assert r.factor("B") == pytest.approx(2.0) and r.factor("A") == pytest.approx(0.5)
    # a shape measured twice as fast as predicted is predicted to finish in half the time
    assert r.corrected("B", 100.0) == pytest.approx(50.0)


def test_a_wrong_prediction_is_overridden_after_measuring_it():
    r = ThroughputRefit(min_samples=1)
    pred = {"colocated": 3000.0, "1P:7D": 1700.0}  # the model favours 1P:7D ...
    r.observe("colocated", 1000, 10, predicted_tokens_per_s=100)  # colocated: as predicted
    r.observe("1P:7D", 440, 10, predicted_tokens_per_s=100)  # ... which really runs 2.3x slower
    best = min(pred, key=lambda s: r.corrected(s, pred[s]))
    assert best == "colocated"


def test_short_or_empty_intervals_are_carried_into_the_next_not_dropped():
    r = ThroughputRefit(min_seconds=1.0)
    r.observe("A", 100, 0.5, 100)
    assert r.ratios == {} and r.seen("A")  # too short alone: carried
    r.observe("A", 0, 10, 100)
    assert r.ratios["A"].value == pytest.approx(100 / 1050)  # both intervals, summed
    r.observe("B", 0, 5, 100)
    assert "B" not in r.ratios  # nothing generated yet: no ratio of 0 from it
    with pytest.raises(ValueError):
        ThroughputRefit(min_samples=0)


def test_the_ticks_between_engine_steps_do_not_bias_the_ratio():
    """On a real run a tick lands between engine steps: an interval that held a long prefill step is
    long and decodes little, one of decode steps is short and decodes a lot. Keeping only intervals of
    at least min_seconds measured SmolLM2 at 0.22x its predicted rate where all intervals say 0.62x."""
    r = ThroughputRefit(min_samples=2, min_seconds=1.0)
    for _ in range(20):
        r.observe("A", 4, 1.4, 25.0)  # a prefill step: long, few tokens
        r.observe("A", 30, 0.6, 25.0)  # decode steps: short, many tokens
    assert r.factor("A") == pytest.approx(34 / (2.0 * 25.0), rel=0.05)


def test_a_ratio_is_of_the_sums_so_one_swing_in_a_batch_cycle_does_not_decide():
    r = ThroughputRefit(min_samples=2)
    # a batch cycle: a slow interval (the prompts of a new batch), then two fast ones; 100 predicted
    for tokens in (300, 1500, 1500):
        r.observe("A", tokens, 10, predicted_tokens_per_s=100)
    assert r.factor("A") == pytest.approx(3300 / 3000)  # not the mean of 0.3, 1.5, 1.5 weighted to the last


def test_a_shape_counts_as_measured_only_after_its_span():
    r = ThroughputRefit(min_samples=2)
    r.span_s = 60.0  # the caller's batch period
    r.observe("A", 1000, 10, 100)
    r.observe("B", 2000, 30, 100)
    r.observe("B", 2000, 20, 100)
    assert not r.measured("B") and r.factor("B") == 1.0  # nothing measured in full yet
    r.observe("B", 1000, 10, 100)
    assert r.measured("B") and r.factor("B") == pytest.approx(5000 / 6000)


def test_old_intervals_fade_with_the_half_life():
    r = ThroughputRefit(min_samples=1, half_life_s=10.0)
    r.observe("A", 2000, 10, 100)  # 2x
    r.observe("A", 500, 10, 100)  # 0.5x: the older one now weighs half
    assert r.factor("A") == pytest.approx((1000 + 500) / (500 + 1000))
