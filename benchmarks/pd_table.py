"""Colocated vs disaggregated prefill/decode, per workload profile and rollout budget, from the simulator,
each side with its knobs tuned.

For each profile (swe, search, game, math-tool, web) and each rollout budget (8, 16, 32 devices of TP1
engines), two static layouts compete, each tuned by short runs on a held-out seed
(`pearl.runtime.tuning.TUNE_SEED`, never a reported seed):
- colocated: every engine mixed, with the best cap on trajectories in flight
  (`rl.max_concurrent_trajectories`: none, B or B/2 for a batch of B);
- disaggregated: the best P:D ratio (a prefill share of 1/8, 1/4, 3/8 or 1/2, `tuning.ratios`) and cap.
Without the cap, 512 trajectories in flight on 8 TP1 engines thrash the KV cache of a colocated layout
on swe (most prefill work is recomputing evicted contexts): the old table, which gave every layout no
cap, credited disaggregation with a win that was the thrash. Qwen3-8B on H800; WORKLOADS.md S1's batch
(32 prompts x 8) and 8 training devices whatever the rollout budget (the extra devices are what an
elastic pool would add); staleness 1. The chosen configuration then runs on seeds 0, 1, 2; each run
stops after 10 training steps (or 8 virtual hours); the figure is the steady-state throughput (trained
trajectories/s from the end of step 1 to the end of the last step), averaged over the seeds.

The reasons columns: time-averaged decode batch per decode-capable worker (how much each decode step
is shared), the KV evictions (idle sessions pushed out of the cache, whose next turn must be prefilled
again), and whether the trainer waits (idle > 0: rollout is the bottleneck; idle ~ 0: every layout ties).

Usage: python benchmarks/pd_table.py [--jobs 2] [--out docs/pd_table.md] [--profiles swe,game]
[--budgets 16] [--mix h20:8]  (--mix: the last 8 rollout devices are H20s, `cluster.rollout_mix`; the
disaggregated layouts then keep their prefill workers on the H800s)
Writes the markdown file and prints it; a summary line is printed last. 315 runs: 279 s on 2 cores,
2026-12-04 (31 minutes on 2 cores shared with other jobs, load 8-14, on 2026-12-01).
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
from pearl.config_layout import parse_mix  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.runtime.tuning import TUNE_SEED, ratios  # noqa: E402

PROFILES = ["swe", "search", "game", "math-tool", "web"]
BUDGETS = [8, 16, 32]
STEPS = 10
SEEDS = (0, 1, 2)
TRAIN_DEVICES = 8
PROMPTS, GROUP = 32, 8  # WORKLOADS.md S1's batch, whatever the rollout budget
CAPS = (None, PROMPTS * GROUP, PROMPTS * GROUP // 2)
RUN_LIMIT_S = 240  # wall seconds per run


class RunTimeout(Exception):
    pass


def _expire(signum, frame):
    raise RunTimeout


def layouts(n: int, mixed: int = 0) -> list[int]:
    """Prefill worker counts: 0 (colocated), then the disaggregated ratios tuning tries; with `mixed`
    devices of another kind (`--mix`, the last ones), only ratios whose prefill workers are all on the
    cluster's own hardware (H800), so the other kind decodes."""
    return [0, *(p for p in ratios(n) if p <= n - mixed)]


def label(n: int, p: int) -> str:
    return "colocated" if p == 0 else f"{p}P:{n - p}D"


def run_one(task: tuple[str, int, int, int | None, int, tuple[tuple[str, int], ...]]) -> dict:
    profile, n, p, cap, seed, mix = task
    lay = {"mode": "colocated"} if p == 0 else {"mode": "disaggregated", "prefill": p, "decode": n - p}
    cfg = parse_config({
        "name": f"{profile}-{n}-{label(n, p)}", "seed": seed, "model": "qwen3-8b", "duration_s": 8 * 3600.0,
        "max_train_steps": STEPS, "cluster": {"hardware": "h800", "rollout_devices": n, "train_devices": TRAIN_DEVICES,
                                                      "rollout_mix": dict(mix)},
        "layout": lay, "workload": {"profile": profile},
        "rl": {"prompts_per_batch": PROMPTS, "group_size": GROUP, "staleness": 1, "max_concurrent_trajectories": cap},
    }, ScenarioConfig)
    out = {"profile": profile, "n": n, "p": p, "cap": cap, "seed": seed, "label": label(n, p)}
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
    return {**out, "steps": r["train_steps"], "thr": r["throughput"]["trajectories_per_s"] if r["train_steps"] >= 3 else 0.0,
            "conc": r["decode_concurrency"]["per_decode_worker"], "evict": r["reconfiguration"]["kv_evictions"],
            "idle": idle / span if span else 0.0}


def chosen(trials: list[dict]) -> dict[tuple[str, int, bool], tuple[int, int | None]]:
    """Per (profile, budget, disaggregated?): the (prefill count, cap) of the best tuning run."""
    best: dict[tuple[str, int, bool], dict] = {}
    for t in trials:
        key = (t["profile"], t["n"], t["p"] > 0)
        if key not in best or t["thr"] > best[key]["thr"]:
            best[key] = t
    return {k: (t["p"], t["cap"]) for k, t in best.items()}


def aggregate(results: list[dict]) -> dict[tuple[str, int, bool], dict]:
    """Mean over seeds per (profile, budget, disaggregated?); keeps the per-seed throughputs."""
    groups: dict[tuple[str, int, bool], list[dict]] = {}
    for r in results:
        groups.setdefault((r["profile"], r["n"], r["p"] > 0), []).append(r)
    cells = {}
    for key, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        mean = lambda f: sum(r[f] for r in rs) / len(rs)  # noqa: E731
        cap = rs[0]["cap"]
        cells[key] = {"label": f"{rs[0]['label']}, cap {cap if cap is not None else 'none'}", "dis": key[2],
                      "steps": min(r["steps"] for r in rs), "thr": mean("thr"), "seeds": [r["thr"] for r in rs],
                      "conc": mean("conc"), "evict": mean("evict"), "idle": mean("idle")}
    return cells


def margin(a: dict, b: dict) -> str:
    won = sum(x > y for x, y in zip(a["seeds"], b["seeds"]))
    return f"+{a['thr'] / b['thr'] - 1:.1%} over {b['label'].split(',')[0]}, {won}/{len(a['seeds'])} seeds"


def rank(co: dict, dis: dict) -> tuple[dict, dict]:
    return (dis, co) if dis["thr"] > co["thr"] else (co, dis)


def cell_text(c: dict, best: bool) -> str:
    txt = f"{c['thr']:.3f} ({c['label']})" if c["steps"] >= 3 else f"n/a ({c['label']}, {c['steps']} steps)"
    return f"**{txt}**" if best else txt


def table(profile: str, cells: dict[tuple[str, int, bool], dict], budgets: list[int]) -> list[str]:
    head = ["rollout budget", "colocated, tuned cap", "disaggregated, tuned ratio and cap", "best's margin",
            "decode batch / worker", "KV evictions", "trainer idle"]
    out = [f"### {profile}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in budgets:
        co, dis = cells[(profile, n, False)], cells[(profile, n, True)]
        a, b = rank(co, dis)
        out.append("| " + " | ".join([f"{n} devices", cell_text(co, a is co), cell_text(dis, a is dis), margin(a, b),
                                      f"{co['conc']:.1f} / {dis['conc']:.1f}", f"{co['evict']:.0f} / {dis['evict']:.0f}",
                                      f"{co['idle']:.0%} / {dis['idle']:.0%}"]) + " |")
    return out + [""]


def headline(cells: dict[tuple[str, int, bool], dict], profiles: list[str],
             budgets: list[int]) -> tuple[list[str], int]:
    out, n_dis = [], 0
    for p in profiles:
        wins = []
        for n in budgets:
            a, b = rank(cells[(p, n, False)], cells[(p, n, True)])
            n_dis += a["dis"]
            wins.append(f"{n} devices: {a['label']} ({margin(a, b)})")
        out.append(f"- **{p}**: " + "; ".join(wins))
    return out, n_dis


def mix_arg(text: str) -> tuple[str, int]:
    try:
        return parse_mix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "pd_table.md"))
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="rollout device counts, e.g. 16,32")
    ap.add_argument("--mix", action="append", default=[], metavar="HARDWARE:N", type=mix_arg,
                    help="the last N rollout devices are of this hardware (cluster.rollout_mix), e.g. h20:8")
    args = ap.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    budgets = [int(b) for b in args.budgets.split(",") if b]
    mix = tuple(args.mix)
    mixed = sum(k for _, k in mix)
    t0 = time.perf_counter()
    tune = [(pr, n, p, cap, TUNE_SEED, mix) for pr in profiles for n in budgets for p in layouts(n, mixed)
            for cap in CAPS]
    tune.sort(key=lambda t: (-t[1], t[0] != "swe"))  # the longest runs first: better packing
    with mp.Pool(args.jobs) as pool:
        pick = chosen(pool.map(run_one, tune, chunksize=1))
        tasks = [(pr, n, *pick[(pr, n, dis)], s, mix) for pr in profiles for n in budgets for dis in (False, True)
                 for s in SEEDS]
        tasks.sort(key=lambda t: (-t[1], t[0] != "swe"))
        results = pool.map(run_one, tasks, chunksize=1)
    wall = time.perf_counter() - t0
    cells = aggregate(results)
    cmd = "python benchmarks/pd_table.py" + ("" if profiles == PROFILES else f" --profiles {args.profiles}") + \
        ("" if budgets == BUDGETS else f" --budgets {args.budgets}") + "".join(f" --mix {h}:{k}" for h, k in mix)
    where = ", ".join(map(str, budgets[:-1])) + (" or " if len(budgets) > 1 else "") + str(budgets[-1])
    kinds = "" if not mix else " (the last " + ", ".join(f"{k} of them {h.upper()}" for h, k in mix) + \
        "; a disaggregated layout keeps its prefill workers on the H800s)"
    heads, n_dis = headline(cells, profiles, budgets)
    md = ["# Colocated vs disaggregated PD, by workload and rollout budget, each side tuned", "",
          f"Generated by `{cmd}` ({len(tune)} tuning runs and {len(tasks)} reported runs, {wall:.0f} s on "
          f"{args.jobs} processes). **Every number comes from the simulator's model** (roofline step times "
          "for Qwen3-8B on H800, emulated engines, virtual time), not from measurements on hardware.", "",
          f"Set-up: WORKLOADS.md S1 (batch {PROMPTS} prompts x {GROUP} samples, {TRAIN_DEVICES} training devices, "
          f"staleness 1) with {where} rollout devices of TP1 engines{kinds}. Each side is tuned by short runs on a "
          "held-out seed: colocated gets the best cap on trajectories in flight (none, "
          f"{CAPS[1]} or {CAPS[2]}), disaggregated the best P:D ratio (prefill share 1/8, 1/4, 3/8 or 1/2) and "
          f"cap; the chosen configuration (in brackets) then runs on seeds {', '.join(map(str, SEEDS))}. "
          f"{STEPS} training steps per run; cells are the steady-state trained trajectories/s (end of step 1 to "
          "end of the last step), mean of the seeds; best per row in bold, with its margin and on how many "
          "seeds it won.", "",
          "Reasons columns, colocated / disaggregated: decode batch / worker = time-averaged number of sequences "
          "in each decode step of a decode-capable worker; KV evictions = idle sessions pushed out of a KV cache "
          "(their next turn is prefilled again); trainer idle = fraction of the steady state the trainer waited "
          "for a batch (near 0: trainer-bound, layouts would tie).", "", "## Who wins", ""]
    md += heads + [""]
    for p in profiles:
        md += table(p, cells, budgets)
    text = "\n".join(md)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    print(text)
    print(f"{len(tune) + len(tasks)} runs in {wall:.0f} s on {args.jobs} processes; wrote {args.out}")
    cells_n = len(profiles) * len(budgets)
    print(f"pd table: disaggregated best in {n_dis} of {cells_n} (profile, budget) rows, colocated in "
          f"{cells_n - n_dis}")


if __name__ == "__main__":
    main()
