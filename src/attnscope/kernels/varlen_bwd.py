"""Packed variable-length FlashAttention-2 backward, and the autograd formula of
`attnscope::flash_attention_varlen`.

Algorithm: the dense backward of `attnscope.kernels.bwd` (Dao, *FlashAttention-2*, arXiv:2307.08691,
Algorithm 2, §3.1.2): P recomputed from Q, K and the saved LSE; its @triton.jit pieces
(`_attnscope_bwd_preprocess`, `_dkdv_tile`, `_dq_tile`, `_q_bounds`, the forward's `_kv_bounds` and
`_tl._window_bounds`) run here with per-sequence row offsets: a tile's rows are 0-based within its sequence,
and the sequence's first packed row goes into the base offset.

1. ``D = rowsum(dO * O) - dLSE`` and ``LSE x log2(e)`` [Hq, total_q] fp32: `_attnscope_bwd_preprocess` over
   the packed rows (one "batch");
2. dK/dV: one program per (sequence, K/V tile) work item x kv head, K and V resident, looping over the
   GQA group's query heads and the query tiles that see the tile (causal / window bounds per sequence);
   ``deterministic=False`` also adds ``dS K`` into an fp32 dQ buffer [Hq, total_q, d] with atomics;
3. ``deterministic=True``: dQ in a separate pass, one program per (sequence, query tile) x query head
   (no atomics anywhere: bitwise-identical gradients run to run). Autograd follows the dense backward's
   rule: the separate pass also for ``flash_attention_varlen(deterministic=False)`` while
   `bwd.ATOMIC_DQ_BY_DEFAULT` is False.

The cu_seqlens are sanitised and the work lists built on the device by `varlen_plan.plan` (one launch
for both lists; the forward's order: sequence-major, heaviest first): no host sync, no access outside
the tensors.
On sm_90 ``impl="auto"`` runs steps 2 and 3 as kernels/varlen_bwd_hopper.py's Gluon dK/dV and dQ kernels
(work lists of their tile sizes; no atomics either way) where `pick_impl` says so: the rule of the dense
backward, `model.dispatch.hopper_backward_ok` (head dim 64 / 128), no window or softcap (not built), fp16 /
bf16.
Sinks: ``dsinks[h] = -sum_rows exp(sink_h - LSE) (D - dLSE)`` from D and the LSE, in torch.
Layout: q, dO, o [total_q, Hq, d], k, v [total_k, Hkv, d] (any strides with a unit last stride; plain
pointer loads); dq, dk, dv contiguous in the same layouts. Configs: the dense backward's tables.
"""

from __future__ import annotations

from attnscope.errors import InputError, choice
from attnscope.kernels._common import (
    LOG2E,
    check_flags,
    head_block,
    hopper_unavailable,
    import_torch_triton,
    interpreting,
    on_tensor_device,
    sink_weight,
)
from attnscope.model import dispatch
from attnscope.model.tiles import cdiv

torch, triton = import_torch_triton()
import triton.language as tl  # noqa: E402

from attnscope.kernels import bwd, varlen_plan  # noqa: E402
from attnscope.kernels._tl import _kv_bounds, _kv_bounds_window, _window_bounds  # noqa: E402
from attnscope.kernels.bwd import (  # noqa: E402
    PRE_BLOCK_M,
    _attnscope_bwd_preprocess,
    _dkdv_tile,
    _dq_tile,
    _out,
    _q_bounds,
)
from attnscope.kernels.bwd import configs as bwd_configs  # noqa: E402


@triton.jit
def _seq(CU_Q, CU_K, s):
    """First packed row and length of sequence ``s`` (q and k/v) from the sanitised cu_seqlens."""
    q0 = tl.load(CU_Q + s)
    k0 = tl.load(CU_K + s)
    return q0, tl.load(CU_Q + s + 1) - q0, k0, tl.load(CU_K + s + 1) - k0


@triton.jit
def _attnscope_varlen_dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV, DQ, CU_Q, CU_K, WORK_SEQ, WORK_TILE,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    H, HKV, TOTAL_Q, qk_scale, sm_scale, left, right, sc_in, sc_out,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, EMULATE_BF16: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    D: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    qk = sc_out if SOFTCAP else qk_scale  # the tiles' log2 scale: softcap * log2(e) under softcap
    w = pid // HKV
    hk = pid % HKV
    s = tl.load(WORK_SEQ + w)
    if s < 0:  # idle item
        return
    q0, NQ, k0, NK = _seq(CU_Q, CU_K, s)
    start_n = tl.load(WORK_TILE + w) * BLOCK_N
    group = H // HKV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D  # the head dim (HEAD_DIM: its power-of-two tile)
    col_ok = offs_n[:, None] < NK
    if DIM != HEAD_DIM:
        col_ok = col_ok & (offs_d[None, :] < DIM)
    k_rows = (k0 + offs_n).to(tl.int64)
    hk64 = hk.to(tl.int64)
    k = tl.load(K + k_rows[:, None] * stride_kt + hk64 * stride_kh + offs_d[None, :], mask=col_ok, other=0.0)
    v = tl.load(V + k_rows[:, None] * stride_vt + hk64 * stride_vh + offs_d[None, :], mask=col_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    n_hi = tl.cdiv(NQ, BLOCK_M) * BLOCK_M
    if WINDOW:  # the query rows that see this K/V tile: the window bounds with rows and keys swapped
        lo, full_lo, full_hi, hi = _window_bounds(start_n, NK, NQ, BLOCK_N, BLOCK_M, right, left)
        if start_n + BLOCK_N > NK:  # ragged last K/V tile: its columns past Nk need the mask
            full_lo = hi
            full_hi = hi
    else:
        lo, hi = _q_bounds(start_n, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        full_lo = hi
        full_hi = n_hi
    q064 = q0.to(tl.int64)
    for g in range(0, group):  # GQA: the group's query heads, reduced in registers
        h = (hk * group + g).to(tl.int64)
        q_base = q064 * stride_qt + h * stride_qh
        do_base = q064 * stride_dot + h * stride_doh
        row_base = h * TOTAL_Q + q064  # LSE, D: [Hq, total_q]
        dq_base = row_base * DIM  # fp32 dQ buffer [Hq, total_q, d]
        for start_m in range(lo, full_lo, BLOCK_M):  # masked (diagonal, window edge, ragged K/V tile)
            dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                stride_qt, stride_dot, start_m, start_n, qk, sm_scale, NQ, NK, left, right,
                                sc_in, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, WINDOW, SOFTCAP, ATOMIC_DQ,
                                EMULATE_BF16, DIM)
        for start_m in range(full_lo, full_hi, BLOCK_M):  # every row sees the whole tile: no mask
            dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                stride_qt, stride_dot, start_m, start_n, qk, sm_scale, NQ, NK, left, right,
                                sc_in, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, WINDOW, SOFTCAP, ATOMIC_DQ,
                                EMULATE_BF16, DIM)
        if WINDOW:
            for start_m in range(full_hi, hi, BLOCK_M):  # the window's far edge: masked
                dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                    stride_qt, stride_dot, start_m, start_n, qk, sm_scale, NQ, NK, left,
                                    right, sc_in, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, WINDOW, SOFTCAP,
                                    ATOMIC_DQ, EMULATE_BF16, DIM)
    out = k_rows[:, None] * (HKV * DIM) + hk64 * DIM + offs_d[None, :]  # [total_k, Hkv, d]
    tl.store(DK + out, _out(dk * sm_scale, DK.dtype.element_ty, EMULATE_BF16), mask=col_ok)
    tl.store(DV + out, _out(dv, DV.dtype.element_ty, EMULATE_BF16), mask=col_ok)


@triton.jit
def _attnscope_varlen_dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ, CU_Q, CU_K, WORK_SEQ, WORK_TILE,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    H, HKV, TOTAL_Q, qk_scale, sm_scale, left, right, sc_in, sc_out,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    EMULATE_BF16: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, D: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    qk = sc_out if SOFTCAP else qk_scale  # the tiles' log2 scale: softcap * log2(e) under softcap
    w = pid // H
    h = pid % H
    s = tl.load(WORK_SEQ + w)
    if s < 0:
        return
    q0, NQ, k0, NK = _seq(CU_Q, CU_K, s)
    start_m = tl.load(WORK_TILE + w)
    hk = h // (H // HKV)
    h64 = h.to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows within the sequence
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < NQ
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D  # the head dim (HEAD_DIM: its power-of-two tile)
    rows = row_ok[:, None] if DIM == HEAD_DIM else row_ok[:, None] & (offs_d[None, :] < DIM)
    q_rows = (q0 + offs_m).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + h64 * stride_qh + offs_d[None, :], mask=rows, other=0.0)
    do = tl.load(DO + q_rows[:, None] * stride_dot + h64 * stride_doh + offs_d[None, :], mask=rows, other=0.0)
    lse2 = tl.load(LSE2 + h64 * TOTAL_Q + q_rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + h64 * TOTAL_Q + q_rows, mask=row_ok, other=0.0)
    k_base = k0.to(tl.int64) * stride_kt + hk.to(tl.int64) * stride_kh
    v_base = k0.to(tl.int64) * stride_vt + hk.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if WINDOW:
        lo, full_lo, full_hi, hi = _kv_bounds_window(start_m, NQ, NK, left, right, BLOCK_M, BLOCK_N)
        for start_n in range(lo, full_lo, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kt, stride_vt, offs_m, start_n,
                          qk, NQ, NK, left, right, sc_in, HEAD_DIM, BLOCK_N, True, False, True, SOFTCAP,
                          EMULATE_BF16, DIM)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kt, stride_vt, offs_m, start_n,
                          qk, NQ, NK, left, right, sc_in, HEAD_DIM, BLOCK_N, False, False, True, SOFTCAP,
                          EMULATE_BF16, DIM)
        for start_n in range(full_hi, hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kt, stride_vt, offs_m, start_n,
                          qk, NQ, NK, left, right, sc_in, HEAD_DIM, BLOCK_N, True, False, True, SOFTCAP,
                          EMULATE_BF16, DIM)
    else:
        lo, hi = _kv_bounds(start_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        for start_n in range(0, lo, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kt, stride_vt, offs_m, start_n,
                          qk, NQ, NK, left, right, sc_in, HEAD_DIM, BLOCK_N, False, CAUSAL,
                          False, SOFTCAP, EMULATE_BF16, DIM)
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kt, stride_vt, offs_m, start_n,
                          qk, NQ, NK, left, right, sc_in, HEAD_DIM, BLOCK_N, True, CAUSAL,
                          False, SOFTCAP, EMULATE_BF16, DIM)
    tl.store(DQ + q_rows[:, None] * (H * DIM) + h64 * DIM + offs_d[None, :],
             _out(dq * sm_scale, DQ.dtype.element_ty, EMULATE_BF16), mask=rows)


# --- the launcher ---------------------------------------------------------------------------------

def pick_impl(impl: str, q, causal: bool, mods, sm_scale: float, bounds=None) -> str:
    """"portable" or "hopper": the dK/dV and dQ kernels of `flash_attention_varlen_backward` (``impl`` as
    there). "hopper" (kernels/varlen_bwd_hopper.py) needs an sm_90 GPU, head dim 40-128 (the builds of 64 and
    128, `head_block`), fp16 / bf16, no window or softcap, ``scale * log2(e)`` in `bwd.HOPPER_QK_SCALE`;
    ``impl="auto"`` takes it where that holds and `model.dispatch.hopper_backward_ok` allows, else the
    portable kernels; ``impl="hopper"`` raises NotImplementedError saying what is supported where it does
    not hold."""
    choice("impl", impl, bwd.IMPLS)
    if impl == "portable":
        return "portable"
    d = q.shape[-1]
    qk_scale = sm_scale * LOG2E
    why = hopper_unavailable(torch, q)
    if why is None and head_block(d) not in dispatch.HOPPER_BACKWARD_DIMS:
        why = f"head_dim {d} is not supported; supported: 40-128 in steps of 8"
    if why is None and q.dtype not in (torch.float16, torch.bfloat16):
        why = f"dtype {q.dtype} is not supported; supported: torch.float16, torch.bfloat16"
    if why is None and (mods.windowed or mods.softcap > 0 or bounds is not None):
        why = "a window or softcap is not supported; supported: causal or not, sinks"
    if why is None and not bwd.HOPPER_QK_SCALE[0] <= qk_scale <= bwd.HOPPER_QK_SCALE[1]:
        why = (f"scale * log2(e) = {qk_scale:.3g} is not supported; supported: {bwd.HOPPER_QK_SCALE[0]:g} "
               f"to {bwd.HOPPER_QK_SCALE[1]:g}")
    if impl == "hopper":
        if why is not None:
            raise NotImplementedError(f"impl='hopper': {why} (impl='portable': every case)")
        return "hopper"
    ok = why is None and dispatch.hopper_backward_ok(d, bool(causal))
    return "hopper" if ok else "portable"


def _check_saved(do, o, lse, dlse, q):
    total_q, Hq, d = q.shape
    for name, t in (("do", do), ("o", o)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype \
                or t.stride(-1) != 1 or t.device != q.device:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputError(f"{name}: expected a tensor [total_q, Hq, d] = {tuple(q.shape)} of {q.dtype} "
                             f"with unit last stride, got {got}")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is None and name == "dlse":
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (Hq, total_q) or t.device != q.device:
            got = f"{tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputError(f"{name}: expected a tensor [Hq, total_q] = {(Hq, total_q)} on {q.device}, "
                             f"got {got}")


@on_tensor_device(torch)
def flash_attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, causal=False, scale=None, *, window=None, softcap=0.0,
                                    sinks=None, deterministic=False, dlse=None, check_seqlens=False,
                                    bounds=None, impl="auto"):
    """Gradients of ``o = flash_attention_varlen(q, k, v, ...)`` (the forward's arguments, its ``o`` and
    its LSE [Hq, total_q]).

    Parameters
    ----------
    do, o : torch.Tensor, [total_q, Hq, d], q's dtype
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, softcap, sinks :
        as `attnscope.kernels.varlen.flash_attention_varlen` (cu_seqlens values checked the same way).
    lse : torch.Tensor, [Hq, total_q], float32: the forward's natural-log LSE.
    deterministic : bool: True gives bitwise-identical gradients (dQ in its own pass); False (default)
        accumulates dQ with fp32 atomics in the portable kernels (the Gluon ones have no atomics).
    dlse : torch.Tensor, [Hq, total_q], optional: the gradient of the returned LSE.
    bounds : signed (left, right) band instead of ``window`` (`varlen_plan.mod_args`; the ring's blocks).
    impl : {"auto", "portable", "hopper"}
        ``"hopper"``: the Gluon sm_90 kernels of kernels/varlen_bwd_hopper.py (dQ in its own pass whatever
        ``deterministic``: bitwise reproducible); ``"portable"``: this module's Triton kernels; ``"auto"``
        (default): hopper where `pick_impl` allows, else portable.

    Returns
    -------
    dq [total_q, Hq, d], dk, dv [total_k, Hkv, d] (q's dtype, contiguous; rows of empty sequences 0),
    dsinks [Hq] float32 (an empty tensor [0] without sinks).
    """
    check_flags(deterministic=deterministic)
    dims, mods, sm_scale = varlen_plan.prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                               max_seqlen_k, causal, window, softcap, sinks, scale,
                                               check_seqlens)
    total_q, Hq, d, total_k, Hkv = dims
    _check_saved(do, o, lse, dlse, q)
    hopper = pick_impl(impl, q, causal, mods, sm_scale, bounds) == "hopper"
    dev, dt = q.device, q.dtype
    dk = torch.zeros((total_k, Hkv, d), dtype=dt, device=dev)  # zeros: rows of no item stay 0 (no keys)
    dv = torch.zeros((total_k, Hkv, d), dtype=dt, device=dev)
    dsinks = torch.zeros((Hq,) if mods.sinks is not None else (0,), dtype=torch.float32, device=dev)
    if total_q == 0:
        return torch.zeros_like(q), dk, dv, dsinks
    delta = torch.empty((Hq, total_q), dtype=torch.float32, device=dev)
    lse2 = torch.empty((Hq, total_q), dtype=torch.float32, device=dev)
    lse = lse.contiguous()
    dl = lse if dlse is None else dlse.to(torch.float32).contiguous()  # unread without dLSE
    pre_m = 16 if interpreting() else PRE_BLOCK_M
    # the packed rows as one batch: [1, Hq, total_q, d] through strides (0, head, row); D - dLSE, LSE2
    _attnscope_bwd_preprocess[(cdiv(total_q, pre_m), Hq)](
        o, do, lse, dl, delta, lse2, delta, delta, 0, o.stride(1), o.stride(0), 0, do.stride(1), do.stride(0),
        Hq, total_q, total_q, 1.0, 0.0, 1.0, HEAD_DIM=head_block(d), BLOCK_M=pre_m, HAS_DLSE=dlse is not None,
        PADDED=False, D=d)
    if mods.sinks is not None:  # dsinks[h] = -sum_rows exp(sink_h - LSE) (D - dLSE)
        dsinks = -(sink_weight(torch, mods.sinks[:, None], lse) * delta).sum(1)
    qk_scale = sm_scale * LOG2E
    B = cu_seqlens_q.shape[0] - 1
    if hopper:
        from attnscope.kernels import varlen_bwd_hopper  # Gluon: imported only when used

        lists = varlen_bwd_hopper.work_lists(total_q, total_k, B, d, causal)
        cu_q, cu_k, items = varlen_plan.plan(cu_seqlens_q, cu_seqlens_k, dims, max_seqlen_q, max_seqlen_k,
                                             lists, sanitize=not check_seqlens)
        dq = torch.empty((total_q, Hq, d), dtype=dt, device=dev)
        varlen_bwd_hopper.launch(q, k, v, do, lse2, delta.contiguous(), cu_q, cu_k, items, dq, dk, dv,
                                 qk_scale, sm_scale, causal)
        return dq, dk, dv, dsinks
    emulate = interpreting() and dt == torch.bfloat16
    mod_kw = varlen_plan.mod_args(mods, sm_scale, causal, bounds)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               do.stride(0), do.stride(1))
    atomic = not deterministic
    (bm, bn, warps, stages), (qm, qn, q_warps, q_stages) = bwd_configs(head_block(d), q, atomic)
    n_kv = cdiv(total_k, bn) + B  # >= sum_s ceil(Nk_s / BLOCK_N) for any partition of total_k
    n_q = cdiv(total_q, qm) + B
    masked = mod_kw["WINDOW"] or bool(causal)
    lists = [(n_kv, bn, masked, True)] + ([] if atomic else [(n_q, qm, masked, False)])
    cu_q, cu_k, items = varlen_plan.plan(cu_seqlens_q, cu_seqlens_k, dims, max_seqlen_q, max_seqlen_k, lists,
                                         sanitize=not check_seqlens)
    seq, tile = items[0]
    dq_acc = torch.zeros((Hq, total_q, d), dtype=torch.float32, device=dev) if atomic else dk  # dk: unused
    if total_k > 0:
        _attnscope_varlen_dkdv_kernel[(n_kv * Hkv,)](
            q, k, v, do, lse2, delta, dk, dv, dq_acc, cu_q, cu_k, seq, tile, *strides,
            Hq, Hkv, total_q, qk_scale, sm_scale, **mod_kw, HEAD_DIM=head_block(d), D=d, ATOMIC_DQ=atomic,
            BLOCK_M=bm, BLOCK_N=bn, EMULATE_BF16=emulate, num_warps=warps, num_stages=stages)
    if atomic:
        return dq_acc.transpose(0, 1).to(dt).contiguous(), dk, dv, dsinks
    dq = torch.empty((total_q, Hq, d), dtype=dt, device=dev)
    seq, tile = items[1]
    _attnscope_varlen_dq_kernel[(n_q * Hq,)](
        q, k, v, do, lse2, delta, dq, cu_q, cu_k, seq, tile, *strides, Hq, Hkv, total_q, qk_scale, sm_scale,
        **mod_kw, HEAD_DIM=head_block(d), D=d, BLOCK_M=qm, BLOCK_N=qn, EMULATE_BF16=emulate,
        num_warps=q_warps, num_stages=q_stages)
    return dq, dk, dv, dsinks


# --- autograd for `attnscope::flash_attention_varlen` ---------------------------------------------
_BWD_SCHEMA = ("(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor? dlse, "
               "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal, "
               "float scale, int[]? window, float softcap, Tensor? sinks, bool deterministic, "
               "bool check_seqlens) -> (Tensor, Tensor, Tensor, Tensor)")


@torch.library.custom_op("attnscope::flash_attention_varlen_backward", mutates_args=(), schema=_BWD_SCHEMA)
def _bwd_op(do, q, k, v, o, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
            window, softcap, sinks, deterministic, check_seqlens):
    return flash_attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, causal, scale, window=window, softcap=softcap,
                                           sinks=sinks, deterministic=deterministic, dlse=dlse,
                                           check_seqlens=check_seqlens)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
      window, softcap, sinks, deterministic, check_seqlens):
    n_sinks = q.shape[1] if sinks is not None else 0
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((n_sinks,), dtype=torch.float32))


def setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, window, softcap, sinks, deterministic,
     check_seqlens) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, sinks)
    ctx.args = (max_q, max_k, causal, scale, window, softcap, deterministic, check_seqlens, return_lse)


def backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    max_q, max_k, causal, scale, window, softcap, deterministic, check_seqlens, return_lse = ctx.args
    if not return_lse:
        raise RuntimeError("attnscope::flash_attention_varlen: the backward needs the LSE; call the op with "
                           "return_lse=True (flash_attention_varlen does so when an input requires grad)")
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    elif grad_o.stride(-1) != 1:
        grad_o = grad_o.contiguous()
    deterministic = deterministic or not bwd.ATOMIC_DQ_BY_DEFAULT  # the dense backward's switch, per call
    dq, dk, dv, dsinks = _bwd_op(grad_o, q, k, v, o, lse, grad_lse, cu_q, cu_k, max_q, max_k, causal, scale,
                                 window, softcap, sinks, deterministic, check_seqlens)
    return (dq, dk, dv, None, None, None, None, None, None, None, None, None,
            dsinks if sinks is not None else None, None, None)
