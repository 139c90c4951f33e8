"""Tune a baseline's knobs by short simulations, and define the `bound` configuration.

A baseline gets every knob that is not PEARL's own contribution: the tensor-parallel size, the cap on
trajectories in flight (`rl.max_concurrent_trajectories`), for `static-pd` the P:D ratio and, for
`rlboost+` where elastic devices come, a smaller tp for the devices of a node its tp cannot use
(`policy.side_tp`: PEARL places such side workers by its own choice), tried on the best layout and cap. (The
simulator has one router, session-affine power-of-two-choices, shared by every policy: there is no
router knob to tune.) When the scenario lets PEARL give prefill workers a tp of their own
(`policy.per_role_tp`), `static-pd` and `bound` get that knob too: every (prefill tp, decode tp)
pair of two valid sizes, at the same prefill shares of the devices. `tune` runs a short simulation of the
scenario per candidate (`candidates`) on a held-out seed (`TUNE_SEED`, never one of the seeds a
comparison reports) and keeps the one with the highest steady-state trajectories/s. Short runs, not
the predictor: the predictor is PEARL's own model, and a baseline tuned by it would inherit its errors.
The search is coarse to fine (`search`): stage 1 one layout per tp (colocated; for `static-pd` its
middle P:D ratio), stage 2 every layout (P:D ratios, per-role tp pairs by their decode tp) of the 2
best tps, stage 3 the caps on the best layout of each of the 2 best tps (`CAP_TPS`: on the
Qwen3-30B-A3B 8 : 8 swe paper cell the best uncapped tp, 1, ran 0.3413 traj/s on the tuning seed with
a cap of 256, tp 4 with it 0.3573, and the caps tried on the best layout alone missed it).
`prune=False`: every candidate, then the caps (the exhaustive search;
`benchmarks/tuning_pruning.py` measures what pruning loses).

`bound` (docs/policies.md): the best static configuration for the time-averaged device budget
with free switching. The budget at a tp is the rollout and elastic devices whole workers of that tp
could use on average (on each node, its devices present rounded down to a multiple of the tp: spot
capacity in pieces of 6 gives tp 8 nothing), plus the trainer's devices times the share of time the
trainer is idle (all measured in PEARL's run of the same scenario and seeds). The bound has no side
workers (`policy.side_tp`): where PEARL or `rlboost+` place them, it may bound less than it says.
Workers come whole, so at a tp the budget lies between two
clusters of whole workers (`bound_split`); with free switching the bound time-shares them so that
the average is the budget, and its throughput is the share-weighted mean of theirs. Each side has
no spot pool and no borrowing (the trainer keeps its own devices: generous) and the best layout of
every colocated tp, P:D ratio and cap, tuned as above; the tp with the best time-share wins.
"""
from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from pearl.config import ScenarioConfig, deep_merge, parse_config
from pearl.errors import ResourceError
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel

__all__ = ["TUNE_SEED", "Bound", "Knobs", "Tuned", "bound_budget", "bound_candidates", "bound_split", "candidates",
           "configure", "pair_ratios", "search", "simulate", "stage_one", "tune", "tune_bound", "tune_duration",
           "valid_tps"]

TUNE_SEED = 1_000_003  # the seed tuning runs use: held out from every reported seed
TUNE_SHARE = 0.25  # a tuning run simulates this share of the scenario's duration ...
TUNE_MIN_S = 600.0  # ... but at least this long (virtual seconds), so a few training steps finish,
TUNE_MIN_STEPS = 6  # ... and doubled (up to the whole run) until the configured layout trains this many
CAP_TPS = 2  # the caps are tried on the best layout of each of this many best tps


@dataclass(frozen=True)
class Knobs:
    """One baseline configuration: tp, the in-flight cap (None: the staleness gate only) and, for a
    disaggregated layout, the prefill and decode worker counts and the prefill workers' own tp (None:
    `tp`, which is then the decode workers')."""

    tp: int
    cap: int | None = None
    prefill: int = 0
    decode: int = 0
    prefill_tp: int | None = None
    side_tp: int | None = None  # rlboost+: workers of this tp on what a node has left (`policy.side_tp`)

    def label(self) -> str:
        ptp = f"@tp{self.prefill_tp}" if self.prefill_tp is not None else ""
        pd = f" {self.prefill}P{ptp}:{self.decode}D" if self.prefill else ""
        side = f" side tp{self.side_tp}" if self.side_tp is not None else ""
        return f"tp{self.tp}{pd}{side} cap {self.cap if self.cap is not None else 'none'}"

    def overrides(self, devices: int | None = None) -> dict[str, Any]:
        lay = ({"mode": "disaggregated", "prefill": self.prefill, "decode": self.decode, "prefill_tp": self.prefill_tp}
               if self.prefill else {"mode": "colocated", "prefill": 0, "decode": 0, "prefill_tp": None})
        out: dict[str, Any] = {"engine": {"tp": self.tp}, "layout": lay, "policy": {"side_tp": self.side_tp},
                               "rl": {"max_concurrent_trajectories": self.cap}}
        if devices is not None:
            out["cluster"] = {"rollout_devices": devices}
        return out


def configure(cfg: ScenarioConfig, over: dict[str, Any]) -> ScenarioConfig:
    """`cfg` with `over` merged in (validated like a scenario file)."""
    return parse_config(deep_merge(cfg.model_dump(mode="json"), over), ScenarioConfig, f"{cfg.name} (tuned)")


def valid_tps(cfg: ScenarioConfig) -> list[int]:
    """Tensor-parallel sizes whose worker fits a device and a node and divides the model's KV heads."""
    model, hw = get_model(cfg.model), get_hardware(cfg.cluster.hardware)
    out = []
    for tp in (1, 2, 4, 8):
        if tp > cfg.cluster.devices_per_node or model.num_kv_heads % tp:
            continue
        try:
            PerfModel(model, hw, tp=tp, memory_utilization=cfg.engine.memory_utilization).kv_capacity_tokens()
        except ResourceError:
            continue
        out.append(tp)
    return out


def _caps(cfg: ScenarioConfig) -> list[int | None]:
    b = cfg.rl.prompts_per_batch * cfg.rl.group_size
    return list(dict.fromkeys([None, b, max(cfg.rl.group_size, b // 2)]))


def ratios(w: int) -> list[int]:
    """Prefill worker counts to try among `w` workers: a prefill share of 1/8, 1/4, 3/8 and 1/2."""
    return sorted({min(w - 1, max(1, round(w * f))) for f in (1 / 8, 1 / 4, 3 / 8, 1 / 2)}) if w >= 2 else []


def candidates(cfg: ScenarioConfig, policy: str, devices: int | None = None) -> list[Knobs]:
    """The layouts to try for `policy` on `devices` rollout devices (default: the scenario's), with
    no cap (`tune` tries the caps on the best layouts). `fixed`, `rlboost+`, `roll-partial`:
    colocated at each tp. `static-pd`: each P:D ratio of `ratios` at each tp, and with
    `policy.per_role_tp` at each (prefill tp, decode tp) pair (`pair_ratios`). `bound`: all of them."""
    n = cfg.cluster.rollout_devices if devices is None else devices
    out: list[Knobs] = []
    tps = valid_tps(cfg)
    for tp in tps:
        if n % tp or n < tp:
            continue
        if policy != "static-pd":
            out.append(Knobs(tp))
        if policy in ("static-pd", "bound"):
            out += [Knobs(tp, None, p, n // tp - p) for p in ratios(n // tp)]
    if policy in ("static-pd", "bound") and cfg.policy.per_role_tp:
        out += [Knobs(tpd, None, p, (n - p * tpp) // tpd, tpp) for tpd in tps for tpp in tps if tpp != tpd
                for p in pair_ratios(n, tpp, tpd)]
    return out


def pair_ratios(n: int, tpp: int, tpd: int) -> list[int]:
    """Prefill worker counts to try on `n` devices with prefill workers of tp `tpp` and decode workers
    of tp `tpd` filling the rest exactly: those nearest a prefill share of 1/8, 1/4, 3/8 and 1/2 of
    the devices."""
    ok = [p for p in range(1, (n - tpd) // tpp + 1) if (n - p * tpp) % tpd == 0]
    return sorted({min(ok, key=lambda p: (abs(p * tpp / n - f), p)) for f in (1 / 8, 1 / 4, 3 / 8, 1 / 2)}) if ok else []


def simulate(cfg: ScenarioConfig, timeline: bool = False) -> dict[str, Any]:
    """One simulation's result (`pearl.runtime.results.collect`) without the per-decision records,
    plus `device_s` (available device-seconds per pool) and, with `timeline`, `roles`
    (`pearl.runtime.timeline.device_roles`)."""
    from pearl.runtime.results import device_seconds, usable_device_seconds
    from pearl.runtime.sim import Simulator
    from pearl.runtime.timeline import device_roles

    sim = Simulator(cfg)
    res = sim.run()
    res.pop("decisions", None)
    res["device_s"] = device_seconds(sim)
    res["usable_s"] = {tp: usable_device_seconds(sim, tp) for tp in valid_tps(cfg)}
    if timeline:
        res["roles"] = device_roles(sim)
    return res


_DURATIONS: dict[str, float] = {}


def tune_duration(cfg: ScenarioConfig) -> float:
    """How long a tuning run lasts: `TUNE_SHARE` of the scenario, at least `TUNE_MIN_S`, doubled up to
    the whole run until the configured layout (`fixed`, no spot pool, the tuning seed) trains
    `TUNE_MIN_STEPS` steps in it. A run too short to reach a steady state ranks layouts by their
    first batch: on s1-swe (4 h) a quarter of the run trains no step at all and picked tp1 with no cap
    (0.144 traj/s) where tp2 with a cap of 128 runs 0.198. Memoised per scenario."""
    key = cfg.model_dump_json()
    if key not in _DURATIONS:
        short = min(cfg.duration_s, max(TUNE_MIN_S, TUNE_SHARE * cfg.duration_s))
        while short < cfg.duration_s:
            probe = configure(cfg, {"seed": TUNE_SEED, "duration_s": short, "policy": {"name": "fixed"},
                                    "cluster": {"elastic": {"kind": "none"}}})
            if simulate(probe)["train_steps"] >= TUNE_MIN_STEPS:
                break
            short = min(cfg.duration_s, 2 * short)
        _DURATIONS[key] = short
    return _DURATIONS[key]


def _trial(args: tuple[dict, str]) -> tuple[str, float]:
    data, key = args
    res = simulate(parse_config(data, ScenarioConfig))
    return key, res["throughput"]["trajectories_per_s"]


@dataclass
class Tuned:
    policy: str
    knobs: Knobs
    cfg: ScenarioConfig  # the scenario with the tuned knobs (the reported seeds are set by the caller)
    trials: list[tuple[str, float]]  # (knobs label, trajectories/s of the short run), best first


Budget = float | dict[int, float]  # devices, the same for every tp or per tp (`bound_budget`)


def _at(budget: Budget, tp: int) -> float:
    return budget[tp] if isinstance(budget, dict) else budget


def bound_candidates(cfg: ScenarioConfig, budget: Budget) -> list[tuple[Knobs, int]]:
    """Every static layout the bound time-shares (module docstring): at each tp, the whole workers
    just below and just above that tp's budget (`bound_split`), colocated or any P:D ratio."""
    return [(k, n) for tp in valid_tps(cfg) for n in bound_split(_at(budget, tp), tp)[:2] if n >= tp
            for k in candidates(cfg, "bound", n) if k.tp == tp]


def _best_sides(got: list[tuple[str, float, tuple[Knobs, int | None]]]) -> dict[tuple[int, int | None], tuple]:
    """(tp, devices) -> the best trial there (`got` is sorted best first)."""
    best: dict[tuple[int, int | None], tuple] = {}
    for g in got:
        best.setdefault((g[2][0].tp, g[2][1]), g)
    return best


def _share_score(best: dict[tuple[int, int | None], tuple], budget: Budget, tp: int) -> float:
    """The time-share's throughput at `tp` (`bound_split`), 0 for a side with no trial."""
    lo, hi, share = bound_split(_at(budget, tp), tp)
    thr = lambda n: best[(tp, n)][1] if (tp, n) in best else 0.0  # noqa: E731
    return (1 - share) * thr(lo) + share * thr(hi)


def _sides(budget: Budget, tp: int) -> list[tuple[int, float]]:
    """(devices, share of time) of each side the time-share at `tp` spends time on (`bound_split`)."""
    lo, hi, share = bound_split(_at(budget, tp), tp)
    return [(n, w) for n, w in ((lo, 1 - share), (hi, share)) if w > 0]


def bound_split(budget: float, tp: int) -> tuple[int, int, float]:
    """(devices below, devices above, share of time above): whole tp-workers around `budget`, time-
    shared so that the average is exactly `budget` (free switching makes the share free)."""
    lo = int(math.floor(budget / tp + 1e-9)) * tp
    share = (budget - lo) / tp
    return lo, lo + tp, (0.0 if share < 1e-9 else share)


@dataclass
class Bound:
    """The bound: `sides`, each (scenario, share of time) with a positive share, at one tp, for the
    device `budget` at that tp; `trials`: (label, trajectories/s) of every short run tried, best first."""
    tp: int
    sides: list[tuple[ScenarioConfig, float]]
    label: str
    budget: float = 0.0
    trials: list[tuple[str, float]] = field(default_factory=list)


def tune_bound(cfg: ScenarioConfig, budget: Budget, pool: ProcessPoolExecutor | None = None,
               prune: bool = True) -> Bound:
    """The best time-share (`bound_split`) over tp, each side's layout and cap tuned like a baseline
    (`search`; its tps ranked by their time-share)."""
    extra = {"policy": {"name": "fixed"}, "cluster": {"elastic": {"kind": "none"}}}
    short = tune_duration(cfg)
    base = {"seed": TUNE_SEED, "duration_s": short, **extra}
    cands = bound_candidates(cfg, budget)
    tps = {k.tp for k, _ in cands}
    got = search(cfg, base, cands, pool, prune,
                 lambda g: sorted(tps, key=lambda tp: -_share_score(_best_sides(g), budget, tp)))
    best = _best_sides(got)
    top = sorted(tps, key=lambda tp: -_share_score(best, budget, tp))[:CAP_TPS]
    caps = [(replace(best[(tp, n)][2][0], cap=c), n) for tp in top for n, _ in _sides(budget, tp) if (tp, n) in best
            for c in _caps(cfg) if c is not None]  # the caps on each side's best layout, at the best tps
    got = sorted(got + _trials(cfg, base, caps, pool), key=lambda x: -x[1])
    best = _best_sides(got)
    tp = max(tps, key=lambda tp: _share_score(best, budget, tp))
    sides, labels = [], []
    for n, w in _sides(budget, tp):
        if (tp, n) not in best:  # below one worker (nothing runs)
            continue
        k = best[(tp, n)][2][0]
        sides.append((configure(cfg, deep_merge(extra, k.overrides(n))), w))
        labels.append(f"{w:.0%} of the time {n} devices {k.label()}")
    return Bound(tp, sides, " + ".join(labels), _at(budget, tp), [(lab, thr) for lab, thr, _ in sorted(got, key=lambda x: -x[1])])


def tune(cfg: ScenarioConfig, policy: str, *, devices: int | None = None, extra: dict | None = None,
         jobs: int = 2, pool: ProcessPoolExecutor | None = None,
         cands: list[tuple[Knobs, int | None]] | None = None, prune: bool = True) -> Tuned:
    """The best of `cands` (default: `candidates(cfg, policy, devices)`) by short simulations
    (`search`, module docstring), then its caps. `extra`: overrides every trial shares (e.g. the
    policy, the spot pool). Raises ValueError if nothing fits."""
    if cands is None:
        cands = [(k, devices) for k in candidates(cfg, policy, devices)]
    if not cands:
        raise ValueError(f"no configuration of {policy!r} fits {devices or cfg.cluster.rollout_devices} devices")
    short = tune_duration(cfg)
    base = {"seed": TUNE_SEED, "duration_s": short, **(extra or {})}
    own = pool is None and jobs > 1
    ex = ProcessPoolExecutor(jobs) if own else pool
    try:
        got = search(cfg, base, cands, ex, prune, lambda g: list(dict.fromkeys(x[2][0].tp for x in g)))
        tops = list(_best_sides(got).values())[:CAP_TPS]  # the best layout of each of the best tps
        caps = [(replace(t[2][0], cap=c), t[2][1]) for t in tops for c in _caps(cfg) if c is not None]
        got = sorted(got + _trials(cfg, base, caps, ex), key=lambda x: -x[1])
        k1, n1 = got[0][2]
        if policy == "rlboost+" and cfg.cluster.elastic.kind != "none":  # its side tp, on the best
            sides = [(replace(k1, side_tp=t), n1) for t in valid_tps(cfg) if t < k1.tp and k1.tp % t == 0]
            got = sorted(got + _trials(cfg, base, sides, ex), key=lambda x: -x[1])
    finally:
        if own:
            ex.shutdown()
    best, n = got[0][2]
    tuned = configure(cfg, deep_merge(extra or {}, best.overrides(n)))
    return Tuned(policy, best, tuned, [(lab, thr) for lab, thr, _ in got])


Trial = tuple[str, float, tuple[Knobs, int | None]]


def search(cfg: ScenarioConfig, base: dict, cands: list[tuple[Knobs, int | None]], ex: ProcessPoolExecutor | None,
           prune: bool, rank: Callable[[list[Trial]], list[int]]) -> list[Trial]:
    """Short runs of `cands`, best first. `prune`: stage 1 runs `stage_one(cands)`, `rank` orders the
    tps from those runs, stage 2 runs the rest of the candidates of the 2 best (a per-role pair when
    its decode tp is among them, whatever its prefill tp: prefill often wants a smaller tp than
    decode); without `prune`, every candidate."""
    if not prune:
        return _trials(cfg, base, cands, ex)
    first = stage_one(cands)
    got = _trials(cfg, base, first, ex)
    top = set(rank(got)[:2])
    rest = [c for c in cands if c not in first and c[0].tp in top]
    return sorted(got + _trials(cfg, base, rest, ex), key=lambda x: -x[1])


def stage_one(cands: list[tuple[Knobs, int | None]]) -> list[tuple[Knobs, int | None]]:
    """One candidate per (tp, devices): the colocated layout, else the middle of its P:D ratios (a
    single tp for both roles)."""
    by: dict[tuple[int, int | None], list[tuple[Knobs, int | None]]] = {}
    for k, n in cands:
        if k.prefill_tp is None:
            by.setdefault((k.tp, n), []).append((k, n))
    out = []
    for group in by.values():
        colo = [c for c in group if not c[0].prefill]
        out.append(colo[0] if colo else sorted(group, key=lambda c: c[0].prefill)[len(group) // 2])
    return out


def _trials(cfg: ScenarioConfig, base: dict, cands: list[tuple[Knobs, int | None]],
            ex: ProcessPoolExecutor | None) -> list[Trial]:
    """(label, trajectories/s of the short run, candidate), best first."""
    by_label = {k.label() + (f" on {n}" if n is not None else ""): (k, n) for k, n in cands}
    jobs_in = [(configure(cfg, deep_merge(base, k.overrides(n))).model_dump(mode="json"), lab)
               for lab, (k, n) in by_label.items()]
    got = list(ex.map(_trial, jobs_in)) if ex is not None else [_trial(j) for j in jobs_in]
    return sorted(((lab, thr, by_label[lab]) for lab, thr in got), key=lambda x: -x[1])


def bound_budget(cfg: ScenarioConfig, results: list[dict[str, Any]]) -> dict[int, float]:
    """The time-averaged device budget PEARL had at each valid tp (module docstring), averaged over its
    runs: the rollout and elastic devices whole workers of that tp could use (`usable_s`; a run
    without it counts every device), plus the trainer's devices times its idle share."""
    tps = valid_tps(cfg)
    vals: dict[int, list[float]] = {tp: [] for tp in tps}
    for r in results:
        T = max(r["virtual_s"], 1e-9)
        pools = cfg.cluster.rollout_devices + r.get("device_s", {}).get("elastic", 0.0) / T
        idle = max(0.0, 1.0 - sum(s["train_s"] for s in r["per_step"]) / T)
        for tp in tps:
            usable = r.get("usable_s", {}).get(tp)
            vals[tp].append((pools if usable is None else usable / T) + cfg.cluster.train_devices * idle)
    return {tp: (sum(v) / len(v) if v else float(cfg.cluster.rollout_devices)) for tp, v in vals.items()}
