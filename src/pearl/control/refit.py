"""Online refit of layout predictions from measured throughput.

The batch predictor is a model; the running system is the truth. While a layout shape serves
unchanged between two controller ticks, the tokens it generated per second are compared with what the
predictor said it would generate: the ratio (an EMA per shape) corrects that shape's predictions from
then on. A shape never measured borrows the ratio of the shape measured most recently (the workload's
and demand's share of the error is common to all shapes; only the layout's own share differs), so a
wrong prediction costs at most one exploratory switch before the measurement overrides it.
Pure: no clocks, no I/O.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class _Ratio:
    value: float
    samples: int


class ThroughputRefit:
    def __init__(self, alpha: float = 0.3, min_samples: int = 2, min_seconds: float = 1.0):
        if not 0 < alpha <= 1 or min_samples < 1:
            raise ValueError(f"alpha must be in (0, 1] and min_samples >= 1 (got {alpha}, {min_samples})")
        self.alpha, self.min_samples, self.min_seconds = alpha, min_samples, min_seconds
        self.ratios: dict[Hashable, _Ratio] = {}
        self.last: Hashable | None = None

    def observe(self, shape: Hashable, tokens: float, seconds: float, predicted_tokens_per_s: float) -> None:
        """`shape` generated `tokens` in `seconds` where the predictor expected `predicted_tokens_per_s`."""
        if seconds < self.min_seconds or predicted_tokens_per_s <= 0 or tokens <= 0:
            return
        ratio = (tokens / seconds) / predicted_tokens_per_s
        r = self.ratios.get(shape)
        if r is None:
            self.ratios[shape] = _Ratio(ratio, 1)
        else:
            r.value += self.alpha * (ratio - r.value)
            r.samples += 1
        self.last = shape

    def rescale(self, shape: Hashable, factor: float) -> None:
        """The predictor's answer for `shape` changed (a new workload estimate): what was measured
        stays, so its ratio to the prediction is multiplied by old / new predicted throughput."""
        r = self.ratios.get(shape)
        if r is not None and factor > 0:
            r.value *= factor

    def measured(self, shape: Hashable) -> bool:
        r = self.ratios.get(shape)
        return r is not None and r.samples >= self.min_samples

    def factor(self, shape: Hashable) -> float:
        """Measured / predicted throughput for `shape` (1.0 while nothing is known)."""
        r = self.ratios.get(shape)
        if r is not None and r.samples >= self.min_samples:
            return r.value
        last = self.ratios.get(self.last) if self.last is not None else None
        return last.value if last is not None else 1.0

    def corrected(self, shape: Hashable, predicted_completion_s: float) -> float:
        """A predicted completion time corrected by what the shape was measured to do."""
        return predicted_completion_s / max(self.factor(shape), 1e-6)
