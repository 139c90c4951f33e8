"""Roofline step times for one inference worker (one model replica on `tp` devices), plus the costs the
controller weighs: KV hand-off, weight loading, training steps and weight sync.

    t_step = overhead + combine(FLOPs / (tp·peak·mfu), bytes / (tp·HBM·bw_eff)) + all-reduces

`combine` is `max` (the roofline: compute and memory traffic overlap; right for GPUs) or `sum` (no
overlap; fits CPUs better). The efficiencies come from `pearl.perf.calibrate`. The simulator calls
`step_time` about a million times per run, so it is plain float arithmetic over constants computed in
`__init__`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pearl.config import ElasticConfig
from pearl.errors import ResourceError, UnknownNameError
from pearl.perf.hardware import Hardware
from pearl.perf.models import ModelShape

DISK_BW = 2e9  # B/s: a local NVMe / parallel-FS read of safetensors
# process start, CUDA context, graph capture, allocator warm-up: one number, `cluster.elastic.cold_start_s`
COLD_START_INIT_S = ElasticConfig.model_fields["cold_start_s"].default
WEIGHT_SOURCES = ("peer", "nvlink", "disk")


@dataclass(frozen=True)
class PerfCoeffs:
    mfu: float = 0.5  # achieved fraction of peak FLOP/s in prefill/mixed steps
    bw_eff: float = 0.8  # achieved fraction of HBM bandwidth
    step_overhead_s: float = 0.004  # fixed per engine step (scheduling, launches)
    allreduce_latency_s: float = 10e-6  # per all-reduce (tp>1)
    kv_setup_s: float = 0.002  # per KV transfer
    combine: str = "max"  # "max" (roofline) or "sum" (additive; fits CPUs better)

    def __post_init__(self) -> None:
        if self.combine not in ("max", "sum"):
            raise ValueError(f"combine must be 'max' or 'sum', got {self.combine!r}")
        if not (self.mfu > 0 and self.bw_eff > 0):
            raise ValueError(f"mfu ({self.mfu}) and bw_eff ({self.bw_eff}) must be > 0")
        if min(self.step_overhead_s, self.allreduce_latency_s, self.kv_setup_s) < 0:
            raise ValueError("overheads and latencies must be >= 0")


class PerfModel:
    """Step-time model of one worker: `model` sharded over `tp` devices of kind `hw`."""

    def __init__(self, model: ModelShape, hw: Hardware, tp: int = 1, coeffs: PerfCoeffs = PerfCoeffs(),
                 memory_utilization: float = 0.9):
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        if not 0 < memory_utilization <= 1:
            raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
        self.model, self.hw, self.tp, self.coeffs = model, hw, tp, coeffs
        self.memory_utilization = memory_utilization
        m, d = model, model.dtype_bytes
        # KV heads are split across tp ranks; with tp > num_kv_heads each head is replicated, so the
        # worker as a whole stores (and reads) more KV per token.
        self._kv_bytes = m.kv_bytes_per_token * max(1.0, tp / m.num_kv_heads)
        # --- FLOPs per unit of work (whole worker)
        self._flops_per_token = 2.0 * m.matmul_params_per_token
        self._flops_per_pair = 4.0 * m.num_q_heads * m.head_dim * m.num_layers  # QK^T and PV, per (q, k)
        self._flops_lm_head = 2.0 * m.hidden * m.vocab  # per sampled position
        # --- bytes (whole worker). Weights read every step: all but the routed experts and the input
        # embedding table (a gather: only the rows of this step's tokens).
        embed_table = 0 if m.tie_embeddings else m.embedding_params
        self._static_weight_bytes = float((m.dense_params_active - embed_table) * d)
        self._bytes_per_token = float(m.hidden * d) + self._kv_bytes  # embedding row read + KV written
        self._expert_bytes = float(m.num_layers * m.expert_params * d)  # one expert in every layer
        self._n_exp = float(m.num_experts)
        self._log_miss = math.log1p(-m.experts_per_token / m.num_experts) if m.is_moe else 0.0
        # Tensor parallelism: two all-reduces per layer (after attention and after the MLP) of
        # tokens·hidden activations; a ring moves 2(tp-1)/tp of the buffer over each device's link.
        self._n_allreduce = 2 * m.num_layers if tp > 1 else 0
        ring = 2.0 * (tp - 1) / tp
        self._ar_s_per_token = self._n_allreduce * ring * m.hidden * d / hw.nvlink_bw
        self._set_rates(coeffs)

    def _set_rates(self, c: PerfCoeffs) -> None:
        self._flop_rate = self.tp * self.hw.peak_flops * c.mfu
        self._byte_rate = self.tp * self.hw.hbm_bw * c.bw_eff
        self._overhead = c.step_overhead_s
        self._ar_fixed_s = self._n_allreduce * c.allreduce_latency_s
        self._sum = c.combine == "sum"

    def with_coeffs(self, coeffs: PerfCoeffs) -> "PerfModel":
        return PerfModel(self.model, self.hw, self.tp, coeffs, self.memory_utilization)

    def with_tp(self, tp: int) -> "PerfModel":
        return PerfModel(self.model, self.hw, tp, self.coeffs, self.memory_utilization)

    # ------------------------------------------------------------ one engine step
    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts per layer that `tokens` tokens route to, with uniform routing:
        an expert is missed by one token with probability 1 - k/E, so touched = E·(1 - (1 - k/E)^tokens)."""
        if self._n_exp == 0.0 or tokens <= 0:
            return 0.0
        return self._n_exp * -math.expm1(tokens * self._log_miss)

    def step_work(self, n_decode: int, decode_context: int, prefill_tokens: int = 0,
                  prefill_attn: float = 0.0) -> tuple[float, float, float]:
        """(FLOPs, bytes, all-reduce seconds) of one step for the whole worker; see `step_time`."""
        tokens = n_decode + prefill_tokens
        if tokens <= 0:
            return 0.0, 0.0, 0.0
        # The LM head runs on sampled positions only: each decode sequence, and (we assume) at most one
        # prompt finishing its prefill per step.
        sampled = n_decode + (1 if prefill_tokens > 0 else 0)
        flops = (self._flops_per_token * tokens + self._flops_per_pair * (decode_context + prefill_attn)
                 + self._flops_lm_head * sampled)
        # KV read by prefill attention: a chunk of l new tokens after c cached ones reads c + l tokens of
        # KV. We only know A = Σ l(c + l/2) and P = Σ l; A/P + P/2 is exact for one chunk.
        prefill_kv = prefill_attn / prefill_tokens + 0.5 * prefill_tokens if prefill_tokens > 0 else 0.0
        nbytes = (self._static_weight_bytes + self._bytes_per_token * tokens
                  + self._kv_bytes * (decode_context + prefill_kv))
        if self._n_exp:
            nbytes += self._expert_bytes * self._n_exp * -math.expm1(tokens * self._log_miss)
        comm = self._ar_s_per_token * tokens + self._ar_fixed_s if self._n_allreduce else 0.0
        return flops, nbytes, comm

    def step_time(self, n_decode: int, decode_context: int, prefill_tokens: int = 0,
                  prefill_attn: float = 0.0) -> float:
        """Seconds for ONE engine step: `n_decode` decode sequences whose context lengths sum to
        `decode_context`, plus `prefill_tokens` new prompt tokens whose attention work is
        `prefill_attn` = Σ_chunks l·(c + l/2). An empty step costs nothing."""
        flops, nbytes, comm = self.step_work(n_decode, decode_context, prefill_tokens, prefill_attn)
        if flops == 0.0:
            return 0.0
        tc, tm = flops / self._flop_rate, nbytes / self._byte_rate
        return self._overhead + (tc + tm if self._sum else (tc if tc > tm else tm)) + comm

    def decode_time(self, batch: int, total_context: int) -> float:
        return self.step_time(batch, total_context)

    def prefill_time(self, tokens: int, context_before: int = 0) -> float:
        """One step prefilling `tokens` prompt tokens after `context_before` cached ones."""
        return self.step_time(0, 0, tokens, tokens * (context_before + tokens / 2.0))

    # ------------------------------------------------------------ memory
    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes per token for the whole worker (all tp ranks)."""
        return self._kv_bytes

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV that fit: (tp·memory·util - weights) / KV bytes per token."""
        free = self.tp * self.hw.memory_bytes * self.memory_utilization - self.model.weight_bytes
        if free <= 0:
            raise ResourceError(
                f"model {self.model.name} ({self.model.weight_bytes / 1e9:.1f} GB of weights) does not fit "
                f"on {self.tp}x {self.hw.name} at tp={self.tp} (memory_utilization "
                f"{self.memory_utilization}: {self.tp * self.hw.memory_bytes * self.memory_utilization / 1e9:.1f}"
                f" GB); use a larger tp")
        return int(free // self._kv_bytes)

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


def ideal_time(pm: PerfModel, n_decode: int, decode_context: int, prefill_tokens: int = 0,
               prefill_attn: float = 0.0) -> tuple[float, float, float]:
    """(compute seconds at 100% of peak, memory seconds at 100% of HBM, all-reduce seconds) of a step:
    the regressors calibration fits efficiencies to."""
    flops, nbytes, comm = pm.step_work(n_decode, decode_context, prefill_tokens, prefill_attn)
    return flops / (pm.tp * pm.hw.peak_flops), nbytes / (pm.tp * pm.hw.hbm_bw), comm


__all__ = ["PerfCoeffs", "PerfModel", "ideal_time", "WEIGHT_SOURCES"]
