"""Published inference measurements (`pearl/data/published_perf.csv`) and what the roofline predicts for
each: the evidence behind the catalogue's coefficients (docs/perf_model.md).

Each row is one published point: a GPU, a model, tp, batch, input/output lengths, an engine, and one
measured quantity. `predict` turns a row's conditions into engine steps (`PerfModel.step_time`) and
returns the same quantity. Rows alternate between a fitting half and a held-out half within each source
(`held_out`), a fixed split that `benchmarks/perf_vs_published.py` fits on and reports against.
Pure computation; nothing here fits (the fit lives in the benchmark, out of the runtime path).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from pearl.perf.hardware import Hardware, get_hardware
from pearl.perf.models import MODELS, ModelShape
from pearl.perf.roofline import PerfCoeffs, PerfModel

# Engines that ran NCCL's ring all-reduce under tensor parallelism; every other engine in the data runs a
# custom one-shot all-reduce on NVLink (vLLM since vllm-project/vllm#2192, SGLang, TensorRT-LLM).
RING_ENGINES = frozenset({"vllm-2023"})
STEP_METRICS = ("decode_step_ms", "prefill_ms", "e2e_s", "ttft_s", "gen_tok_s", "total_tok_s")
BUSBW_METRIC = "allreduce_busbw_gbps"


def _llama(name: str, layers: int, hidden: int, q: int, kv: int, ffn: int, vocab: int, **kw) -> ModelShape:
    return ModelShape(name, layers, hidden, q, kv, hidden // q, ffn, vocab, **kw)


# Shapes of the published models that are not in the simulator's catalogue (from their config.json).
# BLOOM's MLP is two 4h matrices (no gate): ffn = 8h/3 gives the same parameter count in the gated form.
SHAPES: dict[str, ModelShape] = {
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "mixtral-8x7b": _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, num_experts=8,
                           experts_per_token=2, expert_ffn=14336),
    "bloom-176b": _llama("bloom-176b", 70, 14336, 112, 112, 38229, 250880, tie_embeddings=True),
    "qwen2.5-7b": _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
    "qwen2.5-14b": _llama("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064),
    "qwen3-14b": ModelShape("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936),
}


@dataclass(frozen=True)
class Point:
    """One published measurement (a row of the CSV)."""

    id: str
    ref: str
    gpu: str
    model: str
    tp: int
    batch: int
    input_len: int
    output_len: int
    dtype: str
    engine: str
    metric: str
    value: float

    @property
    def is_step(self) -> bool:
        return self.metric in STEP_METRICS


def load(path: str | Path | None = None) -> list[Point]:
    """The rows of the dataset (comment lines start with '#')."""
    if path is None:
        text = resources.files("pearl").joinpath("data/published_perf.csv").read_text()
    else:
        text = Path(path).read_text()
    rows = csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#"))
    ints = ("tp", "batch", "input_len", "output_len")
    return [Point(**{**r, **{k: int(r[k]) for k in ints}, "value": float(r["value"])}) for r in rows]


def held_out(points: list[Point]) -> list[bool]:
    """The fixed split: within each source (ref), in file order, every second row is held out."""
    seen: dict[str, int] = {}
    out = []
    for p in points:
        i = seen.get(p.ref, 0)
        seen[p.ref] = i + 1
        out.append(i % 2 == 1)
    return out


def shape(name: str) -> ModelShape:
    return SHAPES[name] if name in SHAPES else MODELS[name]


def _decode_total(pm: PerfModel, batch: int, ctx0: float, steps: int) -> float:
    """Seconds of `steps` decode steps of `batch` sequences whose context starts at ctx0 and grows by one
    per step: Simpson's rule over the first, middle and last step (exact while the step is linear)."""
    if steps <= 0:
        return 0.0
    f = [pm.step_time(batch, int(batch * (ctx0 + k))) for k in (0, (steps - 1) / 2, steps - 1)]
    return steps * (f[0] + 4 * f[1] + f[2]) / 6


def predict(p: Point, coeffs: PerfCoeffs = PerfCoeffs(), hw: Hardware | None = None) -> float:
    """The roofline's value of `p.metric` under `p`'s conditions (hw: override the catalogue entry)."""
    hw = hw or get_hardware(p.gpu)
    if p.metric == BUSBW_METRIC:
        return hw.ring_bw / 1e9
    if p.engine in RING_ENGINES:
        coeffs = replace(coeffs, allreduce="ring")
    pm = PerfModel(shape(p.model), hw, p.tp, coeffs)
    b, n_in, n_out = p.batch, p.input_len, p.output_len
    prefill = pm.step_time(0, 0, b * n_in, b * n_in * n_in / 2.0)  # b prompts of n_in tokens
    if p.metric == "decode_step_ms":
        return 1e3 * pm.step_time(b, int(b * (n_in + n_out / 2)))
    if p.metric == "prefill_ms":
        return 1e3 * prefill
    if p.metric == "ttft_s":
        return prefill
    total = prefill + _decode_total(pm, b, n_in + 1, n_out - 1)
    if p.metric == "e2e_s":
        return total
    if p.metric == "gen_tok_s":
        return b * n_out / total
    if p.metric == "total_tok_s":
        return b * (n_in + n_out) / total
    raise ValueError(f"row {p.id}: unknown metric {p.metric!r}")


def rel_error(p: Point, coeffs: PerfCoeffs = PerfCoeffs(), hw: Hardware | None = None) -> float:
    """(predicted - measured) / measured."""
    return predict(p, coeffs, hw) / p.value - 1.0


__all__ = ["BUSBW_METRIC", "Point", "RING_ENGINES", "SHAPES", "STEP_METRICS", "held_out", "load", "predict", "rel_error", "shape"]
