"""Hardware catalogue: the few numbers the roofline model needs per accelerator.

Values are datasheet peaks (dense BF16, no sparsity) from DESIGN.md §6; what a real engine achieves is a
fraction of them, and that fraction is what `pearl.perf.calibrate` fits. Memory is the nominal size in
GiB (the driver reports slightly less usable memory; `memory_utilization` absorbs the difference).
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

    def __post_init__(self) -> None:
        for field in ("peak_flops", "hbm_bw", "memory_bytes", "nvlink_bw", "net_bw"):
            if not getattr(self, field) > 0:
                raise ValueError(f"hardware {self.name!r}: {field} must be > 0")


HARDWARE: dict[str, Hardware] = {
    "a100": Hardware("a100", 312 * TFLOPS, 2.04e12, 80 * GIB, 600 * GB, _NET),
    "h100": Hardware("h100", 989 * TFLOPS, 3.35e12, 80 * GIB, 900 * GB, _NET),
    # H800: the export H100, same compute and HBM, NVLink cut to 400 GB/s.
    "h800": Hardware("h800", 989 * TFLOPS, 3.35e12, 80 * GIB, 400 * GB, _NET),
    "h200": Hardware("h200", 989 * TFLOPS, 4.8e12, 141 * GIB, 900 * GB, _NET),
    # H20: little compute, lots of bandwidth: decode-friendly, prefill-poor.
    "h20": Hardware("h20", 148 * TFLOPS, 4.0e12, 96 * GIB, 900 * GB, _NET),
    # A generic laptop-class CPU core, for tiny models in the real runtime and tests. ROUGH values:
    # ~100 GFLOP/s (AVX2/AVX-512 FMA at ~3 GHz, fp32 math on bf16 weights), ~20 GB/s of DRAM bandwidth
    # one core can pull, 16 GiB of RAM, memcpy-class "nvlink" between processes on one machine and a
    # 10 GbE "network". Calibrate (combine="sum") before trusting any number from it.
    "cpu": Hardware("cpu", 100e9, 20 * GB, 16 * GIB, 10 * GB, 1.25 * GB),
}


def get_hardware(name: str) -> Hardware:
    """The catalogue entry for `name` (case-insensitive)."""
    hw = HARDWARE.get(name.strip().lower()) if isinstance(name, str) else None
    if hw is None:
        raise UnknownNameError("hardware", str(name), list(HARDWARE))
    return hw
