"""The ring's communication model: when does context parallelism's K/V exchange hide behind compute?

Ring attention over P ranks (see `attnscope.distributed`) runs P steps per rank. In step i a rank
computes its N/P queries against one K/V block of N/P tokens while it sends that block on and
receives the next, so a step costs max(compute, transfer) and the last step (nothing left to send)
costs its compute alone:

    compute  = attention_flops(block) / kernel rate            (FLOPs: `model.flops.attention_flops`)
    transfer = K + V bytes of one block / link bandwidth       (2 * B * Hkv * N/P * d * elt)
    total    = sum_{i < P-1} max(compute, transfer) + compute + (P-1) * merge + P * step overhead

Causal, load-balanced layout (rank i holds chunks i and 2P-1-i): every step does the same work,
(N/P)^2 / 2 query-key pairs (step 0: one causal block; the others: one unmasked half block), so the
causal step is half the unmasked one while its transfer is the same: the ring turns link-bound at a
longer N for causal. The merge (`kernels/merge.py`) is memory-bound: per step it reads and writes the
fp32 accumulator and reads the partial and LSEs, at the device's HBM rate.

The kernel rate defaults to attnscope's measured forward on the H200 (`KERNEL_RATE`, BENCHMARKS.md):
the model predicts a ring of those kernels. The link is size-dependent by default: the measured 2 x H200
NVLink exchange (`NVLINK_H200`), interpolated in log(size) and clamped outside its sizes (small messages
are credited the 64 MiB rate: optimistic); `link_gbps` replaces it with one number (e.g. an InfiniBand
NIC's ~50 GB/s per direction for a ring across hosts). The step overhead (kernel launches, P2P
posting) is an assumption, not a measurement. Closed forms; no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from attnscope.errors import InputError, choice, expect, finite_real, positive_int, short
from attnscope.model.flops import attention_flops
from attnscope.model.roofline import GiB, MiB
from attnscope.model.roofline import device as get_device

ELT = {"fp16": 2, "bf16": 2, "fp32": 4}

#: measured 2 x H200 NVLink exchange, bytes -> GB/s per direction (torch 2.11; BENCHMARKS.md)
NVLINK_H200 = ((64 * MiB, 212e9), (256 * MiB, 291e9), (1 * GiB, 354e9))
LINKS = {"h200": NVLINK_H200}

#: attnscope forward TFLOP/s on H200, bf16, N = 16,384, impl="auto": BENCHMARKS.md's forward table
#: (bench/results/h200-2026-12-01-prefill-dispatch-16k.json, median of 2 rounds); d = 256: the portable
#: kernel auto runs there, at its table tiles (bench/results/h200-2026-12-03e-tune-d256.json)
KERNEL_RATE = {("h200", 64, False): 504.6e12, ("h200", 64, True): 473.0e12,
               ("h200", 128, False): 633.5e12, ("h200", 128, True): 600.6e12,
               ("h200", 256, False): 539.0e12, ("h200", 256, True): 542.5e12}

#: assumed host/launch overhead per ring step (two kernel launches + posting the P2P batch)
STEP_OVERHEAD_S = 10e-6

#: Accepted `tflops` (TFLOP/s) and `link_gbps` (GB/s): from a thousandth to a million. Outside them a
#: step time overflows to inf or underflows to 0 (1e-320 TFLOP/s), and the crossover's bisection
#: (n_local < 2^62) no longer brackets the answer.
RATE_RANGE = (1e-3, 1e6)


def link_bandwidth(nbytes: int, dev: str = "h200", link_gbps: float | None = None) -> float:
    """Bytes/s per direction for one exchange of `nbytes` (see the module docstring)."""
    expect(finite_real(nbytes) and nbytes >= 0, "nbytes", "a finite number of bytes >= 0", nbytes)
    if link_gbps is not None:
        expect(finite_real(link_gbps) and link_gbps > 0, "link_gbps", "a finite number > 0 (GB/s)", link_gbps)
        return link_gbps * 1e9
    if dev not in LINKS:
        raise InputError(f"link_gbps: expected a number for device {dev!r} (measured links: "
                         f"{', '.join(LINKS)}), got None")
    pts = LINKS[dev]
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (s0, b0), (s1, b1) in zip(pts, pts[1:], strict=False):
        if nbytes <= s1:
            t = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return b0 + t * (b1 - b0)
    return pts[-1][1]


@dataclass(frozen=True)
class RingPrediction:
    ranks: int
    n: int
    n_local: int
    causal: bool
    step_flops: float
    compute_s: float
    kv_bytes: int
    link_gbps: float
    transfer_s: float
    bound: str
    merge_s: float
    total_s: float
    step_s: float            # total / P: the mean step time the benchmark measures against
    tflops_total: float      # whole-sequence FLOPs / total, over all ranks
    efficiency: float        # vs one GPU at the kernel rate
    crossover_n: int         # smallest N at which a step is compute-bound (link-bound below)

    def to_json(self) -> dict:
        return asdict(self)


def _check_rate(name: str, x) -> None:
    """``x`` (tflops or link_gbps) is None or a finite number in `RATE_RANGE`."""
    lo, hi = RATE_RANGE
    if x is not None and not (finite_real(x) and lo <= x <= hi):
        raise InputError(f"{name}: expected a finite number in [{lo:g}, {hi:g}], got {short(x)}")


def _check(ranks, batch, heads, kv_heads, d, dtype, tflops, link_gbps):
    for name, v in (("ranks", ranks), ("batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("d", d)):
        positive_int(name, v)
    choice("dtype", dtype, ELT)
    if heads % kv_heads:
        raise InputError(f"kv_heads: expected a divisor of heads = {heads}, got {kv_heads}")
    _check_rate("tflops", tflops)
    _check_rate("link_gbps", link_gbps)


def kernel_rate(dev: str, d: int, causal: bool, tflops: float | None = None) -> float:
    """FLOP/s of one block's kernel: `tflops` if given, else the measured default (module docstring)."""
    _check_rate("tflops", tflops)
    if tflops is not None:
        return tflops * 1e12
    key = (dev, d, bool(causal))
    if key not in KERNEL_RATE:
        dims = {}
        for device, dim, _ in KERNEL_RATE:
            dims.setdefault(device, set()).add(dim)
        measured = "; ".join(f"{k} with d in {', '.join(map(str, sorted(v)))}"
                             for k, v in sorted(dims.items()))
        raise InputError(f"tflops: expected a number (no measured kernel rate for device {dev!r}, "
                         f"d = {d}; measured: {measured}), got None")
    return KERNEL_RATE[key]


def predict(ranks: int, n: int, heads: int, kv_heads: int | None = None, d: int = 128, dtype: str = "bf16",
            causal: bool = True, dev: str = "h200", batch: int = 1, tflops: float | None = None,
            link_gbps: float | None = None) -> RingPrediction:
    """Predicted ring-attention forward time for P = `ranks` (module docstring); closed form."""
    kv_heads = heads if kv_heads is None else kv_heads
    positive_int("n", n)
    _check(ranks, batch, heads, kv_heads, d, dtype, tflops, link_gbps)
    if ranks > n:
        raise InputError(f"ranks: expected at most n = {n:,} (one token per rank at least), got {ranks:,}")
    spec = get_device(dev)
    rate = kernel_rate(dev, d, causal, tflops)
    elt = ELT[dtype]
    n_local = -(-n // ranks)  # the largest shard sets the pace
    # every balanced causal step has (N/P)^2 / 2 pairs: the count of one causal N/P block
    step_flops = attention_flops(batch, heads, n_local, n_local, d, causal)
    compute = step_flops / rate
    kv_bytes = 2 * batch * kv_heads * n_local * d * elt                  # K and V of one block
    bw = link_bandwidth(kv_bytes, dev, link_gbps)
    transfer = kv_bytes / bw if ranks > 1 else 0.0
    merge_bytes = batch * heads * n_local * (d * (4 + 4 + elt) + 3 * 4)  # acc r+w fp32, partial, 3 LSE
    merge = merge_bytes / spec.hbm
    total = ((ranks - 1) * max(compute, transfer) + compute   # the first step's block is copied, not merged
             + (ranks - 1) * merge + ranks * STEP_OVERHEAD_S)
    whole = attention_flops(batch, heads, n, n, d, causal)
    single = whole / rate
    return RingPrediction(
        ranks=ranks, n=n, n_local=n_local, causal=bool(causal), step_flops=step_flops, compute_s=compute,
        kv_bytes=kv_bytes, link_gbps=bw / 1e9, transfer_s=transfer,
        bound="link" if transfer > compute else "compute", merge_s=merge, total_s=total,
        step_s=total / ranks, tflops_total=whole / total / 1e12, efficiency=single / (ranks * total),
        crossover_n=crossover_n(ranks, heads, kv_heads, d, dtype, causal, dev, batch, tflops, link_gbps))


def crossover_n(ranks: int, heads: int, kv_heads: int, d: int, dtype: str, causal: bool, dev: str = "h200",
                batch: int = 1, tflops: float | None = None, link_gbps: float | None = None) -> int:
    """Smallest N at which compute >= transfer per step (the ring is link-bound below it).

    compute / transfer = n_local * Hq * f * 2 * bw / (Hkv * elt * rate), f = 1 unmasked, 1/2 causal
    (B and d cancel); with a size-dependent link, a bisection on n_local of fixed length (64 steps).
    """
    _check(ranks, batch, heads, kv_heads, d, dtype, tflops, link_gbps)
    rate = kernel_rate(dev, d, causal, tflops)
    elt = ELT[dtype]
    f = 0.5 if causal else 1.0

    def compute_bound(m: int) -> bool:
        bw = link_bandwidth(2 * batch * kv_heads * m * d * elt, dev, link_gbps)
        return m * heads * f * 2 * bw >= kv_heads * elt * rate

    lo, hi = 1, 1 << 62
    if compute_bound(lo):
        return ranks
    for _ in range(64):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi * ranks
