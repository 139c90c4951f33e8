"""Colocated vs disaggregated prefill/decode, per workload profile and rollout budget, from the simulator.

For each profile (swe, search, game, math-tool, web) and each rollout budget (8, 16, 32 devices), the
same scenario runs with a fixed layout: colocated (every TP1 engine mixed) and disaggregated at the
P:D ratios 1:3, 1:1 and 3:1 scaled to the budget (8 devices: 2P:6D, 4P:4D, 6P:2D). Qwen3-8B on
H800; WORKLOADS.md S1's batch (32 prompts x 8) and 8 training devices whatever the rollout budget (the
extra devices are what an elastic pool would add); staleness 1; seeds 0, 1, 2. Each run stops after
10 training steps (or 8 virtual hours); the figure is the steady-state throughput (trained
trajectories/s from the end of step 1 to the end of the last step), averaged over the seeds.

The reasons columns: time-averaged decode batch per decode-capable worker (how much each decode step
is shared) and the KV evictions (idle sessions pushed out of the cache, whose next turn must be
prefilled again). The trainer-idle column says whether rollout is the bottleneck (idle > 0) or the
trainer is (idle ~ 0: every layout ties).

Workaround: response lengths are clipped at 2 tokens instead of 1 (probability ~1e-5 per turn), because
a 1-token response in a disaggregated layout hangs the emulated engine (tests/sim/test_sim.py,
test_one_token_responses_do_not_hang_a_disaggregated_layout). Each run also has a wall-clock limit.

Usage: python benchmarks/pd_table.py [--jobs 2] [--out docs/pd_table.md] [--profiles swe,game]
Writes the markdown file and prints it; a summary line is printed last. About 2-3 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pearl.config import ScenarioConfig, parse_config  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.workloads import PROFILES as WORKLOADS  # noqa: E402

PROFILES = ["swe", "search", "game", "math-tool", "web"]
BUDGETS = [8, 16, 32]
RATIOS = [("colocated", None), ("1:3", (1, 3)), ("1:1", (1, 1)), ("3:1", (3, 1))]
STEPS = 10
SEEDS = (0, 1, 2)
TRAIN_DEVICES = 8
PROMPTS = 32  # x 8 samples: WORKLOADS.md S1's batch, whatever the rollout budget
RUN_LIMIT_S = 240  # wall seconds per run


class RunTimeout(Exception):
    pass


def _expire(signum, frame):
    raise RunTimeout


def layout(n: int, ratio: tuple[int, int] | None) -> dict:
    if ratio is None:
        return {"mode": "colocated"}
    p = n * ratio[0] // sum(ratio)
    return {"mode": "disaggregated", "prefill": p, "decode": n - p}


def min_two_tokens(profile: str) -> dict:
    """The profile's response-length distribution, clipped at 2 tokens (see the module docstring)."""
    d = WORKLOADS[profile]["response_tokens"]
    return d.model_copy(update={"min": max(2.0, d.min)}).model_dump(exclude_none=True)


def run_one(task: tuple[str, int, str, int]) -> dict:
    profile, n, name, seed = task
    lay = layout(n, dict(RATIOS)[name])
    cfg = parse_config({
        "name": f"{profile}-{n}-{name}", "seed": seed, "model": "qwen3-8b", "duration_s": 8 * 3600.0,
        "max_train_steps": STEPS, "cluster": {"hardware": "h800", "rollout_devices": n, "train_devices": TRAIN_DEVICES},
        "layout": lay, "workload": {"profile": profile, "response_tokens": min_two_tokens(profile)},
        "rl": {"prompts_per_batch": PROMPTS, "group_size": 8, "staleness": 1},
    }, ScenarioConfig)
    out = {"profile": profile, "n": n, "name": name, "seed": seed,
           "label": "colocated" if lay["mode"] == "colocated" else f"{lay['prefill']}P:{lay['decode']}D"}
    signal.signal(signal.SIGALRM, _expire)
    signal.alarm(RUN_LIMIT_S)
    try:
        r = Simulator(cfg).run()
    except RunTimeout:
        return {**out, "steps": -1, "thr": 0.0, "conc": 0.0, "evict": 0, "idle": 0.0}
    finally:
        signal.alarm(0)
    span = r["throughput"]["steady_state_s"]
    idle = sum(s["trainer_idle_s"] for s in r["per_step"][1:])
    return {**out, "steps": r["train_steps"], "thr": r["throughput"]["trajectories_per_s"],
            "conc": r["decode_concurrency"]["per_decode_worker"], "evict": r["reconfiguration"]["kv_evictions"],
            "idle": idle / span if span else 0.0}


def aggregate(results: list[dict]) -> dict[tuple[str, int, str], dict]:
    """Mean over seeds per (profile, budget, layout); keeps the per-seed throughputs."""
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["profile"], r["n"], r["name"]), []).append(r)
    cells = {}
    for key, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        mean = lambda f: sum(r[f] for r in rs) / len(rs)  # noqa: E731
        cells[key] = {"label": rs[0]["label"], "name": key[2], "steps": min(r["steps"] for r in rs),
                      "thr": mean("thr"), "seeds": [r["thr"] for r in rs], "conc": mean("conc"),
                      "evict": mean("evict"), "idle": mean("idle")}
    return cells


def ranked(cells: list[dict]) -> list[dict]:
    return sorted((c for c in cells if c["steps"] >= 3), key=lambda c: -c["thr"])


def margin(rank: list[dict]) -> str:
    if len(rank) < 2:
        return "n/a"
    a, b = rank[0], rank[1]
    won = sum(x > y for x, y in zip(a["seeds"], b["seeds"]))
    return f"+{a['thr'] / b['thr'] - 1:.1%} over {b['label']}, {won}/{len(a['seeds'])} seeds"


def table(profile: str, cells: dict[tuple[int, str], dict]) -> list[str]:
    names = [n for n, _ in RATIOS]
    head = (["rollout budget"] + [("colocated" if n == "colocated" else f"P:D {n}") for n in names]
            + ["best's margin", "decode batch / worker", "KV evictions", "trainer idle"])
    out = [f"### {profile}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in BUDGETS:
        row = [cells[(n, name)] for name in names]
        rank = ranked(row)
        line = [f"{n} devices"]
        for c in row:
            txt = (f"{c['thr']:.3f}" if c["steps"] >= 3 else "n/a (run timed out)" if c["steps"] < 0
                   else f"n/a ({c['steps']} steps)")
            txt += f" ({c['label']})" if c["name"] != "colocated" else ""
            line.append(f"**{txt}**" if rank and c is rank[0] else txt)
        line.append(margin(rank))
        line.append(" / ".join(f"{c['conc']:.1f}" for c in row))
        line.append(" / ".join(f"{c['evict']:.0f}" for c in row))
        line.append(" / ".join(f"{c['idle']:.0%}" for c in row))
        out.append("| " + " | ".join(line) + " |")
    return out + [""]


def headline(cells: dict[tuple[str, int, str], dict], profiles: list[str]) -> tuple[list[str], int]:
    out, n_dis = [], 0
    for p in profiles:
        wins = []
        for n in BUDGETS:
            rank = ranked([cells[(p, n, name)] for name, _ in RATIOS])
            if not rank:
                wins.append(f"{n} devices: n/a")
                continue
            n_dis += rank[0]["name"] != "colocated"
            wins.append(f"{n} devices: {rank[0]['label']} ({margin(rank)})")
        out.append(f"- **{p}**: " + "; ".join(wins))
    return out, n_dis


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "pd_table.md"))
    ap.add_argument("--profiles", default=",".join(PROFILES))
    args = ap.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    tasks = [(p, n, name, s) for p in profiles for n in BUDGETS for name, _ in RATIOS for s in SEEDS]
    tasks.sort(key=lambda t: (-t[1], t[0] != "swe"))  # the longest runs first: better packing
    t0 = time.perf_counter()
    with mp.Pool(args.jobs) as pool:
        results = pool.map(run_one, tasks, chunksize=1)
    wall = time.perf_counter() - t0
    cells = aggregate(results)
    cmd = "python benchmarks/pd_table.py" + ("" if profiles == PROFILES else f" --profiles {args.profiles}")
    heads, n_dis = headline(cells, profiles)
    md = ["# Colocated vs disaggregated PD, by workload and rollout budget", "",
          f"Generated by `{cmd}`. **Every number comes from the simulator's model** (roofline step times for "
          "Qwen3-8B on H800, emulated engines, virtual time), not from measurements on hardware.", "",
          f"Set-up: WORKLOADS.md S1 (batch {PROMPTS} prompts x 8 samples, {TRAIN_DEVICES} training devices, "
          "staleness 1) with 8, 16 or 32 rollout devices of TP1 engines in a fixed layout; P:D ratios scaled to "
          f"the budget (the layout is in brackets). {STEPS} training steps per run; cells are the steady-state "
          f"trained trajectories/s (end of step 1 to end of step {STEPS}), mean of seeds {', '.join(map(str, SEEDS))}; "
          "best per row in bold, with its margin over the runner-up and on how many seeds it beat it.", "",
          "Reasons columns, in the order colocated / 1:3 / 1:1 / 3:1: decode batch / worker = time-averaged "
          "number of sequences in each decode step of a decode-capable worker; KV evictions = idle sessions "
          "pushed out of a KV cache (their next turn is prefilled again); trainer idle = fraction of the steady "
          "state the trainer waited for a batch (near 0: trainer-bound, layouts would tie).", "",
          "Response lengths are clipped at 2 tokens instead of 1: a 1-token response hangs a disaggregated "
          "layout in the current simulator (see the script's docstring).", "", "## Who wins", ""]
    md += heads + [""]
    for p in profiles:
        md += table(p, {(n, name): cells[(p, n, name)] for n in BUDGETS for name, _ in RATIOS})
    text = "\n".join(md)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    print(text)
    print(f"{len(tasks)} runs in {wall:.0f} s on {args.jobs} processes; wrote {args.out}")
    cells_n = len(profiles) * len(BUDGETS)
    print(f"pd table: disaggregated best in {n_dis} of {cells_n} (profile, budget) rows, colocated in "
          f"{cells_n - n_dis}")


if __name__ == "__main__":
    main()
