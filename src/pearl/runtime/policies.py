"""Layout policies for the simulator. `fixed` (ROLL-style colocated, or `static-pd` at a fixed ratio)
never changes the layout; the PEARL controller and the elastic baselines live in `pearl.control`
and plug in through the same hooks."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pearl.config import PolicyConfig
from pearl.types import Mode, Role

if TYPE_CHECKING:
    from pearl.runtime.sim import Simulator


class Policy:
    name = "base"

    def __init__(self, cfg: PolicyConfig):
        self.cfg = cfg

    def setup(self, sim: "Simulator") -> None:
        """Build the initial layout on the rollout devices (ready at t=0: weights already loaded)."""
        lay, tp = sim.cfg.layout, sim.cfg.engine.tp
        devs = sim.rollout_devices
        groups = [tuple(devs[i:i + tp]) for i in range(0, len(devs) - tp + 1, tp)]
        roles = ([Role.PREFILL] * lay.prefill + [Role.DECODE] * lay.decode
                 if lay.mode is Mode.DISAGGREGATED else [Role.MIXED] * len(groups))
        for g, role in zip(groups, roles):
            sim.start_worker(g, role, load_s=0.0)

    def on_worker_ready(self, sim: "Simulator", eng) -> None:
        pass

    def on_train_start(self, sim: "Simulator", t: float, t_end: float) -> None:
        pass

    def on_train_end(self, sim: "Simulator", t: float) -> None:
        pass

    def on_devices_added(self, sim: "Simulator", devs: list[int]) -> None:
        pass

    def on_notice(self, sim: "Simulator", devs: list[int], at: float) -> None:
        pass

    def on_devices_removed(self, sim: "Simulator", devs: list[int]) -> None:
        pass

    def trainer_needs_devices(self, sim: "Simulator", t: float) -> float:
        """Seconds the trainer must wait for its devices to come back (0: none are lent)."""
        return 0.0


class FixedPolicy(Policy):
    name = "fixed"


def make_policy(cfg: PolicyConfig) -> Policy:
    if cfg.name in ("fixed", "static-pd"):
        return FixedPolicy(cfg)
    from pearl.runtime.controlled import make_controlled_policy  # the controller-driven policies

    return make_controlled_policy(cfg)
