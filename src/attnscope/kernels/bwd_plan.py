"""Launch plans of the backward, `bwd.flash_attention_backward`: as the forward's (`fwd._Plan`), the first
call of a layout checks it, picks the kernels and packs their arguments; a later call of that layout
allocates the gradients and launches (through the compiled binaries' launchers, `_direct`). A plan holds no
user tensor. The key (`plan_key`): the shapes, strides, dtypes and devices of every tensor argument, the flags
and options with their types; calls whose checks must see them (a flag not a bool, an argument not a tensor,
a base address not 16-byte aligned) and calls on CPU tensors (the interpreter) are planned each time."""

from __future__ import annotations

import math
import threading

from attnscope.errors import InputError
from attnscope.kernels import bwd
from attnscope.kernels._common import LOG2E, MAX_GRID_Y, check_mods, import_torch_triton, interpreting
from attnscope.kernels._direct import planned_launch
from attnscope.kernels._tl import mod_args
from attnscope.model.tiles import cdiv

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
    return key


def run(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl):
    """`bwd.flash_attention_backward` (its arguments, checked on a layout's first call)."""
    try:
        key = plan_key(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl)
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable option: the checks name it
        key = plan = None
    if plan is None:
        plan = _plan(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl)
        if key is not None and q.device.type == "cuda":  # CPU tensors (the interpreter): planned each call
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


def _plan(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl):
    """Check the call (every documented error) and plan its launches: ``run(do, q, k, v, o, lse, dlse,
    sinks) -> gradients``."""
    B, Hq, Nq, d, Hkv, Nk = bwd._check_inputs(do, q, k, v, o, lse, scale)
    if dlse is not None and (not isinstance(dlse, Tensor) or tuple(dlse.shape) != (B, Hq, Nq)
                             or dlse.device != q.device):
        got = (f"{tuple(dlse.shape)} on {dlse.device}" if isinstance(dlse, Tensor)
               else type(dlse).__name__)
        raise InputError(f"dlse: expected None or a tensor [B, Hq, Nq] = {(B, Hq, Nq)} on {q.device}, "
                         f"got {got}")
    mods = check_mods(torch, causal, window, softcap, sinks, Hq, q.device)._replace(sinks=None)
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    hopper = bwd._pick_impl(impl, q, bool(causal), mods, sm_scale * LOG2E) == "hopper"
    if B * Hq > MAX_GRID_Y:  # every backward kernel's grid puts (batch, head) on the y axis
        raise NotImplementedError(f"q: B x Hq = {B} x {Hq} = {B * Hq} (batch, head) programs is past the "
                                  f"launch grid's {MAX_GRID_Y} for the backward; supported: B x Hq <= "
                                  f"{MAX_GRID_Y}")
    margs = mod_args(mods, sm_scale, Nq, Nk)
    causal = bool(causal) and not mods.windowed  # a window folds causal in as right = 0
    emulate = interpreting() and q.dtype == torch.bfloat16
    dev = q.device
    pre_m = 16 if interpreting() else bwd.PRE_BLOCK_M
    pre = planned_launch(bwd._attnscope_bwd_preprocess, (cdiv(Nq, pre_m), B * Hq),
                         dict(HEAD_DIM=d, BLOCK_M=pre_m), dev)
    pre_strides = (o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2), Hq, Nq)
    grad_shapes = ((B, Hkv, Nk, d), (B, Hkv, Nk, d), (B, Hq, Nq, d))

    def preprocess(do, o, lse, dlse, sinks):
        """(dk, dv, dq outputs, D = rowsum(dO O) - dLSE, LSE x log2(e), dsinks or None)."""
        dk, dv, dq = (torch.empty(s, dtype=q.dtype, device=dev) for s in grad_shapes)
        delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=dev)
        pre((o, do, delta, *pre_strides), (o.data_ptr() | do.data_ptr()) % 16 == 0)
        if dlse is not None:
            delta = delta - dlse.to(torch.float32)  # d LSE / d S = P: dS = P * (dP - (D - dLSE))
        dsinks = None
        if sinks is not None:  # dLSE/dsink = exp(sink - LSE); dO . dO/dsink = -exp(sink - LSE) D
            w = torch.exp(sinks.view(1, Hq, 1) - lse)
            dsinks = -(torch.where(torch.isneginf(lse), 0.0, w) * delta).sum((0, 2))
        return dk, dv, dq, delta, (lse * LOG2E).contiguous(), dsinks

    if hopper:  # the Gluon dK/dV kernel then the Gluon dQ kernel, or the one-pass dK/dV kernel (atomic dQ)
        from attnscope.kernels import bwd_hopper  # Gluon: imported only when used

        onepass = not deterministic and d in bwd.HOPPER_ONEPASS_DIMS and bwd_hopper.onepass_ok(d, mods)
        kernels = bwd_hopper.launcher(q, k, v, do, margs["qk_scale"], sm_scale, causal, mods,
                                      mode=bwd.HOPPER_ONEPASS_MODE if onepass else "twokernel")

        def run_hopper(do, q, k, v, o, lse, dlse, sinks):
            dk, dv, dq, delta, lse2, dsinks = preprocess(do, o, lse, dlse, sinks)
            kernels(q, k, v, do, lse2, delta.contiguous(), dq, dk, dv)
            return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)
        return run_hopper

    atomic = not deterministic
    (bm, bn, warps, stages), (dq_bm, dq_bn, dq_warps, dq_stages) = bwd.configs(d, q, atomic)
    off64 = bwd._off64(q, k, v, do)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    scalars = (*strides, Hq, Hkv, Nq, Nk, margs["qk_scale"], sm_scale, margs["LEFT"], margs["RIGHT"],
               margs["cap_in"])
    consts = dict(HEAD_DIM=d, CAUSAL=causal, EMULATE_BF16=emulate, WINDOW=margs["WINDOW"],
                  SOFTCAP=margs["SOFTCAP"], OFF64=off64)
    dkdv = planned_launch(bwd._attnscope_bwd_dkdv_kernel, (cdiv(Nk, bn), B * Hkv),
                          dict(consts, ATOMIC_DQ=atomic, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                               num_stages=stages), dev)
    dq_pass = planned_launch(bwd._attnscope_bwd_dq_kernel, (cdiv(Nq, dq_bm), B * Hq),
                             dict(consts, BLOCK_M=dq_bm, BLOCK_N=dq_bn, num_warps=dq_warps,
                                  num_stages=dq_stages), dev)

    def run_portable(do, q, k, v, o, lse, dlse, sinks):
        dk, dv, dq, delta, lse2, dsinks = preprocess(do, o, lse, dlse, sinks)
        aligned = (q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr() | delta.data_ptr()) % 16 == 0
        dq_acc = torch.zeros((B, Hq, Nq, d), dtype=torch.float32, device=dev) if atomic else dk  # dk: unused
        dkdv((q, k, v, do, lse2, delta, dk, dv, dq_acc, *scalars), aligned)
        if atomic:
            dq = dq_acc.to(q.dtype)
        else:
            dq_pass((q, k, v, do, lse2, delta, dq, *scalars), aligned)
        return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)
    return run_portable
