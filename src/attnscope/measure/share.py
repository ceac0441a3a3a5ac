"""Attention's time share of a transformer prefill, measured, and the closed Amdahl loop (spec §5, §5.1).

A prefill of P tokens runs through the Llama-shaped decoder of measure/decoder.py with one attention:
``naive`` (the explicit 3-kernel baseline, spec §1), one SDPA backend (``flash``, ``cudnn``,
``efficient``, ``math``; restricted, no fallback) or ``attnscope`` (this project's Triton kernel).

**f_time** = attention kernel time / the prefill's kernel time, from one torch.profiler trace, by
`attnscope.chrome_trace.attention_share` (the rule `report --profile` uses too: "attention" is the
kernels inside the ``attnscope::attention`` range: QK^T, mask, softmax, PV). The FLOP share is printed
beside it; it is not a time share.

**Closed loop** (``project_to``): measure f_time(A) of the baseline A and the kernel speedup
S = t_A / t_B of attention alone ([1, 32, P, 128], causal), project the prefill speedup with Amdahl
(model/amdahl.py), then swap B in, time both prefills, and report projected vs measured and the error.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

from attnscope import chrome_trace
from attnscope.errors import choice, positive_int
from attnscope.measure.backends import attention_fn, profile_trace, require_cuda, save_trace, torch_dtype
from attnscope.measure.decoder import ATTENTIONS, PREFILL, LlamaShape, build_decoder
from attnscope.model import amdahl
from attnscope.model.flops import attention_flops


# --- FLOPs (analytic, CPU) --------------------------------------------------------------------------
def flops(shape: LlamaShape, p: int, causal: bool = True) -> dict:
    """FLOPs of a P-token prefill through ``shape.layers`` layers, split attention core / the rest.

    Per layer: QKV projection 2*P*h*3h, output projection 2*P*h*h, SwiGLU MLP 3 x 2*P*h*m; attention
    core from `attnscope.model.flops.attention_flops` (4*P^2*d*H, halved when causal). Norms, RoPE and the
    softmax's elementwise work are not counted (they are FLOP-cheap; that is spec §5.1's point).
    """
    positive_int("p", p)
    h, m = shape.hidden, shape.mlp
    linear = 2 * p * h * 3 * h + 2 * p * h * h + 3 * 2 * p * h * m
    attn = attention_flops(1, shape.heads, p, p, shape.head_dim, causal)
    total = shape.layers * (linear + attn)
    return {"attention": shape.layers * attn, "other": shape.layers * linear, "total": total,
            "share": shape.layers * attn / total}


# --- timing and the profile (GPU) --------------------------------------------------------------------
def cuda_time_ms(fn, warmup: int = 3, reps: int = 10) -> float:
    """Median device time of ``fn()`` in ms, CUDA events around each repetition, after warm-up."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


@dataclass
class ShareResult:
    """f_time of one prefill: attention and total kernel device time (ms), the FLOP share beside it."""

    attention: str
    p: int
    layers: int
    attention_ms: float
    total_ms: float          # the prefill's kernel time (union; chrome_trace.Share.busy_ms)
    flop_share: float
    kernels: int
    top: list = field(default_factory=list)  # [(name, ms, is_attention)] the longest kernels
    span_ms: float | None = None  # the prefill's wall span on the GPU, idle gaps included

    @property
    def f_time(self) -> float:  # as chrome_trace.Share.share
        return min(1.0, self.attention_ms / self.total_ms) if self.total_ms > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "f_time": self.f_time,
                "top": [{"name": n, "ms": ms, "attention": a} for n, ms, a in self.top]}


def share_from_trace(trace, attention: str, p: int, shape: LlamaShape) -> ShareResult:
    """f_time from a Chrome trace of one prefill (pure Python: recorded traces are tested on a CPU)."""
    s = chrome_trace.attention_share(trace, f"trace of the {attention} prefill")
    return ShareResult(attention, p, shape.layers, s.attention_ms, s.busy_ms, flops(shape, p)["share"],
                       s.kernels, list(s.longest), s.span_ms)


def measure_share(attention: str = "flash", p: int = 4096, layers: int = 2, dtype: str = "fp16",
                  keep_trace: str | None = None) -> ShareResult:
    """Build the decoder, warm it up, profile one prefill, and return f_time (see module docstring)."""
    torch = require_cuda()
    positive_int("p", p)  # attention: checked by build_decoder, layers by LlamaShape
    shape = LlamaShape(layers=layers)
    dt = torch_dtype(torch, dtype)
    model = build_decoder(shape, attention, dtype=dt)
    x = torch.randn(1, p, shape.hidden, device="cuda", dtype=dt)  # [B, P, hidden]
    with torch.inference_mode():
        model(x)  # warm-up: cuBLAS heuristics, Triton autotuning
        torch.cuda.synchronize()
        trace = profile_trace(lambda: model(x), PREFILL)
    if keep_trace:
        save_trace(trace, keep_trace)
    return share_from_trace(trace, attention, p, shape)


@dataclass
class ClosedLoop:
    """Projected vs measured prefill speedup when attention ``baseline`` is swapped for ``candidate``."""

    baseline: str
    candidate: str
    p: int
    layers: int
    f_time: float
    kernel_ms: dict          # attention alone: {baseline: ms, candidate: ms}
    prefill_ms: dict         # the whole prefill: {baseline: ms, candidate: ms}
    share: ShareResult | None = None

    @property
    def s_kernel(self) -> float:
        return self.kernel_ms[self.baseline] / self.kernel_ms[self.candidate]

    @property
    def projected(self) -> float:
        return amdahl.speedup(self.f_time, self.s_kernel)

    @property
    def measured(self) -> float:
        return self.prefill_ms[self.baseline] / self.prefill_ms[self.candidate]

    @property
    def error(self) -> float:
        """projected / measured - 1: positive when Amdahl promised more than the swap delivered."""
        return self.projected / self.measured - 1.0

    def to_json(self) -> dict:
        return {**asdict(self), "s_kernel": self.s_kernel, "projected_speedup": self.projected,
                "measured_speedup": self.measured, "error": self.error,
                "share": self.share.to_json() if self.share else None}


def closed_loop(baseline: str = "naive", candidate: str = "attnscope", p: int = 4096, layers: int = 2,
                dtype: str = "fp16", reps: int = 10) -> ClosedLoop:
    """The closed loop of the module docstring: f_time(baseline), S, Amdahl's projection, both prefills."""
    torch = require_cuda()
    choice("baseline", baseline, ATTENTIONS)
    choice("project_to", candidate, ATTENTIONS)
    shape = LlamaShape(layers=layers)
    sh = measure_share(baseline, p, layers, dtype)
    dt = torch_dtype(torch, dtype)
    qkv = [torch.randn(1, shape.heads, p, shape.head_dim, device="cuda", dtype=dt) for _ in range(3)]
    kernel_ms, prefill_ms = {}, {}
    with torch.inference_mode():
        for name in (baseline, candidate):
            kernel_ms[name] = cuda_time_ms(functools.partial(attention_fn(name, True), *qkv), reps=reps)
        qkv.clear()  # free the attention-alone inputs before the prefills
        x = torch.randn(1, p, shape.hidden, device="cuda", dtype=dt)
        for name in (baseline, candidate):  # each decoder (its weights) is freed when its timing returns
            prefill_ms[name] = cuda_time_ms(functools.partial(build_decoder(shape, name, dtype=dt), x),
                                            reps=reps)
            torch.cuda.empty_cache()
    return ClosedLoop(baseline, candidate, p, layers, sh.f_time, kernel_ms, prefill_ms, sh)
