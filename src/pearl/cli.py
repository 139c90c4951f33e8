"""The `pearl` command line: simulate a cluster, ask for a plan, train an agent, calibrate a profile.

Every user error (a bad config field, an unknown model, a missing file) is a one-line message on
stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from pearl.config import MAX_BATCH, MAX_DEVICES, MAX_DURATION_S, MAX_SEED, TP_SIZES
from pearl.errors import ConfigError, PearlError, UnknownNameError, one_line

try:  # typer >= 0.2x vendors its click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - an older typer on the real click
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[no-redef]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="PEARL: adaptive prefill-decode execution with elasticity for agentic RL.")
out = Console()
err = Console(stderr=True)


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_+-]*")


def _parse_sets(sets: list[str]) -> dict[str, Any]:
    """`--set a.b=3` overrides, values parsed as YAML (scalars, or flow lists/mappings)."""
    tree: dict[str, Any] = {}
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, val = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(_KEY.fullmatch(p) for p in parts):
            raise ConfigError(f"--set {item!r}: {key.strip()!r} is not a field path like rl.staleness")
        try:
            value = yaml.safe_load(val)
        except yaml.YAMLError:
            raise ConfigError(f"--set {item!r}: the value {val!r} is not valid YAML") from None
        node = tree
        for i, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[:i + 1])} is already set to a value")
        if isinstance(node.get(parts[-1]), dict):
            raise ConfigError(f"--set {item!r}: {key.strip()} already has fields set")
        node[parts[-1]] = value
    return tree


def _int_in(lo: int, hi: int) -> Callable[[Any], int]:
    """A typer `parser` for an integer option in [lo, hi]: `1e30`, `abc`, `3.5` or 10**30 is a
    one-line usage error naming the option and the value."""
    def parse(raw: Any) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            n = raw
        else:
            try:
                n = int(str(raw).strip(), 10)
            except ValueError:
                raise typer.BadParameter(f"{str(raw)!r} is not an integer") from None
        if not lo <= n <= hi:
            raise typer.BadParameter(f"{n} is out of range (expected {lo} to {hi})")
        return n
    return parse


def _float_in(lo: float, hi: float) -> Callable[[Any], float]:
    """A typer `parser` for a finite number option in (lo, hi]."""
    def parse(raw: Any) -> float:
        try:
            x = float(str(raw).strip()) if not isinstance(raw, (int, float)) else float(raw)
        except (ValueError, OverflowError):
            raise typer.BadParameter(f"{str(raw)!r} is not a number") from None
        if not math.isfinite(x):
            raise typer.BadParameter(f"{str(raw)!r} is not a finite number")
        if not lo < x <= hi:
            raise typer.BadParameter(f"{x:g} is out of range (expected above {lo:g}, at most {hi:.0f})")
        return x
    return parse


def _check_writable(path: Path, what: str) -> None:
    """Before any work: the file `path` can be written, else a one-line ConfigError (a long run must
    not die at its end on an unwritable --out)."""
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r}: is a directory; give a file path")
    d = path.parent
    top = d
    while not top.exists() and top != top.parent:  # the nearest ancestor that exists
        top = top.parent
    if not top.is_dir():
        raise ConfigError(f"{what} {str(path)!r}: {str(top)!r} is not a directory")
    if top == d:
        try:  # really write: root passes os.access everywhere but not on a read-only mount
            with tempfile.TemporaryFile(dir=top):
                pass
            return
        except OSError as e:
            raise ConfigError(f"{what} {str(path)!r}: cannot write there ({e.strerror or e})") from None
    if not os.access(top, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(path)!r}: cannot create it ({str(top)!r} is not writable)")


@app.command()
def simulate(
    scenario: Path = typer.Argument(..., help="Scenario YAML (see scenarios/)."),
    policy: Optional[str] = typer.Option(None, help="Override policy.name: fixed, static-pd, plan-static, plan-warmup, pearl, rlboost+, roll-partial."),
    seed: Optional[int] = typer.Option(None, parser=_int_in(0, MAX_SEED), help="Override the scenario's seed."),
    duration: Optional[float] = typer.Option(None, parser=_float_in(0, MAX_DURATION_S),
                                             help="Override duration_s (virtual seconds, at most a year)."),
    set_: list[str] = typer.Option([], "--set", help="Override any field: --set rl.staleness=2 (repeatable)."),
    output: Optional[Path] = typer.Option(None, "--out", help="Result JSON path (default runs/<name>-<policy>-s<seed>.json)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Also write a Chrome trace (roles, steps, decisions) here; open it in Perfetto."),
) -> None:
    """Run a scenario in virtual time and print/save throughput, utilisation, concurrency, staleness."""
    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.results import save
    from pearl.runtime.sim import simulator_for

    over = _parse_sets(set_)
    if policy:
        over.setdefault("policy", {})["name"] = policy
    if seed is not None:
        over["seed"] = seed
    if duration is not None:
        over["duration_s"] = duration
    cfg = load_config(scenario, ScenarioConfig, over)
    path = output or Path("runs") / f"{cfg.name}-{cfg.policy.name}-s{cfg.seed}.json"
    _check_writable(path, "--out")
    if trace is not None:
        _check_writable(trace, "--trace")
    sim = simulator_for(cfg, scenario, bool(over))
    with out.status(f"simulating {cfg.name} ({cfg.policy.name}, {cfg.duration_s:.0f} virtual s)"):
        res = sim.run()
    path = save(res, path)
    _print_result(res)
    out.print(f"saved {path}")
    if trace is not None:
        import json

        from pearl.runtime.trace import sim_trace

        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.write_text(json.dumps(sim_trace(sim)))
        out.print(f"saved trace {trace}")


def _print_result(r: dict[str, Any]) -> None:
    t = Table(title=f"{r['scenario']} · policy {r['policy']} · seed {r['seed']}", show_header=False)
    thr = r["throughput"]
    rows = [
        ("trajectories/s (steady state)", f"{thr['trajectories_per_s']:.4f}"),
        ("tokens/s (steady state)", f"{thr['tokens_per_s']:.0f}"),
        ("train steps", str(r["train_steps"])),
        ("trained / discarded (stale)", f"{r['trained_trajectories']} / {r['discarded_stale']}"),
        ("trainer wait for batch / devices (s)", f"{r['trainer']['wait_for_batch_s']:.1f} / {r['trainer']['wait_for_devices_s']:.2f}"),
        ("utilisation by pool", ", ".join(f"{k} {v:.0%}" for k, v in r["utilisation"]["by_pool"].items())),
        ("decode concurrency / active trajectories",
         f"{r['decode_concurrency']['per_decode_worker']:.1f} / {r['decode_concurrency']['active_trajectories']:.1f}"),
        ("a trained trajectory's gate slot (s): generating / group / batch / training",
         " / ".join(f"{r['gate_slot_s'][k]:.1f}" for k in ("generating", "group_wait", "batch_wait", "training"))),
        ("staleness histogram", str(r["staleness_histogram"])),
        ("switches / migrated requests", f"{r['reconfiguration']['switches']} / {r['reconfiguration']['migrated_requests']}"),
        ("final layout", r["layout_final"]),
    ]
    if r["rollout_s_per_step"]:
        xs = r["rollout_s_per_step"]
        rows.insert(3, ("rollout s per step (mean)", f"{sum(xs) / len(xs):.1f}"))
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


@app.command()
def plan(
    model: str = typer.Option("qwen3-8b", help="Catalogue name or path to a Hugging Face config.json."),
    hardware: str = typer.Option("h800", help="h100, h800, h200, h20, a100, cpu."),
    devices: int = typer.Option(16, parser=_int_in(1, MAX_DEVICES), help=f"Rollout device budget (1 to {MAX_DEVICES})."),
    workload: str = typer.Option("swe", help="Workload profile: swe, search, game, math-tool, web."),
    batch: int = typer.Option(256, parser=_int_in(1, MAX_BATCH), help="Trajectories in the rollout batch."),
    tp: str = typer.Option("1", help="Tensor-parallel sizes to consider, comma-separated (e.g. 1,2,4)."),
    top: int = typer.Option(10, parser=_int_in(1, 100_000), help="Rows to show."),
    per_role_tp: bool = typer.Option(False, "--per-role-tp", help="Also rank prefill workers at a tp of their own (e.g. 1P@tp4:4D@tp1)."),
    max_in_flight: Optional[int] = typer.Option(None, "--max-in-flight", parser=_int_in(1, MAX_BATCH), help="At most this many trajectories in flight, the rest of the batch queued (rl.max_concurrent_trajectories)."),
    mix: Optional[str] = typer.Option(None, "--mix", help="HARDWARE:N: N of the --devices are of this other kind (e.g. h20:8): rank layouts on either kind, prefill on one and decode on the other, and pools of both kinds."),
) -> None:
    """Which PD mode and ratio for this model, hardware, budget and workload? A ranked table."""
    from pearl.control.advisor import advise, advise_mix

    try:
        tps = tuple(int(x) for x in tp.split(","))
    except ValueError:
        raise ConfigError(f"--tp: expected comma-separated integers, got {tp!r}") from None
    bad = [t for t in tps if t not in TP_SIZES]
    if bad or len(set(tps)) != len(tps):
        raise ConfigError(f"--tp {tp!r}: expected distinct sizes from {','.join(map(str, TP_SIZES))}")
    cap = f", at most {max_in_flight} in flight" if max_in_flight is not None and max_in_flight < batch else ""
    if mix is None:
        ranked, elapsed = advise(model, hardware, devices, workload, batch, tps, per_role_tp, max_in_flight)
        rows, where = [("", s, p) for s, p in ranked], f"{devices}× {hardware}"
    else:
        from pearl.config_layout import parse_mix
        from pearl.perf.hardware import get_hardware
        try:
            other, k = parse_mix(mix)
        except ValueError:
            k = 0
        if not 1 <= k < devices:
            raise ConfigError(f"--mix {mix!r}: expected HARDWARE:N with 1 <= N < --devices ({devices}), e.g. h20:8")
        if get_hardware(other) is get_hardware(hardware):
            raise ConfigError(f"--mix {mix!r}: {other} is --hardware itself; give another kind, or leave --mix out")
        kinds = ((hardware, devices - k), (other, k))
        rows, elapsed = advise_mix(model, kinds, workload, batch, tps, max_in_flight, per_role_tp)
        where = f"{kinds[0][1]}× {hardware} + {kinds[1][1]}× {other}"
    t = Table(title=f"{model} on {where}, {workload}, batch {batch}{cap}  ({elapsed * 1e3:.1f} ms)")
    for c in ("rank", "layout", *(("on",) if mix else ()), "batch time (s)", "tokens/s", "decode conc.", "bottleneck"):
        t.add_column(c, no_wrap=True)
    for i, (on, shape, p) in enumerate(rows[:top], 1):
        t.add_row(str(i), str(shape), *((on,) if mix else ()), f"{p.completion_s:.1f}", f"{p.tokens_per_s:.0f}",
                  f"{p.decode_concurrency:.1f}", p.bottleneck)
    out.print(t)
    if mix:
        out.print("On 'both' and 'P …, D both': workers of both kinds in one pool, one tp on all, the batch split "
                  "between the kinds as the router splits it. Not ranked: a pool with a tp per kind, prefill "
                  "workers on both kinds. To run a layout, simulate it: cluster.rollout_mix in a scenario "
                  "(docs/scenarios.md).")


@app.command()
def train(
    config: Optional[Path] = typer.Argument(None, help="Training YAML (default: the embedded tiny model on a built-in environment)."),
    set_: list[str] = typer.Option([], "--set", help="Override any field: --set max_steps=20 (repeatable)."),
    output: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/<name>-<date>-<time>)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run directory from its newest checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run directory given by --out if it holds a run."),
    address: Optional[str] = typer.Option(None, "--address", help="Join this running Ray cluster (auto, or the head's HOST:PORT); sets backend ray and ray_address."),
) -> None:
    """Train an agent for real (torch engines + GRPO trainer) with the PEARL rollout stack."""
    from pearl.runtime.training import RunInterrupted, run_training

    over = _parse_sets(set_)
    if address is not None:  # overrides ray_address from the config and --set; backend ray unless --set says
        over["ray_address"] = address
        over.setdefault("backend", "ray")
    try:
        run_training(config, over, output, out, resume=resume, overwrite=overwrite)
    except RunInterrupted as e:  # a clean stop, not an error: say how to continue
        print(str(e), file=sys.stderr)
        raise typer.Exit(e.exit_code) from None


@app.command()
def report(
    run: Path = typer.Argument(..., help="A pearl train run directory, or a pearl simulate result JSON."),
    output: Optional[Path] = typer.Option(None, "--out", help="Where to write the PNGs and report.html (default: the run directory, or <result>-report/)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Chrome trace for the role timeline (default: RUN/trace.json, or <result>-trace.json beside a result)."),
) -> None:
    """Plot a run (reward, throughput, staleness, utilisation, role timeline) into PNGs and report.html."""
    from pearl.report import write_report

    page = write_report(run, output, trace)
    out.print(f"saved {page}")


@app.command()
def compare(
    scenario: Path = typer.Argument(..., help="Scenario YAML (see scenarios/)."),
    seeds: int = typer.Option(3, parser=_int_in(1, 1000), help="Seeds to run: the scenario's seed and the next ones."),
    output: Path = typer.Option(Path("runs/compare"), "--out", help="Directory for results.json and the PNGs."),
    jobs: int = typer.Option(2, parser=_int_in(1, 256), help="Simulations run in parallel (processes)."),
    duration: Optional[float] = typer.Option(None, parser=_float_in(0, MAX_DURATION_S), help="Override duration_s."),
    set_: list[str] = typer.Option([], "--set", help="Override any field: --set policy.per_role_tp=true (repeatable)."),
) -> None:
    """Every policy (baselines as configured and tuned, pearl, bound, ablations) on the same seeds: table + PNGs."""
    from pearl.runtime.compare_cli import run_compare

    run_compare(scenario, seeds, output, jobs, duration, lambda s: out.print(s, soft_wrap=True, markup=False, highlight=False),
                _parse_sets(set_))


@app.command()
def profile(
    model: Optional[str] = typer.Option(None, help="A runnable model: tiny, smollm2-135m (default: the config's)."),
    output: Path = typer.Option(Path("runs/profile.json"), "--out", help="Where to save the profile (JSON)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Training YAML whose trainer settings, batch and workers to measure with (default: the embedded one)."),
    set_: list[str] = typer.Option([], "--set", help="Override a field of the training config: --set trainer.micro_batch_size=16."),
) -> None:
    """Measure the torch engine and the GRPO trainer on this machine and save a calibrated profile."""
    from pearl.real.models import SOURCES
    from pearl.runtime.train_config import load_train_config
    from pearl.runtime.twin_profile import calibrate

    over = _parse_sets(set_)
    if model is not None:
        if model not in SOURCES:
            raise UnknownNameError("model", model, list(SOURCES))
        over["model"] = model
    cfg = load_train_config(config, over)
    if cfg.model not in SOURCES:
        raise UnknownNameError("model", cfg.model, list(SOURCES))
    _check_writable(output, "--out")
    with out.status(f"measuring {cfg.model} engine steps and trainer steps"):
        prof = calibrate(cfg, output)
    tr = prof.trainer
    out.print(f"saved {output} ({prof.model} on {prof.hardware}; trainer {tr.fixed_s * 1e3:.1f} ms + "
              f"{tr.per_token_s * 1e6:.2f} us/token + {tr.per_pair_s * 1e9:.2f} ns/attention pair)")


@app.command("convert-gguf")
def convert_gguf(
    out_dir: Path = typer.Argument(Path("models/smollm2-135m"), help="Folder to write (must not exist or be empty)."),
) -> None:
    """Write the embedded SmolLM2-135M-Instruct GGUF as a Hugging Face folder (config.json, safetensors,
    tokenizer) that `model: DIR`, transformers and vLLM load offline."""
    from pearl.real.models import convert_gguf as convert

    with out.status("converting the embedded SmolLM2 GGUF"):
        folder = convert(out_dir)
    out.print(f"saved {folder}")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. A user error (bad option, bad config, missing file) is one line on stderr,
    `error: <message>`, and exit code 2; never a traceback or a boxed usage panel."""
    try:
        rv = app(args=argv, prog_name="pearl", standalone_mode=False)
    except NoArgsIsHelpError as e:  # bare `pearl`: the help, as before
        print(e.ctx.get_help())
        sys.exit(e.exit_code)
    except UsageError as e:  # bad / unknown option, missing argument, unknown command
        print(f"error: {one_line(e.format_message())}", file=sys.stderr)
        sys.exit(2)
    except ClickException as e:
        print(f"error: {one_line(e.format_message())}", file=sys.stderr)
        sys.exit(e.exit_code)
    except PearlError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)  # one line, never wrapped
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
