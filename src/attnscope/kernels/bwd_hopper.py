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
- dQ (`_attnscope_bwd_hopper_dq_kernel`): the forward's schedule (`fwd_hopper._producer` streams the K/V
  ring): a CTA owns NWG x 64 query rows of one (batch, head); per K/V tile S = Q K^T, dP = dO V^T,
  dQ += dS K; dQ leaves by TMA through the dead Q buffer.
No atomics: the gradients are bitwise reproducible run to run.

Causal, bottom-right (key c visible to row r iff ``c <= r + Nk - Nq``): the dK/dV kernel skips query tiles
wholly above its keys' diagonal (`_q_range`), the dQ kernel K/V tiles past its rows' (`fwd_hopper._kv_range`);
only tiles straddling the diagonal and the ragged last tiles are masked. Ragged N: TMA reads zeros past
Nq / Nk and clips the stores; rows with no visible key (LSE = -inf) give 0. Score mods: sinks need nothing
here (the LSE includes them; their gradient is torch on D and LSE); window and softcap are not built
(`supports`): kernels/bwd.py refuses them for ``impl="hopper"``. Layout: 4-D TMA descriptors
``[B, H, N, d]`` over the caller's strides; dQ, dK, dV contiguous.
"""

from __future__ import annotations

from typing import NamedTuple

from attnscope.kernels._common import import_torch_triton

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

from attnscope.kernels.fwd_hopper import (  # noqa: E402
    NUM_WARPS,
    PRODUCER_REGS,
    _kv_full,
    _kv_range,
    _layout,
    wgmma_layout,
)
from attnscope.kernels.fwd_hopper import _producer as _producer_fwd  # noqa: E402

#: setmaxnreg of the consumer warpgroup that is a worker partition (the other is the default partition)
CONSUMER_REGS = 240


class BwdConfig(NamedTuple):
    """A block configuration: dK/dV, a CTA owns ``BN`` keys (``BN / NWG`` per warpgroup) against ``BM``-row
    query tiles; dQ, a CTA owns ``NWG x BM`` query rows against ``BN``-key K/V tiles."""

    BM: int  # query rows per Q/dO tile (dK/dV: the N of S^T = K Q^T; dQ: per warpgroup)
    BN: int  # keys per K/V tile
    STAGES: int  # depth of the shared-memory ring (dK/dV: Q/dO; dQ: K/V)
    NWG: int = 2  # consumer warpgroups


#: Per kernel and head dim. dK/dV registers per consumer thread: dK + dV (BN/NWG x d fp32 each) and S^T, dP^T
#: (BN/NWG x BM fp32 each) under the 240 of `CONSUMER_REGS`: 64-row Q tiles at both head dims (d = 64 with
#: 128-row tiles spills). dQ: dQ (BM x d) and S, dP (BM x BN each); 128-key K/V tiles. Shared memory: dK/dV
#: 2 BN d (K, V) + STAGES 2 BM d (Q, dO) elements; dQ 2 NWG BM d + STAGES 2 BN d (bench/sm90_resources.py
#: --kernel bwd prints the compiled numbers).
CONFIGS = {"dkdv": {128: BwdConfig(64, 128, 2), 64: BwdConfig(64, 128, 2)},
           "dq": {128: BwdConfig(64, 128, 2), 64: BwdConfig(64, 128, 2)}}
KERNELS = tuple(CONFIGS)


def config(d: int, kernel: str = "dkdv") -> BwdConfig:
    """The block configuration of ``kernel`` ("dkdv" or "dq") for head dim ``d`` (NotImplementedError if
    not built for it)."""
    if d not in CONFIGS[kernel]:
        raise NotImplementedError(f"Hopper backward: head_dim {d} is not supported; supported: "
                                  f"{sorted(CONFIGS[kernel])}")
    return CONFIGS[kernel][d]


def supports(d: int, windowed: bool, softcap: float) -> bool:
    """Whether the kernel is built for head dim ``d`` with these score mods (sinks need no kernel support)."""
    return all(d in c for c in CONFIGS.values()) and not windowed and not softcap > 0


@gluon.jit
def _q_range(start_n, NQ, NK, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """Query tiles of the K/V tile of keys ``[start_n, start_n + BN)``: ``[0, lo)`` skipped (they see none of
    its keys), ``[lo, hi)`` masked, ``[hi, cdiv(NQ, BM))`` unmasked (every row sees every key). The mirror of
    the forward's `fwd_hopper._kv_range`; the ragged last K/V tile is masked throughout."""
    n_m = gl.cdiv(NQ, BM)
    lo = 0
    hi = 0
    if CAUSAL:
        lo = gl.maximum(start_n - (NK - NQ), 0) // BM  # the first row that sees the tile's first key
        last = gl.minimum(start_n + BN, NK) - 1
        hi = gl.cdiv(gl.maximum(last - (NK - NQ), 0), BM)  # from here every row sees the tile's last key
    if start_n + BN > NK:
        hi = n_m
    lo = gl.minimum(lo, n_m)
    hi = gl.minimum(gl.maximum(hi, lo), n_m)
    return lo, hi


@gluon.jit
def _producer(desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, b, hk, group, start_n, lo, n_m,
              BM: gl.constexpr, BNW: gl.constexpr, STAGES: gl.constexpr, NWG: gl.constexpr):
    """K and V of the tile once, then (Q, dO, LSE2, Delta) per query tile in the consumers' order: the
    group's heads, each from query tile ``lo`` on."""
    mbarrier.expect(kv_bar.index(0), NWG * (desc_k.block_type.nbytes + desc_v.block_type.nbytes))
    for w in gl.static_range(NWG):
        n0 = start_n + w * BNW
        tma.async_copy_global_to_shared(desc_k, [b, hk, n0, 0], kv_bar.index(0), k_smem.index(w))
        tma.async_copy_global_to_shared(desc_v, [b, hk, n0, 0], kv_bar.index(0), v_smem.index(w))
    n = n_m - lo  # query tiles per head
    for i in range(group * n):
        h = hk * group + i // n
        m = lo + i % n
        s = i % STAGES
        mbarrier.wait(q_empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
        mbarrier.expect(q_ready.index(s), desc_q.block_type.nbytes + desc_do.block_type.nbytes
                        + desc_lse.block_type.nbytes + desc_delta.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, m * BM, 0], q_ready.index(s), q_smem.index(s))
        tma.async_copy_global_to_shared(desc_do, [b, h, m * BM, 0], q_ready.index(s), do_smem.index(s))
        tma.async_copy_global_to_shared(desc_lse, [b, h, m * BM], q_ready.index(s), lse_smem.index(s))
        tma.async_copy_global_to_shared(desc_delta, [b, h, m * BM], q_ready.index(s), delta_smem.index(s))


@gluon.jit
def _step(dk, dv, kmat, vmat, q_smem, do_smem, lse_smem, delta_smem, q_ready, q_empty, it, m, masked, offs_n,
          NQ, NK, qk_scale, s_layout: gl.constexpr, a_layout: gl.constexpr, BM: gl.constexpr,
          BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Query tile ``m`` (ring slot counter ``it``; ``masked``: it straddles the diagonal or the keys end in
    the tile) against this warpgroup's keys ``offs_n``; everything transposed: [BNW keys, BM rows]. Returns
    (dK, dV) accumulated (dK unscaled). One loop body for every tile: the mask is a select on the initial
    value before the MMAs are issued, so masked and unmasked tiles differ in no register after them."""
    s = it % STAGES
    mbarrier.wait(q_ready.index(s), (it // STAGES) & 1)
    q = q_smem.index(s).reshape([BM, D])
    do = do_smem.index(s).reshape([BM, D])
    # LSE2, Delta and the mask enter as the accumulators' initial values (no registers of their own across
    # the MMAs): S^T - LSE2 / qk_scale (the ring holds -LSE2 / qk_scale, -inf past Nq; -inf where masked:
    # P = 0) and dP^T - Delta
    neg_lse = lse_smem.index(s).reshape([BM]).load(gl.SliceLayout(0, s_layout))
    init = gl.zeros([BNW, BM], gl.float32, s_layout) + neg_lse[None, :]
    if masked:  # rows with no visible key (LSE = -inf: causal with Nq > Nk) are masked by the diagonal
        keep = offs_n[:, None] < NK
        if CAUSAL:
            offs_m = m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))  # rows: S^T's columns
            keep = keep & (offs_n[:, None] <= offs_m[None, :] + (NK - NQ))
        init = gl.where(keep, init, float("-inf"))
    st_tok = warpgroup_mma(kmat, q.permute((1, 0)), init, is_async=True)  # S^T = K Q^T (+ init)
    delta = delta_smem.index(s).reshape([BM]).load(gl.SliceLayout(0, s_layout))
    init = gl.zeros([BNW, BM], gl.float32, s_layout) - delta[None, :]
    dpt_tok = warpgroup_mma(vmat, do.permute((1, 0)), init, is_async=True)  # dP^T = V dO^T (- Delta)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))  # S^T done, dP^T still running
    pt = gl.exp2(st * qk_scale)  # P^T [BNW, BM]
    pt_op = gl.convert_layout(pt.to(q_smem.dtype), a_layout)
    dv_tok = warpgroup_mma(pt_op, do, dv, is_async=True)  # dV += P^T dO
    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt_tok,))  # dP^T - D done, P^T dO still running
    dst = pt * dpt  # dS^T = P^T * (dP^T - D)
    dst_op = gl.convert_layout(dst.to(q_smem.dtype), a_layout)
    dk_tok = warpgroup_mma(dst_op, q, dk, is_async=True)  # dK += dS^T Q
    dv, dk, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, pt_op, dst_op))
    mbarrier.arrive(q_empty.index(s))  # Q and dO read: the slot goes back
    return dk, dv


@gluon.jit
def _consumer(desc_dk, desc_dv, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, q_ready,
              q_empty, b, hk, H, HKV, group, start_n, lo, hi, n_m, NQ, NK, qk_scale, sm_scale,
              BM: gl.constexpr, BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
              CAUSAL: gl.constexpr):
    """Warpgroup WG's keys of the tile: dK, dV over the group's query tiles, then stored (dK x sm_scale)."""
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
    n = n_m - lo  # query tiles per head, in the producer's order
    for i in range(group * n):  # GQA: the group's query heads, reduced in registers
        m = lo + i % n
        dk, dv = _step(dk, dv, kmat, vmat, q_smem, do_smem, lse_smem, delta_smem, q_ready, q_empty, i, m,
                       m < hi, offs_n, NQ, NK, qk_scale, s_layout, a_layout, BM, BNW, D, STAGES, CAUSAL)
    # epilogue: dK, dV through this warpgroup's K and V buffers (read for the last time above) by TMA,
    # which clips the keys past Nk
    v_smem.index(WG).reshape([BNW, D]).store(dv.to(desc_dv.dtype))
    k_smem.index(WG).reshape([BNW, D]).store((dk * sm_scale).to(desc_dk.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dv, [b, hk, n0, 0], v_smem.index(WG))
    tma.async_copy_shared_to_global(desc_dk, [b, hk, n0, 0], k_smem.index(WG))
    tma.store_wait(pendings=0)


#: Runtime integers are not specialised (one compile per (d, dtype, causal), as `fwd_hopper`).
@gluon.jit(do_not_specialize=["H", "HKV", "NQ", "NK", "qk_scale", "sm_scale"])
def _attnscope_bwd_hopper_dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, desc_lse,
                                      desc_delta, H, HKV, NQ, NK, qk_scale, sm_scale, CAUSAL: gl.constexpr,
                                      STAGES: gl.constexpr, NWG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                      num_warps: gl.constexpr):
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BNW: gl.constexpr = desc_k.block_type.shape[2]  # keys per consumer warpgroup
    D: gl.constexpr = desc_q.block_type.shape[3]
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    group = H // HKV
    start_n = pid_n * (NWG * BNW)
    lo, hi = _q_range(start_n, NQ, NK, BM, NWG * BNW, CAUSAL)
    n_m = gl.cdiv(NQ, BM)

    k_smem = gl.allocate_shared_memory(desc_k.dtype, [NWG] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [NWG] + desc_v.block_type.shape, desc_v.layout)
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [STAGES] + desc_q.block_type.shape, desc_q.layout)
    do_smem = gl.allocate_shared_memory(desc_do.dtype, [STAGES] + desc_do.block_type.shape, desc_do.layout)
    rows: gl.constexpr = [STAGES] + desc_lse.block_type.shape  # LSE2 and Delta per query tile
    lse_smem = gl.allocate_shared_memory(gl.float32, rows, desc_lse.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, rows, desc_delta.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar.index(0), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=NWG)  # every consumer warpgroup's
    fence_async_shared()

    gl.static_assert(NWG == 2, "two consumer warpgroups (CONFIGS)")
    gl.warp_specialize(
        [(_consumer, (desc_dk, desc_dv, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                      q_ready, q_empty, b, hk, H, HKV, group, start_n, lo, hi, n_m, NQ, NK, qk_scale,
                      sm_scale, BM, BNW, D, STAGES, 0, CAUSAL)),
         (_consumer, (desc_dk, desc_dv, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                      q_ready, q_empty, b, hk, H, HKV, group, start_n, lo, hi, n_m, NQ, NK, qk_scale,
                      sm_scale, BM, BNW, D, STAGES, 1, CAUSAL)),
         (_producer, (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem,
                      lse_smem, delta_smem, kv_bar, q_ready, q_empty, b, hk, group, start_n, lo, n_m, BM, BNW,
                      STAGES, NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --- the dQ pass: per query tile, K and V streamed (the forward's schedule) --------------------------------
@gluon.jit
def _dq_producer(desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                 v_ready, k_empty, v_empty, b, h, hk, row0, n_tiles, BM: gl.constexpr, BN: gl.constexpr,
                 STAGES: gl.constexpr, NWG: gl.constexpr):
    """The dO tiles, then the forward's producer: the Q tiles and the K/V ring."""
    for w in gl.static_range(NWG):
        mbarrier.expect(do_bar.index(w), desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_do, [b, h, row0 + w * BM, 0], do_bar.index(w), do_smem.index(w))
    _producer_fwd(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                  b, h, hk, row0, 0, n_tiles, BM, BN, STAGES, NWG)


@gluon.jit
def _dq_consumer(desc_dq, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready, v_ready,
                 k_empty, v_empty, b, h, pid_bh, row0_cta, n_tiles, NQ, NK, qk_scale, sm_scale,
                 BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                 CAUSAL: gl.constexpr):
    """Warpgroup WG's query rows: ``dQ = sum_j dS_j K_j`` over the K/V tiles, with ``S = Q K^T - LSE2 /
    qk_scale`` and ``dP = dO V^T - Delta`` from the accumulators' initial values (as `_step`); stored
    x sm_scale through the dead Q buffer by TMA."""
    s_layout: gl.constexpr = wgmma_layout(BN)  # S, dP [BM, BN]
    acc_layout: gl.constexpr = wgmma_layout(D)  # dQ [BM, D]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row0 = row0_cta + WG * BM
    offs_m = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    row_ok = offs_m < NQ
    lse2 = gl.load(LSE2 + pid_bh * NQ + offs_m, mask=row_ok, other=float("inf"))  # +inf past Nq: P = 0
    delta = gl.load(DELTA + pid_bh * NQ + offs_m, mask=row_ok, other=0.0)
    n_full = gl.minimum(_kv_full(row0, BM, NQ, NK, 0, BN, CAUSAL, 0)[1], n_tiles)  # [0, n_full): no mask
    dq = gl.zeros([BM, D], gl.float32, acc_layout)
    q = q_smem.index(WG).reshape([BM, D])
    do = do_smem.index(WG).reshape([BM, D])
    mbarrier.wait(q_bar.index(WG), 0)
    mbarrier.wait(do_bar.index(WG), 0)
    for j in range(n_tiles):
        s = j % STAGES
        ph = (j // STAGES) & 1
        init = gl.zeros([BM, BN], gl.float32, s_layout) - (lse2 / qk_scale)[:, None]
        if j >= n_full:  # the diagonal and the ragged tile (rows with LSE = -inf see no key: all masked)
            offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            keep = offs_n[None, :] < NK
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))
            init = gl.where(keep, init, float("-inf"))
        mbarrier.wait(k_ready.index(s), ph)
        kmat = k_smem.index(s).reshape([BN, D])
        s_tok = warpgroup_mma(q, kmat.permute((1, 0)), init, is_async=True)  # S = Q K^T (+ init)
        mbarrier.wait(v_ready.index(s), ph)
        init = gl.zeros([BM, BN], gl.float32, s_layout) - delta[:, None]
        dp_tok = warpgroup_mma(do, v_smem.index(s).reshape([BN, D]).permute((1, 0)), init,
                               is_async=True)  # dP = dO V^T (- Delta)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        p = gl.exp2(st * qk_scale)  # P [BM, BN]
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        mbarrier.arrive(v_empty.index(s))  # V read
        ds_op = gl.convert_layout((p * dp).to(q_smem.dtype), a_layout)  # dS = P * (dP - D)
        dq_tok = warpgroup_mma(ds_op, kmat, dq, is_async=True)  # dQ += dS K
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))
        mbarrier.arrive(k_empty.index(s))  # K read
    q_smem.index(WG).reshape([BM, D]).store((dq * sm_scale).to(desc_dq.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dq, [b, h, row0, 0], q_smem.index(WG))
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["H", "HKV", "NQ", "NK", "qk_scale", "sm_scale"])
def _attnscope_bwd_hopper_dq_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE2, DELTA, H, HKV, NQ, NK,
                                    qk_scale, sm_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                                    NWG: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """dQ of ``NWG x BM`` query rows of one (batch, query head) per CTA (heaviest causal tiles first)."""
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_q.block_type.shape[3]
    start_m = gl.program_id(0)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - start_m
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // HKV)
    row0 = start_m * (NWG * BM)
    n_tiles = _kv_range(row0, NWG * BM, NQ, NK, 0, BN, CAUSAL, 0)[1]

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [NWG] + desc_q.block_type.shape, desc_q.layout)
    do_smem = gl.allocate_shared_memory(desc_do.dtype, [NWG] + desc_do.block_type.shape, desc_do.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [NWG, 1], mbarrier.MBarrierLayout())
    do_bar = gl.allocate_shared_memory(gl.int64, [NWG, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(NWG):
        mbarrier.init(q_bar.index(w), count=1)
        mbarrier.init(do_bar.index(w), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=NWG)
        mbarrier.init(v_empty.index(s), count=NWG)
    fence_async_shared()

    gl.static_assert(NWG == 2, "two consumer warpgroups (CONFIGS)")
    gl.warp_specialize(
        [(_dq_consumer, (desc_dq, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                         v_ready, k_empty, v_empty, b, h, pid_bh, row0, n_tiles, NQ, NK, qk_scale, sm_scale,
                         BM, BN, D, STAGES, 0, CAUSAL)),
         (_dq_consumer, (desc_dq, LSE2, DELTA, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar, k_ready,
                         v_ready, k_empty, v_empty, b, h, pid_bh, row0, n_tiles, NQ, NK, qk_scale, sm_scale,
                         BM, BN, D, STAGES, 1, CAUSAL)),
         (_dq_producer, (desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_smem, v_smem, q_bar, do_bar,
                         k_ready, v_ready, k_empty, v_empty, b, h, hk, row0, n_tiles, BM, BN, STAGES, NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def kernel(name: str):
    """The Gluon kernel function of ``name`` ("dkdv" or "dq")."""
    return _attnscope_bwd_hopper_dkdv_kernel if name == "dkdv" else _attnscope_bwd_hopper_dq_kernel


def _blocks(d: int, name: str) -> dict:
    """Rows of each TMA descriptor's block."""
    cfg = config(d, name)
    if name == "dkdv":
        bnw = cfg.BN // cfg.NWG
        return {"desc_q": cfg.BM, "desc_k": bnw, "desc_v": bnw, "desc_do": cfg.BM, "desc_dk": bnw,
                "desc_dv": bnw}
    return {"desc_q": cfg.BM, "desc_k": cfg.BN, "desc_v": cfg.BN, "desc_do": cfg.BM, "desc_dq": cfg.BM}


#: Rows of the padded -LSE2 / qk_scale and Delta copies the dK/dV kernel reads by TMA: a multiple of every
#: ``BM`` (TMA also needs 16-byte row strides); the padding is -inf (P = 0) and 0.
ROW_PAD = 128


def _row_layout(bm: int):
    return gl.NVMMASharedLayout.get_default_for([1, 1, bm], gl.float32)  # one row: no swizzle


def signature(d: int, dtype: str, name: str = "dkdv"):
    """Signature of kernel ``name`` ("dkdv" or "dq") for ``triton.compile`` without a GPU (``dtype``
    "fp16"/"bf16"): resource reports (bench/sm90_resources.py --kernel bwd)."""
    def ds(rows):
        elem = gl.bfloat16 if dtype == "bf16" else gl.float16
        lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], elem)
        return f"tensordesc<{dtype}[1,1,{rows},{d}],{lay!r}>"

    if name == "dkdv":
        bm = config(d, name).BM
        rows = {n: f"tensordesc<fp32[1,1,{bm}],{_row_layout(bm)!r}>" for n in ("desc_lse", "desc_delta")}
    else:
        rows = {"LSE2": "*fp32", "DELTA": "*fp32"}
    return {**{n: ds(r) for n, r in _blocks(d, name).items()}, **rows,
            "H": "i32", "HKV": "i32", "NQ": "i32", "NK": "i32", "qk_scale": "fp32", "sm_scale": "fp32",
            **{n: "constexpr" for n in ("CAUSAL", "STAGES", "NWG", "CONSUMER_REGS", "num_warps")}}


def constexprs(d: int, causal: bool, name: str = "dkdv") -> dict:
    """The constexpr arguments of kernel ``name`` for head dim ``d``."""
    cfg = config(d, name)
    return {"CAUSAL": causal, "STAGES": cfg.STAGES, "NWG": cfg.NWG, "CONSUMER_REGS": CONSUMER_REGS,
            "num_warps": NUM_WARPS}


def _tma_ready(t):
    """``t`` itself when a TMA descriptor can address it (16-byte aligned base and non-unit strides, none 0),
    else a contiguous copy."""
    es = t.element_size()
    ok = t.data_ptr() % 16 == 0 and all(s > 0 and s * es % 16 == 0 for s in t.stride()[:-1])
    return t if ok else t.contiguous()


def launch(q, k, v, do, lse2, delta, dq, dk, dv, qk_scale: float, sm_scale: float, causal: bool):
    """dQ, dK and dV on checked inputs (kernels/bwd.py `flash_attention_backward` checks them and runs the
    preprocess); writes ``dq`` (contiguous [B, Hq, Nq, d]), ``dk``, ``dv`` (contiguous [B, Hkv, Nk, d]) in
    place: the dK/dV kernel, then the dQ kernel.

    ``lse2``: the forward's LSE x log2(e), contiguous float32 [B, Hq, Nq]; ``delta``: rowsum(dO * O)
    (minus dLSE), contiguous float32 [B, Hq, Nq]; ``qk_scale``: the softmax scale x log2(e). Each
    (kernel, d, dtype, causal) compiles once per process. Returns the two compiled kernels (``.n_regs``,
    ``.n_spills``, ``.metadata.shared``).
    """
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    tensors = {"desc_q": _tma_ready(q), "desc_k": _tma_ready(k), "desc_v": _tma_ready(v),
               "desc_do": _tma_ready(do), "desc_dk": dk, "desc_dv": dv, "desc_dq": dq}  # outputs: contiguous
    assert all(t.is_contiguous() for t in (dq, dk, dv)), "dq, dk, dv: expected fresh contiguous tensors"

    def descs(name):
        out = []
        for n, rows in _blocks(d, name).items():
            t = tensors[n]
            block = [1, 1, rows, d]
            out.append(TensorDescriptor(t, list(t.shape), list(t.stride()), block, _layout(block, t.dtype)))
        return out

    args = (Hq, Hkv, Nq, Nk, qk_scale, sm_scale)
    cfg = config(d, "dkdv")
    assert ROW_PAD % cfg.BM == 0, (ROW_PAD, cfg)
    n_pad = triton.cdiv(Nq, ROW_PAD) * ROW_PAD
    rows = []
    for t, pad in ((lse2 / -qk_scale, float("-inf")), (delta, 0.0)):  # the S^T, dP^T initial values
        padded = torch.full((B, Hq, n_pad), pad, dtype=torch.float32, device=q.device)
        padded[:, :, :Nq] = t
        rows.append(TensorDescriptor(padded, [B, Hq, n_pad], list(padded.stride()), [1, 1, cfg.BM],
                                     _row_layout(cfg.BM)))
    dkdv = _attnscope_bwd_hopper_dkdv_kernel[(triton.cdiv(Nk, cfg.BN), B * Hkv)](
        *descs("dkdv"), *rows, *args, **constexprs(d, causal, "dkdv"))
    cfg = config(d, "dq")
    dq_k = _attnscope_bwd_hopper_dq_kernel[(triton.cdiv(Nq, cfg.NWG * cfg.BM), B * Hq)](
        *descs("dq"), lse2, delta, *args, **constexprs(d, causal, "dq"))
    return dkdv, dq_k
