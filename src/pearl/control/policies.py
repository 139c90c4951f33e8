"""The policies a run can use, as configurations of the one controller.

- `fixed` / `static-pd` (`StaticController`): the configured layout, never changed; nothing borrowed.
- `pearl` (`Controller`): PD mode, ratio and tp chosen by the predictor over the whole budget,
  incremental make-before-break plans, cost-aware switching, borrowing with timely return,
  elastic devices absorbed. Its ablations are `PolicyConfig` flags (adapt_pd, borrow, elastic,
  cost_aware, incremental).
- `plan-static` / `plan-warmup` (`control.plan_static`): the layout `pearl plan` ranks best, planned
  before the run from the declared workload, or after `plan_after_s` from the observed one; then kept.
- `rlboost+` (`RLBoostPlus`): elastic devices + idle-trainer reuse with token-level migration; fixed
  colocated PD at the configured tp, no cost model.
- `roll-partial` (`RollPartial`): borrow the trainer's devices every step and give them back by
  aborting (recompute); no external elasticity, no periodic re-decision.
"""
from __future__ import annotations

from pearl.config import PolicyConfig
from pearl.control.controller import ControlSetting, Controller
from pearl.control.observation import Effects, Event, Observation
from pearl.control.plan_static import PlanStatic, PlanWarmup

__all__ = ["RLBoostPlus", "RollPartial", "StaticController", "given_declared_workload", "make_controller"]


class StaticController:
    """The layout the run starts with, kept: no ticks, every event ignored."""

    static = True

    def __init__(self, policy: PolicyConfig):
        self.cfg = policy
        self.name = policy.name

    def first_tick_t(self) -> float | None:
        return None

    def on_tick(self, obs: Observation) -> Effects:
        return Effects()

    def on_event(self, ev: Event, obs: Observation) -> Effects:
        return Effects()


class RLBoostPlus(Controller):
    """Elastic devices + idle-trainer reuse with token-level migration; fixed colocated PD, no cost model."""

    name = "rlboost+"
    adapt_pd = False
    cost_model = False
    adapt_cap = False  # its cap is tuned before the run (`runtime.tuning`), like every baseline's


class RollPartial(Controller):
    """ROLL partial-GPU mode: borrow training devices every step, return them by aborting (recompute)."""

    name = "roll-partial"
    adapt_pd = False
    cost_model = False
    return_migrate = False
    absorbs_elastic = False
    adapt_cap = False

    def decide(self, obs: Observation, why: str) -> Effects:
        if why == "periodic":  # re-lays out only when the budget changes (a return)
            return Effects()
        return super().decide(obs, why)


def given_declared_workload(name: str) -> bool:
    """Whether policy `name` plans from the scenario's declared workload (as a user running `pearl plan`
    before the run would): only `plan-static`. The adaptive policies learn it (`control.estimate`)."""
    return PlanStatic.name == name


def make_controller(policy: PolicyConfig, setting: ControlSetting | None) -> Controller | StaticController:
    """The controller for `policy.name`. `setting` may be None for the static policies."""
    if policy.name in ("fixed", "static-pd"):
        return StaticController(policy)
    if setting is None:
        raise ValueError(f"policy {policy.name!r} needs a ControlSetting")
    if policy.name == PlanStatic.name:  # the layout `pearl plan` ranks best, kept (control/plan_static.py)
        return PlanStatic(policy, setting)
    if policy.name == PlanWarmup.name:  # the same, planned from the workload seen in the first plan_after_s
        return PlanWarmup(policy, setting)
    return {"pearl": Controller, "rlboost+": RLBoostPlus, "roll-partial": RollPartial}[policy.name](policy, setting)
