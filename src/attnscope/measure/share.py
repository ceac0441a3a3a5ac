"""Attention's time share of a transformer prefill, measured, and the closed Amdahl loop (spec §5, §5.1).

A prefill of P tokens runs through a Llama-shaped decoder in plain torch (8B-like by default: hidden
4,096, 32 heads of d = 128, SwiGLU MLP 14,336, RMSNorm, RoPE; random weights, no embedding or LM head;
x [B, P, hidden], q, k, v [B, H, P, d]) with one attention: ``naive`` (the explicit 3-kernel baseline,
spec §1), one SDPA backend (``flash``, ``cudnn``, ``efficient``, ``math``; restricted, no fallback) or
``attnscope`` (this project's Triton kernel). Each layer's attention core runs inside
``record_function("attnscope::attention")``, a whole prefill inside ``"attnscope::prefill"``.

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
import math
from dataclasses import asdict, dataclass, field

from attnscope import chrome_trace
from attnscope.errors import InputError, choice, positive_int
from attnscope.measure.backends import attention_fn, profile_trace, require_cuda, save_trace, torch_dtype
from attnscope.model import amdahl
from attnscope.model.flops import attention_flops

ATTENTIONS = ("naive", "flash", "cudnn", "efficient", "math", "attnscope")
ANNOTATION = "attnscope::attention"
PREFILL = "attnscope::prefill"


@dataclass(frozen=True)
class LlamaShape:
    """Dimensions of the decoder (Llama-3-8B-like, with as many K/V heads as query heads)."""

    hidden: int = 4096
    heads: int = 32
    head_dim: int = 128
    mlp: int = 14336
    layers: int = 2
    eps: float = 1e-5
    rope_theta: float = 500000.0

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "head_dim", "mlp", "layers"):
            positive_int(name, getattr(self, name))
        if self.heads * self.head_dim != self.hidden:
            raise InputError(f"heads: expected heads x head_dim == hidden ({self.hidden}), "
                             f"got {self.heads} x {self.head_dim}")


def build_decoder(shape: LlamaShape, attention: str, device="cuda", dtype=None, seed: int = 0):
    """The decoder with random weights whose attention core is ``attention``: ``x [B, P, hidden] -> same``."""
    import torch
    from torch.nn.functional import linear, silu

    choice("attention", attention, ATTENTIONS)
    dtype = dtype or torch.float16
    attn = attention_fn(attention, causal=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, m, heads, d = shape.hidden, shape.mlp, shape.heads, shape.head_dim

    def weight(*dims):  # N(0, 1/fan_in), drawn on the device (fast), then cast
        return (torch.randn(*dims, generator=gen, device=device) * (1.0 / math.sqrt(dims[-1]))).to(dtype)

    # per layer: wqkv [3h, h], wo [h, h], w_gate_up [2m, h], w_down [h, m]; RMSNorm weights are ones
    layers = [(weight(3 * h, h), weight(h, h), weight(2 * m, h), weight(h, m)) for _ in range(shape.layers)]
    ones = torch.ones(h, device=device, dtype=dtype)

    def rms_norm(x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + shape.eps)).to(x.dtype) * ones

    def rope(x, cos, sin):  # x [B, H, P, d]; rotate pairs (x_i, x_{i+d/2})
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def decoder(x):  # x [B, P, h] -> [B, P, h]
        B, P, _ = x.shape
        inv = 1.0 / shape.rope_theta ** (torch.arange(0, d, 2, device=device).float() / d)
        ang = torch.outer(torch.arange(P, device=device).float(), inv)  # [P, d/2]
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        for wqkv, wo, w_gate_up, w_down in layers:
            q, k, v = linear(rms_norm(x), wqkv).view(B, P, 3, heads, d).permute(2, 0, 3, 1, 4)  # [B, H, P, d]
            q, k, v = rope(q, cos, sin), rope(k, cos, sin), v.contiguous()  # all contiguous, every impl alike
            with torch.profiler.record_function(ANNOTATION):
                o = attn(q, k, v)  # [B, H, P, d]
            x = x + linear(o.transpose(1, 2).reshape(B, P, -1), wo)
            gate, up = linear(rms_norm(x), w_gate_up).chunk(2, dim=-1)
            x = x + linear(silu(gate) * up, w_down)
        return rms_norm(x)

    return decoder


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
