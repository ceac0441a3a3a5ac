"""Attention's time share of a transformer prefill, measured, and the closed Amdahl loop (spec §5, §5.1).

The model is a Llama-shaped decoder in plain torch (8B-like: hidden 4,096, 32 heads of d = 128, SwiGLU
MLP 14,336, RMSNorm, RoPE; random weights, nothing downloaded; no embedding and no LM head, so the
prefill is the decoder layers only). A prefill of P tokens runs with one attention implementation:

    naive      the explicit 3-kernel baseline (S and P materialised in the input dtype; spec §1)
    flash | cudnn | efficient | math   one SDPA backend, restricted with sdpa_kernel (no fallback)
    attnscope  this project's Triton FlashAttention-2 kernel

**f_time** = device time of the attention kernels / device time of all the prefill's kernels, both
from one torch.profiler trace (kernel durations summed; "attention" is the kernels launched inside the
``attnscope::attention`` range around the attention core: QK^T, mask, softmax, PV; the QKV and output
projections and RoPE count as the rest). The FLOP share is printed beside it; it is not a time share.

**Closed loop** (``project_to``): with the baseline attention A and the candidate B on the same shapes,
measure f_time(A) and the kernel speedup S = t_A / t_B of attention alone ([1, 32, P, 128], causal),
project the prefill speedup with Amdahl (model/amdahl.py), then swap B in, time both prefills, and
report projected vs measured and the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from attnscope.errors import choice, positive_int
from attnscope.model import amdahl

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
            from attnscope.errors import InputError

            raise InputError(f"heads: expected heads x head_dim == hidden ({self.hidden}), "
                             f"got {self.heads} x {self.head_dim}")


# --- FLOPs (analytic, CPU) --------------------------------------------------------------------------
def flops(shape: LlamaShape, p: int, causal: bool = True) -> dict:
    """FLOPs of a P-token prefill through ``shape.layers`` layers, split attention core / the rest.

    Per layer: QKV projection 2*P*h*3h, output projection 2*P*h*h, SwiGLU MLP 3 x 2*P*h*m; attention
    core 4*P^2*d*H (QK^T and PV), halved when causal (DESIGN.md's convention). Norms, RoPE and the
    softmax's elementwise work are not counted (they are FLOP-cheap; that is spec §5.1's point).
    """
    positive_int("p", p)
    h, m = shape.hidden, shape.mlp
    linear = 2 * p * h * 3 * h + 2 * p * h * h + 3 * 2 * p * h * m
    attn = 4 * p * p * shape.head_dim * shape.heads
    attn = attn // 2 if causal else attn
    total = shape.layers * (linear + attn)
    return {"attention": shape.layers * attn, "other": shape.layers * linear, "total": total,
            "share": shape.layers * attn / total}


# --- attention implementations (GPU) -----------------------------------------------------------------
_MASKS: dict = {}


def _future_mask(torch, n: int, device):
    """Bool [n, n], True above the diagonal (the future); built once per (n, device) and cached, so
    building it is not part of the measured call (model/traffic.py's naive-causal-eager row)."""
    key = (n, str(device))
    if key not in _MASKS:
        _MASKS[key] = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
    return _MASKS[key]


def naive_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """The explicit materialising baseline (spec §1): three kernels, four with the causal mask.

    q, k, v: [B, H, N, d] (Nq == Nk when causal). S = scale * Q K^T is one batched GEMM (baddbmm with
    alpha = scale, so no separate scaling kernel), masked_fill with a cached bool mask when causal
    (out of place), softmax in the input dtype, then O = P V.
    """
    import torch

    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q3, k3, v3 = q.reshape(B * H, Nq, d), k.reshape(B * H, Nk, d), v.reshape(B * H, Nk, d)
    s = torch.baddbmm(q3.new_empty(1, 1, 1), q3, k3.transpose(1, 2), beta=0.0, alpha=scale)  # S [B*H, Nq, Nk]
    if causal:
        s = s.masked_fill(_future_mask(torch, Nq, q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)  # P [B*H, Nq, Nk], input dtype
    return torch.bmm(p, v3).view(B, H, Nq, d)  # O [B, H, Nq, d]


# --- the decoder (GPU) ------------------------------------------------------------------------------
def build_decoder(shape: LlamaShape, attention: str, device="cuda", dtype=None, seed: int = 0):
    """A ``torch.nn.Module`` decoder with random weights whose attention core is ``attention``."""
    import torch
    from torch import nn

    from attnscope.measure.backends import attention_fn

    choice("attention", attention, ATTENTIONS)
    dtype = dtype or torch.float16
    attn = attention_fn(attention, causal=True)
    gen = torch.Generator(device=device).manual_seed(seed)

    def weight(*dims):  # N(0, 1/fan_in), drawn on the device (fast), then cast
        w = torch.randn(*dims, generator=gen, device=device) * (1.0 / math.sqrt(dims[-1]))
        return nn.Parameter(w.to(dtype), requires_grad=False)

    def rms_norm(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + shape.eps)).to(x.dtype) * w

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            h, m = shape.hidden, shape.mlp
            self.norm1 = nn.Parameter(torch.ones(h, device=device, dtype=dtype), requires_grad=False)
            self.norm2 = nn.Parameter(torch.ones(h, device=device, dtype=dtype), requires_grad=False)
            self.wqkv = weight(3 * h, h)     # [3h, h]
            self.wo = weight(h, h)           # [h, h]
            self.w_gate_up = weight(2 * m, h)  # [2m, h]
            self.w_down = weight(h, m)       # [h, m]

        def forward(self, x, cos, sin):  # x [B, P, h]
            B, P, _ = x.shape
            qkv = nn.functional.linear(rms_norm(x, self.norm1), self.wqkv)  # [B, P, 3h]
            q, k, v = qkv.view(B, P, 3, shape.heads, shape.head_dim).permute(2, 0, 3, 1, 4)  # [B, H, P, d]
            q, k, v = rope(q, cos, sin), rope(k, cos, sin), v.contiguous()  # all contiguous, every impl alike
            with torch.profiler.record_function(ANNOTATION):
                o = attn(q, k, v)  # [B, H, P, d]
            x = x + nn.functional.linear(o.transpose(1, 2).reshape(B, P, -1), self.wo)
            gate, up = nn.functional.linear(rms_norm(x, self.norm2), self.w_gate_up).chunk(2, dim=-1)
            return x + nn.functional.linear(nn.functional.silu(gate) * up, self.w_down)

    def rope(x, cos, sin):  # x [B, H, P, d]; rotate pairs (x_i, x_{i+d/2})
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(shape.layers))
            self.norm = nn.Parameter(torch.ones(shape.hidden, device=device, dtype=dtype),
                                     requires_grad=False)

        def forward(self, x):  # x [B, P, h] -> [B, P, h]
            P = x.shape[1]
            inv = 1.0 / shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, device=device).float()
                                              / shape.head_dim)
            ang = torch.outer(torch.arange(P, device=device).float(), inv)  # [P, d/2]
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return rms_norm(x, self.norm)

    return Decoder().eval()


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
    times.sort()
    return times[len(times) // 2]


@dataclass
class ShareResult:
    """f_time of one prefill: attention and total kernel device time (ms), the FLOP share beside it."""

    attention: str
    p: int
    layers: int
    attention_ms: float
    total_ms: float
    flop_share: float
    kernels: int
    top: list = field(default_factory=list)  # [(name, ms, is_attention)] the longest kernels

    @property
    def f_time(self) -> float:
        return self.attention_ms / self.total_ms if self.total_ms else float("nan")

    def to_json(self) -> dict:
        return {"attention": self.attention, "p": self.p, "layers": self.layers,
                "attention_ms": self.attention_ms, "total_ms": self.total_ms, "f_time": self.f_time,
                "flop_share": self.flop_share, "kernels": self.kernels,
                "top": [{"name": n, "ms": ms, "attention": a} for n, ms, a in self.top]}


def share_from_trace(trace, attention: str, p: int, shape: LlamaShape) -> ShareResult:
    """f_time from a Chrome trace of one prefill (pure Python: recorded traces are tested on a CPU).

    The prefill's kernels are those launched inside ``attnscope::prefill`` (all kernels if the trace
    has no such range); the attention kernels those launched inside ``attnscope::attention``.
    """
    from attnscope.measure.backends import kernels, kernels_within

    every = kernels_within(trace, PREFILL) or kernels(trace)
    attn = {(k.correlation, k.ts_us) for k in kernels_within(trace, ANNOTATION)}
    if not attn:
        raise RuntimeError(f"no kernel was found inside the {ANNOTATION!r} ranges of the trace: f_time "
                           "cannot be measured from it")
    total = sum(k.dur_us for k in every) / 1e3
    att = sum(k.dur_us for k in every if (k.correlation, k.ts_us) in attn) / 1e3
    longest = sorted(every, key=lambda k: -k.dur_us)[:8]
    top = [(k.name, k.dur_us / 1e3, (k.correlation, k.ts_us) in attn) for k in longest]
    return ShareResult(attention, p, shape.layers, att, total, flops(shape, p)["share"], len(every), top)


def _inputs(shape: LlamaShape, p: int, dtype):
    import torch

    return torch.randn(1, p, shape.hidden, device="cuda", dtype=dtype)


def measure_share(attention: str = "flash", p: int = 4096, layers: int = 2, dtype: str = "fp16",
                  keep_trace: str | None = None) -> ShareResult:
    """Build the decoder, warm it up, profile one prefill, and return f_time (see module docstring)."""
    import torch

    from attnscope.measure.backends import profile_trace, require_cuda, save_trace, torch_dtype

    require_cuda()
    choice("attention", attention, ATTENTIONS)
    positive_int("p", p)
    shape = LlamaShape(layers=positive_int("layers", layers))
    dt = torch_dtype(torch, dtype)
    model = build_decoder(shape, attention, dtype=dt)
    x = _inputs(shape, p, dt)
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
        return {"baseline": self.baseline, "candidate": self.candidate, "p": self.p, "layers": self.layers,
                "f_time": self.f_time, "s_kernel": self.s_kernel, "kernel_ms": self.kernel_ms,
                "prefill_ms": self.prefill_ms, "projected_speedup": self.projected,
                "measured_speedup": self.measured, "error": self.error,
                "share": self.share.to_json() if self.share else None}


def closed_loop(baseline: str = "naive", candidate: str = "attnscope", p: int = 4096, layers: int = 2,
                dtype: str = "fp16", reps: int = 10) -> ClosedLoop:
    """Measure f_time(baseline) and S = t_baseline / t_candidate (attention alone, same shapes),
    project with Amdahl, then time both prefills and compare (see module docstring)."""
    import torch

    from attnscope.measure.backends import attention_fn, require_cuda, torch_dtype

    require_cuda()
    choice("baseline", baseline, ATTENTIONS)
    choice("project_to", candidate, ATTENTIONS)
    shape = LlamaShape(layers=positive_int("layers", layers))
    sh = measure_share(baseline, p, layers, dtype)
    dt = torch_dtype(torch, dtype)
    qkv = [torch.randn(1, shape.heads, p, shape.head_dim, device="cuda", dtype=dt) for _ in range(3)]
    kernel_ms, prefill_ms = {}, {}
    with torch.inference_mode():
        for name in (baseline, candidate):
            fn = attention_fn(name, causal=True)
            kernel_ms[name] = cuda_time_ms(lambda fn=fn, qkv=qkv: fn(*qkv), reps=reps)
        qkv.clear()  # free the attention-alone inputs before the prefills
        x = _inputs(shape, p, dt)
        for name in (baseline, candidate):
            model = build_decoder(shape, name, dtype=dt)
            prefill_ms[name] = cuda_time_ms(lambda model=model: model(x), reps=reps)
            del model
            torch.cuda.empty_cache()
    return ClosedLoop(baseline, candidate, p, layers, sh.f_time, kernel_ms, prefill_ms, sh)
