"""Which attention kernel actually ran: profiler kernel names -> backend (spec §6, §6.2).

An eligibility check answers "could it run?"; this module answers "did it run?". It restricts SDPA's
dispatch to one backend with ``torch.nn.attention.sdpa_kernel`` (an input that backend cannot take
raises instead of falling back), records the launched kernels with ``torch.profiler`` and names the
backend from their families (the one kernel-name table: attnscope/chrome_trace.py). Also: the naive
baseline and the one SDPA-backend map the other measurements use. Running a call needs a CUDA GPU.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field

import attnscope
from attnscope import chrome_trace
from attnscope.chrome_trace import KernelEvent, backend_of, family, kernels, kernels_within  # noqa: F401
from attnscope.errors import choice, positive_int
from attnscope.inputs import write_atomic

#: Backends `attnscope which --backend` accepts; ``auto`` is SDPA's own default dispatch.
BACKENDS = ("flash", "cudnn", "efficient", "math", "attnscope", "auto")
DTYPES = ("fp16", "bf16")


# --- the naive baseline (GPU or CPU) -----------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _future_mask(torch, n: int, device):
    """Bool [n, n], True above the diagonal; cached, so building it is not part of the measured call.
    Built outside inference mode: masked_fill saves it for a backward, which an inference tensor cannot be."""
    with torch.inference_mode(False):
        return torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)


def naive_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """The explicit materialising baseline (spec §1): three kernels, four with the causal mask.

    q, k, v: [B, H, N, d] (Nq == Nk when causal). S = scale * Q K^T is one batched GEMM (baddbmm with
    alpha = scale, so no separate scaling kernel), masked_fill with a cached bool mask when causal
    (out of place), softmax in the input dtype, then O = P V.
    """
    import torch

    B, H, Nq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q3, k3, v3 = (t.reshape(B * H, t.shape[2], d) for t in (q, k, v))  # [B*H, N, d]
    s = torch.baddbmm(q3.new_empty(1, 1, 1), q3, k3.transpose(1, 2), beta=0.0, alpha=scale)  # S [B*H, Nq, Nk]
    if causal:
        s = s.masked_fill(_future_mask(torch, Nq, q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)  # P [B*H, Nq, Nk], input dtype
    return torch.bmm(p, v3).view(B, H, Nq, d)  # O [B, H, Nq, d]


# --- running a call (GPU) --------------------------------------------------------------------------
@dataclass
class WhichResult:
    """What ran for one attention call. ``ok`` is True when the asked backend ran (always for auto)."""

    asked: str
    ran: str
    ok: bool
    shape: dict
    kernels: list[KernelEvent] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "kernels": [k.to_json() for k in self.kernels]}


def gpu_problem() -> str | None:
    """Why the GPU commands cannot run here (one line), or None when torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA: pip install 'attnscope[kernels]'"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"
    return None


def require_cuda():
    """Import torch and check for a CUDA device; raise RuntimeError with `gpu_problem`'s line otherwise."""
    if why := gpu_problem():
        raise RuntimeError(why)
    import torch

    return torch


def torch_dtype(torch, dtype: str):
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[choice("dtype", dtype, DTYPES)]


def attention_fn(impl: str, causal: bool):
    """A function ``f(q, k, v) -> o`` for ``impl``: an SDPA backend (restricted, no fallback; GQA when k
    has fewer heads than q), SDPA's default dispatch (``auto``), the explicit 3-kernel ``naive`` baseline,
    or ``attnscope``'s kernel."""
    import torch.nn.functional as F

    if impl == "attnscope":
        return lambda q, k, v: attnscope.flash_attention(q, k, v, causal=causal)
    if impl == "naive":
        return functools.partial(naive_attention, causal=causal)
    if impl == "auto":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    call = sdpa(impl)
    return lambda q, k, v: call(q, k, v, causal, gqa=q.shape[1] != k.shape[1])


def sdpa(backend: str):
    """``f(q, k, v, causal, gqa=False)``: SDPA restricted to one backend (flash, cudnn, efficient, math)
    with ``sdpa_kernel``, so an input it cannot take raises instead of falling back. The one SDPA map."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    choice("backend", backend, ("flash", "cudnn", "efficient", "math"))
    sdpb = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]

    def run(q, k, v, causal=False, gqa=False):
        with sdpa_kernel(sdpb):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return run


def capture_graph(fn):
    """``fn`` captured in a CUDA graph (after a warm-up call on a side stream); ``.replay()`` runs it."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def profile_trace(fn, annotation: str = "attnscope::call") -> dict:
    """Run ``fn()`` once inside ``record_function(annotation)`` under torch.profiler (CPU + CUDA) and
    return the Chrome trace as a dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(annotation):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return chrome_trace.load(path, path)


def save_trace(trace: dict, path: str, field: str = "--trace") -> None:
    """Write a Chrome trace as JSON, gzip-compressed when ``path`` ends in ``.gz`` (atomically, never
    through a symlink: `inputs.write_atomic`)."""
    data = json.dumps(trace).encode("utf-8")
    write_atomic(path, gzip.compress(data) if str(path).endswith(".gz") else data, field)


def which(backend: str = "flash", n: int = 4096, d: int = 128, heads: int = 32, batch: int = 1,
          dtype: str = "fp16", causal: bool = False) -> WhichResult:
    """Run one attention call with dispatch restricted to ``backend`` and report which kernels ran.

    Inputs are fresh ``randn`` tensors ``[batch, heads, n, d]`` on the GPU. A backend that refuses the
    input (SDPA raises "No available kernel") gives ``ran = "none"`` and the error's first line.
    ``ok`` is True when the kernels show the asked backend (``auto`` is always ok: it reports).
    """
    choice("backend", backend, BACKENDS)
    for name, v in (("n", n), ("d", d), ("heads", heads), ("batch", batch)):
        positive_int(name, v)
    torch = require_cuda()
    shape = {"batch": batch, "heads": heads, "n": n, "d": d, "dtype": dtype, "causal": causal}
    dt = torch_dtype(torch, dtype)
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dt) for _ in range(3))
    fn = attention_fn(backend, causal)
    try:
        fn(q, k, v)  # warm-up: compile/autotune outside the profiled call
        torch.cuda.synchronize()
        ks = kernels(profile_trace(lambda: fn(q, k, v)))  # all the run's kernels: none can hide
    except RuntimeError as e:  # SDPA: "No available kernel. Aborting execution."
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return WhichResult(backend, "none", False, shape, [], first)
    ran = backend_of([x.name for x in ks])
    return WhichResult(backend, ran, backend == "auto" or ran == backend, shape, ks)
