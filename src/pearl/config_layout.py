"""The checks and the shape of a scenario's configured layout (`layout:` in a scenario file).

`pearl.config.LayoutConfig` holds the fields (mode, prefill and decode worker counts, and the
prefill workers' own tensor-parallel size `prefill_tp`); the rules live here so that `pearl.config`
stays small. Plain functions over values: this module imports only `pearl.types`, and raises
ValueError with one line that pydantic turns into the field's `ConfigError`.
"""
from __future__ import annotations

from pearl.types import LayoutShape, Mode

__all__ = ["check_layout", "check_layout_fits", "check_rollout_mix", "layout_shape", "parse_mix", "worker_sizes"]


def check_layout(mode: Mode, prefill: int, decode: int, prefill_tp: int | None) -> None:
    """The layout on its own: a disaggregated one needs both roles; `prefill_tp` only means something
    in a disaggregated layout."""
    if mode is Mode.DISAGGREGATED and (prefill < 1 or decode < 1):
        raise ValueError(f"a disaggregated layout needs prefill >= 1 and decode >= 1 (got {prefill}P:{decode}D)")
    if mode is Mode.COLOCATED and prefill_tp is not None:
        raise ValueError("layout.prefill_tp is the prefill workers' tensor-parallel size: it needs mode: disaggregated")


def layout_shape(mode: Mode, prefill: int, decode: int, prefill_tp: int | None, n_devices: int,
                 tp: int) -> LayoutShape:
    """The configured layout on `n_devices` rollout devices at `tp` (the decode or mixed workers')."""
    if mode is Mode.COLOCATED:
        return LayoutShape.colocated(n_devices // tp, tp)
    return LayoutShape.disaggregated(prefill, decode, tp, prefill_tp)


def check_layout_fits(mode: Mode, prefill: int, decode: int, prefill_tp: int | None, tp: int, n: int,
                      node: int) -> None:
    """The layout against the cluster: it uses exactly the `n` rollout devices, and every worker fits
    on a node of `node` devices."""
    if mode is Mode.DISAGGREGATED:
        need = prefill * (prefill_tp or tp) + decode * tp
        if need != n:
            what = f"{prefill}P:{decode}D at tp={tp}" if prefill_tp in (None, tp) else \
                f"{prefill}P@tp{prefill_tp}:{decode}D@tp{tp}"
            raise ValueError(f"layout {what} needs {need} devices but cluster.rollout_devices is {n}")
        if prefill_tp is not None and prefill_tp > node:
            raise ValueError(f"layout.prefill_tp ({prefill_tp}) is larger than cluster.devices_per_node ({node})")
    elif n % tp:
        raise ValueError(f"cluster.rollout_devices ({n}) is not a multiple of engine.tp ({tp})")


def check_rollout_mix(mix: dict[str, int], n: int, worker_sizes: list[int], policy: str) -> None:
    """`cluster.rollout_mix` ({hardware: count}, the last rollout devices of other kinds, in the order
    given) against the cluster: counts of at least 1 that fit in the `n` rollout devices, no worker of
    the layout (`worker_sizes`, in the order they are cut from the devices) across two kinds, and only
    a fixed policy (the controller plans rollout devices of one kind)."""
    if not mix:
        return
    bad = [h for h, k in mix.items() if k < 1]
    if bad:
        raise ValueError(f"cluster.rollout_mix: {bad[0]!r} needs a count of at least 1 (got {mix[bad[0]]})")
    if sum(mix.values()) > n:
        raise ValueError(f"cluster.rollout_mix has {sum(mix.values())} devices but cluster.rollout_devices is {n}")
    if policy != "fixed":
        raise ValueError(f"cluster.rollout_mix needs policy.name: fixed (got {policy!r}); the controller "
                         "plans rollout devices of one kind")
    edges, at = {0}, 0
    for size in worker_sizes:
        at += size
        edges.add(at)
    at = n
    for h, k in reversed(list(mix.items())):
        at -= k
        if at not in edges:
            raise ValueError(f"cluster.rollout_mix: the {k} {h} devices split a worker of the layout "
                             f"(worker sizes {worker_sizes}); give a count that ends on a worker")


def worker_sizes(mode: Mode, prefill: int, decode: int, prefill_tp: int | None, n: int, tp: int) -> list[int]:
    """The devices of each worker of the configured layout, in the order they are cut from the rollout
    devices: the larger tp first when the prefill workers have a tp of their own."""
    if mode is Mode.COLOCATED:
        return [tp] * (n // tp)
    sizes = [prefill_tp or tp] * prefill + [tp] * decode
    return sorted(sizes, reverse=True)


def parse_mix(text: str) -> tuple[str, int]:
    """A `--mix HARDWARE:N` option as (hardware, N); ValueError if it is not that shape or N < 1."""
    name, _, k = text.partition(":")
    if not name or not k.isdigit() or int(k) < 1:
        raise ValueError(f"expected HARDWARE:N with N >= 1, e.g. h20:8 (got {text!r})")
    return name, int(k)
