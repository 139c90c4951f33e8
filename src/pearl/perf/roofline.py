"""Roofline step times for one inference worker (one model replica on `tp` devices), plus the costs the
controller weighs: KV hand-off, weight loading, training steps and weight sync.

One engine step is timed as

    t_step = overhead + seq_overhead·sequences + combine(operators) + all-reduces

- `overhead`: fixed per engine step (scheduling, kernel launches); `seq_overhead` per sequence in the
  step (each decode sequence, and a prefill chunk counts as one): sampling, detokenisation and
  per-sequence bookkeeping, which the roofline does not see.
- operators: the dense matmuls (weights, experts, LM head) and attention (QK^T/PV FLOPs, KV reads).
  Each has FLOPs over tp·peak·mfu and bytes over tp·HBM·bw_eff; KV bytes are read at `kv_eff` of the
  weight-read rate (paged, scattered blocks) and routed experts at `expert_eff` of the dense rate
  (small grouped GEMMs, routing, uneven expert load).
- `combine`: "per_op" (the default: each operator its own max(FLOPs, bytes), summed: a mixed step whose
  matmuls are compute-bound and whose attention is KV-bound pays both), "max" (one roofline for the
  whole step: compute and memory traffic overlap; what a GPU calibration fits), or "sum" (no overlap;
  fits CPUs better).
- all-reduces (tp > 1): two per layer, each a fixed latency plus tokens·hidden activations moved at the
  hardware's measured bus bandwidth (`Hardware.ring_bw`; S bytes take S·2(tp-1)/tp / ring_bw). The
  latency depends on the engine's all-reduce (`allreduce`): "oneshot", a custom all-reduce whose
  latency does not grow with tp (vLLM since vllm-project/vllm#2192, SGLang, TensorRT-LLM, on NVLink):
  `oneshot_latency_s` each; "ring", NCCL's ring (the alpha-beta model, as Splitwise's 2023 vLLM ran):
  2(tp-1) hops of `allreduce_latency_s`.

Per-GPU efficiencies (mfu, bw_eff, ring_bw) live in `pearl.perf.hardware`; the engine-level ones below
were fitted to published measurements (docs/perf_model.md). A `PerfCoeffs` field left at None takes the
hardware's value. The simulator calls `step_time` about a million times per run, so it is plain float
arithmetic over constants computed in `__init__`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from pearl.config import ElasticConfig
from pearl.errors import ResourceError, UnknownNameError
from pearl.perf.hardware import Hardware
from pearl.perf.models import ModelShape

DISK_BW = 2e9  # B/s: a local NVMe / parallel-FS read of safetensors
# process start, CUDA context, graph capture, allocator warm-up: one number, `cluster.elastic.cold_start_s`
COLD_START_INIT_S = ElasticConfig.model_fields["cold_start_s"].default
WEIGHT_SOURCES = ("peer", "nvlink", "disk")
COMBINE_FORMS = ("max", "per_op", "sum")
ALLREDUCE_FORMS = ("oneshot", "ring")


@dataclass(frozen=True)
class PerfCoeffs:
    """Engine-level coefficients; defaults fitted by `benchmarks/perf_vs_published.py` (docs/perf_model.md)."""

    mfu: float | None = None  # achieved fraction of peak FLOP/s; None: the hardware's `mfu`
    bw_eff: float | None = None  # achieved fraction of HBM bandwidth on weights; None: the hardware's
    step_overhead_s: float = 0.001185  # fixed per engine step (scheduling, launches)
    # Per sequence in a step (sampling, bookkeeping). 0 in the catalogue (fitted to the published points
    # it is ~69 us, docs/perf_model.md); a CPU calibration (`pearl.perf.calibrate`, sum form) fits it.
    seq_overhead_s: float = 0.0
    allreduce: str = "oneshot"  # the engine's all-reduce: "oneshot" (custom kernel) or "ring" (NCCL)
    oneshot_latency_s: float = 2.46e-5  # per all-reduce, any tp, with allreduce="oneshot"
    allreduce_latency_s: float = 1.63e-5  # per ring hop with allreduce="ring" (2(tp-1) hops each)
    kv_eff: float = 0.650  # KV-read rate relative to weight reads
    expert_eff: float = 0.855  # routed-expert matmul rate relative to dense matmuls
    kv_setup_s: float = 0.002  # per KV transfer
    combine: str = "per_op"  # "per_op" (per operator), "max" (one roofline) or "sum" (additive; CPUs)

    def __post_init__(self) -> None:
        if self.combine not in COMBINE_FORMS:
            raise ValueError(f"combine must be one of {', '.join(COMBINE_FORMS)}, got {self.combine!r}")
        if self.allreduce not in ALLREDUCE_FORMS:
            raise ValueError(f"allreduce must be one of {', '.join(ALLREDUCE_FORMS)}, got {self.allreduce!r}")
        for name in ("mfu", "bw_eff"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} ({v}) must be > 0")
        if not (0 < self.kv_eff <= 1 and 0 < self.expert_eff <= 1):
            raise ValueError(f"kv_eff ({self.kv_eff}) and expert_eff ({self.expert_eff}) must be in (0, 1]")
        for name in ("step_overhead_s", "seq_overhead_s", "oneshot_latency_s", "allreduce_latency_s", "kv_setup_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")

    def resolved(self, hw: Hardware) -> "PerfCoeffs":
        """These coefficients with every None taken from `hw`'s catalogue entry."""
        return replace(self, mfu=hw.mfu if self.mfu is None else self.mfu,
                       bw_eff=hw.bw_eff if self.bw_eff is None else self.bw_eff)


class PerfModel:
    """Step-time model of one worker: `model` sharded over `tp` devices of kind `hw`."""

    def __init__(self, model: ModelShape, hw: Hardware, tp: int = 1, coeffs: PerfCoeffs = PerfCoeffs(),
                 memory_utilization: float = 0.9, kv_capacity: int | None = None):
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        if not 0 < memory_utilization <= 1:
            raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
        coeffs = coeffs.resolved(hw)
        self.model, self.hw, self.tp, self.coeffs = model, hw, tp, coeffs
        self.memory_utilization = memory_utilization
        # An engine whose KV pool is configured (pearl train's `engine.kv_capacity_tokens`) holds at
        # most that many tokens, however much memory the device has.
        self.kv_capacity = kv_capacity
        m, d = model, model.dtype_bytes
        # KV heads are split across tp ranks; with tp > num_kv_heads each head is replicated, so the
        # worker as a whole stores (and reads) more KV per token.
        self._kv_bytes = m.kv_bytes_per_token * max(1.0, tp / m.num_kv_heads)
        # --- FLOPs per unit of work (whole worker); routed experts run at expert_eff of the dense rate.
        expert_mm = m.num_layers * m.experts_per_token * m.expert_params if m.is_moe else 0
        self._flops_per_token = 2.0 * ((m.matmul_params_per_token - expert_mm) + expert_mm / coeffs.expert_eff)
        self._flops_per_pair = 4.0 * m.num_q_heads * m.head_dim * m.num_layers  # QK^T and PV, per (q, k)
        self._flops_lm_head = 2.0 * m.hidden * m.vocab  # per sampled position
        # --- bytes (whole worker), in weight-read equivalents: KV reads count 1/kv_eff and expert reads
        # 1/expert_eff of their size. Weights read every step: all but the routed experts and the input
        # embedding table (a gather: only the rows of this step's tokens).
        embed_table = 0 if m.tie_embeddings else m.embedding_params
        self._static_weight_bytes = float((m.dense_params_active - embed_table) * d)
        self._bytes_per_token = float(m.hidden * d) + self._kv_bytes  # embedding row read + KV written
        self._kv_read = self._kv_bytes / coeffs.kv_eff
        self._expert_bytes = float(m.num_layers * m.expert_params * d) / coeffs.expert_eff  # one expert, all layers
        self._n_exp = float(m.num_experts)
        self._log_miss = math.log1p(-m.experts_per_token / m.num_experts) if m.is_moe else 0.0
        # Tensor parallelism: two all-reduces per layer (after attention and after the MLP) of
        # tokens·hidden activations; a ring moves 2(tp-1)/tp of the buffer at the bus bandwidth.
        # (None on a CPU: its tp is intra-op threads sharing one memory.)
        self._n_allreduce = 2 * m.num_layers if tp > 1 and not hw.shared_memory else 0
        ring = 2.0 * (tp - 1) / tp
        self._ar_s_per_token = self._n_allreduce * ring * m.hidden * d / hw.ring_bw
        self._set_rates(coeffs)

    def _set_rates(self, c: PerfCoeffs) -> None:
        self._flop_rate = self.tp * self.hw.peak_flops * c.mfu
        self._byte_rate = self.tp * self.hw.hbm_bw * c.bw_eff
        self._overhead = c.step_overhead_s
        self._seq = c.seq_overhead_s
        # A ring all-reduce over tp ranks takes 2(tp-1) hops, each paying the per-hop latency; a one-shot
        # (custom) all-reduce pays one latency at any tp.
        per_ar = c.oneshot_latency_s if c.allreduce == "oneshot" else 2 * (self.tp - 1) * c.allreduce_latency_s
        self._ar_fixed_s = self._n_allreduce * per_ar
        self._form = COMBINE_FORMS.index(c.combine)  # 0 max, 1 per_op, 2 sum

    def with_coeffs(self, coeffs: PerfCoeffs) -> "PerfModel":
        return PerfModel(self.model, self.hw, self.tp, coeffs, self.memory_utilization, self.kv_capacity)

    def with_tp(self, tp: int) -> "PerfModel":
        return PerfModel(self.model, self.hw, tp, self.coeffs, self.memory_utilization, self.kv_capacity)

    def with_kv_capacity(self, tokens: int | None) -> "PerfModel":
        return PerfModel(self.model, self.hw, self.tp, self.coeffs, self.memory_utilization, tokens)

    # ------------------------------------------------------------ one engine step
    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts per layer that `tokens` tokens route to, with uniform routing:
        an expert is missed by one token with probability 1 - k/E, so touched = E·(1 - (1 - k/E)^tokens)."""
        if self._n_exp == 0.0 or tokens <= 0:
            return 0.0
        return self._n_exp * -math.expm1(tokens * self._log_miss)

    def step_ops(self, n_decode: int, decode_context: int, prefill_tokens: int = 0,
                 prefill_attn: float = 0.0) -> tuple[float, float, float, float, float]:
        """(dense FLOPs, dense bytes, attention FLOPs, attention bytes, additive seconds) of one step for
        the whole worker; bytes in weight-read equivalents, additive = per-sequence costs + all-reduces."""
        tokens = n_decode + prefill_tokens
        if tokens <= 0:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        # The LM head runs on sampled positions only: each decode sequence, and (we assume) at most one
        # prompt finishing its prefill per step. Per-sequence costs are charged on the same count.
        sampled = n_decode + (1 if prefill_tokens > 0 else 0)
        dense_f = self._flops_per_token * tokens + self._flops_lm_head * sampled
        dense_b = self._static_weight_bytes + self._bytes_per_token * tokens
        if self._n_exp:
            dense_b += self._expert_bytes * self._n_exp * -math.expm1(tokens * self._log_miss)
        # KV read by prefill attention: a chunk of l new tokens after c cached ones reads c + l tokens of
        # KV. We only know A = Σ l(c + l/2) and P = Σ l; A/P + P/2 is exact for one chunk.
        prefill_kv = prefill_attn / prefill_tokens + 0.5 * prefill_tokens if prefill_tokens > 0 else 0.0
        attn_f = self._flops_per_pair * (decode_context + prefill_attn)
        attn_b = self._kv_read * (decode_context + prefill_kv)
        add = self._seq * sampled + (self._ar_s_per_token * tokens + self._ar_fixed_s if self._n_allreduce else 0.0)
        return dense_f, dense_b, attn_f, attn_b, add

    def step_work(self, n_decode: int, decode_context: int, prefill_tokens: int = 0,
                  prefill_attn: float = 0.0) -> tuple[float, float, float]:
        """(FLOPs, bytes, additive seconds) of one step for the whole worker; see `step_ops`."""
        df, db, af, ab, add = self.step_ops(n_decode, decode_context, prefill_tokens, prefill_attn)
        return df + af, db + ab, add

    def step_time(self, n_decode: int, decode_context: int, prefill_tokens: int = 0,
                  prefill_attn: float = 0.0) -> float:
        """Seconds for ONE engine step: `n_decode` decode sequences whose context lengths sum to
        `decode_context`, plus `prefill_tokens` new prompt tokens whose attention work is
        `prefill_attn` = Σ_chunks l·(c + l/2). An empty step costs nothing."""
        df, db, af, ab, add = self.step_ops(n_decode, decode_context, prefill_tokens, prefill_attn)
        if df == 0.0:
            return 0.0
        fr, br = self._flop_rate, self._byte_rate
        if self._form == 1:
            t1, t2, t3, t4 = df / fr, db / br, af / fr, ab / br
            return self._overhead + (t1 if t1 > t2 else t2) + (t3 if t3 > t4 else t4) + add
        tc, tm = (df + af) / fr, (db + ab) / br
        return self._overhead + (tc + tm if self._form == 2 else (tc if tc > tm else tm)) + add

    def decode_time(self, batch: int, total_context: int) -> float:
        return self.step_time(batch, total_context)

    def decode_speed(self) -> float:
        """Decode steps per second at a reference load (32 sequences, 128k tokens of context): how
        the router and the two-kind predictor weigh workers on different hardware against each other."""
        return 1.0 / self.decode_time(32, 1 << 17)

    def prefill_time(self, tokens: int, context_before: int = 0) -> float:
        """One step prefilling `tokens` prompt tokens after `context_before` cached ones."""
        return self.step_time(0, 0, tokens, tokens * (context_before + tokens / 2.0))

    def terms(self) -> "StepTerms":
        """This model's step-time constants, for `step_times` (vectorised over batches and candidates)."""
        return StepTerms(self._flop_rate, self._byte_rate, self._overhead, self._seq, float(self._form),
                         self._flops_per_token, self._flops_lm_head, self._flops_per_pair,
                         self._static_weight_bytes, self._bytes_per_token, self._kv_read, self._expert_bytes,
                         self._n_exp, self._log_miss, self._ar_s_per_token if self._n_allreduce else 0.0,
                         self._ar_fixed_s)

    # ------------------------------------------------------------ memory
    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes per token for the whole worker (all tp ranks)."""
        return self._kv_bytes

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV that fit: (tp·memory·util - weights) / KV bytes per token, at most the
        configured pool (`kv_capacity`)."""
        free = self.tp * self.hw.memory_bytes * self.memory_utilization - self.model.weight_bytes
        if free <= 0:
            raise ResourceError(
                f"model {self.model.name} ({self.model.weight_bytes / 1e9:.1f} GB of weights) does not fit "
                f"on {self.tp}x {self.hw.name} at tp={self.tp} (memory_utilization "
                f"{self.memory_utilization}: {self.tp * self.hw.memory_bytes * self.memory_utilization / 1e9:.1f}"
                f" GB); use a larger tp")
        fits = int(free // self._kv_bytes)
        return fits if self.kv_capacity is None else min(fits, self.kv_capacity)

    # ------------------------------------------------------------ transfers
    def kv_transfer_time(self, tokens: int, same_node: bool = True) -> float:
        """Hand-off of `tokens` tokens of KV between two workers of this shape. Each rank sends its own
        shard to its peer rank over its own link, so the tp links work in parallel."""
        bw = self.hw.nvlink_bw if same_node else self.hw.net_bw
        return self.coeffs.kv_setup_s + tokens * self._kv_bytes / (bw * self.tp)

    def weight_transfer_time(self, source: str = "peer") -> float:
        """Load this worker's weights: "peer" (RDMA from another node), "nvlink" (a worker on the same
        node), "disk" (cold start: read at ~2 GB/s plus ~30 s of engine init)."""
        w = float(self.model.weight_bytes)
        if source == "peer":
            return w / (self.hw.net_bw * self.tp)
        if source == "nvlink":
            return w / (self.hw.nvlink_bw * self.tp)
        if source == "disk":
            return COLD_START_INIT_S + w / DISK_BW
        raise UnknownNameError("weight source", source, WEIGHT_SOURCES)

    def weight_sync_time(self, same_node: bool = False) -> float:
        """Push freshly trained weights into this worker (after an update): a broadcast from the
        trainer, each rank receiving its shard."""
        return self.weight_transfer_time("nvlink" if same_node else "peer")

    # ------------------------------------------------------------ training
    def train_step_time(self, tokens: int, n_devices: int, mfu: float = 0.35, seq_len: float = 0.0) -> float:
        """One optimizer step over `tokens` tokens on `n_devices` devices: 6 FLOPs per active parameter
        per token (forward 2 + backward 4; the LM head runs on every position), plus causal attention
        when `seq_len` (mean sequence length) is given, over n·peak·mfu."""
        if n_devices < 1 or not 0 < mfu <= 1:
            raise ValueError(f"need n_devices >= 1 and 0 < mfu <= 1 (got {n_devices}, {mfu})")
        per_token = 3.0 * (self._flops_per_token + self._flops_lm_head + self._flops_per_pair * seq_len / 2.0)
        return tokens * per_token / (n_devices * self.hw.peak_flops * mfu)

    def __repr__(self) -> str:
        return f"PerfModel({self.model.name}, {self.hw.name}, tp={self.tp}, {self.coeffs})"


@dataclass(frozen=True)
class StepTerms:
    """`PerfModel.step_time`'s constants; each field a float, or (after `stack`) a column of one value per
    model, so that `step_times` evaluates many models and batch sizes in a few numpy operations."""

    flop_rate: float
    byte_rate: float
    overhead: float
    seq: float
    form: float  # index into COMBINE_FORMS
    f_tok: float
    f_lm: float
    f_pair: float
    b_static: float
    b_tok: float
    b_kv: float
    b_exp: float
    n_exp: float
    log_miss: float
    ar_tok: float
    ar_fixed: float

    @staticmethod
    def stack(terms: "list[StepTerms]") -> "StepTerms":
        """One column (shape (n, 1)) per field, rows in the order of `terms`."""
        return StepTerms(**{f.name: np.array([getattr(t, f.name) for t in terms], float)[:, None]
                            for f in fields(StepTerms)})


def step_times(t: StepTerms, n_decode, decode_context, prefill_tokens=0.0, prefill_attn=0.0):
    """`PerfModel.step_time` on numpy arrays (broadcast together; n_decode may be fractional: a mean
    batch). The same formula as `step_ops` and `step_time`, term for term; an empty step costs nothing."""
    B, C = np.asarray(n_decode, float), np.asarray(decode_context, float)
    P, A = np.asarray(prefill_tokens, float), np.asarray(prefill_attn, float)
    tokens, has_p = B + P, P > 0
    sampled = B + has_p
    df = t.f_tok * tokens + t.f_lm * sampled
    db = t.b_static + t.b_tok * tokens + t.b_exp * t.n_exp * -np.expm1(tokens * t.log_miss)
    af = t.f_pair * (C + A)
    ab = t.b_kv * (C + np.where(has_p, A / np.maximum(P, 1.0) + 0.5 * P, 0.0))
    add = t.seq * sampled + t.ar_tok * tokens + t.ar_fixed
    fr, br = t.flop_rate, t.byte_rate
    one = np.maximum((df + af) / fr, (db + ab) / br)
    per_op = np.maximum(df / fr, db / br) + np.maximum(af / fr, ab / br)
    summed = (df + af) / fr + (db + ab) / br
    body = np.where(t.form == 1, per_op, np.where(t.form == 2, summed, one))
    return np.where(tokens > 0, t.overhead + body + add, 0.0)


def ideal_time(pm: PerfModel, n_decode: int, decode_context: int, prefill_tokens: int = 0,
               prefill_attn: float = 0.0) -> tuple[float, float, float]:
    """(compute seconds at 100% of peak, memory seconds at 100% of HBM, additive seconds) of a step:
    the regressors calibration fits efficiencies to."""
    flops, nbytes, comm = pm.step_work(n_decode, decode_context, prefill_tokens, prefill_attn)
    return flops / (pm.tp * pm.hw.peak_flops), nbytes / (pm.tp * pm.hw.hbm_bw), comm


__all__ = ["COMBINE_FORMS", "PerfCoeffs", "PerfModel", "StepTerms", "ideal_time", "step_times", "WEIGHT_SOURCES"]
