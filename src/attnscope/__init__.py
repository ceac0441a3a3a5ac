"""attnscope: make attention's data movement checkable, then make attention fast.

Public API (the kernels load torch and triton on first use; everything else runs without them):

    flash_attention(q, k, v, causal, scale, return_lse)   FA-2 forward, differentiable; q [B, Hq, Nq, d]
    flash_attention_varlen(q, k, v, cu_seqlens_q, ...)    packed variable-length batch; q [total_q, Hq, d]
    flash_decode(q, k_cache, v_cache, cache_seqlens)      split-KV decode / chunked prefill, dense or paged
    decode_plan(q, k_cache, v_cache, cache_seqlens)       plan a decode once, then ``plan.run(...)``
    quantize_kv(x)                                        an e4m3 KV cache and its per-head scales
    check_errors(device=None)                             raise the bad values the kernels met on the device
    attnscope.flash_attn_interface                        flash-attn 2.x's functions: flash_attn_func, ...
    attnscope.integrations.transformers.register()        attn_implementation="attnscope" in transformers
    attnscope.distributed.ring_attention(q, k, v, causal) context parallelism over torch.distributed
    attnscope.reference                                   float64 NumPy reference (naive, tiled, backward)
    attnscope.model                                       analytic byte, FLOP, tile and footprint models
    attnscope.checks                                      the algorithm checks and the kernel tolerance rule
    attnscope.report                                      the latency attribution report
    `attnscope` (command line)                            traffic, tiles, verify, report, bench, ...
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importing attnscope never imports torch
    import torch

__version__ = "0.1.0"

#: The public kernels, imported on first use (PEP 562 `__getattr__`): FA-2 forward (differentiable), packed
#: varlen forward, split-KV decode / chunked prefill, ``decode_plan`` (plan once, then ``plan.run(...)``).
_KERNELS = {"flash_attention": ("attnscope.kernels.fwd", "flash_attention"),
            "flash_attention_varlen": ("attnscope.kernels.varlen", "flash_attention_varlen"),
            "flash_decode": ("attnscope.kernels.decode", "flash_decode"),
            "decode_plan": ("attnscope.kernels.decode", "decode_plan"),
            "DecodePlan": ("attnscope.kernels.decode", "DecodePlan"),
            "quantize_kv": ("attnscope.kernels.decode", "quantize_kv")}
__all__ = [*_KERNELS, "check_errors", "__version__"]


def check_errors(device: torch.device | str | int | None = None) -> None:
    """Raise `attnscope.errors.InputError` for the out-of-range values the kernels' device-side checks met
    since the last check -- decode (lengths, block-table entries, K/V scales), `quantize_kv` (NaN or inf),
    the KV-cache append, varlen (``cu_seqlens``, ``max_seqlen``) -- and clear the records. The default calls
    never read them back (no host sync); this is one sync: call it where one is cheap (after a generation
    or training step, in tests), never inside CUDA-graph capture. ``device``: one device, or every device
    used. The kernels' own `attnscope.kernels.decode.check_errors` / `attnscope.kernels.varlen.check_errors`
    check one family each; a family whose module was never imported launched nothing and is skipped."""
    import sys

    for module in ("attnscope.kernels.decode", "attnscope.kernels.varlen"):
        if module in sys.modules:
            sys.modules[module].check_errors(device)


def __getattr__(name: str):
    if name not in _KERNELS:
        raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
    module, attr = _KERNELS[name]
    value = globals()[name] = getattr(importlib.import_module(module), attr)  # later lookups: no import call
    return value


def __dir__() -> list[str]:
    """The module's names plus the lazy kernels, so ``dir()`` and ``help(attnscope)`` show them; the kernels
    only where torch and triton are installed (help() imports what it lists)."""
    kernels = [*_KERNELS] if all(importlib.util.find_spec(m) for m in ("torch", "triton")) else []
    return sorted({*globals(), *kernels})
