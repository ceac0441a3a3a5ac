"""The Hopper backward's dQ pass (kernels/bwd_hopper.py, mode "twokernel"), and the mask and softcap helpers
both of its kernels share: a CTA owns NWG x 64 query rows of one (batch, head), the forward's schedule
(`fwd_hopper._producer` streams the K/V ring); per K/V tile S = Q K^T, dP = dO V^T, dQ += dS K, with
``S - LSE2 / qk_scale`` and ``dP - Delta`` the accumulators' initial values (-inf where masked); dQ leaves
by TMA through the dead Q buffer; the lean build (``LEAN``, `bwd_hopper.LEAN_CONFIGS`) starts S from
nothing and takes P by one FFMA instead (`_dq_tile`). Launched by `bwd_hopper.launch`.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from attnscope.kernels._gluon_smem import buffers, kv_ring
from attnscope.kernels._tl import cta_tile
from attnscope.kernels.fwd_hopper import (
    PRODUCER_REGS,
    SOFTCAP,
    WINDOW,
    _kv_full,
    _kv_range,
    _tanh,
    wgmma_layout,
)
from attnscope.kernels.fwd_hopper import _producer as _producer_fwd


@gluon.jit
def _keep(rows, cols, NQ, NK, sc, CAUSAL: gl.constexpr, MODS: gl.constexpr):
    """Whether key ``cols`` is visible to query row ``rows`` (broadcasting index tensors): inside Nk, on or
    left of the bottom-right diagonal (causal), inside the window ``(sc[1], sc[2])`` (-1 unbounded): the
    forward's mask (`fwd_hopper._softmax`)."""
    keep = cols < NK
    diag = rows + (NK - NQ)  # the key on a row's bottom-right diagonal
    if CAUSAL:
        keep = keep & (cols <= diag)
    if MODS & WINDOW:
        keep = keep & ((sc[1] < 0) | (cols >= diag - sc[1]))
        keep = keep & ((sc[2] < 0) | (cols <= diag + sc[2]))
    return keep


@gluon.jit
def _capped(st, neg_lse, sc):
    """Softcap: ``(P, P (1 - t^2))`` from the raw scores ``st`` (either orientation; ``neg_lse`` broadcast to
    it, -LSE2 / qk_scale): ``t = tanh(S scale / cap)``, ``P = exp2(qk_scale (t - LSE2 / qk_scale))``
    (qk_scale = cap log2 e, `_tl.mod_args`); ``1 - t^2`` is d s' / d s (the scale comes at the end):
    dS = P (1 - t^2) (dP - Delta). The mask arrives as ``st = -inf`` (the MMA's initial value, as in the
    plain build): P = 0 there by a select, no index arithmetic after the MMAs."""
    t = _tanh(st * sc[3])
    p = gl.where(st == float("-inf"), 0.0, gl.exp2((t + neg_lse) * sc[0]))
    return p, p * (1.0 - t * t)


# --- the dQ pass: per query tile, K and V streamed (the forward's schedule) --------------------------------
@gluon.jit
def _dq_producer(desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                 v_ready, k_empty, v_empty, b, h, hk, row0, t_lo, n_tiles, BM: gl.constexpr, BN: gl.constexpr,
                 STAGES: gl.constexpr, NWG: gl.constexpr):
    """The dO tiles, then the forward's producer: the Q tiles and the K/V ring."""
    for w in gl.static_range(NWG):
        mbarrier.expect(do_bar.index(w), desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_do, [b, h, row0 + w * BM, 0], do_bar.index(w), do_smem.index(w))
    _producer_fwd(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                  b, h, hk, row0, t_lo, n_tiles, BM, BN, STAGES, NWG)


@gluon.jit
def _dq_tile(LSE2, DELTA, head, stride, q0, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready, v_ready,
             k_empty, v_empty, row0, t_lo, n_tiles, NQ, NK, sc, sm_scale, BM: gl.constexpr, BN: gl.constexpr,
             D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, CAUSAL: gl.constexpr,
             MODS: gl.constexpr, LEAN: gl.constexpr):
    """Warpgroup WG's query rows ``[row0, row0 + BM)`` (LSE2 and Delta of row r at ``head stride + q0 + r``):
    ``sm_scale sum_j dS_j K_j`` [BM, D] over the K/V tiles ``[t_lo, t_lo + n_tiles)``, with
    ``S = Q K^T - LSE2 / qk_scale`` and ``dP = dO V^T - Delta`` from the accumulators' initial values (as
    `_step`, softcap too). ``LEAN`` (no softcap): S from nothing, P = exp2(S qk_scale + log2(sm_scale) - LSE2)
    by one FFMA (dS carries the scale), P = 0 where masked by a select on masked tiles only."""
    s_layout: gl.constexpr = wgmma_layout(BN)  # S, dP [BM, BN]
    acc_layout: gl.constexpr = wgmma_layout(D)  # dQ [BM, D]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    offs_m = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    row_ok = offs_m < NQ
    base = head * stride + q0
    lse2 = gl.load(LSE2 + base + offs_m, mask=row_ok, other=float("inf"))  # +inf past Nq: P = 0
    delta = gl.load(DELTA + base + offs_m, mask=row_ok, other=0.0)
    qk_scale = sc[0]
    if MODS & WINDOW:  # this warpgroup's unmasked tiles [f_a, f_b) (absolute)
        f_a, f_b = _kv_full(row0, BM, NQ, NK, sc, BN, CAUSAL, MODS)
    else:
        n_full = gl.minimum(_kv_full(row0, BM, NQ, NK, sc, BN, CAUSAL, MODS)[1], n_tiles)  # [0, n_full) whole
    if MODS & SOFTCAP:
        neg_lse = -(lse2 / qk_scale)
    if LEAN:
        neg_lse = gl.log2(sm_scale) - lse2  # -inf past Nq: P = 0
    dq = gl.zeros([BM, D], gl.float32, acc_layout)
    q = q_smem.index(WG).reshape([BM, D])
    do = do_smem.index(WG).reshape([BM, D])
    mbarrier.wait(q_bar.index(WG), 0)
    mbarrier.wait(do_bar.index(WG), 0)
    for j in range(n_tiles):
        s = j % STAGES
        ph = (j // STAGES) & 1
        if MODS & WINDOW:  # noqa: SIM108 - a constexpr branch
            masked = (t_lo + j < f_a) | (t_lo + j >= f_b)
        else:
            masked = j >= n_full
        if LEAN:
            init = gl.zeros([BM, BN], gl.float32, s_layout)  # not read (use_acc False)
        else:
            if MODS & SOFTCAP:
                init = gl.zeros([BM, BN], gl.float32, s_layout)  # the raw S: the cap comes before the LSE
            else:
                init = gl.zeros([BM, BN], gl.float32, s_layout) - (lse2 / qk_scale)[:, None]
            if masked:  # diagonal, window edges, ragged tile (rows with LSE = -inf see no key: all masked)
                offs_n = (t_lo + j) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                init = gl.where(_keep(offs_m[:, None], offs_n[None, :], NQ, NK, sc, CAUSAL, MODS), init,
                                float("-inf"))
        mbarrier.wait(k_ready.index(s), ph)
        kmat = k_smem.index(s).reshape([BN, D])
        s_tok = warpgroup_mma(q, kmat.permute((1, 0)), init, use_acc=not LEAN,
                              is_async=True)  # S = Q K^T (+ init)
        mbarrier.wait(v_ready.index(s), ph)
        init = gl.zeros([BM, BN], gl.float32, s_layout) - delta[:, None]
        dp_tok = warpgroup_mma(do, v_smem.index(s).reshape([BN, D]).permute((1, 0)), init,
                               is_async=True)  # dP = dO V^T (- Delta)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        if LEAN:
            p = gl.exp2(st * qk_scale + neg_lse[:, None])  # sm_scale P [BM, BN]
            if masked:
                offs_n = (t_lo + j) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                p = gl.where(_keep(offs_m[:, None], offs_n[None, :], NQ, NK, sc, CAUSAL, MODS), p, 0.0)
        elif MODS & SOFTCAP:
            p = _capped(st, neg_lse[:, None], sc)[1]  # P (1 - t^2)
        else:
            p = gl.exp2(st * qk_scale)  # P [BM, BN]
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        mbarrier.arrive(v_empty.index(s))  # V read
        ds_op = gl.convert_layout((p * dp).to(q_smem.dtype), a_layout)  # dS = P (dP - D) (softcap: (1 - t^2))
        dq_tok = warpgroup_mma(ds_op, kmat, dq, is_async=True)  # dQ += dS K
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))
        mbarrier.arrive(k_empty.index(s))  # K read
    if LEAN:  # dS carried the scale
        sm_scale = 1.0
    return dq * sm_scale


@gluon.jit
def _dq_consumer(desc_dq, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready, v_ready,
                 k_empty, v_empty, b, h, pid_bh, row0_cta, t_lo, n_tiles, NQ, NK, sc, sm_scale,
                 BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                 CAUSAL: gl.constexpr, MODS: gl.constexpr, LEAN: gl.constexpr):
    """Warpgroup WG's query rows: dQ (`_dq_tile`) stored through the dead Q buffer by TMA."""
    row0 = row0_cta + WG * BM
    dq = _dq_tile(LSE2, DELTA, pid_bh, NQ, 0, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                  v_ready, k_empty, v_empty, row0, t_lo, n_tiles, NQ, NK, sc, sm_scale, BM, BN, D, STAGES, WG,
                  CAUSAL, MODS, LEAN)
    q_smem.index(WG).reshape([BM, D]).store(dq.to(desc_dq.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dq, [b, h, row0, 0], q_smem.index(WG))
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["H", "HKV", "NQ", "NK", "qk_scale", "sm_scale", "LEFT", "RIGHT", "cap_in",
                              "TAIL"])
def _attnscope_bwd_hopper_dq_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE2, DELTA, H, HKV, NQ, NK,
                                    qk_scale, sm_scale, LEFT, RIGHT, cap_in, TAIL, CAUSAL: gl.constexpr,
                                    MODS: gl.constexpr, STAGES: gl.constexpr, NWG: gl.constexpr,
                                    CONSUMER_REGS: gl.constexpr, LEAN: gl.constexpr, num_warps: gl.constexpr):
    """dQ of ``NWG x BM`` query rows of one (batch, query head) per CTA (causal: heaviest tiles first)."""
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_q.block_type.shape[3]
    start_m, pid_bh = cta_tile(TAIL)  # causal: rank 0 the heaviest, the last rows (`_tl.cta_tile`)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - start_m
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // HKV)
    row0 = start_m * (NWG * BM)
    if MODS:  # noqa: SIM108 - a constexpr branch
        sc = (qk_scale, LEFT, RIGHT, cap_in)  # the scale and the score mods' runtime values
    else:
        sc = (qk_scale,)  # the plain build captures no unused value into its partitions
    if MODS & WINDOW:
        t_lo, n_tiles = _kv_range(row0, NWG * BM, NQ, NK, sc, BN, CAUSAL, MODS)
    else:
        t_lo: gl.constexpr = 0  # a constant for the partitions, not a captured value
        n_tiles = _kv_range(row0, NWG * BM, NQ, NK, sc, BN, CAUSAL, MODS)[1]

    q_smem = buffers(desc_q, NWG)
    do_smem = buffers(desc_do, NWG)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, wg_bars = kv_ring(desc_k, desc_v, STAGES, NWG, 2)
    q_bar, do_bar = wg_bars

    gl.static_assert(NWG == 2, "two consumer warpgroups (CONFIGS)")
    gl.warp_specialize(
        [(_dq_consumer, (desc_dq, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                         v_ready, k_empty, v_empty, b, h, pid_bh, row0, t_lo, n_tiles, NQ, NK, sc, sm_scale,
                         BM, BN, D, STAGES, 0, CAUSAL, MODS, LEAN)),
         (_dq_consumer, (desc_dq, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                         v_ready, k_empty, v_empty, b, h, pid_bh, row0, t_lo, n_tiles, NQ, NK, sc, sm_scale,
                         BM, BN, D, STAGES, 1, CAUSAL, MODS, LEAN)),
         (_dq_producer, (desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar,
                         k_ready, v_ready, k_empty, v_empty, b, h, hk, row0, t_lo, n_tiles, BM, BN, STAGES,
                         NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
