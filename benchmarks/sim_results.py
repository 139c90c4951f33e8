"""Every shipped scenario under every policy, saved as result JSONs, and optionally compared with an
earlier set: the check that a refactor of the simulator or the controller changed no result.

    .venv/bin/python benchmarks/sim_results.py OUT_DIR [--compare EARLIER_DIR]

Decision records are compared without the fields added since the first recorded set (`kind`,
`rule`, `gain_s`, `cost_s`). Prints, last, how many of the result files are identical.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pearl.config import ScenarioConfig, load_config  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402

POLICIES = ("fixed", "pearl", "rlboost+", "roll-partial")
NEW_DECISION_FIELDS = ("kind", "rule", "gain_s", "cost_s")


def run_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for sc in sorted((ROOT / "scenarios").glob("*.yaml")):
        for pol in POLICIES:
            t0 = time.perf_counter()
            res = Simulator(load_config(sc, ScenarioConfig, {"policy": {"name": pol}})).run()
            (out / f"{sc.stem}-{pol}.json").write_text(json.dumps(res, indent=1, sort_keys=True))
            print(f"{sc.stem:32s} {pol:13s} {time.perf_counter() - t0:5.1f} s  "
                  f"{res['throughput']['trajectories_per_s']:.4f} traj/s", flush=True)


def _strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in NEW_DECISION_FIELDS}


def compare(new: Path, old: Path) -> int:
    same = 0
    files = sorted(old.glob("*.json"))
    for f in files:
        a, b = json.loads(f.read_text()), json.loads((new / f.name).read_text())
        keys = [k for k in a if k != "decisions" and a[k] != b.get(k)]
        dec = [_strip(x) for x in b.get("decisions", [])] != [_strip(x) for x in a.get("decisions", [])]
        if keys or dec:
            print(f"DIFFERS {f.name}: {keys + (['decisions'] if dec else [])}")
        else:
            same += 1
    print(f"identical: {same} of {len(files)}")
    return same


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--compare", type=Path, default=None)
    a = ap.parse_args()
    run_all(a.out)
    if a.compare is not None:
        compare(a.out, a.compare)
