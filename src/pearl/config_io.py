"""Reading and validating configuration files: a YAML file to a mapping (`read_yaml`), a mapping to a
frozen config (`parse_config`), overrides merged in (`deep_merge`); every user error a one-line
`ConfigError` naming the file or the dotted field. `pearl.config` re-exports all of it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from pearl.errors import ConfigError, describe, one_line

MAX_CONFIG_BYTES = 16 << 20  # a config file is a few KB; anything this large is the wrong file
T = TypeVar("T", bound=BaseModel)


def format_validation_error(err: ValidationError, what: str) -> str:
    """One line: the first problem, with its dotted field path and the bad value."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        return f"{what}: unknown field '{loc}'"
    val = e.get("input")
    shown = "" if isinstance(val, dict) or val is None else f" = {val!r:.60}"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    if not loc:
        return one_line(f"{what}: {msg}{more}")
    return one_line(f"{what}: field '{loc}'{shown}: {msg}{more}")


def parse_config(data: dict[str, Any] | None, cls: type[T], what: str = "config") -> T:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, what)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [(self.construct_object(k, deep=deep), k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
        for i, (key, k) in enumerate(keys):
            if isinstance(key, (str, int, float, bool)) and key in [x for x, _ in keys[:i]]:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping. Missing / a directory / unreadable / not UTF-8 text /
    not YAML / empty / not a mapping / a key given twice: a one-line ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        why = "is a directory, not a YAML file" if p.is_dir() else "not a regular file" if p.exists() else "file not found"
        raise ConfigError(f"{p}: {why}")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: {p.stat().st_size} bytes is too large for a config file (the most is {MAX_CONFIG_BYTES})")
    try:
        data = yaml.load(p.read_bytes().decode("utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not a text file (byte {e.start} is not UTF-8)") from None
    except yaml.YAMLError as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        where, why = (f" line {mark.line + 1}" if mark else ""), (f" ({problem})" if problem else "")
        raise ConfigError(one_line(f"{p}:{where} is not valid YAML{why}")) from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply") from None
    if data is None:
        raise ConfigError(f"{p}: the file is empty (write at least one field, or {{}} for every default)")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of fields at the top level, got {describe(data)}")
    return data


def load_config(path: str | Path, cls: type[T], overrides: dict[str, Any] | None = None) -> T:
    data, what = read_yaml(path), str(path)
    if overrides:
        data, what = deep_merge(data, overrides), f"{path} (with overrides)"
    return parse_config(data, cls, what)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(base, dict):  # a config file whose top level is not a mapping
        raise ConfigError(f"expected a mapping of fields at the top level to apply overrides to, got {describe(base)}")
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
