"""Online refit of layout predictions from measured throughput.

The batch predictor is a model; the running system is the truth. While a layout shape serves
unchanged between two controller ticks, the tokens it generated are compared with the tokens the
predictor said it would generate in that time. A shape's correction is the ratio of the two *sums*
over its measured intervals (older intervals fade with a half-life), not an average of per-interval
ratios: throughput swings within a batch's cycle (the prompts of a new batch, a long turn's tail),
so one 30-second interval says little, and a shape whose correction rests on one or two of them
flaps the layout. A shape counts as measured once it has served `span_s` seconds (the controller
sets it to one predicted batch period, so the swings of a cycle average out) in at least
`min_samples` intervals. A shape not (yet) measured borrows the ratio of the shape most recently
measured in full (the workload's and demand's share of the error is common to all shapes; only the
layout's own share differs), never its own first intervals: those hold the switch that brought it
(contexts recomputed, workers starting), and trusting them made a new layout look worse than the
one it replaced and switched straight back. So a wrong prediction costs at most one exploratory
switch before the measurement overrides it.
Intervals shorter than `min_seconds`, or with no tokens, are not dropped but carried into the next
one: on a real run the ticks land between engine steps, so a long interval is one in which a long
(prefill) step ran and a short one holds decode steps; keeping only the long ones measured SmolLM2's
colocated×2 at 0.22× its predicted rate where all intervals together give 0.62× (docs/results.md).
Pure: no clocks, no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class _Ratio:
    tokens: float  # measured tokens (faded)
    predicted: float  # tokens the predictor expected in the same intervals (faded alike)
    seconds: float  # measured seconds, not faded (for `measured`)
    samples: int

    @property
    def value(self) -> float:
        return self.tokens / self.predicted


class ThroughputRefit:
    def __init__(self, min_samples: int = 2, min_seconds: float = 1.0, half_life_s: float = math.inf):
        if min_samples < 1 or not half_life_s > 0:
            raise ValueError(f"min_samples must be >= 1 and half_life_s > 0 (got {min_samples}, {half_life_s})")
        self.min_samples, self.min_seconds, self.half_life_s = min_samples, min_seconds, half_life_s
        self.span_s = 0.0  # seconds of measurement before a shape counts as measured (set by the caller)
        self.ratios: dict[Hashable, _Ratio] = {}
        self.last: Hashable | None = None  # the shape most recently measured in full
        self._pending: dict[Hashable, tuple[float, float, float]] = {}  # (tokens, predicted tokens, s)

    def observe(self, shape: Hashable, tokens: float, seconds: float, predicted_tokens_per_s: float) -> None:
        """`shape` generated `tokens` in `seconds` where the predictor expected `predicted_tokens_per_s`."""
        if predicted_tokens_per_s <= 0 or seconds <= 0:
            return
        t0, p0, s0 = self._pending.pop(shape, (0.0, 0.0, 0.0))
        tokens, predicted, seconds = tokens + t0, predicted_tokens_per_s * seconds + p0, seconds + s0
        if seconds < self.min_seconds or tokens <= 0:  # too short to count alone: carried over
            self._pending[shape] = (tokens, predicted, seconds)
            return
        r = self.ratios.get(shape)
        if r is None:
            self.ratios[shape] = _Ratio(tokens, predicted, seconds, 1)
        else:
            fade = 0.5 ** (seconds / self.half_life_s)
            r.tokens = r.tokens * fade + tokens
            r.predicted = r.predicted * fade + predicted
            r.seconds += seconds
            r.samples += 1
        if self.measured(shape):
            self.last = shape

    def rescale(self, shape: Hashable, factor: float) -> None:
        """The predictor's answer for `shape` changed (a new workload estimate): what was measured
        stays, so its ratio to the prediction is multiplied by old / new predicted throughput."""
        r = self.ratios.get(shape)
        if r is not None and factor > 0:
            r.tokens *= factor
        pend = self._pending.get(shape)
        if pend is not None and factor > 0:
            self._pending[shape] = (pend[0] * factor, pend[1], pend[2])

    def seen(self, shape: Hashable) -> bool:
        """Whether anything was measured for `shape` (a ratio, or an interval carried over)."""
        return shape in self.ratios or shape in self._pending

    def measured(self, shape: Hashable) -> bool:
        r = self.ratios.get(shape)
        return r is not None and r.samples >= self.min_samples and r.seconds >= self.span_s

    def factor(self, shape: Hashable) -> float:
        """Measured / predicted throughput for `shape` (1.0 while nothing is known)."""
        if self.measured(shape):
            return self.ratios[shape].value
        last = self.ratios.get(self.last) if self.last is not None else None
        return last.value if last is not None else 1.0

    def corrected(self, shape: Hashable, predicted_completion_s: float) -> float:
        """A predicted completion time corrected by what the shape was measured to do."""
        return predicted_completion_s / max(self.factor(shape), 1e-6)
