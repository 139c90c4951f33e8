"""The shell around the controller that both runtimes share: observe, ask, act.

`ControlDriver` asks the runtime for an `Observation`, hands it to the controller (`on_tick` on the
clock's schedule, `on_event` when the runtime reports a fact), and carries out the returned `Effects`
through the runtime's `Actuators`, scheduling delayed actions on the runtime's `Clock`. A follow-up
event (`Effects.then`) is evaluated at once on a fresh observation. Every decision is kept, as a
JSON-ready dict, in `decisions`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pearl.control.observation import Effects, Event, Flip, Lend, Observation, Reclaim, Resize, SetCap, Start, Stop
from pearl.runtime.clock import Clock
from pearl.types import Role

__all__ = ["Actuators", "ControlDriver"]


class Actuators(Protocol):
    """What a runtime can do to its workers and devices. Each call on a worker that no longer exists,
    or a start on devices that are no longer free, is a no-op (the controller decided on an older
    snapshot)."""

    def start(self, devices: tuple[int, ...], role: Role, load_s: float) -> None: ...

    def stop(self, worker: int, migrate: bool) -> None: ...

    def drain(self, worker: int) -> None: ...

    def flip(self, worker: int, role: Role) -> None: ...

    def lend(self, devices: tuple[int, ...], deadline: float) -> None: ...

    def reclaim(self, devices: tuple[int, ...]) -> None: ...

    def set_cap(self, cap: int | None) -> None: ...

    def resize(self, worker: int, devices: tuple[int, ...]) -> None: ...


class ControlDriver:
    def __init__(self, controller: Any, clock: Clock, actuators: Actuators,
                 observe: Callable[[bool], Observation]):
        """`observe(tick)` builds an observation; `tick` is True on a periodic tick (the runtime may
        bring its counters up to date then)."""
        self.controller, self.clock, self.act, self.observe = controller, clock, actuators, observe
        self.decisions: list[dict[str, Any]] = []
        self.ticks = 0

    @property
    def name(self) -> str:
        return self.controller.name

    def start(self) -> None:
        """Schedule the controller's first tick."""
        t = self.controller.first_tick_t()
        if t is not None:
            self.clock.at(t, self.tick)

    def tick(self) -> None:
        self.ticks += 1
        self.apply(self.controller.on_tick(self.observe(True)))

    def event(self, ev: Event) -> float:
        """Report a fact; returns how long the trainer must wait for its devices (0 unless lent)."""
        if self.controller.static:
            return 0.0  # a static policy ignores every event: no observation needed
        return self.apply(self.controller.on_event(ev, self.observe(False)))

    def apply(self, eff: Effects) -> float:
        """Carry out `eff` (and its follow-ups); returns the largest trainer wait they announce."""
        wait = eff.trainer_wait_s
        self.decisions += [d.to_dict() for d in eff.decisions]
        now, act, at = self.clock.now, self.act, self.clock.at
        for a in eff.actions:
            if isinstance(a, Start):
                if a.delay_s > 0:  # on devices that a stop frees first (e.g. a tensor-parallel change)
                    at(now + a.delay_s, act.start, a.devices, a.role, a.load_s)
                else:
                    act.start(a.devices, a.role, a.load_s)
            elif isinstance(a, Flip):
                if a.delay_s > 0:
                    at(now + a.delay_s, act.flip, a.worker, a.role)
                else:
                    act.flip(a.worker, a.role)
            elif isinstance(a, Stop):
                if a.delay_s is None:
                    act.stop(a.worker, a.migrate)
                else:  # make-before-break: no new turns now, stop once the replacements serve
                    act.drain(a.worker)
                    at(now + a.delay_s, act.stop, a.worker, a.migrate)
            elif isinstance(a, Lend):
                act.lend(a.devices, a.deadline)
            elif isinstance(a, Reclaim):
                act.reclaim(a.devices)
            elif isinstance(a, SetCap):
                act.set_cap(a.cap)
            elif isinstance(a, Resize):
                act.resize(a.worker, a.devices)
        if eff.next_tick_t is not None:
            at(eff.next_tick_t, self.tick)
        if eff.then is not None:
            wait = max(wait, self.apply(self.controller.on_event(eff.then, self.observe(False))))
        return wait
