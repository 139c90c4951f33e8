"""`pearl compare`'s body: load the scenario, run `pearl.runtime.compare.compare`, print and write."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pearl.config import ScenarioConfig, load_config
from pearl.errors import ConfigError
from pearl.runtime.compare import compare, format_table, headline, write
from pearl.runtime.sim import simulator_for

__all__ = ["run_compare"]


def run_compare(scenario: Path, seeds: int, out_dir: Path, jobs: int, duration: float | None,
                echo: Callable[[str], None] = print, sets: dict | None = None) -> dict[str, float]:
    """`sets`: overrides of the scenario's fields (`pearl compare --set`), before `duration`."""
    over = {**(sets or {}), **({"duration_s": duration} if duration is not None else {})} or None
    cfg = load_config(scenario, ScenarioConfig, over)
    simulator_for(cfg, scenario, bool(over))  # fail before any run
    if cfg.cluster.rollout_mix:  # every policy but fixed plans one kind of rollout device
        raise ConfigError(f"{scenario}: cluster.rollout_mix is for pearl simulate with policy.name: fixed; "
                          "pearl compare runs the controller's policies too")
    t0 = time.perf_counter()
    rows = compare(cfg, [cfg.seed + i for i in range(seeds)], jobs=jobs, log=echo)
    echo(format_table(rows))
    h = headline(rows)
    for p in write(rows, out_dir):
        echo(f"saved {p}")
    echo(f"{cfg.name}: PEARL / best baseline {h['pearl_over_best_baseline']:.3f}, PEARL / bound "
         f"{h['pearl_over_bound']:.3f} ({seeds} seeds, {time.perf_counter() - t0:.0f} s)")
    return h
