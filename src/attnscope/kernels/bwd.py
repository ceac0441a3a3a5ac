"""FlashAttention-2 backward in Triton, and `flash_attention_backward`, the backward's launch (autograd's
formula for `attnscope::flash_attention`: kernels/bwd_autograd.py).

Algorithm: Dao, *FlashAttention-2*, arXiv:2307.08691, Algorithm 2 and §3.1.2 (spec §2.2): nothing
``N x N`` is kept from the forward; every tile of ``P = exp(S - LSE)`` is recomputed from Q, K and the
saved natural-log LSE. Three kernels:

1. preprocess, one program per (query tile, batch x query head): ``D = rowsum(dO * O) - dLSE`` and
   ``LSE x log2(e)`` in fp32 (for the Hopper kernels also their padded rows, `bwd_hopper.padded_rows`);
2. dK/dV, one program per (KV tile, batch x kv head): K and V stay in registers; the loop runs over the
   query heads of the GQA group and, inside, over query tiles, so dK/dV are reduced over the group in
   registers (no atomics on dK/dV): ``dV += P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)``,
   ``dK += dS^T Q``. With ``deterministic=False`` the same program also adds ``dS K`` into an fp32 dQ
   buffer with atomics (one read-modify-write per KV tile);
3. ``deterministic=True`` (the default): dQ in a separate pass per (query tile, batch x query head) over
   the KV tiles (re-reading K and V); bit-reproducible and faster than the atomic variant at nearly
   every measured shape, so autograd runs it for ``deterministic=False`` too (`ATOMIC_DQ_BY_DEFAULT`).

Causal alignment is bottom-right (key c visible to query r iff ``c <= r + Nk - Nq``). The dQ pass uses
the forward's `_kv_bounds` (`model.tiles.causal_kv_bounds0`); the dK/dV kernel its mirror `_q_bounds`:
query tiles ``[0, lo)`` are skipped (they see none of the KV tile), ``[lo, hi)`` straddle the diagonal
and are masked, ``[hi, Nq)`` see the whole tile and run without mask arithmetic (tests/test_bwd.py
holds it against `model.tiles.Grid`). Out-of-range query rows load LSE = +inf (P = 0); rows with no
visible key (LSE = -inf) are masked everywhere, so they contribute zero, never NaN.

Score mods (constexpr-gated, as the forward): a window runs each kernel's loop as the forward does, the
whole tiles without mask arithmetic, then the masked tiles of both edges in one loop, the dQ pass between
the forward's `_tl._kv_bounds_window`, the dK/dV kernel between their mirror `_q_bounds_window`
(tests/test_mods.py holds it against `reference.permitted`); softcap recomputes ``t = tanh(s * scale /
softcap)`` and multiplies dS by ``1 - t^2``; sinks need nothing in the kernels (the LSE includes them), their
gradient ``dsinks[h] = -sum exp(sinks[h] - LSE) (D - dLSE)`` over batch and rows is torch ops on D and LSE.

On sm_90, ``impl="hopper"`` replaces kernels 2 and 3 by kernels/bwd_hopper.py's Gluon dK/dV and dQ kernels
after the same preprocess; their modes, builds and dispatch: `flash_attention_backward`'s ``deterministic``
and ``impl``.

Layout: q, dO [B, Hq, Nq, d], k, v [B, Hkv, Nk, d], any strides with a unit last stride (plain pointer loads);
dq, dk, dv allocated contiguous; ``exp2`` with log2(e) in the scale; a fixed config table per head_dim.
"""

from __future__ import annotations

import math

from attnscope.errors import InputError, choice
from attnscope.kernels._common import (
    HOPPER_MAX_SOFTCAP,
    LOG2E,
    MAX_GRID_Y,
    UNBOUNDED_SIDE,
    built_dim,
    check_device,
    check_head_dim,
    check_mods,
    check_same,
    check_scale,
    check_tensor,
    fitting,
    head_block,
    hopper_unavailable,
    import_torch_triton,
    interpreting,
    on_tensor_device,
    sink_weight,
    smem_per_block,
)
from attnscope.model import dispatch
from attnscope.model.tiles import cdiv

torch, triton = import_torch_triton()
import triton.language as tl  # noqa: E402

from attnscope.kernels import bwd_plan  # noqa: E402  the launch plans' cache
from attnscope.kernels._direct import planned_launch  # noqa: E402
from attnscope.kernels._tl import (  # noqa: E402
    _kv_bounds,
    _kv_bounds_window,
    _window_bounds,
    mod_args,
    round_bf16,
    tanh_,
)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and head_dim: a first choice after the Triton
# tutorial's FA-2 backward (few query rows against many resident keys for dK/dV, the mirror for dQ),
# picked by compiling candidates for sm_90 and reading ptxas's register/spill report: dK/dV holds K, V,
# dK and dV of its KV tile in registers, so 4 warps spill and 8 warps with 32 query
# rows against 128 keys spill least (none at d = 64); bench/backward.py times it
# (--dkdv / --dq try others). No runtime autotuning. d = 256: the fastest of `bench/tune.py backward --d 256`
# (H200, N 4k: 224-230 TFLOP/s against 107 for the spill-free 16 x 64 / 64 x 32; up to 1.1 KiB of spills
# with softcap), each in 193 KiB of shared memory (`SMEM_NEEDS`).
DKDV_CONFIGS = {64: (32, 128, 8, 2), 128: (32, 128, 8, 2), 256: (64, 64, 8, 2)}
DQ_CONFIGS = {64: (128, 64, 8, 2), 128: (128, 64, 8, 2), 256: (128, 64, 8, 1)}
#: The dK/dV kernel with dQ by fp32 atomics (``deterministic=False``), where its tiles differ: at d = 256
#: 64 x 64 needs 257 KiB of shared memory with the atomics (over an H200's 227), so the first d = 256 tiles
#: (144 KiB, <= 88 B of spills; bench/sm90_resources.py --kernel bwd); not tuned (the default is the dQ pass).
ATOMIC_DKDV_CONFIGS = {256: (16, 64, 8, 2)}
#: config -> (its shared memory compiled for sm_90, bytes; the first d = 256 tiles, run on a device that
#: offers a block less, e.g. an A100's 163 KiB: 96 / 128 KiB, no spills); `_common.fitting`
SMEM_NEEDS = {(64, 64, 8, 2): (197632, (16, 64, 8, 2)), (128, 64, 8, 1): (196608, (64, 32, 8, 2))}
PRE_BLOCK_M = 64  # 128 rows x d = 128 spills (ptxas, sm_90)
_LOG2E = tl.constexpr(LOG2E)
INTERPRET_CONFIG = (16, 32, 4, 1)  # CPU tests: small tiles, still multi-tile, ragged and diagonal
INTERPRET_DQ_CONFIG = (32, 16, 4, 1)


def dkdv_config(d: int, atomic: bool) -> tuple:
    """The dK/dV kernel's table config at head dim ``d``, with (``atomic``) or without dQ atomics."""
    return ATOMIC_DKDV_CONFIGS.get(d, DKDV_CONFIGS[d]) if atomic else DKDV_CONFIGS[d]


def configs(d: int, t, atomic: bool = False) -> tuple:
    """((dK/dV BLOCK_M, BLOCK_N, warps, stages), (dQ ...)) at head dim ``d`` on tensor ``t``'s device, the
    dK/dV kernel with (``atomic``) or without dQ atomics: the tables' or their `SMEM_NEEDS` fallbacks; the
    small interpreter tiles under TRITON_INTERPRET=1."""
    if interpreting():
        return INTERPRET_CONFIG, INTERPRET_DQ_CONFIG
    smem, d = smem_per_block(torch, t), built_dim(d, DQ_CONFIGS)
    return fitting(dkdv_config(d, atomic), SMEM_NEEDS, smem), fitting(DQ_CONFIGS[d], SMEM_NEEDS, smem)


@triton.jit
def _mm(a, b, acc, EMULATE_BF16: tl.constexpr):
    """acc + a @ b; under the interpreter with bf16 the product is taken in fp32 (see _tl.py)."""
    if EMULATE_BF16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _lowp(x, dtype, EMULATE_BF16: tl.constexpr):
    """fp32 -> the input dtype for the next tensor-core matmul (rounded as the GPU would)."""
    if EMULATE_BF16:
        return round_bf16(x)
    return x.to(dtype)


@triton.jit
def _out(x, dtype, EMULATE_BF16: tl.constexpr):
    """fp32 -> a gradient in the input dtype, rounded to nearest even (the interpreter's cast truncates)."""
    return _lowp(x, dtype, EMULATE_BF16).to(dtype)


#: An unbounded window side as the kernels take it (`varlen.mod_args`; `_common.UNBOUNDED_SIDE`): larger than
#: any offset, so the bound formulas need no branch, and a side may be negative (a band off the diagonal).
WINDOW_UNBOUNDED = UNBOUNDED_SIDE


@triton.jit
def window_keep(rows, cols, NQ, NK, left, right):
    """Visibility of key ``cols`` to query ``rows`` under the signed bounds ``(left, right)``
    (`WINDOW_UNBOUNDED` for an open side), bottom-right aligned: ``r + (Nk - Nq) - left <= c <=
    r + (Nk - Nq) + right``."""
    diag = rows + (NK - NQ)
    return (cols >= diag - left) & (cols <= diag + right)


@triton.jit
def _q_bounds(start_n, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Query rows of KV tile ``start_n`` (0-based element offset): ``[0, lo)`` skipped, ``[lo, hi)``
    masked, ``[hi, Nq)`` unmasked; lo, hi multiples of BLOCK_M (hi may pass Nq). The mirror of
    `_kv_bounds`: row r sees column c iff ``r >= c - (Nk - Nq)``. The ragged last KV tile is always
    masked (its columns past Nk need a bounds check)."""
    if CAUSAL:
        first = start_n - (NK - NQ)  # first row seeing the tile's first column
        if first < 0:
            first = 0
        lo = (first // BLOCK_M) * BLOCK_M
        c_last = start_n + BLOCK_N - 1
        if c_last > NK - 1:
            c_last = NK - 1
        full = c_last - (NK - NQ)  # first row seeing the tile's last column
        if full < 0:
            full = 0
        hi = tl.cdiv(full, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        hi = 0
    if start_n + BLOCK_N > NK:
        hi = tl.cdiv(NQ, BLOCK_M) * BLOCK_M
    if hi < lo:
        hi = lo
    return lo, hi


@triton.jit
def _q_bounds_window(start_n, NQ, NK, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query rows of KV tile ``start_n`` under a window (``LEFT``, ``RIGHT`` from `_tl.window_args`):
    ``(lo, full_lo, full_hi, hi)``, ``[lo, full_lo)`` and ``[full_hi, hi)`` masked, ``[full_lo, full_hi)``
    unmasked, the rest skipped: `_tl._window_bounds` with rows and keys swapped (row r sees column c iff
    ``c - off - RIGHT <= r <= c - off + LEFT``), all four multiples of BLOCK_M. The ragged last KV tile is
    always masked."""
    lo, full_lo, full_hi, hi = _window_bounds(start_n, NK, NQ, BLOCK_N, BLOCK_M, RIGHT, LEFT)
    hi_m = tl.cdiv(hi, BLOCK_M) * BLOCK_M  # multiples of BLOCK_M (rows past Nq load LSE = +inf: P = 0)
    ragged = start_n + BLOCK_N > NK  # its columns past Nk need the bounds check
    full_lo = tl.where(ragged | (full_lo == hi), hi_m, full_lo)
    full_hi = tl.where(ragged | (full_hi == hi), hi_m, full_hi)
    return lo, full_lo, full_hi, hi_m


@triton.jit
def _attnscope_bwd_preprocess(O, DO, LSE, DLSE, DELTA, LSE2, ROW0, ROW1, stride_ob, stride_oh, stride_om,
                              stride_db, stride_dh, stride_dm, H, NQ, N_PAD, row0_mul, row0_add, row1_mul,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr,
                              PADDED: tl.constexpr, D: tl.constexpr = 0):
    """Every per-row term of the backward in one pass, program (query tile, batch x head): ``DELTA = rowsum(dO
    * O) - dLSE`` and ``LSE2 = LSE log2(e)`` (LSE, dLSE, DELTA, LSE2 contiguous fp32 [B x H, NQ]); with
    ``PADDED`` also the Hopper kernels' rows padded to ``N_PAD`` ([B x H, N_PAD]): ``ROW0 = row0_mul LSE2 +
    row0_add`` (-inf past NQ) and ``ROW1 = row1_mul DELTA`` (0 past NQ), `bwd_hopper.launcher`'s terms."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64 offsets: a tensor may hold 2^31 elements or more
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < NQ
    row = ok[:, None] if D == 0 or D == HEAD_DIM else ok[:, None] & (offs_d[None, :] < D)  # D: `_dkdv_tile`
    offs_m = offs_m.to(tl.int64)  # varlen: a row of the packed [total, H, d] is H * d elements apart
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], mask=row,
                other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :], mask=row,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # D = rowsum(dO * O)  [BLOCK_M]
    stat = pid_bh.to(tl.int64) * NQ + offs_m
    if HAS_DLSE:  # d LSE / d S = P: dS = P * (dP - (D - dLSE))
        delta -= tl.load(DLSE + stat, mask=ok, other=0.0)
    lse2 = tl.load(LSE + stat, mask=ok, other=0.0) * _LOG2E
    tl.store(DELTA + stat, delta, mask=ok)
    tl.store(LSE2 + stat, lse2, mask=ok)
    if PADDED:
        padded = pid_bh.to(tl.int64) * N_PAD + offs_m
        inside = offs_m < N_PAD
        tl.store(ROW0 + padded, tl.where(ok, lse2 * row0_mul + row0_add, float("-inf")), mask=inside)
        tl.store(ROW1 + padded, tl.where(ok, delta * row1_mul, 0.0), mask=inside)


@triton.jit
def _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
               stride_qm, stride_dom, start_m, start_n, qk_scale, sm_scale, NQ, NK, LEFT, RIGHT, cap_in,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ATOMIC_DQ: tl.constexpr,
               EMULATE_BF16: tl.constexpr, D: tl.constexpr = 0):
    """One query tile against the resident KV tile; everything transposed ([BLOCK_N, BLOCK_M]); ``D``: a head
    dim below its power-of-two tile ``HEAD_DIM`` (0: ``HEAD_DIM`` itself), the columns past it masked.
    ``SOFTCAP``: P from the capped scores ``t = tanh(s * cap_in)`` (``qk_scale = softcap * log2(e)``), and
    ``dS`` through the cap: ``dS_raw = dS' * (1 - t^2)`` (the scale is applied at the end)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < NQ
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D
    m_t = row_ok[None, :] if DIM == HEAD_DIM else row_ok[None, :] & (offs_d[:, None] < DIM)  # [d, BLOCK_M]
    m_r = row_ok[:, None] if DIM == HEAD_DIM else row_ok[:, None] & (offs_d[None, :] < DIM)  # [BLOCK_M, d]
    q_t = tl.load(Q + q_base + offs_m[None, :] * stride_qm + offs_d[:, None], mask=m_t, other=0.0)  # Q^T
    do = tl.load(DO + do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=m_r, other=0.0)
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=row_ok, other=float("inf"))  # log2 domain; +inf: P = 0
    delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
    s_t = _mm(k, q_t, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), EMULATE_BF16)  # S^T = K Q^T
    if SOFTCAP:
        s_t = tanh_(s_t * cap_in)  # t^T; s' = softcap * t
    if MASKED:
        keep = (offs_n[:, None] < NK) & (lse2[None, :] > float("-inf"))
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :] + (NK - NQ))
        if WINDOW:
            keep = keep & window_keep(offs_m[None, :], offs_n[:, None], NQ, NK, LEFT, RIGHT)
        p_t = tl.where(keep, tl.math.exp2(s_t * qk_scale - lse2[None, :]), 0.0)
    else:
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])  # P^T [BLOCK_N, BLOCK_M]
    dv = _mm(_lowp(p_t, do.dtype, EMULATE_BF16), do, dv, EMULATE_BF16)  # dV += P^T dO
    dp_t = _mm(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), EMULATE_BF16)  # dP^T = V dO^T
    ds_t = p_t * (dp_t - delta[None, :])  # dS^T = P^T * (dP^T - D)
    if SOFTCAP:
        ds_t = ds_t * (1.0 - s_t * s_t)
    ds_lp = _lowp(ds_t, do.dtype, EMULATE_BF16)
    dk = _mm(ds_lp, tl.trans(q_t), dk, EMULATE_BF16)  # dK += dS^T Q  (scaled at the end)
    if ATOMIC_DQ:
        dq = _mm(tl.trans(ds_lp), k, tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), EMULATE_BF16) * sm_scale
        tl.atomic_add(DQ + dq_base + offs_m[:, None] * DIM + offs_d[None, :], dq, mask=m_r, sem="relaxed")
    return dk, dv


@triton.jit
def _attnscope_bwd_dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV, DQ,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    H, HKV, NQ, NK, qk_scale, sm_scale, LEFT, RIGHT, cap_in,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EMULATE_BF16: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, OFF64: tl.constexpr = False, D: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HKV
    if OFF64:  # int64 bases and offsets: a tensor of 2^31 elements or more (`_off64`)
        b = b.to(tl.int64)
    hk = pid_bh % HKV
    group = H // HKV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D  # the head dim (HEAD_DIM: its power-of-two tile)
    col_ok = offs_n[:, None] < NK
    if DIM != HEAD_DIM:
        col_ok = col_ok & (offs_d[None, :] < DIM)
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=col_ok, other=0.0)  # [BLOCK_N, d], resident
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=col_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    if WINDOW:  # query rows [full_lo, full_hi) whole, then [lo, full_lo) and [full_hi, hi) masked in one
        # loop (two tile bodies, as without a window); the rest skipped
        lo, full_lo, full_hi, hi = _q_bounds_window(start_n, NQ, NK, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        n_left = full_lo - lo
        for g in range(0, group):
            h = hk * group + g
            q_base = b * stride_qb + h * stride_qh
            do_base = b * stride_dob + h * stride_doh
            row_base = (b * H + h) * NQ
            dq_base = row_base * DIM
            for start_m in range(full_lo, full_hi, BLOCK_M):
                dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                    stride_qm, stride_dom, start_m, start_n, qk_scale, sm_scale, NQ, NK,
                                    LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_M, BLOCK_N, False, False, True,
                                    SOFTCAP, ATOMIC_DQ, EMULATE_BF16, DIM)
            for i in range(0, n_left + (hi - full_hi), BLOCK_M):
                start_m = tl.where(i < n_left, lo + i, full_hi + (i - n_left))
                dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                    stride_qm, stride_dom, start_m, start_n, qk_scale, sm_scale, NQ, NK,
                                    LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_M, BLOCK_N, True, False, True,
                                    SOFTCAP, ATOMIC_DQ, EMULATE_BF16, DIM)
    else:
        lo, hi = _q_bounds(start_n, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        n_hi = tl.cdiv(NQ, BLOCK_M) * BLOCK_M
        for g in range(0, group):  # GQA: the group's query heads, reduced in registers
            h = hk * group + g
            q_base = b * stride_qb + h * stride_qh
            do_base = b * stride_dob + h * stride_doh
            row_base = (b * H + h) * NQ
            dq_base = row_base * DIM
            for start_m in range(lo, hi, BLOCK_M):  # straddling the diagonal / ragged: masked
                dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                    stride_qm, stride_dom, start_m, start_n, qk_scale, sm_scale, NQ, NK,
                                    LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, False,
                                    SOFTCAP, ATOMIC_DQ, EMULATE_BF16, DIM)
            for start_m in range(hi, n_hi, BLOCK_M):  # every row sees the whole tile: no mask arithmetic
                dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE2, DELTA, DQ, q_base, do_base, dq_base, row_base,
                                    stride_qm, stride_dom, start_m, start_n, qk_scale, sm_scale, NQ, NK,
                                    LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, False,
                                    SOFTCAP, ATOMIC_DQ, EMULATE_BF16, DIM)
    out = (b * HKV + hk) * NK * DIM + offs_n[:, None] * DIM + offs_d[None, :]
    tl.store(DK + out, _out(dk * sm_scale, DK.dtype.element_ty, EMULATE_BF16), mask=col_ok)
    tl.store(DV + out, _out(dv, DV.dtype.element_ty, EMULATE_BF16), mask=col_ok)


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, start_n,
             qk_scale, NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
             MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
             EMULATE_BF16: tl.constexpr, D: tl.constexpr = 0):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < NK
    kv_ok = col_ok[None, :] if D == 0 or D == HEAD_DIM else col_ok[None, :] & (offs_d[:, None] < D)
    k_t = tl.load(K + k_base + offs_n[None, :] * stride_kn + offs_d[:, None], mask=kv_ok, other=0.0)
    v_t = tl.load(V + v_base + offs_n[None, :] * stride_vn + offs_d[:, None], mask=kv_ok, other=0.0)
    s = _mm(q, k_t, tl.zeros([q.shape[0], BLOCK_N], tl.float32), EMULATE_BF16)  # [BLOCK_M, BLOCK_N]
    if SOFTCAP:
        s = tanh_(s * cap_in)  # t; s' = softcap * t
    if MASKED:
        keep = col_ok[None, :] & (lse2[:, None] > float("-inf"))
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))
        if WINDOW:
            keep = keep & window_keep(offs_m[:, None], offs_n[None, :], NQ, NK, LEFT, RIGHT)
        p = tl.where(keep, tl.math.exp2(s * qk_scale - lse2[:, None]), 0.0)
    else:
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
    dp = _mm(do, v_t, tl.zeros([q.shape[0], BLOCK_N], tl.float32), EMULATE_BF16)  # dP = dO V^T
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - s * s)
    dq = _mm(_lowp(ds, q.dtype, EMULATE_BF16), tl.trans(k_t), dq, EMULATE_BF16)  # dQ += dS K
    return dq


@triton.jit
def _attnscope_bwd_dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    H, HKV, NQ, NK, qk_scale, sm_scale, LEFT, RIGHT, cap_in,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EMULATE_BF16: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, OFF64: tl.constexpr = False, D: tl.constexpr = 0,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    start_m = pid_m
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - pid_m  # heaviest query tiles first
    b = pid_bh // H
    if OFF64:  # int64 bases and offsets: a tensor of 2^31 elements or more (`_off64`)
        b = b.to(tl.int64)
    h = pid_bh % H
    hk = h // (H // HKV)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    DIM: tl.constexpr = HEAD_DIM if D == 0 else D  # the head dim (HEAD_DIM: its power-of-two tile)
    row_ok = offs_m < NQ
    rows = row_ok[:, None] if DIM == HEAD_DIM else row_ok[:, None] & (offs_d[None, :] < DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                 mask=rows, other=0.0)
    lse2 = tl.load(LSE2 + pid_bh * NQ + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * NQ + offs_m, mask=row_ok, other=0.0)
    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if WINDOW:  # the forward's bounds and loops: whole tiles, then both edges' masked tiles in one loop
        lo, full_lo, full_hi, hi = _kv_bounds_window(start_m, NQ, NK, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, start_n,
                          qk_scale, NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, False, False, True,
                          SOFTCAP, EMULATE_BF16, DIM)
        n_left = full_lo - lo
        for i in range(0, n_left + (hi - full_hi), BLOCK_N):
            start_n = tl.where(i < n_left, lo + i, full_hi + (i - n_left))
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, start_n,
                          qk_scale, NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, True, False, True,
                          SOFTCAP, EMULATE_BF16, DIM)
    else:
        lo, hi = _kv_bounds(start_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)
        for start_n in range(0, lo, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, start_n,
                          qk_scale, NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, False, CAUSAL, False,
                          SOFTCAP, EMULATE_BF16, DIM)
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, k_base, v_base, stride_kn, stride_vn, offs_m, start_n,
                          qk_scale, NQ, NK, LEFT, RIGHT, cap_in, HEAD_DIM, BLOCK_N, True, CAUSAL, False,
                          SOFTCAP, EMULATE_BF16, DIM)
    tl.store(DQ + pid_bh * NQ * DIM + offs_m[:, None] * DIM + offs_d[None, :],
             _out(dq * sm_scale, DQ.dtype.element_ty, EMULATE_BF16), mask=rows)


# --- the launcher ---------------------------------------------------------------------------------
def _check_inputs(do, q, k, v, o, lse, scale):
    for name, t, layout in (("do", do, "[B, Hq, Nq, d]"), ("q", q, "[B, Hq, Nq, d]"),
                            ("k", k, "[B, Hkv, Nk, d]"), ("v", v, "[B, Hkv, Nk, d]"),
                            ("o", o, "[B, Hq, Nq, d]")):
        check_tensor(torch, name, t, 4, layout)
    if not isinstance(lse, torch.Tensor):
        raise InputError(f"lse: expected a float32 tensor [B, Hq, Nq], got {type(lse).__name__}")
    check_device({"q": q, "k": k, "v": v, "o": o, "do": do, "lse": lse})
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    check_same("k", "batch", B, k.shape[0])
    check_same("k", "head_dim", d, k.shape[3])
    check_same("v", "shape (as k)", tuple(k.shape), tuple(v.shape))
    check_same("o", "shape (as q)", tuple(q.shape), tuple(o.shape))
    check_same("do", "shape (as q)", tuple(q.shape), tuple(do.shape))
    for name, t in (("k", k), ("v", v), ("o", o), ("do", do)):
        check_same(name, "dtype (as q)", q.dtype, t.dtype)
    if tuple(lse.shape) != (B, Hq, Nq) or lse.dtype != torch.float32:
        got = f"{tuple(lse.shape)} {lse.dtype}"
        raise InputError(f"lse: expected a float32 tensor [B, Hq, Nq] = {(B, Hq, Nq)}, got {got}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q: expected Hq a multiple of the kv heads ({Hkv}), got Hq = {Hq}")
    if min(B, Hq, Nq, Nk) == 0:
        raise InputError(f"q: expected B, Hq, Nq, Nk >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    check_head_dim(d, padded=True)
    check_scale(scale)
    return B, Hq, Nq, d, Hkv, Nk


IMPLS = ("auto", "portable", "hopper")


#: The range of ``scale * log2(e)`` the Hopper kernels take: they subtract ``LSE2 / qk_scale`` inside the
#: accumulator (kernels/bwd_hopper.py), which must stay finite, and need ``qk_scale <= 1`` as the forward.
HOPPER_QK_SCALE = (1e-30, 1.0)


def _off64(*tensors) -> bool:
    """Whether the dK/dV and dQ kernels need int64 offsets (their int64 build holds more registers): a tensor
    whose elements span 2^31 or more from its first (a view's span, not its numel: a packed qkv's q)."""
    span = max(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True)) for t in tensors)
    return span >= 2 ** 31 - 1


def _pick_impl(impl, q, causal: bool, mods, qk_scale: float = LOG2E / 8) -> str:
    """"portable" or "hopper": the kernels of `flash_attention_backward` (``impl`` as there). The
    Hopper kernels run on sm_90 with every score mod (softcap up to `_common.HOPPER_MAX_SOFTCAP` x
    scale: their tanh is ``tanh.approx.f32`` too); ``impl="auto"`` takes them only where
    `model.dispatch.hopper_backward_ok` allows."""
    choice("impl", impl, IMPLS)
    if impl == "portable":
        return "portable"
    why = hopper_unavailable(torch, q)
    d = q.shape[-1]
    if why is None and head_block(d) not in dispatch.HOPPER_BACKWARD_DIMS:
        why = f"head_dim {d} is not supported; supported: 40-128 in steps of 8"
    huge_cap = mods.softcap > HOPPER_MAX_SOFTCAP * (qk_scale / LOG2E)
    if impl == "hopper":
        if why:
            raise NotImplementedError(f"impl='hopper': {why}; supported elsewhere: impl='portable'")
        if huge_cap:
            raise NotImplementedError("impl='hopper': softcap / scale > 2^60 is not supported; supported: "
                                      "impl='portable' (any softcap)")
        if not HOPPER_QK_SCALE[0] <= qk_scale <= HOPPER_QK_SCALE[1]:
            raise NotImplementedError(f"impl='hopper': scale * log2(e) = {qk_scale:.3g} is not supported; "
                                      f"supported: {HOPPER_QK_SCALE[0]:g} to {HOPPER_QK_SCALE[1]:g} "
                                      "(impl='portable': any finite scale)")
        return "hopper"
    ok = (why is None and HOPPER_QK_SCALE[0] <= qk_scale <= HOPPER_QK_SCALE[1] and not huge_cap
          and dispatch.hopper_backward_ok(d, causal))
    return "hopper" if ok else "portable"


#: The dQ mode of ``deterministic=False`` (`attnscope.flash_attention`'s default): fp32 atomics inside the
#: dK/dV kernel when True; False: the separate dQ pass, measured faster at nearly every shape (BENCHMARKS.md,
#: backward), which is also bit-reproducible.
ATOMIC_DQ_BY_DEFAULT = False
#: The head dims at which the Hopper kernels run ``deterministic=False`` (`attnscope.flash_attention`'s
#: default) as their one-pass dK/dV kernel (dQ by fp32 atomics: 5 MMAs per tile pair, not 7); elsewhere
#: the dK/dV then dQ kernels (bitwise reproducible). Measured on the H200 (BENCHMARKS.md, backward): at
#: d = 64 the one-pass build is 1.03-1.08 x the two kernels; at d = 128 it is 0.78-0.90 x (by `head_block`).
HOPPER_ONEPASS_DIMS = (64,)
#: The one-pass build ``deterministic=False`` runs (kernels/bwd_hopper.py ``MODES``)
HOPPER_ONEPASS_MODE = "onepass"


def atomic_dq_by_default(q, causal: bool, scale, window=None, softcap: float = 0.0) -> bool:
    """Whether autograd's ``deterministic=False`` runs dQ by atomics for this call: the head dim in
    `HOPPER_ONEPASS_DIMS` where ``impl="auto"`` picks the Hopper kernels (`_pick_impl`), else
    `ATOMIC_DQ_BY_DEFAULT`."""
    onepass = head_block(q.shape[-1]) in HOPPER_ONEPASS_DIMS
    if onepass == ATOMIC_DQ_BY_DEFAULT:
        return ATOMIC_DQ_BY_DEFAULT
    window = None if window is None else tuple(window)
    mods = check_mods(torch, causal, window, softcap, None, q.shape[1], q.device)
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    hopper = _pick_impl("auto", q, bool(causal), mods, sm_scale * LOG2E) == "hopper"
    return onepass if hopper else ATOMIC_DQ_BY_DEFAULT


@on_tensor_device(torch)
def flash_attention_backward(do, q, k, v, o, lse, causal: bool, scale: float | None,
                             deterministic: bool = True, dlse=None, *, window=None, softcap: float = 0.0,
                             sinks=None, impl: str = "auto"):
    """FlashAttention-2 backward: the gradients of ``o = attention(q, k, v)``.

    Parameters
    ----------
    do : torch.Tensor, [B, Hq, Nq, d]
        Gradient of the output; q's dtype, any strides with a unit last stride.
    q : torch.Tensor, [B, Hq, Nq, d]
    k, v : torch.Tensor, [B, Hkv, Nk, d]
    o : torch.Tensor, [B, Hq, Nq, d]
        The forward's output.
    lse : torch.Tensor, [B, Hq, Nq], float32
        The forward's natural-log logsumexp (``return_lse=True``); -inf for rows with no visible key.
    causal : bool
        Bottom-right causal mask, as the forward.
    scale : float or None
        Softmax scale; None means ``1/sqrt(d)``.
    deterministic : bool, default True
        False: dQ accumulated with fp32 atomics inside the dK/dV kernel (one pass; the Hopper kernels at the
        head dims of `HOPPER_ONEPASS_DIMS` by their one-pass build, 5 MMAs per tile pair instead of 7, at
        the others by the separate pass). True: dQ in a separate pass over the KV tiles (bit-reproducible,
        re-reads K and V). The Hopper kernels run their lean build in either mode where
        `model.dispatch.hopper_backward_lean` says so (`bwd_hopper.config`).
    dlse : torch.Tensor, [B, Hq, Nq], optional
        Gradient of the returned LSE (``dS += P * dLSE``, folded into D), e.g. for a ring merge.
    window, softcap, sinks
        The forward's score mods (`attnscope.flash_attention`); KV tiles outside the window are skipped
        in both passes, softcap's tanh is recomputed from the recomputed scores.
    impl : {"auto", "portable", "hopper"}
        The kernels: ``"portable"`` this module's; ``"hopper"`` the Gluon sm_90 dK/dV and dQ kernels of
        kernels/bwd_hopper.py (needs an sm_90 GPU; every score mod; with ``deterministic=True`` its
        gradients are bitwise reproducible: dK, dV are summed in registers and dQ in its own pass);
        ``"auto"``: hopper where `attnscope.model.dispatch.hopper_backward_ok` says so, else portable.

    Returns
    -------
    dq : [B, Hq, Nq, d]; dk, dv : [B, Hkv, Nk, d] (summed over each kv head's group of query heads),
    q's dtype, contiguous.
    dsinks : [Hq], float32 — only with ``sinks``: ``-sum over (batch, rows) exp(sinks[h] - LSE) (D - dLSE)``.

    Example
    -------
    >>> o, lse = attnscope.flash_attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = flash_attention_backward(torch.randn_like(o), q, k, v, o, lse, True, None)
    """
    return bwd_plan.run(_plan, do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap,
                        sinks, impl)


def _plan(do, q, k, v, o, lse, causal, scale, deterministic, dlse, window, softcap, sinks, impl):
    """Check the call (every documented error) and plan its launches: ``run(do, q, k, v, o, lse, dlse,
    sinks) -> gradients``."""
    B, Hq, Nq, d, Hkv, Nk = _check_inputs(do, q, k, v, o, lse, scale)
    if dlse is not None and (not isinstance(dlse, torch.Tensor) or tuple(dlse.shape) != (B, Hq, Nq)
                             or dlse.device != q.device):
        got = (f"{tuple(dlse.shape)} on {dlse.device}" if isinstance(dlse, torch.Tensor)
               else type(dlse).__name__)
        raise InputError(f"dlse: expected None or a tensor [B, Hq, Nq] = {(B, Hq, Nq)} on {q.device}, "
                         f"got {got}")
    mods = check_mods(torch, causal, window, softcap, sinks, Hq, q.device)._replace(sinks=None)
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    hopper = _pick_impl(impl, q, bool(causal), mods, sm_scale * LOG2E) == "hopper"
    if B * Hq > MAX_GRID_Y:  # every backward kernel's grid puts (batch, head) on the y axis
        raise NotImplementedError(f"q: B x Hq = {B} x {Hq} = {B * Hq} (batch, head) programs is past the "
                                  f"launch grid for the backward; supported: B x Hq <= {MAX_GRID_Y}")
    margs = mod_args(mods, sm_scale, Nq, Nk)
    causal = bool(causal) and not mods.windowed  # a window folds causal in as right = 0
    emulate = interpreting() and q.dtype == torch.bfloat16
    dev = q.device
    kernels = None
    if hopper:  # the Gluon dK/dV kernel then the Gluon dQ kernel, or the one-pass dK/dV kernel (atomic dQ)
        from attnscope.kernels import bwd_hopper  # Gluon: imported only when used

        onepass = (not deterministic and head_block(d) in HOPPER_ONEPASS_DIMS
                   and bwd_hopper.onepass_ok(d, mods))
        kernels = bwd_hopper.launcher(q, k, v, do, margs["qk_scale"], sm_scale, causal, mods,
                                      mode=HOPPER_ONEPASS_MODE if onepass else "twokernel")
    # the preprocess writes Delta and LSE2, and the Hopper kernels' padded rows (`bwd_hopper.padded_rows`)
    n_pad, *row_terms = kernels.row_terms if hopper else (Nq, 1.0, 0.0, 1.0)
    pre_m = 16 if interpreting() else PRE_BLOCK_M
    pre = planned_launch(_attnscope_bwd_preprocess, (cdiv(n_pad, pre_m), B * Hq),
                         dict(HEAD_DIM=head_block(d), BLOCK_M=pre_m, HAS_DLSE=dlse is not None, PADDED=hopper,
                              D=d), dev)
    pre_scalars = (o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2), Hq, Nq,
                   n_pad, *row_terms)
    contiguous = lse.is_contiguous() and (dlse is None or dlse.is_contiguous() and dlse.dtype == lse.dtype)
    grad_shapes = ((B, Hkv, Nk, d), (B, Hkv, Nk, d), (B, Hq, Nq, d))
    dtype = q.dtype  # the closures below name no tensor of this call: a kept plan must not keep it alive

    def preprocess(do, o, lse, dlse, sinks):
        """(dk, dv, dq outputs, D = rowsum(dO O) - dLSE, LSE x log2(e), the Hopper kernels' two padded rows
        (() for the portable ones), dsinks or None)."""
        dk, dv, dq = (torch.empty(s, dtype=dtype, device=dev) for s in grad_shapes)
        delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=dev)
        lse2 = torch.empty((B, Hq, Nq), dtype=torch.float32, device=dev)
        rows = [torch.empty((B, Hq, n_pad), dtype=torch.float32, device=dev) for _ in "01"] if hopper else ()
        if not contiguous:
            lse = lse.contiguous()
            dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
        dl = lse if dlse is None else dlse  # unread without dLSE
        pre((o, do, lse, dl, delta, lse2, *(rows or (delta, delta)), *pre_scalars),  # rows: unread if ()
            (o.data_ptr() | do.data_ptr() | lse.data_ptr() | dl.data_ptr()) % 16 == 0)
        dsinks = None
        if sinks is not None:  # dLSE/dsink = exp(sink - LSE); dO . dO/dsink = -exp(sink - LSE) D
            w = sink_weight(torch, sinks.view(1, Hq, 1), lse)
            dsinks = -(torch.where(torch.isneginf(lse), 0.0, w) * delta).sum((0, 2))
        return dk, dv, dq, delta, lse2, rows, dsinks

    if hopper:
        def run_hopper(do, q, k, v, o, lse, dlse, sinks):
            dk, dv, dq, delta, lse2, rows, dsinks = preprocess(do, o, lse, dlse, sinks)
            kernels(q, k, v, do, lse2, delta, rows, dq, dk, dv)
            return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)
        return run_hopper

    atomic = not deterministic
    (bm, bn, warps, stages), (dq_bm, dq_bn, dq_warps, dq_stages) = configs(head_block(d), q, atomic)
    off64 = _off64(q, k, v, do)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    scalars = (*strides, Hq, Hkv, Nq, Nk, margs["qk_scale"], sm_scale, margs["LEFT"], margs["RIGHT"],
               margs["cap_in"])
    consts = dict(HEAD_DIM=head_block(d), CAUSAL=causal, EMULATE_BF16=emulate, WINDOW=margs["WINDOW"],
                  SOFTCAP=margs["SOFTCAP"], OFF64=off64, D=d)
    dkdv = planned_launch(_attnscope_bwd_dkdv_kernel, (cdiv(Nk, bn), B * Hkv),
                          dict(consts, ATOMIC_DQ=atomic, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                               num_stages=stages), dev)
    dq_pass = planned_launch(_attnscope_bwd_dq_kernel, (cdiv(Nq, dq_bm), B * Hq),
                             dict(consts, BLOCK_M=dq_bm, BLOCK_N=dq_bn, num_warps=dq_warps,
                                  num_stages=dq_stages), dev)

    def run_portable(do, q, k, v, o, lse, dlse, sinks):
        dk, dv, dq, delta, lse2, _, dsinks = preprocess(do, o, lse, dlse, sinks)
        aligned = (q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr() | delta.data_ptr()) % 16 == 0
        dq_acc = torch.zeros((B, Hq, Nq, d), dtype=torch.float32, device=dev) if atomic else dk  # dk: unused
        dkdv((q, k, v, do, lse2, delta, dk, dv, dq_acc, *scalars), aligned)
        if atomic:
            dq = dq_acc.to(q.dtype)
        else:
            dq_pass((q, k, v, do, lse2, delta, dq, *scalars), aligned)
        return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)
    return run_portable
