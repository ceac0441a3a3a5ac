"""The cache of the backward's launch plans, `bwd.flash_attention_backward`: as the forward's (`fwd._Plan`),
the first call of a layout checks it, picks the kernels and packs their arguments (`bwd._plan`); a later call
of that layout allocates the gradients and launches (through the compiled binaries' launchers, `_direct`). A
plan holds no user tensor. The key (`plan_key`): the shapes, strides, dtypes and devices of every tensor
argument, the flags and options with their types; calls whose checks must see them (a flag not a bool, an
argument not a tensor, a base address not 16-byte aligned) are planned each time."""

from __future__ import annotations

import threading

from attnscope.kernels._common import import_torch_triton, interpreting

torch, triton = import_torch_triton()
Tensor = torch.Tensor

#: Plans of the most recent call layouts (the oldest dropped first), as `fwd.PLAN_CACHE_SIZE`.
PLAN_CACHE_SIZE = 64
_PLANS: dict = {}
_PLANS_LOCK = threading.Lock()


def plan_key(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl):
    """All a plan depends on, or None where the call is planned each time; an unhashable option makes an
    unhashable key (`run` plans that call; its checks name the option)."""
    tensors = (do, q, k, v, o, lse)
    if (type(causal) is not bool or type(deterministic) is not bool
            or not all(isinstance(t, Tensor) for t in tensors)
            or (do.data_ptr() | q.data_ptr() | k.data_ptr() | v.data_ptr() | o.data_ptr()) & 15):
        return None
    key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)
    for t in (dlse, sinks):
        if t is not None and not isinstance(t, Tensor):
            return None
        key += (None if t is None else (t.shape, t.stride(), t.dtype, t.device),)
    key += (causal, deterministic, scale, type(scale), softcap, type(softcap), impl)
    if window is not None:  # 1.0 == 1: the checks refuse a float side
        key += (window, tuple(map(type, window)))
    if q.device.type != "cuda":  # CPU tensors run under the interpreter only (its tiles)
        key += (interpreting(),)
    return key


def run(build, do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl):
    """`bwd.flash_attention_backward` (its arguments) through the kept plan of the call's layout, or
    ``build(...)`` (the same arguments; it checks them) -> ``plan(do, q, k, v, o, lse, dlse, sinks)``."""
    try:
        key = plan_key(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl)
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable option: the checks name it
        key = plan = None
    if plan is None:
        plan = build(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl)
        if key is not None:
            with _PLANS_LOCK:
                _PLANS[key] = plan
                if len(_PLANS) > PLAN_CACHE_SIZE:
                    del _PLANS[next(iter(_PLANS))]
    return plan(do, q, k, v, o, lse, dlse, sinks)


def clear_plan_cache() -> None:
    """Drop every backward plan kept: a plan reads the dispatch rule and the config tables (`bwd`,
    `bwd_hopper`) once, so a change to them applies to calls planned after this."""
    with _PLANS_LOCK:
        _PLANS.clear()
