"""The device table and the roofline: ridge point, arithmetic intensity, time floor (spec §1.1, §5.1).

One source of truth for device facts: peak dense FLOP/s, HBM bandwidth, L2, SMs and the
shared-memory carve-out, each with the source it comes from. Peaks are dense (no sparsity), at boost
clock, and are not sustained rates: the ridge point is arithmetic on peaks, not a property of a kernel.

Rates are decimal (TFLOP/s = 1e12 FLOP/s, TB/s = 1e12 B/s), written as float literals (2.039e12) so
they are the exact numbers of their sources; sizes are binary (KiB = 1024 B).

    ridge      = peak FLOP/s / HBM B/s                       [FLOP/byte]
    intensity  = kernel FLOPs / kernel HBM bytes             [FLOP/byte]
    time floor = max(FLOPs / peak, bytes / bandwidth)        per kernel; kernels run one after another

A kernel whose intensity is below the ridge is memory-bound: its floor is its bytes over the bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.errors import choice

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TERA = 10**12


@dataclass(frozen=True)
class Device:
    """One GPU's peaks and limits. ``sources`` says where each number comes from."""

    name: str
    label: str
    tensor_fp16: float        # dense FP16/BF16 Tensor Core FLOP/s (FP32 accumulate)
    fp32: float               # FP32 FLOP/s on the CUDA cores (non-tensor): softmax, masking, scaling
    tensor_fp8: float | None  # dense FP8 Tensor Core FLOP/s; None where there are no FP8 Tensor Cores
    hbm: float                # HBM bandwidth, B/s
    l2: int                   # L2 cache, bytes
    sms: int
    smem_carveout: int        # largest shared-memory carve-out of one SM, bytes
    smem_per_block: int       # largest shared memory one thread block may opt in to, bytes
    sources: dict

    def to_json(self) -> dict:
        return {"name": self.name, "label": self.label, "tensor_fp16_tflops": self.tensor_fp16 / TERA,
                "fp32_tflops": self.fp32 / TERA,
                "tensor_fp8_tflops": None if self.tensor_fp8 is None else self.tensor_fp8 / TERA,
                "hbm_tb_s": self.hbm / TERA, "l2_bytes": self.l2, "sms": self.sms,
                "smem_carveout_bytes": self.smem_carveout, "smem_per_block_bytes": self.smem_per_block,
                "ridge_fp16": ridge(self), "sources": dict(self.sources)}


_CUDA_GUIDE = ("CUDA C++ Programming Guide, Technical Specifications per Compute Capability "
               "(max shared memory per SM / per thread block)")

DEVICES: dict[str, Device] = {
    "a100": Device(
        name="a100", label="NVIDIA A100 SXM4 80GB",
        tensor_fp16=312e12, fp32=19.5e12, tensor_fp8=None, hbm=2.039e12,
        l2=40 * MiB, sms=108, smem_carveout=164 * KiB, smem_per_block=163 * KiB,
        sources={
            "flops": "NVIDIA A100 datasheet: 312 TFLOPS FP16/BF16 Tensor Core dense, 19.5 TFLOPS FP32",
            "hbm": "NVIDIA A100 datasheet: 2,039 GB/s HBM2e (80GB SXM4)",
            "l2": "NVIDIA A100 (Ampere GA100) whitepaper: 40 MB L2",
            "sms": "NVIDIA A100 whitepaper: 108 SMs",
            "smem": f"{_CUDA_GUIDE}, compute capability 8.0: 164 KB per SM, 163 KB per block "
                    "(of 192 KB combined L1 + shared memory)",
        }),
    "h100": Device(
        name="h100", label="NVIDIA H100 SXM5 80GB",
        tensor_fp16=989e12, fp32=67e12, tensor_fp8=1979e12, hbm=3.35e12,
        l2=50 * MiB, sms=132, smem_carveout=228 * KiB, smem_per_block=227 * KiB,
        sources={
            "flops": "NVIDIA H100 datasheet (SXM): 1,979 TFLOPS FP16/BF16 and 3,958 FP8 with sparsity, "
                     "so 989 and 1,979 dense; 67 TFLOPS FP32",
            "hbm": "NVIDIA H100 datasheet (SXM): 3.35 TB/s HBM3",
            "l2": "NVIDIA H100 (Hopper) whitepaper: 50 MB L2 on H100 SXM5",
            "sms": "NVIDIA H100 whitepaper: 132 SMs on H100 SXM5",
            "smem": f"{_CUDA_GUIDE}, compute capability 9.0: 228 KB per SM, 227 KB per block "
                    "(of 256 KB combined L1 + shared memory)",
        }),
    "h200": Device(
        name="h200", label="NVIDIA H200 SXM 141GB",
        tensor_fp16=989e12, fp32=67e12, tensor_fp8=1979e12, hbm=4.8e12,
        l2=60 * MiB, sms=132, smem_carveout=228 * KiB, smem_per_block=227 * KiB,
        sources={
            "flops": "NVIDIA H200 datasheet (SXM): 1,979 TFLOPS FP16/BF16 and 3,958 FP8 with sparsity, "
                     "so 989 and 1,979 dense; 67 TFLOPS FP32",
            "hbm": "NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e, 141 GB",
            "l2": "not in the H200 datasheet; measured: torch.cuda.get_device_properties(0).L2_cache_size "
                  "= 62,914,560 B (60 MiB) on this project's H200 (the H100 SXM5 whitepaper "
                  "gives 50 MB for its GH100)",
            "sms": "same GH100 configuration as H100 SXM5: 132 SMs",
            "smem": f"{_CUDA_GUIDE}, compute capability 9.0: 228 KB per SM, 227 KB per block",
        }),
}


def device(name: str) -> Device:
    """Look a device up by name (a100, h100, h200); the error lists the valid ones."""
    return DEVICES[choice("device", name, DEVICES)]


def peak(dev: Device, dtype: str = "fp16", unit: str = "tensor") -> float:
    """Peak FLOP/s for work of ``unit`` ("tensor": GEMMs, "elementwise": CUDA cores) in ``dtype``; fp32
    GEMMs get the FP32 CUDA-core peak (no TF32), fp8 on a device without FP8 Tensor Cores is refused."""
    choice("dtype", dtype, ("fp16", "bf16", "fp32", "fp8"))
    choice("unit", unit, ("tensor", "elementwise"))
    if unit == "elementwise" or dtype == "fp32":
        return dev.fp32
    if dtype == "fp8":
        if dev.tensor_fp8 is None:
            with_fp8 = ", ".join(n for n, d in DEVICES.items() if d.tensor_fp8 is not None)
            raise NotImplementedError(f"fp8 roofline on {dev.name}: it has no FP8 Tensor Cores; "
                                      f"supported on {with_fp8}")
        return dev.tensor_fp8
    return dev.tensor_fp16


def ridge(dev: Device, dtype: str = "fp16") -> float:
    """Ridge point, FLOP/byte: H100 989 TFLOP/s / 3.35 TB/s = 295; A100 312 / 2.039 = 153."""
    return peak(dev, dtype) / dev.hbm


@dataclass(frozen=True)
class KernelPoint:
    """One kernel on the roofline."""

    name: str
    flops: int
    nbytes: int
    peak: float
    bandwidth: float

    @property
    def intensity(self) -> float:
        """FLOP per HBM byte (inf for a kernel that moves no bytes)."""
        return self.flops / self.nbytes if self.nbytes else float("inf")

    @property
    def compute_s(self) -> float:
        return self.flops / self.peak

    @property
    def memory_s(self) -> float:
        return self.nbytes / self.bandwidth

    @property
    def floor_s(self) -> float:
        """max(FLOPs / peak, bytes / bandwidth): no kernel of this work can be faster."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    def to_json(self) -> dict:
        return {"kernel": self.name, "flops": self.flops, "bytes": self.nbytes, "intensity": self.intensity,
                "peak_tflops": self.peak / TERA, "bound": self.bound, "floor_s": self.floor_s}


def roofline(row, dev: Device, dtype: str = "fp16", scale: int = 1) -> list[KernelPoint]:
    """Place each kernel of a traffic row (``model.traffic.Row``) on ``dev``'s roofline.

    ``scale`` multiplies FLOPs and bytes (batch x heads for a whole call; the intensity does not change,
    the floor does).
    """
    return [KernelPoint(k.name, k.flops * scale, k.total * scale, peak(dev, dtype, k.unit), dev.hbm)
            for k in row.kernels]


def time_floor(points: list[KernelPoint]) -> float:
    """Floor of a chain of kernels run one after another: the sum of their floors, in seconds."""
    return sum(p.floor_s for p in points)
