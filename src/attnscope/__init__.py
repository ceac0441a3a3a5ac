"""attnscope: make attention's data movement checkable, then make attention fast.

Layers (data flows downward; a module imports only from layers below it):

    cli/         the `attnscope` command: parse, call one function, print
    report/      latency attribution report
    measure/     GPU only: timing, SDPA backend check, ncu counters, profiler time share
    kernels/     Triton: FA-2 prefill forward (dense and packed varlen) and backward, split-KV decode
    reference.py float64 NumPy reference
    model/       analytic, pure Python

Importing `attnscope` is light: torch and triton load only when a kernel is first called.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["flash_attention", "flash_attention_varlen", "flash_decode", "decode_plan", "__version__"]


def flash_attention(q, k, v, causal=False, scale=None, return_lse=False, config=None, impl="auto"):
    """FlashAttention-2 forward (Triton), differentiable (FA-2 backward in `attnscope.kernels.bwd`).
    See `attnscope.kernels.fwd.flash_attention`."""
    from attnscope.kernels.fwd import flash_attention as _impl

    return _impl(q, k, v, causal=causal, scale=scale, return_lse=return_lse, config=config, impl=impl)


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           scale=None, return_lse=False, check_seqlens=True):
    """Packed variable-length FA-2 forward (Triton). See `attnscope.kernels.varlen.flash_attention_varlen`."""
    from attnscope.kernels.varlen import flash_attention_varlen as _impl

    return _impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale,
                 return_lse=return_lse, check_seqlens=check_seqlens)


def flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits=None, scale=None, return_lse=False,
                 **options):
    """Split-KV decode / chunked prefill, dense or paged cache (Triton). See
    `attnscope.kernels.decode.flash_decode` (``options``: ``block_table``, ``check_seqlens``, ``use_dot``,
    ``fuse_combine``)."""
    from attnscope.kernels.decode import flash_decode as _impl

    return _impl(q, k_cache, v_cache, cache_seqlens=cache_seqlens, num_splits=num_splits, scale=scale,
                 return_lse=return_lse, **options)


def decode_plan(q, k_cache, v_cache, cache_seqlens=None, block_table=None, **options):
    """Plan a decode layout once, then ``plan.run(q, k_cache, v_cache, cache_seqlens, block_table)``
    (CUDA-graph capturable). See `attnscope.kernels.decode.DecodePlan`."""
    from attnscope.kernels.decode import DecodePlan

    return DecodePlan(q, k_cache, v_cache, cache_seqlens, block_table, **options)
