"""FlashAttention backward for Hopper (sm_90) in Gluon: a dK/dV kernel and a dQ kernel, FA-3's structure.

Algorithm: the backward of FlashAttention-2 (Dao, arXiv:2307.08691, Algorithm 2) with FlashAttention-3's
machinery (Shah et al., arXiv:2407.08608: TMA, asynchronous `warpgroup_mma`, `gl.warp_specialize` into a
1-warp TMA producer (``PRODUCER_REGS``) and NWG = 2 consumer warpgroups (``CONSUMER_REGS``), mbarrier rings).
P is recomputed from the forward's LSE (no running max); LSE2 = LSE log2 e, Delta = rowsum(dO O)
(kernels/bwd.py's preprocess, minus dLSE) and the mask enter as the accumulators' initial values:
``S - LSE2 / qk_scale`` (-inf where masked or past Nq, so P = exp2(S qk_scale) = 0 there) and
``dP - Delta``, so masked and unmasked tiles run one loop body, no extra registers across the MMAs.

- dK/dV (`_attnscope_bwd_hopper_dkdv_kernel`): a CTA owns BN = 128 keys of one (batch, kv head), warpgroup w
  keys ``[w BN/2, (w+1) BN/2)``; K, V loaded once, then (Q, dO, -LSE2 / qk_scale, Delta) tiles of every
  query head of the GQA group through a ``STAGES``-deep ring (``q_ready`` / ``q_empty``; the rows from
  copies padded to `ROW_PAD`). Per query tile, transposed: S^T = K Q^T and
  dP^T = V dO^T issued together; P^T once S^T is done and dV += P^T dO under the dP^T product; then
  dS^T = P^T (dP^T - Delta) and dK += dS^T Q (P^T, dS^T the register A operands in the input dtype). dK, dV
  are summed over the group in registers and leave by TMA through the dead K/V buffers.
- dQ (kernels/bwd_hopper_dq.py, `_attnscope_bwd_hopper_dq_kernel`): the forward's schedule
  (`fwd_hopper._producer` streams the K/V ring): a CTA owns NWG x 64 query rows of one (batch, head); per
  K/V tile S = Q K^T, dP = dO V^T, dQ += dS K; dQ leaves by TMA through the dead Q buffer.
Those two (mode "twokernel", ``deterministic=True``) use no atomics: bitwise reproducible run to run. One-pass
(``deterministic=False``; FA-3's dQ): the dK/dV kernel alone, built with ``ONEPASS``, also stores dS^T to
shared memory and adds ``sm_scale dS K`` into a zeroed fp32 dQ [B, Hq, Nq, d] by fp32 atomics (5 MMAs per tile
pair instead of 7), cast to the input dtype after: "onepass" (`ONEPASS_CTA`) over the CTA's keys once per
query tile (the warpgroups meet at an mbarrier; d = 128 a 64-column slice each, d = 64 the whole tile by one
warpgroup in turns), "onepass-wg" (`ONEPASS_WG`) per warpgroup over its own keys (twice the atomics);
``BwdConfig.RED = 0``: each slice through shared memory by one TMA reduce-add, no per-element atomics.
The lean dK/dV build (``BwdConfig.LEAN``, `LEAN_CONFIGS`; either mode; the default where
`model.dispatch.hopper_backward_lean` says so, `config`: d = 64 without softcap, fp16 with a scale >= 2^-4)
cuts the work per tile pair that is not MMA: masked and whole query tiles in separate runs (the mask a
constant), S^T from nothing and dP^T from -Delta issued back to back, P^T = exp2(S^T qk_scale +
log2(scale) - LSE2) by one FFMA (so P^T, dS^T carry the scale: dK and dQ need no product, dV / scale
once), dQ into rows padded to `ROW_PAD` by unmasked reductions.

Causal, bottom-right (key c visible to row r iff ``c <= r + Nk - Nq``): the dK/dV kernel skips query tiles
wholly above its keys' diagonal (`_q_range`), the dQ kernel K/V tiles past its rows' (`fwd_hopper._kv_range`);
only tiles straddling the diagonal and the ragged last tiles are masked. Both kernels start their heaviest
tiles first (the dK/dV kernel's first keys, the dQ kernel's last rows) and interleave the last heads rank by
rank (`model.tiles.launch_tail`, `_tl.cta_tile`): in the grid's order the last head's heaviest tile
started when little work was left. Ragged N: TMA reads
zeros past Nq / Nk and clips the stores; rows with no visible key (LSE = -inf) give 0. Score mods (constexpr
``MODS``, `fwd_hopper.mods_flags`; 0 is the plain build): a window visits only the tiles it reaches (the
forward's `fwd_hopper._window` bounds; for the dK/dV kernel with rows and keys swapped), masked only on its
edge tiles; softcap recomputes ``t = tanh(S scale / cap)`` (`fwd_hopper._tanh`) from the raw S (the mask still
its initial value), ``P = exp2(cap log2(e) t - LSE2)``, ``dS = P (dP - Delta) (1 - t^2)`` (`_capped`; dK/dV at
d = 128 on 32-row Q tiles, `SOFTCAP_CONFIGS`); sinks need nothing here (the LSE includes them; their gradient
is torch on D and LSE). Layout: 4-D TMA descriptors ``[B, H, N, d]`` over the caller's strides; dQ, dK, dV
contiguous.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from attnscope.errors import choice
from attnscope.kernels._common import descriptor_over, import_torch_triton, num_sms
from attnscope.kernels._direct import planned_launch
from attnscope.model import dispatch
from attnscope.model.tiles import head_block, launch_tail

torch, triton = import_torch_triton()
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from attnscope.kernels._gluon_red import red_add, tma_reduce_add  # noqa: E402
from attnscope.kernels._gluon_smem import dkdv_smem  # noqa: E402
from attnscope.kernels._tl import cta_tile  # noqa: E402
from attnscope.kernels.bwd_hopper_dq import _attnscope_bwd_hopper_dq_kernel, _capped, _keep  # noqa: E402
from attnscope.kernels.fwd_hopper import (  # noqa: E402
    NUM_WARPS,
    PRODUCER_REGS,
    SOFTCAP,
    WINDOW,
    _window,
    desc_type,
    descriptor,
    mods_flags,
    wgmma_layout,
)

#: setmaxnreg of the consumer warpgroup that is a worker partition (the other is the default partition)
CONSUMER_REGS = 240
#: launch's ``mode`` -> the dK/dV kernel's ``ONEPASS`` (the module docstring): 0 dK, dV only
ONEPASS_WG, ONEPASS_CTA = gl.constexpr(1), gl.constexpr(2)
MODES = {"twokernel": 0, "onepass-wg": ONEPASS_WG.value, "onepass": ONEPASS_CTA.value}


class BwdConfig(NamedTuple):
    """A block configuration: dK/dV, a CTA owns ``BN`` keys (``BN / NWG`` per warpgroup) against ``BM``-row
    query tiles; dQ, a CTA owns ``NWG x BM`` query rows against ``BN``-key K/V tiles."""

    BM: int  # query rows per Q/dO tile (dK/dV: the N of S^T = K Q^T; dQ: per warpgroup)
    BN: int  # keys per K/V tile
    STAGES: int  # depth of the shared-memory ring (dK/dV: Q/dO; dQ: K/V)
    NWG: int = 2  # consumer warpgroups
    DQ: int = 64  # one-pass dK/dV kernel: dQ columns per dS K product (head dim / DQ products per tile)
    RED: int = 1  # one-pass dQ: fp32 per `_gluon_red.red_add` (1, 2), or 0: TMA reduce-adds (`_add_dq`)
    LEAN: int = 0  # dK/dV: 1 the lean step (`_step`; no softcap), 0 the plain one


#: Per kernel and head dim. dK/dV registers per consumer thread: dK + dV (BN/NWG x d fp32 each) and S^T, dP^T
#: (BN/NWG x BM fp32 each) under the 240 of `CONSUMER_REGS`: 64-row Q tiles at both head dims (d = 64 with
#: 128-row tiles spills). dQ: dQ (BM x d) and S, dP (BM x BN each); 128-key K/V tiles. Shared memory: dK/dV
#: 2 BN d (K, V) + STAGES 2 BM d (Q, dO) elements; dQ 2 NWG BM d + STAGES 2 BN d (bench/sm90_resources.py
#: --kernel bwd prints the compiled numbers).
CONFIGS = {"dkdv": {128: BwdConfig(64, 128, 2), 64: BwdConfig(64, 128, 2)},
           "dq": {128: BwdConfig(64, 128, 2), 64: BwdConfig(64, 128, 2)}}
KERNELS = tuple(CONFIGS)
#: The lean d = 64 builds (`BwdConfig.LEAN`; dK/dV with two fp32 per dQ reduction): a call's default where
#: `model.dispatch.hopper_backward_lean` says so (`config`), both modes; `CONFIGS` elsewhere.
LEAN_CONFIGS = {"dkdv": {64: BwdConfig(64, 128, 2, RED=2, LEAN=1)}, "dq": {64: BwdConfig(64, 128, 2, LEAN=1)}}
#: The lowest scale of the lean build in fp16 (`model.dispatch.HOPPER_LEAN_MIN_FP16_SCALE`, which says why)
LEAN_MIN_FP16_SCALE = dispatch.HOPPER_LEAN_MIN_FP16_SCALE
#: Softcap builds that differ (`config`): dK/dV at d = 128 holds P^T (1 - t^2) across the dP^T product on top
#: of the plain build's registers, which spills with 64-row Q tiles; 32-row tiles halve S^T and dP^T (the
#: ring is twice as deep for the same shared memory).
SOFTCAP_CONFIGS = {"dkdv": {128: BwdConfig(32, 128, 4)}}


def config(d: int, kernel: str = "dkdv", mods: int = 0, dtype: str | None = None,
           sm_scale: float | None = None) -> BwdConfig:
    """The block configuration of ``kernel`` ("dkdv" or "dq") for head dim ``d`` and the build ``mods``
    (`fwd_hopper.mods_flags`) (NotImplementedError if not built for it). With ``dtype`` ("fp16" or "bf16")
    and ``sm_scale`` (None: ``1 / sqrt(d)``): a call's default build, `LEAN_CONFIGS`' where
    `model.dispatch.hopper_backward_lean` says so (both modes), else the plain one; without ``dtype``: the
    plain build (`CONFIGS`, `SOFTCAP_CONFIGS`), as kernels/varlen_bwd_hopper.py runs it."""
    if d not in CONFIGS[kernel]:
        raise NotImplementedError(f"Hopper backward: head_dim {d} is not supported; supported: "
                                  f"{sorted(CONFIGS[kernel])}")
    capped = bool(mods & SOFTCAP.value)
    if (dtype is not None and d in LEAN_CONFIGS[kernel]
            and dispatch.hopper_backward_lean(d, dtype, sm_scale, float(capped))):  # the flag: 1 is any cap
        return LEAN_CONFIGS[kernel][d]
    if capped and d in SOFTCAP_CONFIGS.get(kernel, {}):
        return SOFTCAP_CONFIGS[kernel][d]
    return CONFIGS[kernel][d]


def onepass_ok(d: int, mods=None) -> bool:
    """Whether the one-pass builds run for head dim ``d`` (its `head_block`'s build) and the `_common.Mods`
    ``mods``: the dQ product needs 64-row Q tiles (a warpgroup's wgmma): softcap at d = 128
    (`SOFTCAP_CONFIGS`) takes two kernels."""
    flags = 0 if mods is None else mods_flags(mods.windowed, mods.softcap, False)
    return config(head_block(d), "dkdv", flags).BM % 64 == 0


def supports(d: int) -> bool:
    """Whether the kernels are built for head dim ``d`` (every score mod: window, softcap, sinks)."""
    return all(d in c for c in CONFIGS.values())


@gluon.jit
def _q_range(start_n, NQ, NK, sc, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
             MODS: gl.constexpr):
    """Query tiles of the K/V tile of keys ``[start_n, start_n + BN)``: ``(lo, f_lo, f_hi, end)``, tiles
    ``[lo, end)`` visited (the others see none of its keys), ``[f_lo, f_hi)`` unmasked (every row sees every
    key), the rest masked. Causal or none: ``f_hi = end = cdiv(Nq, BM)``. Window (``MODS & WINDOW``):
    `fwd_hopper._window` with rows and keys swapped (row r sees key c iff ``c - off - right <= r <= c - off
    + left``, ``off = Nk - Nq``). The mirror of the forward's `fwd_hopper._kv_range`; the ragged last K/V
    tile is masked throughout."""
    n_m = gl.cdiv(NQ, BM)
    if MODS & WINDOW:
        keys = gl.minimum(NK - start_n, BN)  # the tile's keys inside Nk
        w_lo, w_flo, w_fhi, w_hi = _window(start_n, keys, NK, NQ, (sc[0], sc[2], sc[1]), BM)
        lo = w_lo // BM
        end = gl.cdiv(w_hi, BM)
        ragged = start_n + BN > NK
        f_lo = gl.where(ragged, end, gl.cdiv(w_flo, BM))  # full_lo: a tile start, or w_hi when none is full
        f_hi = gl.where(ragged, end, gl.cdiv(w_fhi, BM))  # full_hi: a tile start or Nq (P = 0 past Nq)
    else:
        lo = 0
        hi = 0
        if CAUSAL:
            lo = gl.maximum(start_n - (NK - NQ), 0) // BM  # the first row that sees the tile's first key
            last = gl.minimum(start_n + BN, NK) - 1
            hi = gl.cdiv(gl.maximum(last - (NK - NQ), 0), BM)  # from here every row sees the tile's last key
        if start_n + BN > NK:
            hi = n_m
        lo = gl.minimum(lo, n_m)
        f_lo = gl.minimum(gl.maximum(hi, lo), n_m)
        f_hi = n_m
        end = n_m
    return lo, f_lo, f_hi, end


@gluon.jit
def _producer(desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, b, hk, group, k_row, q_row, lse_row, lo, end,
              BM: gl.constexpr, BNW: gl.constexpr, STAGES: gl.constexpr, NWG: gl.constexpr):
    """K and V of the tile from row ``k_row`` once, then (Q, dO, LSE2, Delta) per query tile in the consumers'
    order: the group's heads, each query tiles ``[lo, end)`` (rows from ``q_row``; LSE2, Delta from
    ``lse_row``: 0 dense, the sequence's first rows packed, kernels/varlen_bwd_hopper.py)."""
    mbarrier.expect(kv_bar.index(0), NWG * (desc_k.block_type.nbytes + desc_v.block_type.nbytes))
    for w in gl.static_range(NWG):
        n0 = k_row + w * BNW
        tma.async_copy_global_to_shared(desc_k, [b, hk, n0, 0], kv_bar.index(0), k_smem.index(w))
        tma.async_copy_global_to_shared(desc_v, [b, hk, n0, 0], kv_bar.index(0), v_smem.index(w))
    n = end - lo  # query tiles per head
    for i in range(group * n):
        h = hk * group + i // n
        m = lo + i % n
        s = i % STAGES
        mbarrier.wait(q_empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
        mbarrier.expect(q_ready.index(s), desc_q.block_type.nbytes + desc_do.block_type.nbytes
                        + desc_lse.block_type.nbytes + desc_delta.block_type.nbytes)
        r = q_row + m * BM
        tma.async_copy_global_to_shared(desc_q, [b, h, r, 0], q_ready.index(s), q_smem.index(s))
        tma.async_copy_global_to_shared(desc_do, [b, h, r, 0], q_ready.index(s), do_smem.index(s))
        r = lse_row + m * BM
        tma.async_copy_global_to_shared(desc_lse, [b, h, r], q_ready.index(s), lse_smem.index(s))
        tma.async_copy_global_to_shared(desc_delta, [b, h, r], q_ready.index(s), delta_smem.index(s))


@gluon.jit
def _add_dq(dq_base, offs_m, offs_d, NQ, ds_smem, k_smem, slot, sm_scale, acc_layout: gl.constexpr,
            BM: gl.constexpr, BNW: gl.constexpr, DQ: gl.constexpr, D: gl.constexpr, C0: gl.constexpr,
            NC: gl.constexpr, W0: gl.constexpr, NW: gl.constexpr, RED: gl.constexpr, LEAN: gl.constexpr = 0,
            row0=0, WG: gl.constexpr = 0):
    """One-pass dQ: ``dQ[rows, cols] += sm_scale sum_w dS_w K_w[:, cols]`` over the dS^T tiles ``slot +
    [0, NW)`` of ``ds_smem`` (written and fenced) and the K buffers ``W0 + [0, NW)``, for ``NC`` slices of
    ``DQ`` columns from ``C0``, each added by fp32 reductions of ``RED`` elements (`_gluon_red.red_add`)
    into the head's fp32 dQ at ``dq_base`` [Nq, D] (rows ``offs_m``; past Nq masked); ``LEAN``: dS^T
    carries sm_scale, dQ's rows are padded to `ROW_PAD` (no mask, no product). ``RED = 0``: ``dq_base`` is
    (the fp32 dQ's tensor map [B Hq, rows, D], the head's index, the staging blocks): the slice goes through
    warpgroup ``WG``'s staging block [BM, DQ] and leaves by one TMA reduce-add at rows ``row0 +`` (TMA clips
    the rows past the map's)."""
    for c in gl.static_range(NC):
        part = gl.zeros([BM, DQ], gl.float32, acc_layout)
        for w in gl.static_range(NW):
            kcols = k_smem.index(W0 + w).reshape([BNW, D]).slice(C0 + c * DQ, DQ, dim=1)
            part = warpgroup_mma(ds_smem.index(slot + w).permute((1, 0)), kcols, part, use_acc=w > 0,
                                 is_async=LEAN)
        if LEAN:  # the NW products issued back to back, one wait
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
        if RED == 0:  # registers -> this warpgroup's staging block -> one TMA reduce-add
            stage = dq_base[2].index(WG)
            tma.store_wait(pendings=0)  # its previous reduce-add has read the block
            if LEAN:
                stage.reshape([BM, DQ]).store(part)
            else:
                stage.reshape([BM, DQ]).store(part * sm_scale)
            fence_async_shared()
            tma_reduce_add(dq_base[0], [dq_base[1], row0, C0 + c * DQ], stage)
        else:
            ptrs = dq_base + offs_m[:, None] * D + (C0 + c * DQ + offs_d[None, :])  # after the product
            if LEAN:
                red_add(ptrs, part, (offs_m == offs_m)[:, None], RED)
            else:
                red_add(ptrs, part * sm_scale, (offs_m < NQ)[:, None], RED)


@gluon.jit
def _step(dk, dv, kmat, vmat, q_smem, do_smem, lse_smem, delta_smem, q_ready, q_empty, it, m, masked, offs_n,
          NQ, NK, sc, ds_smem, ds_bar, k_smem, dq_base, sm_scale, s_layout: gl.constexpr,
          a_layout: gl.constexpr, BM: gl.constexpr, BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
          CAUSAL: gl.constexpr, MODS: gl.constexpr, ONEPASS: gl.constexpr, DQ: gl.constexpr, WG: gl.constexpr,
          NWG: gl.constexpr, RED: gl.constexpr, LEAN: gl.constexpr = 0):
    """Query tile ``m`` (ring slot counter ``it``; ``masked``: it straddles the diagonal or a window edge, or
    the keys end in the tile) against this warpgroup's keys ``offs_n``; everything transposed: [BNW keys, BM
    rows]. ``sc`` = (qk_scale, left, right, cap_in). Returns (dK, dV) accumulated (dK unscaled). ``ONEPASS``:
    dS^T also to ``ds_smem``, `_add_dq` adds ``sm_scale dS K`` to the head's fp32 dQ at ``dq_base``. One loop
    body for every tile: the mask is a select on the initial value before the MMAs are issued, so masked
    and unmasked tiles differ in no register after them. Softcap: S^T starts from 0 (the raw scores: the cap
    comes before the LSE), -inf where masked, and `_capped` makes P^T = 0 there by one select. ``LEAN``
    (``masked`` a constant): S^T from nothing, dP^T from the ring's -Delta, both issued before any wait;
    P^T = exp2(S^T qk_scale + log2(sm_scale) - LSE2) (one FFMA: the ring holds log2(sm_scale) - LSE2), so
    P^T, dS^T and dV carry sm_scale; masked tiles only: P^T = 0 where masked, by a select."""
    s = it % STAGES
    mbarrier.wait(q_ready.index(s), (it // STAGES) & 1)
    q = q_smem.index(s).reshape([BM, D])
    do = do_smem.index(s).reshape([BM, D])
    if LEAN:
        neg_lse = lse_smem.index(s).reshape([BM]).load(gl.SliceLayout(0, s_layout))  # log2(scale) - LSE2
        neg_delta = delta_smem.index(s).reshape([BM]).load(gl.SliceLayout(0, s_layout))
        zero = gl.zeros([BNW, BM], gl.float32, s_layout)
        st_tok = warpgroup_mma(kmat, q.permute((1, 0)), zero, use_acc=False, is_async=True)  # S^T = K Q^T
        dpt_tok = warpgroup_mma(vmat, do.permute((1, 0)), neg_delta[None, :].broadcast_to([BNW, BM]),
                                is_async=True)  # dP^T = V dO^T - Delta
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))
        pt = gl.exp2(st * sc[0] + neg_lse[None, :])  # sm_scale P^T [BNW, BM]
        if masked:
            offs_m = m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))
            pt = gl.where(_keep(offs_m[None, :], offs_n[:, None], NQ, NK, sc, CAUSAL, MODS), pt, 0.0)
        pt_cap = pt
    else:
        # LSE2, Delta and the mask enter as the accumulators' initial values (no registers of their own across
        # the MMAs): S^T - LSE2 / qk_scale (the ring holds -LSE2 / qk_scale, -inf past Nq; -inf where masked:
        # P = 0) and dP^T - Delta
        neg_lse = lse_smem.index(s).reshape([BM]).load(gl.SliceLayout(0, s_layout))
        if MODS & SOFTCAP:
            init = gl.zeros([BNW, BM], gl.float32, s_layout)  # the raw S^T (the cap comes before the LSE)
        else:
            init = gl.zeros([BNW, BM], gl.float32, s_layout) + neg_lse[None, :]
        if masked:  # rows with no visible key (LSE = -inf) are masked by the diagonal or the window
            offs_m = m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))  # rows: S^T's columns
            keep = _keep(offs_m[None, :], offs_n[:, None], NQ, NK, sc, CAUSAL, MODS)
            init = gl.where(keep, init, float("-inf"))
        st_tok = warpgroup_mma(kmat, q.permute((1, 0)), init, is_async=True)  # S^T = K Q^T (+ init)
        delta = delta_smem.index(s).reshape([BM]).load(gl.SliceLayout(0, s_layout))
        init = gl.zeros([BNW, BM], gl.float32, s_layout) - delta[None, :]
        dpt_tok = warpgroup_mma(vmat, do.permute((1, 0)), init, is_async=True)  # dP^T = V dO^T (- Delta)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))  # S^T done, dP^T still running
        if MODS & SOFTCAP:
            pt, pt_cap = _capped(st, neg_lse[None, :], sc)  # P^T, P^T (1 - t^2)
        else:
            pt = gl.exp2(st * sc[0])  # P^T [BNW, BM]
            pt_cap = pt
    pt_op = gl.convert_layout(pt.to(q_smem.dtype), a_layout)
    dv_tok = warpgroup_mma(pt_op, do, dv, is_async=True)  # dV += P^T dO
    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt_tok,))  # dP^T - D done, P^T dO still running
    dst = pt_cap * dpt  # dS^T = P^T * (dP^T - D) (softcap: x (1 - t^2))
    dst_op = gl.convert_layout(dst.to(q_smem.dtype), a_layout)
    dk_tok = warpgroup_mma(dst_op, q, dk, is_async=True)  # dK += dS^T Q
    buf = it % 2  # the dS^T ring slot
    if ONEPASS:  # dS^T to shared memory under the dK product: the dQ product's A operand
        ds_smem.index(buf * NWG + WG).store(dst.to(q_smem.dtype))
        fence_async_shared()
    dv, dk, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, pt_op, dst_op))
    mbarrier.arrive(q_empty.index(s))  # Q and dO read: the slot goes back
    if ONEPASS:  # dQ += dS K, once the register operands are dead (fewer registers live across it)
        dq_layout: gl.constexpr = wgmma_layout(DQ)
        offs_m = m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, dq_layout))
        offs_d = gl.arange(0, DQ, layout=gl.SliceLayout(0, dq_layout))
        if ONEPASS == ONEPASS_WG:  # this warpgroup's keys, every column
            _add_dq(dq_base, offs_m, offs_d, NQ, ds_smem, k_smem, buf * NWG + WG, sm_scale, dq_layout, BM,
                    BNW, DQ, D, 0, D // DQ, WG, 1, RED, LEAN, m * BM, WG)
        else:  # every warpgroup's dS^T stored: DQ columns each (D = NWG DQ), or the whole dQ in turns
            gl.thread_barrier()  # this warpgroup's stores (and fences) all done before its arrival
            mbarrier.arrive(ds_bar.index(buf))
            mbarrier.wait(ds_bar.index(buf), (it // 2) & 1)
            if D == NWG * DQ:
                _add_dq(dq_base, offs_m, offs_d, NQ, ds_smem, k_smem, buf * NWG, sm_scale, dq_layout, BM, BNW,
                        DQ, D, WG * DQ, 1, 0, NWG, RED, LEAN, m * BM, WG)
            elif it % NWG == WG:
                _add_dq(dq_base, offs_m, offs_d, NQ, ds_smem, k_smem, buf * NWG, sm_scale, dq_layout, BM, BNW,
                        DQ, D, 0, 1, 0, NWG, RED, LEAN, m * BM, WG)
    return dk, dv


@gluon.jit
def _dkdv_tile(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready, q_empty, ds_smem,
               ds_bar, DQACC, b, hk, H, group, start_n, lo, f_lo, f_hi, end, NQ, NK, sc, sm_scale,
               BM: gl.constexpr, BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
               CAUSAL: gl.constexpr, MODS: gl.constexpr, ONEPASS: gl.constexpr, DQ: gl.constexpr,
               NWG: gl.constexpr, RED: gl.constexpr, LEAN: gl.constexpr):
    """Warpgroup WG's keys ``[start_n + WG BNW, + BNW)``: (dK, dV) [BNW, D] over the group's query tiles (dK
    without sm_scale; ``LEAN``: dV with it); ``ONEPASS``: dQ added into ``DQACC`` on the way (`_step`), and
    every warpgroup done with this one's K before it returns. ``LEAN``: each head's tiles in runs, masked
    ``[lo, f_lo)``, whole ``[f_lo, f_hi)``, masked ``[f_hi, end)`` (bounds clipped in order; a `_step` each,
    ``masked`` a constant; no division per tile), dQ rows padded to `ROW_PAD`."""
    s_layout: gl.constexpr = wgmma_layout(BM)  # S^T, dP^T [BNW, BM]
    acc_layout: gl.constexpr = wgmma_layout(D)  # dK, dV [BNW, D]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    n0 = start_n + WG * BNW
    offs_n = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, s_layout))
    dk = gl.zeros([BNW, D], gl.float32, acc_layout)
    dv = gl.zeros([BNW, D], gl.float32, acc_layout)
    mbarrier.wait(kv_bar.index(0), 0)
    kmat = k_smem.index(WG).reshape([BNW, D])
    vmat = v_smem.index(WG).reshape([BNW, D])
    if LEAN:
        runs = (lo, gl.minimum(gl.maximum(f_lo, lo), end))  # masked, whole, masked: bounds clipped in order
        runs = runs + (gl.minimum(gl.maximum(f_hi, runs[1]), end), end)
        it = 0
        for g in range(group):  # GQA: the group's query heads, reduced in registers
            if RED == 0:  # (tensor map, head, staging blocks): `_add_dq`
                dq_base = (DQACC[0], b * H + hk * group + g, DQACC[1])
            else:
                dq_base = DQACC + (b * H + hk * group + g).to(gl.int64) * gl.cdiv(NQ, ROWS) * (ROWS * D)
            for r in gl.static_range(3 if MODS & WINDOW else 2):
                for m in range(runs[r], runs[r + 1]):
                    dk, dv = _step(dk, dv, kmat, vmat, q_smem, do_smem, lse_smem, delta_smem, q_ready,
                                   q_empty, it, m, r != 1, offs_n, NQ, NK, sc, ds_smem, ds_bar, k_smem,
                                   dq_base, sm_scale, s_layout, a_layout, BM, BNW, D, STAGES, CAUSAL, MODS,
                                   ONEPASS, DQ, WG, NWG, RED, 1)
                    it += 1
    else:
        n = end - lo  # query tiles per head, in the producer's order
        for i in range(group * n):  # GQA: the group's query heads, reduced in registers
            m = lo + i % n
            if RED == 0:  # (tensor map, head, staging blocks): `_add_dq`
                dq_base = (DQACC[0], b * H + hk * group + i // n, DQACC[1])
            else:
                dq_base = DQACC + (b * H + hk * group + i // n).to(gl.int64) * NQ * D  # the head's dQ [Nq, D]
            if MODS & WINDOW:  # noqa: SIM108 - a constexpr branch: the plain build keeps one compare
                masked = (m < f_lo) | (m >= f_hi)
            else:
                masked = m < f_lo  # f_hi = end
            dk, dv = _step(dk, dv, kmat, vmat, q_smem, do_smem, lse_smem, delta_smem, q_ready, q_empty, i, m,
                           masked, offs_n, NQ, NK, sc, ds_smem, ds_bar, k_smem, dq_base, sm_scale, s_layout,
                           a_layout, BM, BNW, D, STAGES, CAUSAL, MODS, ONEPASS, DQ, WG, NWG, RED)
    if ONEPASS == ONEPASS_CTA:  # the other warpgroups' last dS K product read this one's K: done first
        mbarrier.arrive(ds_bar.index(2))
        mbarrier.wait(ds_bar.index(2), 0)
    return dk, dv


@gluon.jit
def _consumer(desc_dk, desc_dv, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready,
              q_empty, ds_smem, ds_bar, DQACC, b, hk, H, HKV, group, start_n, lo, f_lo, f_hi, end, NQ, NK, sc,
              sm_scale, BM: gl.constexpr, BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
              WG: gl.constexpr, CAUSAL: gl.constexpr, MODS: gl.constexpr, ONEPASS: gl.constexpr,
              DQ: gl.constexpr, NWG: gl.constexpr, RED: gl.constexpr, LEAN: gl.constexpr):
    """Warpgroup WG's keys of the tile: dK, dV (`_dkdv_tile`) stored (dK x sm_scale; ``LEAN``: dV /
    sm_scale)."""
    dk, dv = _dkdv_tile(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready, q_empty,
                        ds_smem, ds_bar, DQACC, b, hk, H, group, start_n, lo, f_lo, f_hi, end, NQ, NK, sc,
                        sm_scale, BM, BNW, D, STAGES, WG, CAUSAL, MODS, ONEPASS, DQ, NWG, RED, LEAN)
    n0 = start_n + WG * BNW
    # epilogue: dK, dV through this warpgroup's K and V buffers (read for the last time above) by TMA,
    # which clips the keys past Nk
    if LEAN:  # P^T carried sm_scale (`_step`): dK is whole, dV has it once too many
        dv = dv * (1.0 / sm_scale)
        sm_scale = 1.0
    v_smem.index(WG).reshape([BNW, D]).store(dv.to(desc_dv.dtype))
    k_smem.index(WG).reshape([BNW, D]).store((dk * sm_scale).to(desc_dk.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dv, [b, hk, n0, 0], v_smem.index(WG))
    tma.async_copy_shared_to_global(desc_dk, [b, hk, n0, 0], k_smem.index(WG))
    tma.store_wait(pendings=0)


#: Runtime integers are not specialised (one compile per (d, dtype, causal), as `fwd_hopper`).
@gluon.jit(do_not_specialize=["H", "HKV", "NQ", "NK", "qk_scale", "sm_scale", "LEFT", "RIGHT",
                              "cap_in", "TAIL"])
def _attnscope_bwd_hopper_dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, desc_lse,
                                      desc_delta, DQACC, H, HKV, NQ, NK, qk_scale, sm_scale, LEFT, RIGHT,
                                      cap_in, TAIL,
                                      CAUSAL: gl.constexpr, MODS: gl.constexpr, STAGES: gl.constexpr,
                                      NWG: gl.constexpr, CONSUMER_REGS: gl.constexpr, ONEPASS: gl.constexpr,
                                      DQ: gl.constexpr, RED: gl.constexpr, LEAN: gl.constexpr,
                                      num_warps: gl.constexpr):
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BNW: gl.constexpr = desc_k.block_type.shape[2]  # keys per consumer warpgroup
    D: gl.constexpr = desc_q.block_type.shape[3]
    pid_n, pid_bh = cta_tile(TAIL)  # causal: rank 0 the heaviest, the first keys (`_tl.cta_tile`)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    group = H // HKV
    start_n = pid_n * (NWG * BNW)
    if MODS:  # noqa: SIM108 - a constexpr branch
        sc = (qk_scale, LEFT, RIGHT, cap_in)  # the scale and the score mods' runtime values
    else:
        sc = (qk_scale,)  # the plain build captures no unused value into its partitions
    lo, f_lo, f_hi, end = _q_range(start_n, NQ, NK, sc, BM, NWG * BNW, CAUSAL, MODS)

    # ds_bar: dS^T 0/1 stored; done (`_step`, `_consumer`)
    smem = dkdv_smem(desc_k, desc_v, desc_q, desc_do, desc_lse, desc_delta, STAGES, NWG, ONEPASS, 3)
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready, q_empty, ds_smem, ds_bar = smem
    if ONEPASS and RED == 0:  # DQACC is the fp32 dQ's tensor map: a staging block [1, BM, DQ] per warpgroup
        dqs = gl.allocate_shared_memory(gl.float32, [NWG, 1, BM, DQ], DQACC.layout)
        dq_acc = (DQACC, dqs)
    else:
        dq_acc = DQACC

    gl.static_assert(NWG == 2, "two consumer warpgroups (CONFIGS)")
    gl.warp_specialize(
        [(_consumer, (desc_dk, desc_dv, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                      q_ready, q_empty, ds_smem, ds_bar, dq_acc, b, hk, H, HKV, group, start_n, lo, f_lo,
                      f_hi, end, NQ, NK, sc, sm_scale, BM, BNW, D, STAGES, 0, CAUSAL, MODS, ONEPASS, DQ,
                      NWG, RED, LEAN)),
         (_consumer, (desc_dk, desc_dv, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                      q_ready, q_empty, ds_smem, ds_bar, dq_acc, b, hk, H, HKV, group, start_n, lo, f_lo,
                      f_hi, end, NQ, NK, sc, sm_scale, BM, BNW, D, STAGES, 1, CAUSAL, MODS, ONEPASS, DQ,
                      NWG, RED, LEAN)),
         (_producer, (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem,
                      lse_smem, delta_smem, kv_bar, q_ready, q_empty, b, hk, group, start_n, 0, 0, lo, end,
                      BM, BNW, STAGES, NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def kernel(name: str):
    """The Gluon kernel function of ``name`` ("dkdv" or "dq")."""
    return _attnscope_bwd_hopper_dkdv_kernel if name == "dkdv" else _attnscope_bwd_hopper_dq_kernel


def _blocks(d: int, name: str, mods: int = 0, cfg: BwdConfig | None = None) -> dict:
    """Rows of each TMA descriptor's block."""
    cfg = cfg or config(d, name, mods)
    if name == "dkdv":
        bnw = cfg.BN // cfg.NWG
        return {"desc_q": cfg.BM, "desc_k": bnw, "desc_v": bnw, "desc_do": cfg.BM, "desc_dk": bnw,
                "desc_dv": bnw}
    return {"desc_q": cfg.BM, "desc_k": cfg.BN, "desc_v": cfg.BN, "desc_do": cfg.BM, "desc_dq": cfg.BM}


#: Rows of the padded -LSE2 / qk_scale and Delta copies the dK/dV kernel reads by TMA: a multiple of every
#: ``BM`` (TMA also needs 16-byte row strides); the padding is -inf (P = 0) and 0. The lean one-pass build's
#: fp32 dQ rows too. One value with model/ (`model.dispatch.HOPPER_BWD_ROW_PAD`).
ROW_PAD = dispatch.HOPPER_BWD_ROW_PAD
ROWS = gl.constexpr(ROW_PAD)  # in the kernels: the lean build's padded fp32 dQ rows


def _row_layout(bm: int):
    return gl.NVMMASharedLayout.get_default_for([1, 1, bm], gl.float32)  # one row: no swizzle


def _acc_block(cfg: BwdConfig, d: int) -> tuple:
    """The block of the fp32 dQ's tensor map [B Hq, rows, d] a ``RED = 0`` one-pass build adds by (`_add_dq`),
    a warpgroup's [BM, DQ] slice, and its shared layout."""
    block = [1, cfg.BM, min(cfg.DQ, d)]
    return block, gl.NVMMASharedLayout.get_default_for(block, gl.float32)


def signature(d: int, dtype: str, name: str = "dkdv", mods: int = 0, cfg: BwdConfig | None = None,
              mode: str = "twokernel"):
    """Signature of kernel ``name`` ("dkdv" or "dq") for ``triton.compile`` without a GPU (``dtype``
    "fp16"/"bf16"; ``mode`` as `constexprs`'): resource reports (bench/sm90_resources.py --kernel bwd)."""
    if name == "dkdv":
        bm = (cfg or config(d, name, mods)).BM
        rows = {n: f"tensordesc<fp32[1,1,{bm}],{_row_layout(bm)!r}>" for n in ("desc_lse", "desc_delta")}
        cfg = cfg or config(d, name, mods)
        block, layout = _acc_block(cfg, d)
        tmap = f"tensordesc<fp32[{','.join(map(str, block))}],{layout!r}>"
        rows["DQACC"] = tmap if cfg.RED == 0 and MODES[mode] else "*fp32"  # as `constexprs`' RED
        extra = ("ONEPASS", "DQ", "RED", "LEAN")
    else:
        rows = {"LSE2": "*fp32", "DELTA": "*fp32"}
        extra = ("LEAN",)
    return {**{n: desc_type(dtype, r, d) for n, r in _blocks(d, name, mods, cfg).items()}, **rows,
            "H": "i32", "HKV": "i32", "NQ": "i32", "NK": "i32", "qk_scale": "fp32", "sm_scale": "fp32",
            "LEFT": "i32", "RIGHT": "i32", "cap_in": "fp32", "TAIL": "i32",
            **{n: "constexpr" for n in ("CAUSAL", "MODS", "STAGES", "NWG", "CONSUMER_REGS", *extra,
                                        "num_warps")}}


def constexprs(d: int, causal: bool, name: str = "dkdv", mods: int = 0, mode: str = "twokernel",
               cfg: BwdConfig | None = None) -> dict:
    """The constexpr arguments of kernel ``name`` for head dim ``d`` (``mods``: `fwd_hopper.mods_flags`; a
    windowed call has ``causal`` False, its right bound carrying the diagonal; ``mode``: a `MODES` key, the
    dK/dV kernel's ``ONEPASS``; ``cfg``: another block configuration than `config`'s)."""
    cfg = cfg or config(d, name, mods)
    red = cfg.RED if cfg.RED or MODES[mode] else 1  # RED = 0 (the tensor map) only for a one-pass build
    extra = ({"ONEPASS": MODES[mode], "DQ": min(cfg.DQ, d), "RED": red, "LEAN": cfg.LEAN}
             if name == "dkdv" else {"LEAN": cfg.LEAN})
    return {"CAUSAL": causal, "MODS": mods, "STAGES": cfg.STAGES, "NWG": cfg.NWG,
            "CONSUMER_REGS": CONSUMER_REGS, **extra,
            "num_warps": NUM_WARPS}


def _tma_ready(t):
    """``t`` itself when a TMA descriptor can address it (16-byte aligned base and non-unit strides, none 0),
    else a contiguous copy."""
    es = t.element_size()
    ok = t.data_ptr() % 16 == 0 and all(s > 0 and s * es % 16 == 0 for s in t.stride()[:-1])
    return t if ok else t.contiguous()


def check_configs(configs) -> dict:
    """``configs`` ({"dkdv": BwdConfig, "dq": BwdConfig}, either optional) checked against what the kernels
    are built for (wgmma's 64-row warpgroup tiles: dK/dV ``BN / NWG``, dQ ``BM``; `ROW_PAD`)."""
    configs = dict(configs or {})
    for name, cfg in configs.items():
        if name not in KERNELS or not isinstance(cfg, BwdConfig):
            raise ValueError(f"configs: expected {{'dkdv' | 'dq': BwdConfig}}, got {name!r}: {cfg!r}")
        rows = cfg.BN // cfg.NWG if name == "dkdv" else cfg.BM
        ok = (cfg.DQ in (16, 32, 64, 128, 256), cfg.RED in (0, 1, 2), cfg.STAGES >= 1,
              name == "dq" or ROW_PAD % cfg.BM == 0, cfg.LEAN in (0, 1))
        if (cfg.NWG, rows % 64, cfg.BN % 64, cfg.BM % 16) != (2, 0, 0, 0) or not all(ok):
            raise NotImplementedError(f"configs[{name!r}] = {cfg}: supported: NWG = 2, dK/dV BN / NWG and dQ "
                                      f"BM multiples of 64, BM of 16, dK/dV BM dividing {ROW_PAD}, DQ 16-256,"
                                      " RED 0, 1 or 2, LEAN 0 or 1")
    return configs


def launch(q, k, v, do, lse2, delta, dq, dk, dv, qk_scale: float, sm_scale: float, causal: bool, mods=None,
           mode: str = "twokernel", configs=None):
    """dQ, dK and dV on checked inputs (kernels/bwd.py `flash_attention_backward` checks them and runs the
    preprocess); writes ``dq`` (contiguous [B, Hq, Nq, d]), ``dk``, ``dv`` (contiguous [B, Hkv, Nk, d]) in
    place. ``mode`` (`MODES`): "twokernel", the dK/dV kernel then the dQ kernel (bitwise reproducible);
    "onepass" or "onepass-wg", the dK/dV kernel alone, adding dQ by fp32 atomics into a zeroed fp32 buffer,
    then cast into ``dq`` (the atomics' order varies run to run: not bitwise reproducible). Either mode runs
    the call's default build (`config` of q's dtype and ``sm_scale``: the lean one where it applies).

    ``lse2``: the forward's LSE x log2(e), contiguous float32 [B, Hq, Nq]; ``delta``: rowsum(dO * O)
    (minus dLSE), contiguous float32 [B, Hq, Nq]; ``qk_scale``: the softmax scale x log2(e), softcap x
    log2(e) under softcap (`_tl.mod_args`); ``mods``: a `_common.Mods` (None: none; ``causal`` then False
    under a window); ``configs``: {"dkdv": BwdConfig, "dq": BwdConfig} in place of `config`'s (either
    optional; `check_configs`; the lean build refused with softcap, and in fp16 under `LEAN_MIN_FP16_SCALE`),
    for tuning. Each (kernel, d, dtype, causal, mods used, mode, config) compiles once per process. Returns
    the compiled kernels (``.n_regs``, ``.n_spills``, ``.metadata.shared``): (dK/dV, dQ), or (dK/dV,)
    one-pass.
    """
    run = launcher(q, k, v, do, qk_scale, sm_scale, causal, mods, mode, configs)
    return run(q, k, v, do, lse2, delta, padded_rows(lse2, delta, run.row_terms), dq, dk, dv)


def padded_rows(lse2, delta, terms):
    """The two per-row tensors a `launcher` run reads, [B, Hq, n_pad] fp32, in torch ops from ``lse2`` and
    ``delta`` (contiguous [B, Hq, Nq]) and its ``row_terms`` (n_pad, row0_mul, row0_add, row1_mul):
    ``row0_mul lse2 + row0_add`` (-inf past Nq) and ``row1_mul delta`` (0 past Nq). kernels/bwd.py's
    preprocess writes the same in its one pass."""
    n_pad, row0_mul, row0_add, row1_mul = terms
    rows = []
    for t, pad in ((lse2 * row0_mul + row0_add, float("-inf")), (delta * row1_mul, 0.0)):
        padded = torch.full((*lse2.shape[:2], n_pad), pad, dtype=torch.float32, device=lse2.device)
        padded[:, :, :lse2.shape[2]] = t
        rows.append(padded)
    return rows


def launcher(q, k, v, do, qk_scale: float, sm_scale: float, causal: bool, mods=None, mode: str = "twokernel",
             configs=None):
    """`launch` for tensors of these layouts (shapes, strides, dtypes, device; q, k, v, do as `_tma_ready`
    gives them): ``run(q, k, v, do, lse2, delta, rows, dq, dk, dv) -> compiled kernels`` with the configs,
    grids, constexprs, scalars and descriptor templates worked out once, the kernels launched through
    `_direct.planned_launch` (kernels/bwd.py keeps one per call layout). ``rows``: the two padded per-row
    tensors of ``run.row_terms`` (`padded_rows`; kernels/bwd.py's preprocess writes them). Arguments as
    `launch`. A head dim between the built ones runs the builds of its `head_block` (TMA reads zeros past d
    and clips the stores; the one-pass fp32 dQ is that wide)."""
    (B, Hq, Nq, d_in), d = q.shape, head_block(q.shape[3])
    Hkv, Nk = k.shape[1], k.shape[2]
    choice("mode", mode, tuple(MODES))
    onepass = MODES[mode] > 0
    configs = check_configs(configs)
    windowed = mods is not None and mods.windowed
    softcap = 0.0 if mods is None else mods.softcap
    flags = mods_flags(windowed, softcap, False)  # sinks: no kernel support needed
    dtype = "fp16" if q.dtype == torch.float16 else "bf16"
    cfgs = {name: configs.get(name) or config(d, name, flags, dtype, sm_scale) for name in KERNELS}
    left, right = (mods.left, mods.right) if windowed else (-1, -1)
    cap_in = sm_scale / softcap if softcap > 0 else 0.0  # t = tanh(s scale / softcap)
    args = (Hq, Hkv, Nq, Nk, qk_scale, sm_scale, left, right, cap_in)
    cfg = cfgs["dkdv"]
    assert ROW_PAD % cfg.BM == 0, (ROW_PAD, cfg)
    if onepass and (cfg.BM % 64 or d not in (cfg.DQ, cfg.NWG * cfg.DQ)):
        raise NotImplementedError(f"Hopper backward mode {mode!r}: dK/dV BM = {cfg.BM}, DQ = {cfg.DQ} at "
                                  f"head_dim {d}; supported: BM a multiple of 64 (`onepass_ok`), DQ = "
                                  "head_dim or head_dim / NWG (mode 'twokernel': every config)")
    lean = any(c.LEAN for c in cfgs.values())
    if lean and flags & SOFTCAP.value:
        raise NotImplementedError("Hopper backward: the lean build (LEAN = 1) with softcap; supported: "
                                  "LEAN = 0")
    if lean and q.dtype == torch.float16 and sm_scale < LEAN_MIN_FP16_SCALE:
        raise NotImplementedError(f"Hopper backward: the lean build (LEAN = 1) with fp16 and scale "
                                  f"{sm_scale:.3g}; supported: scale >= {LEAN_MIN_FP16_SCALE} in fp16, or "
                                  "LEAN = 0")
    # descriptor templates: the inputs as `_tma_ready` gives them, the outputs contiguous (`run` puts the
    # tensors in); the padded LSE / Delta rows too
    meta = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in (("desc_dk", k), ("desc_dv", v),
                                                                             ("desc_dq", q))}
    shapes = {"desc_q": _tma_ready(q), "desc_k": _tma_ready(k), "desc_v": _tma_ready(v),
              "desc_do": _tma_ready(do), **meta}
    templates = {name: [(n, descriptor_over(descriptor(shapes[n], rows, d), None))
                        for n, rows in _blocks(d, name, flags, cfgs[name]).items()] for name in KERNELS}
    n_pad = triton.cdiv(Nq, ROW_PAD) * ROW_PAD
    row = torch.empty((B, Hq, n_pad), device="meta")
    row_t = descriptor_over(TensorDescriptor(row, [B, Hq, n_pad], list(row.stride()), [1, 1, cfg.BM],
                                             _row_layout(cfg.BM)), None)
    rows_acc = n_pad if cfg.LEAN else Nq  # the lean build adds unmasked rows up to n_pad
    acc_t = None
    if onepass and cfg.RED == 0:  # dQ by TMA reduce-adds: the fp32 dQ's tensor map [B Hq, rows, d]
        acc = torch.empty((B * Hq, rows_acc, d), dtype=torch.float32, device="meta")
        acc_t = TensorDescriptor(acc, list(acc.shape), list(acc.stride()), *_acc_block(cfg, d))
        acc_t = descriptor_over(acc_t, None)
    log2_scale, neg_qk = math.log2(sm_scale), -qk_scale
    dev = q.device
    sms = num_sms(torch, q.device)
    tails = {"dkdv": launch_tail(causal, triton.cdiv(Nk, cfg.BN), B * Hkv, sms)}
    dkdv = planned_launch(_attnscope_bwd_hopper_dkdv_kernel, (triton.cdiv(Nk, cfg.BN), B * Hkv),
                          constexprs(d, causal, "dkdv", flags, mode, cfg), dev)
    if not onepass:
        dq_cfg = cfgs["dq"]
        dq_grid = (triton.cdiv(Nq, dq_cfg.NWG * dq_cfg.BM), B * Hq)
        tails["dq"] = launch_tail(causal, *dq_grid, sms)
        dq_run = planned_launch(_attnscope_bwd_hopper_dq_kernel, dq_grid,
                                constexprs(d, causal, "dq", flags, cfg=dq_cfg), dev)

    def run(q, k, v, do, lse2, delta, rows, dq, dk, dv):
        tensors = {"desc_q": _tma_ready(q), "desc_k": _tma_ready(k), "desc_v": _tma_ready(v),
                   "desc_do": _tma_ready(do), "desc_dk": dk, "desc_dv": dv, "desc_dq": dq}

        def descs(name):
            return [descriptor_over(t, tensors[n]) for n, t in templates[name]]
        dq_acc = (torch.zeros((B, Hq, rows_acc, d), dtype=torch.float32, device=dev) if onepass
                  else rows[0])
        acc_arg = dq_acc if acc_t is None else descriptor_over(acc_t, dq_acc.view(B * Hq, rows_acc, d))
        done = (dkdv((*descs("dkdv"), *(descriptor_over(row_t, r) for r in rows), acc_arg, *args,
                      tails["dkdv"]), True),)
        if onepass:
            dq.copy_(dq_acc[:, :, :Nq, :d_in])  # fp32 -> q's dtype (the kernel added sm_scale dS K)
            return done
        aligned = (lse2.data_ptr() | delta.data_ptr()) % 16 == 0
        return (*done, dq_run((*descs("dq"), lse2, delta, *args, tails["dq"]), aligned))
    # the rows `run` reads (`padded_rows`): lean, the FFMA's addend log2(scale) - LSE2 and dP^T's initial
    # value -Delta; else S^T's and dP^T's initial values, LSE2 / -qk_scale and Delta (`_step`)
    run.row_terms = (n_pad, -1.0, log2_scale, -1.0) if cfg.LEAN else (n_pad, 1.0 / neg_qk, 0.0, 1.0)
    return run

