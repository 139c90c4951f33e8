"""Write (or list) the paper's experiment as scenario YAML files: one per cell of the matrix in
`pearl.runtime.paper` (model × cluster × elastic pool × availability × workload × seed).

    PYTHONPATH=src python scenarios/paper/generate.py --list               # the cells, with the bottleneck check
    PYTHONPATH=src python scenarios/paper/generate.py --out runs/paper     # write the YAMLs there
    PYTHONPATH=src python scenarios/paper/generate.py --smoke --out DIR    # the small smoke subset

Filters: --model, --workload, --cluster (e.g. 8r8t), --pool, --availability (none, spot, constant),
--seeds N, --duration S. The YAMLs are generated, not committed: regenerate them from the code.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from pearl.runtime.paper import bottleneck, cells, scenario_dict, smoke_cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="directory to write <name>-s<seed>.yaml files into")
    ap.add_argument("--list", action="store_true", help="print the cells and whether the trainer is the bottleneck")
    ap.add_argument("--smoke", action="store_true", help="only the smoke subset")
    ap.add_argument("--model", action="append")
    ap.add_argument("--workload", action="append")
    ap.add_argument("--cluster", action="append")
    ap.add_argument("--pool", action="append", type=int)
    ap.add_argument("--availability", action="append", choices=["none", "spot", "constant"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--duration", type=float, help="virtual seconds (default: 3600, swe 14400)")
    a = ap.parse_args(argv)
    got = smoke_cells(a.duration or 600.0) if a.smoke else cells(a.model, a.workload, a.pool, a.availability, a.cluster,
                                                          range(a.seeds), a.duration)
    if not got:
        print("no cell matches the filters", file=sys.stderr)
        return 2
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        for c in got:
            d = scenario_dict(c.model, c.cluster, c.pool, c.availability, c.workload, c.seed, c.config.duration_s)
            (a.out / f"{c.key}-s{c.seed}.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
        print(f"wrote {len(got)} scenarios to {a.out}")
    if a.list or not a.out:
        for c in got:
            if c.seed != got[0].seed:
                continue
            b = bottleneck(c)
            flag = "trainer-bound" if b.trainer_bound else f"rollout-bound (headroom {b.rollout_s / b.train_s:.1f}x)"
            print(f"{c.key:55s} train {b.train_s:7.1f} s/step  rollout {b.rollout_s:7.1f} s/step  {flag}")
    print(f"{len(got)} cells ({len({c.key for c in got})} scenarios x seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
