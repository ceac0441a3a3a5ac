"""attnscope: make attention's data movement checkable, then make attention fast.

Layers (data flows downward; a module imports only from layers below it):

    cli/         the `attnscope` command: parse, call one function, print
    report/      latency attribution report
    measure/     GPU only: timing, SDPA backend check, ncu counters, profiler time share
    kernels/     Triton: FA-2 prefill forward, split-KV decode
    reference.py float64 NumPy reference
    model/       analytic, pure Python

Importing `attnscope` is light: torch and triton load only when a kernel is first called.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["flash_attention", "flash_decode", "__version__"]


def flash_attention(q, k, v, causal=False, scale=None, return_lse=False, config=None, impl="auto"):
    """FlashAttention-2 forward (Triton). See `attnscope.kernels.fwd.flash_attention`."""
    from attnscope.kernels.fwd import flash_attention as _impl

    return _impl(q, k, v, causal=causal, scale=scale, return_lse=return_lse, config=config, impl=impl)


def flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits=None, scale=None, return_lse=False,
                 **options):
    """Split-KV decode (Flash-Decoding, Triton). See `attnscope.kernels.decode.flash_decode` (``options``:
    ``check_seqlens``, ``use_dot``)."""
    from attnscope.kernels.decode import flash_decode as _impl

    return _impl(q, k_cache, v_cache, cache_seqlens=cache_seqlens, num_splits=num_splits, scale=scale,
                 return_lse=return_lse, **options)
