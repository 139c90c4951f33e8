"""Hardware catalogue: the few numbers the roofline model needs per accelerator.

Values are datasheet peaks (dense BF16, no sparsity) from DESIGN.md §6; what a real engine achieves is a
fraction of them. Memory is the nominal size in GiB (the driver reports slightly less usable memory;
`memory_utilization` absorbs the difference).

The achieved fractions are per GPU and were fitted to published measurements (docs/perf_model.md,
`benchmarks/perf_vs_published.py`, data in `pearl/data/published_perf.csv`); `pearl.perf.calibrate`
refits them to a real engine's own steps:

- `mfu`: achieved fraction of `peak_flops` in compute-bound (prefill) work;
- `bw_eff`: achieved fraction of `hbm_bw` when reading weights in memory-bound (decode) steps;
- `ring_bw`: the bus bandwidth one tensor-parallel all-reduce achieves (NCCL's "busbw": a ring all-reduce
  of S bytes over n ranks takes S·2(n-1)/n / ring_bw), well below the NVLink line rate.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.errors import UnknownNameError

GB = 1e9
GIB = float(1 << 30)
TFLOPS = 1e12

# Inter-node RDMA per device: one 200-400 Gb/s NIC per GPU is 25-50 GB/s; we take the low end because
# achieved bandwidth for many medium-sized transfers sits well below line rate.
_NET = 25 * GB


@dataclass(frozen=True)
class Hardware:
    """One accelerator. All bandwidths are bytes per second, per device."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bw: float  # B/s
    memory_bytes: float
    nvlink_bw: float  # intra-node B/s per device
    net_bw: float  # inter-node B/s per device (RDMA)
    mfu: float = 0.5  # achieved fraction of peak_flops (fitted; see the module docstring)
    bw_eff: float = 0.8  # achieved fraction of hbm_bw on weight reads (fitted)
    ring_bw: float = 0.0  # all-reduce bus bandwidth, B/s; 0: half of nvlink_bw
    # peak_flops / hbm_bw are rough guesses, not a datasheet's: a calibration may find more than them
    rough: bool = False
    # tp is intra-op threads of one process sharing one memory (a CPU): no all-reduce between them
    shared_memory: bool = False

    def __post_init__(self) -> None:
        for field in ("peak_flops", "hbm_bw", "memory_bytes", "nvlink_bw", "net_bw"):
            if not getattr(self, field) > 0:
                raise ValueError(f"hardware {self.name!r}: {field} must be > 0")
        if not (0 < self.mfu <= 1 and 0 < self.bw_eff <= 1):
            raise ValueError(f"hardware {self.name!r}: mfu and bw_eff must be in (0, 1]")
        if self.ring_bw < 0:
            raise ValueError(f"hardware {self.name!r}: ring_bw must be >= 0")
        if self.ring_bw == 0:
            object.__setattr__(self, "ring_bw", 0.5 * self.nvlink_bw)


# mfu / bw_eff: fitted by `benchmarks/perf_vs_published.py` (catalogue form) on the fitting half of
# src/pearl/data/published_perf.csv. ring_bw: measured NCCL bus bandwidths (rows n01, n02 of that file).
# H200, H800 and H20's ring_bw have no published row of their own here: H200 takes H100's efficiencies
# (same compute die and NVLink), H800 H100's with ring_bw scaled by its NVLink cut (400/900), H20 H100's
# ring_bw (same 900 GB/s NVLink).
_H100_RING = 370 * GB
HARDWARE: dict[str, Hardware] = {
    "a100": Hardware("a100", 312 * TFLOPS, 2.04e12, 80 * GIB, 600 * GB, _NET, mfu=0.614, bw_eff=0.596,
                     ring_bw=200 * GB),
    "h100": Hardware("h100", 989 * TFLOPS, 3.35e12, 80 * GIB, 900 * GB, _NET, mfu=0.506, bw_eff=0.725,
                     ring_bw=_H100_RING),
    # H800: the export H100, same compute and HBM, NVLink cut to 400 GB/s.
    "h800": Hardware("h800", 989 * TFLOPS, 3.35e12, 80 * GIB, 400 * GB, _NET, mfu=0.506, bw_eff=0.725,
                     ring_bw=_H100_RING * 400 / 900),
    "h200": Hardware("h200", 989 * TFLOPS, 4.8e12, 141 * GIB, 900 * GB, _NET, mfu=0.506, bw_eff=0.725,
                     ring_bw=_H100_RING),
    # H20: little compute, lots of bandwidth: decode-friendly, prefill-poor. Its published decode runs at
    # at about a third of its 4.0 TB/s (bw_eff 0.351); its mfu sits at the fit's 0.85 bound.
    "h20": Hardware("h20", 148 * TFLOPS, 4.0e12, 96 * GIB, 900 * GB, _NET, mfu=0.85, bw_eff=0.351,
                    ring_bw=_H100_RING),
    # A generic laptop-class CPU core, for tiny models in the real runtime and tests. ROUGH values:
    # ~100 GFLOP/s (AVX2/AVX-512 FMA at ~3 GHz, fp32 math on bf16 weights), ~20 GB/s of DRAM bandwidth
    # one core can pull, 16 GiB of RAM, memcpy-class "nvlink" between processes on one machine and a
    # 10 GbE "network". Calibrate (combine="sum") before trusting any number from it: a fitted mfu
    # above 1 is allowed (a core of this machine measured 1.15-1.18 of it on 2026-12-05, SmolLM2-135M).
    "cpu": Hardware("cpu", 100e9, 20 * GB, 16 * GIB, 10 * GB, 1.25 * GB, rough=True, shared_memory=True),
}


def get_hardware(name: str) -> Hardware:
    """The catalogue entry for `name` (case-insensitive)."""
    hw = HARDWARE.get(name.strip().lower()) if isinstance(name, str) else None
    if hw is None:
        raise UnknownNameError("hardware", str(name), list(HARDWARE))
    return hw
