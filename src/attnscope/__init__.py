"""attnscope: make attention's data movement checkable, then make attention fast.

Layers (data flows downward; a module imports only from layers below it):

    cli/         the `attnscope` command: parse, call one function, print
    report/      latency attribution report
    measure/     GPU only: timing, SDPA backend check, ncu counters, profiler time share
    kernels/     Triton: FA-2 prefill forward (dense and packed varlen) and backward, split-KV decode
    reference.py float64 NumPy reference
    model/       analytic, pure Python

Importing `attnscope` is light: torch and triton load when a kernel is first used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: The public kernels, imported on first use (PEP 562 `__getattr__`): FA-2 forward (differentiable), packed
#: varlen forward, split-KV decode / chunked prefill, ``decode_plan`` (plan once, then ``plan.run(...)``).
_KERNELS = {"flash_attention": ("attnscope.kernels.fwd", "flash_attention"),
            "flash_attention_varlen": ("attnscope.kernels.varlen", "flash_attention_varlen"),
            "flash_decode": ("attnscope.kernels.decode", "flash_decode"),
            "decode_plan": ("attnscope.kernels.decode", "decode_plan"),
            "DecodePlan": ("attnscope.kernels.decode", "DecodePlan"),
            "quantize_kv": ("attnscope.kernels.decode", "quantize_kv")}
__all__ = [*_KERNELS, "__version__"]


def __getattr__(name: str):
    if name not in _KERNELS:
        raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
    module, attr = _KERNELS[name]
    return getattr(importlib.import_module(module), attr)
