"""User-facing errors. Each carries a one-line message naming the problem; the CLI prints it and
exits with code 2 (no traceback). Internal bugs stay ordinary exceptions."""
from __future__ import annotations

import numbers
from typing import Any


def one_line(text: str) -> str:
    """A message on one line: every run of whitespace (newlines included) becomes one space."""
    return " ".join(str(text).split())


def describe(v: Any) -> str:
    """What kind of value a user gave, for messages: 'a boolean', 'a string', 'an integer', ..."""
    kinds = ((bool, "a boolean"), (str, "a string"), (numbers.Integral, "an integer"), (numbers.Real, "a float"),
             (dict, "a mapping"), ((list, tuple), "a list"))
    return next((w for t, w in kinds if isinstance(v, t)), type(v).__name__)


class PearlError(Exception):
    """Base of every error caused by the user's input or environment."""

    exit_code = 2


class ConfigError(PearlError):
    """A config or scenario field is wrong: the message names the field and the bad value."""


class UnknownNameError(ConfigError):
    """An unknown model / hardware / profile / environment name; the message lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str] | tuple[str, ...]):
        self.kind, self.name, self.known = kind, name, list(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(sorted(self.known))}")


class CalibrationError(PearlError):
    """A performance-model fit that is physically impossible (negative time, MFU above 1, ...)."""


class ResourceError(PearlError):
    """A model that does not fit in memory, a layout that does not fit the devices, ..."""


class EnvironmentFailure(PearlError):
    """An environment raised or timed out; the trajectory fails with this reason, the run goes on."""
