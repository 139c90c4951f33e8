"""Profile the real engine: time its steps and calibrate the performance model from them.

Job: measure `TorchEngine` steps on this machine (the step's shape — decode batch, Σ decode context,
prefill tokens, prefill attention work — and the seconds it took), over a sweep that mixes decode-only,
prefill-only and mixed steps of different sizes, then fit the roofline coefficients (`combine="sum"`:
on a CPU compute and memory traffic do not overlap) and save them as a `pearl.perf.profile.Profile`.

The step shape comes from the engine's own scheduler: `StepRecorder` wraps the `schedule` method of the
engine's `Scheduler` *instance* (engine.py is untouched) and keeps the `ScheduledBatch` it returned, so
the shape recorded is exactly what the step ran. Each step is timed with both the wall clock
(`time.perf_counter`) and this process's CPU clock (`time.process_time`); with one intra-op thread the
latter is what the wall time would be on an idle core, which matters on a shared machine.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pearl.perf.calibrate import Calibration, StepSample, fit
from pearl.perf.hardware import get_hardware
from pearl.perf.models import ModelShape, model_from_hf_config
from pearl.perf.profile import Profile, save_profile
from pearl.real.engine import Output, TorchEngine
from pearl.real.sampling import SamplingParams

CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class StepRecord:
    """One engine step: its shape (from the ScheduledBatch) and its duration on both clocks."""

    n_decode: int
    decode_context: int
    prefill_tokens: int
    prefill_attn: float
    wall_s: float
    cpu_s: float

    def sample(self, clock: str = "wall") -> StepSample:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        return StepSample(self.n_decode, self.decode_context, self.prefill_tokens, self.prefill_attn,
                          self.wall_s if clock == "wall" else self.cpu_s)


class StepRecorder:
    """Observes a TorchEngine: `step()` runs `engine.step()` timed, recording the batch it scheduled.

    The hook is an instance attribute shadowing `Scheduler.schedule` on this engine's scheduler only;
    `detach()` (or leaving a `with` block) removes it. Steps with nothing scheduled are not recorded."""

    def __init__(self, engine: TorchEngine):
        self.engine = engine
        self.records: list[StepRecord] = []
        self.recording = True
        self._last = None
        sched = engine.scheduler
        inner = sched.schedule

        def schedule():
            batch = inner()
            self._last = batch
            return batch

        sched.schedule = schedule  # type: ignore[method-assign]

    def step(self) -> list[Output]:
        self._last = None
        w0, c0 = time.perf_counter(), time.process_time()
        outs = self.engine.step()
        w1, c1 = time.perf_counter(), time.process_time()
        b = self._last
        if b is not None and self.recording:
            self.records.append(StepRecord(b.n_decode, b.decode_context, b.prefill_tokens, b.prefill_attn,
                                           w1 - w0, c1 - c0))
        return outs

    def samples(self, clock: str = "wall") -> list[StepSample]:
        return [r.sample(clock) for r in self.records]

    def median_samples(self, clock: str = "wall") -> list[StepSample]:
        """One sample per distinct step shape, timed by the median over its occurrences: a repeated
        sweep thus filters out the steps another process happened to interrupt."""
        return median_samples(self.records, clock)

    def detach(self) -> None:
        self.engine.scheduler.__dict__.pop("schedule", None)

    def __enter__(self) -> "StepRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


def median_samples(records: Sequence[StepRecord], clock: str = "wall") -> list[StepSample]:
    """Group records by step shape; one StepSample per shape with the median duration on `clock`."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        s = r.sample(clock)
        groups.setdefault((s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn), []).append(s.seconds)
    return [StepSample(*key, statistics.median(v)) for key, v in groups.items()]


def _params(max_new: int) -> SamplingParams:
    # Greedy, eos ignored, no stop ids: every request generates exactly max_new tokens.
    return SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True, stop_token_ids=())


def _drain(rec: StepRecorder, max_steps: int = 100_000) -> None:
    eng = rec.engine
    for _ in range(max_steps):
        if not eng.has_work():
            break
        for o in rec.step():
            eng.drop_session(o.req.session)


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    hi = min(vocab, 256) - 1
    return [rng.randint(0, hi) for _ in range(n)]


def sweep(rec: StepRecorder, decode_batches: Sequence[int] = (1, 4, 16), contexts: Sequence[int] = (32, 256),
          prefill_chunks: Sequence[int] = (16, 128), decode_steps: int = 4, seed: int = 0) -> None:
    """Drive the engine through the sweep, recording every step.

    For each (decode batch B, context c): B requests with c-token prompts are prefilled (prefill steps,
    chunked at the engine's token budget) and decode `decode_steps` tokens; midway, one request per
    prefill size P arrives (a mixed step of B decodes + P prefill tokens). Then, for each P, a lone
    P-token prompt (a pure prefill step) and a follow-up turn of P tokens on a retained session whose
    context is the largest c (a prefill chunk after cached context)."""
    eng = rec.engine
    rng = random.Random(seed)
    vocab = eng.decoder.shape.vocab
    for B in decode_batches:
        for c in contexts:
            sessions = [f"sw{B}-{c}-{i}" for i in range(B)]
            for s in sessions:
                # long enough that the first to finish prefilling are still decoding when the last joins
                n_new = decode_steps + len(prefill_chunks) + 1 + -(-B * c // eng.scheduler.max_batched_tokens)
                eng.add_request(_tokens(rng, c, vocab), _params(n_new), session=s)
            while any(not r.decoding for r in eng.requests()):  # prefill everything
                rec.step()
            rec.step()
            for P in prefill_chunks:  # one mixed step per chunk size, then a plain decode step
                eng.add_request(_tokens(rng, P, vocab), _params(1), session=f"mx{B}-{c}-{P}")
                for o in rec.step():
                    eng.drop_session(o.req.session)
            _drain(rec)
    c = max(contexts)
    for P in prefill_chunks:
        eng.add_request(_tokens(rng, P, vocab), _params(1), session=f"pf{P}")
        _drain(rec)  # keep nothing: drain drops sessions, so also build a context for the chunk test
        ids = _tokens(rng, c, vocab)
        req = eng.add_request(ids, _params(1), session=f"ctx{P}")
        while eng.has_work():
            rec.step()
        eng.add_request(list(req.token_ids) + _tokens(rng, P, vocab), _params(1), session=f"ctx{P}")
        _drain(rec)


def warm_up(engine: TorchEngine, steps: int = 8, seed: int = 1) -> None:
    """Run a few unrecorded steps (allocator, kernels, caches)."""
    rng = random.Random(seed)
    for i in range(4):
        engine.add_request(_tokens(rng, 64, engine.decoder.shape.vocab), _params(steps), session=f"warm{i}")
    outs = engine.run_until_done()
    for o in outs:
        engine.drop_session(o.req.session)


def measure_steps(engine: TorchEngine, decode_batches: Sequence[int] = (1, 4, 16),
                  contexts: Sequence[int] = (32, 256), prefill_chunks: Sequence[int] = (16, 128),
                  decode_steps: int = 4, clock: str = "wall", warmup: bool = True, repeats: int = 3,
                  seed: int = 0) -> list[StepSample]:
    """Timed engine steps over the `sweep` run `repeats` times (after `warm_up`), as calibration samples
    on `clock` ("wall" or "cpu"), one per step shape (`median_samples`). The engine must be idle; it is
    idle again afterwards."""
    if engine.has_work():
        raise RuntimeError("measure_steps needs an idle engine")
    if warmup:
        warm_up(engine)
    with StepRecorder(engine) as rec:
        for _ in range(repeats):
            sweep(rec, decode_batches, contexts, prefill_chunks, decode_steps, seed)
    return rec.median_samples(clock)


def model_shape(config, name: str = "custom") -> ModelShape:
    """The performance model's shape of a model from its transformers config (or config dict). The
    engine computes in float32 whatever the checkpoint's dtype, so the shape says float32; for the
    embedded models this is their catalogue entry, `pearl.perf.models.get_model(name)`."""
    return model_from_hf_config(config, name, dtype="float32")


def fit_profile(samples: Sequence[StepSample], shape: ModelShape, hardware: str = "cpu",
                max_rel_error: float = 0.25, tp: int = 1) -> tuple[Profile, Calibration]:
    """Fit the `sum` form on `hardware` at `tp` (on CPU: the engine's intra-op threads). Raises
    CalibrationError when the fit is refused."""
    cal = fit(samples, shape, get_hardware(hardware), tp, combine="sum", max_rel_error=max_rel_error)
    return Profile.from_calibration(cal, shape.name, hardware, tp), cal


def calibrate_engine(model_name: str = "tiny", path: str | Path | None = None, *, clock: str = "wall",
                     num_threads: int | None = 1, max_rel_error: float = 0.25,
                     **sweep_kw) -> Profile:
    """Load `model_name`, build a TorchEngine, measure the sweep and fit its profile (hardware "cpu",
    tp 1, combine "sum"); saved as JSON at `path` when given."""
    from pearl.real.models import load_model

    loaded = load_model(model_name)
    engine = TorchEngine(loaded, num_threads=num_threads)
    samples = measure_steps(engine, clock=clock, **sweep_kw)
    profile, _ = fit_profile(samples, model_shape(loaded.config, model_name), "cpu", max_rel_error)
    if path is not None:
        save_profile(profile, path)
    return profile


__all__ = ["StepRecord", "StepRecorder", "median_samples", "sweep", "warm_up", "measure_steps", "model_shape", "fit_profile",
           "calibrate_engine", "CLOCKS"]
