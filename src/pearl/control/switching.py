"""Cost-aware switching: whether the controller should move from the current layout to a candidate.

Job: turn two predictions (time to finish the remaining work under the current layout and under the
candidate, the candidate's including the transition's makespan), the transition's disruption cost and
how long the devices are expected to stay into a yes/no with the rule that decided and the numbers.
A switch needs all of:

- **gain**: the candidate is faster at all;
- **hysteresis**: the relative gain exceeds a band sized to the predictor's error, so two near-equal
  layouts do not trade places on noise;
- **cost**: the gain beats the transition cost by a margin, gain > cost·(1 + margin);
- **window**: the devices stay longer than the break-even time, cost / (rate of gain), where the rate
  is the gain spread over the candidate's remaining time (a lent or elastic device that leaves first
  never pays the transition back);
- **dwell**: `min_dwell_s` has passed since the last switch;
- **confirm**: a marginal candidate (relative gain below `clear` × hysteresis) must pass the rules
  above (all but dwell) on `confirm` consecutive decisions about it; a clear one is taken at once.
  This streak is the gate's only state: independent noise has to beat the band `confirm` times in a
  row, while a real change keeps beating it (the streak builds during the dwell, too).

What it must not do: predict anything, own time (`now` comes in as data), or import torch, Ray,
asyncio or `time`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

from pearl.config import PolicyConfig

__all__ = ["SwitchGate", "SwitchVerdict"]

# Rule names: each verdict's reason starts with one of these, then ": " and the numbers.
RULES = ("no-gain", "hysteresis", "cost", "window", "dwell", "confirm", "switch")


@dataclass(frozen=True)
class SwitchVerdict:
    switch: bool
    reason: str  # "<rule>: <numbers>"
    gain_s: float  # current_s - candidate_s
    cost_s: float  # the transition cost the gain must beat
    break_even_s: float  # cost / rate of gain; inf when there is no gain

    @property
    def rule(self) -> str:
        return self.reason.split(":", 1)[0]


class SwitchGate:
    """The switching rules, plus a streak counter for `confirm` (see the module docstring)."""

    def __init__(self, margin: float = 0.1, min_dwell_s: float = 60.0, hysteresis: float = 0.05,
                 confirm: int = 3, clear: float = 3.0):
        for name, v in (("margin", margin), ("min_dwell_s", min_dwell_s), ("hysteresis", hysteresis),
                        ("clear", clear)):
            if not v >= 0:
                raise ValueError(f"SwitchGate: {name} must be >= 0, got {v!r}")
        if confirm < 1:
            raise ValueError(f"SwitchGate: confirm must be >= 1, got {confirm!r}")
        self.margin, self.min_dwell_s, self.hysteresis = margin, min_dwell_s, hysteresis
        self.confirm, self.clear = confirm, clear
        self._streak = 0
        self._key: Hashable = None

    @classmethod
    def from_policy(cls, policy: PolicyConfig, hysteresis: float | None = None) -> "SwitchGate":
        """The gate `policy` configures (`policy.controller` holds the band, streak and clear factor);
        `hysteresis` overrides the band (0 for a pure scale-out, which disturbs no running worker)."""
        k = policy.controller
        return cls(policy.switch_margin, policy.min_dwell_s, k.hysteresis if hysteresis is None else hysteresis,
                   k.confirm, k.clear)

    def evaluate(self, now: float, current_s: float, candidate_s: float, transition_cost_s: float,
                 window_s: float = math.inf, last_switch_t: float | None = None) -> SwitchVerdict:
        """The stateless rules (everything but `confirm`). Pure."""
        gain = current_s - candidate_s
        cost = max(0.0, transition_cost_s)
        # Seconds saved per second run under the candidate; the cost is paid back at this rate.
        rate = gain / candidate_s if gain > 0 and candidate_s > 0 else (math.inf if gain > 0 else 0.0)
        be = cost / rate if rate > 0 else math.inf

        def no(rule: str, why: str) -> SwitchVerdict:
            return SwitchVerdict(False, f"{rule}: {why}", gain, cost, be)

        if not gain > 0:
            return no("no-gain", f"candidate {candidate_s:.3g} s is not faster than current {current_s:.3g} s")
        rel = gain / current_s if current_s > 0 else math.inf
        if not rel > self.hysteresis:
            return no("hysteresis", f"relative gain {rel:.3f} within the band {self.hysteresis:.3f}")
        if not gain > cost * (1 + self.margin):
            return no("cost", f"gain {gain:.3g} s does not beat cost {cost:.3g} s × (1 + {self.margin:g})")
        if not window_s > be:
            return no("window", f"devices stay {window_s:.3g} s < break-even {be:.3g} s")
        if last_switch_t is not None and now - last_switch_t < self.min_dwell_s:
            return no("dwell", f"{now - last_switch_t:.3g} s since the last switch < {self.min_dwell_s:g} s")
        return SwitchVerdict(True, f"switch: gain {gain:.3g} s ({rel:.1%}) beats cost {cost:.3g} s, "
                                   f"break-even {be:.3g} s < window {window_s:.3g} s", gain, cost, be)

    def decide(self, now: float, current_s: float, candidate_s: float, transition_cost_s: float,
               window_s: float = math.inf, last_switch_t: float | None = None,
               candidate: Hashable = None) -> SwitchVerdict:
        """`evaluate`, then require the streak. `candidate` names the candidate layout (e.g. its
        LayoutShape): a streak for one candidate does not carry over to another. A switch resets it,
        since the incumbent changes; the caller records `now` as its next `last_switch_t`."""
        v = self.evaluate(now, current_s, candidate_s, transition_cost_s, window_s, last_switch_t)
        if candidate != self._key:
            self._key, self._streak = candidate, 0
        # The dwell only says "not yet": the evidence for the candidate still counts.
        self._streak = self._streak + 1 if v.switch or v.rule == "dwell" else 0
        if not v.switch:
            return v
        clear = v.gain_s > self.clear * self.hysteresis * current_s
        if not clear and self._streak < self.confirm:
            return SwitchVerdict(False, f"confirm: {self._streak} of {self.confirm} consecutive decisions "
                                        f"favour the candidate", v.gain_s, v.cost_s, v.break_even_s)
        self._streak = 0
        return v

    def reset(self) -> None:
        """Forget the streak (e.g. the layout changed for another reason)."""
        self._streak, self._key = 0, None
