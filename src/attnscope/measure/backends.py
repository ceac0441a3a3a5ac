"""Which attention kernel actually ran: profiler kernel names -> backend (spec §6, §6.2).

An eligibility check answers "could it run?"; this module answers "did it run?". It restricts SDPA's
dispatch to one backend with ``torch.nn.attention.sdpa_kernel`` (so an input that backend cannot take
raises instead of silently falling back), records the launched kernels with ``torch.profiler``, and
classifies each kernel by its name with the table below.

Kernel-name table (substring of the lower-cased name; first match wins; torch 2.x on SM80/SM90):

    family     backend    matches                                examples
    attnscope  attnscope  starts with ``_attnscope_``            _attnscope_fwd_kernel, _attnscope_decode_*
    flash      flash      flash_fwd                              pytorch_flash::flash_fwd_kernel<...>,
                                                                 flash_fwd_splitkv_kernel, ..._combine_kernel
    efficient  efficient  fmha_cutlass, pytorchmemeffattention,  fmha_cutlassF_f16_aligned_64x128_rf_sm80(
                          attentionkernel                        PyTorchMemEffAttention::AttentionKernel<..>)
    cudnn      cudnn      cudnn + one of sdpa/fmha/flash/fprop   cudnn_generated_fort_native_sdpa_sm90_...
    softmax    (math)     softmax                                softmax_warp_forward, cunn_SoftMaxForward
    gemm       (math)     gemm, xmma, cutlass, bmm, s16816,      sm90_xmma_gemm_f16f16_..., ampere_..._gemm,
                          s1688, nvjet                           nvjet_sm90_hsh_256x128_..._coopA_TNT
                                                                 (cuBLASLt's nvJet GEMMs: torch 2.11 + CUDA
                                                                 13 on the H200 launch these for bmm)
    other      -          anything else (elementwise, copies, casts, fill, masks)

The backend of a call is its fused family when exactly one fused family (attnscope, flash, efficient,
cudnn) appears; ``math`` when no fused kernel appears but both a GEMM and a softmax do (the bmm +
softmax + bmm chain); otherwise ``unknown``. Two fused families in one call is ``mixed``.

The classification is pure Python and runs on a CPU; running a call needs torch and a CUDA GPU.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from dataclasses import dataclass, field

from attnscope.errors import choice, positive_int

#: Backends `attnscope which --backend` accepts; ``auto`` is SDPA's own default dispatch.
BACKENDS = ("flash", "cudnn", "efficient", "math", "attnscope", "auto")
#: Kernel families, fused ones first.
FUSED = ("attnscope", "flash", "efficient", "cudnn")
DTYPES = ("fp16", "bf16")

#: (family, predicate on the lower-cased name). Order matters: fused families before gemm/softmax,
#: because fused kernels' names can contain "cutlass" or "flash".
_TABLE = (
    ("attnscope", lambda s: s.startswith("_attnscope_")),
    ("flash", lambda s: "flash_fwd" in s and "cudnn" not in s),
    ("efficient", lambda s: "fmha_cutlass" in s or "pytorchmemeffattention" in s or "attentionkernel" in s),
    ("cudnn", lambda s: "cudnn" in s and any(t in s for t in ("sdpa", "fmha", "flash", "fprop"))),
    ("softmax", lambda s: "softmax" in s),
    ("gemm", lambda s: any(t in s for t in ("gemm", "xmma", "cutlass", "bmm", "s16816", "s1688", "nvjet"))),
)


def family(name: str) -> str:
    """The family of one kernel name (see the module table); ``other`` when nothing matches."""
    s = name.strip().lower()
    for fam, match in _TABLE:
        if match(s):
            return fam
    return "other"


def backend_of(names) -> str:
    """The backend a list of launched kernel names shows: a fused family, ``math``, ``mixed`` or
    ``unknown`` (see the module docstring for the rule)."""
    fams = {family(n) for n in names}
    fused = [f for f in FUSED if f in fams]
    if len(fused) == 1:
        return fused[0]
    if len(fused) > 1:
        return "mixed"
    if "gemm" in fams and "softmax" in fams:
        return "math"
    return "unknown"


# --- profiler traces -------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelEvent:
    """One GPU kernel from a torch.profiler Chrome trace: name, start and duration in microseconds,
    and the correlation id that links it to the CPU-side launch."""

    name: str
    ts_us: float
    dur_us: float
    correlation: int | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "family": family(self.name), "ts_us": self.ts_us, "dur_us": self.dur_us}


def load_trace(path: str) -> dict:
    """Read a Chrome trace written by ``prof.export_chrome_trace`` (``.json`` or ``.json.gz``)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _events(trace) -> list[dict]:
    return trace["traceEvents"] if isinstance(trace, dict) else list(trace)


def kernels(trace) -> list[KernelEvent]:
    """GPU kernels of a Chrome trace (events of category ``kernel``), in start order."""
    out = []
    for e in _events(trace):
        if e.get("cat") == "kernel" and e.get("ph", "X") == "X":
            corr = (e.get("args") or {}).get("correlation")
            out.append(KernelEvent(e["name"], float(e["ts"]), float(e.get("dur", 0.0)), corr))
    return sorted(out, key=lambda k: k.ts_us)


def kernels_within(trace, annotation: str) -> list[KernelEvent]:
    """Kernels launched (on the CPU side) inside any ``record_function(annotation)`` range.

    The link is the correlation id: a kernel's id equals the id of the runtime or driver call that
    launched it (``cudaLaunchKernel``, ``cuLaunchKernelEx`` for Triton), and that call's timestamp lies
    within the annotation's CPU range on the same thread.
    """
    events = _events(trace)
    ranges = [(e.get("tid"), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
              for e in events if e.get("cat") == "user_annotation" and e.get("name") == annotation]
    inside = set()
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            ts = float(e["ts"])
            if corr is not None and any(t == e.get("tid") and a <= ts <= b for t, a, b in ranges):
                inside.add(corr)
    found = [k for k in kernels(trace) if k.correlation in inside]
    if found or not ranges:
        return found
    # no launch linked (a build that does not trace driver-API launches): fall back to the range's GPU
    # projection, the ``gpu_user_annotation`` events, and take the kernels that start inside it
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
           for e in events if e.get("cat") == "gpu_user_annotation" and e.get("name") == annotation]
    return [k for k in kernels(trace) if any(a <= k.ts_us <= b for a, b in gpu)]


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
        return {"asked": self.asked, "ran": self.ran, "ok": self.ok, "shape": self.shape, "error": self.error,
                "kernels": [k.to_json() for k in self.kernels]}


def require_cuda():
    """Import torch and check for a CUDA device; raise RuntimeError with one line otherwise."""
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"needs torch with CUDA: pip install 'attnscope[kernels]' ({e})") from e
    if not torch.cuda.is_available():
        raise RuntimeError("needs a CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def torch_dtype(torch, dtype: str):
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[choice("dtype", dtype, DTYPES)]


def attention_fn(impl: str, causal: bool):
    """A function ``f(q, k, v) -> o`` for ``impl``: an SDPA backend (restricted, no fallback), SDPA's
    default dispatch (``auto``), the explicit 3-kernel ``naive`` baseline, or ``attnscope``'s kernel."""
    import torch.nn.functional as F

    if impl == "attnscope":
        import attnscope

        return lambda q, k, v: attnscope.flash_attention(q, k, v, causal=causal)
    if impl == "naive":
        from attnscope.measure.share import naive_attention

        return lambda q, k, v: naive_attention(q, k, v, causal=causal)
    if impl == "auto":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpb = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[impl]

    def run(q, k, v):
        with sdpa_kernel(sdpb):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def profile_trace(fn, annotation: str = "attnscope::call") -> dict:
    """Run ``fn()`` once inside ``record_function(annotation)`` under torch.profiler (CPU + CUDA) and
    return the Chrome trace as a dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(annotation):
            fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return load_trace(path)
    finally:
        os.unlink(path)


def save_trace(trace: dict, path: str) -> None:
    """Write a Chrome trace as JSON, gzip-compressed when ``path`` ends in ``.gz``."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(trace, f)


def profile_kernels(fn, annotation: str = "attnscope::call") -> list[KernelEvent]:
    """The kernels ``fn()`` launches, from one profiled run (see `profile_trace`).

    All the trace's kernels: the profiler ran around ``fn()`` alone (after a synchronise), so nothing
    else launched, and no launch path (runtime, driver, cuDNN's own) can hide a kernel from the answer.
    """
    return kernels(profile_trace(fn, annotation))


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
        ks = profile_kernels(lambda: fn(q, k, v))
    except RuntimeError as e:  # SDPA: "No available kernel. Aborting execution."
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return WhichResult(backend, "none", False, shape, [], first)
    ran = backend_of([x.name for x in ks])
    return WhichResult(backend, ran, backend == "auto" or ran == backend, shape, ks)
