"""FlashAttention backward for Hopper (sm_90) in Gluon: the dK/dV pass with FlashAttention-3's structure.

Algorithm: the backward of FlashAttention-2 (Dao, arXiv:2307.08691, Algorithm 2) scheduled as in
FlashAttention-3 (Shah et al., arXiv:2407.08608, §3 and its backward): a CTA owns one K/V tile of ``BN``
keys of one (batch, kv head) and loops over the query tiles of every query head of its GQA group, so dK and
dV are summed over the group in registers and written once (no atomics). Partitions (`gl.warp_specialize`):

- producer (1 warp, ``PRODUCER_REGS`` after `setmaxnreg`): TMA loads of the K and V tile (once, ``kv_bar``),
  then the Q and dO tiles into a ``STAGES``-deep shared-memory ring; ``q_ready`` (TMA byte count) hands a
  slot to the consumers, ``q_empty`` (NWG arrivals) hands it back.
- NWG = 2 consumer warpgroups (4 warps each), warpgroup ``w`` owning keys ``[w BN/NWG, (w+1) BN/NWG)`` of
  the tile. Per query tile: ``S^T = K Q^T`` and ``dP^T = V dO^T`` issued together as asynchronous
  `warpgroup_mma` (K, V, Q, dO in shared memory, fp32 accumulators in registers); once S^T is done,
  ``P^T = exp2(S^T scale log2 e - LSE2)`` from the forward's LSE (no running max) and ``dV += P^T dO``
  issued under the dP^T product; then ``dS^T = P^T (dP^T - Delta)`` and ``dK += dS^T Q`` (P^T and dS^T
  are the register A operands, rounded to the input dtype). LSE2 and Delta rows are plain loads.

dQ is kernels/bwd.py's separate pass (``_bwd_dq_kernel``) and Delta = rowsum(dO * O) its preprocess, so
the whole Hopper backward is deterministic (no atomics anywhere).

Causal, bottom-right (key c visible to row r iff ``c <= r + Nk - Nq``): `_q_range` skips query tiles wholly
above the tile's diagonal, masks those that straddle it (and every query tile of the ragged last K/V tile)
and runs the rest without mask arithmetic. Ragged N: TMA reads zeros past Nq / Nk; rows past Nq load
LSE2 = +inf (P = 0), keys past Nk are masked and never stored; rows with no visible key (LSE = -inf) give 0.
Score mods: sinks need nothing here (the LSE includes them; their gradient is torch on D and LSE); window and
softcap are not built (`supports`): kernels/bwd.py refuses them for ``impl="hopper"``.
Layout: 4-D TMA descriptors ``[B, H, N, d]`` over the caller's strides; dK, dV contiguous [B, Hkv, Nk, d].
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

from attnscope.kernels.fwd_hopper import NUM_WARPS, PRODUCER_REGS, _layout, wgmma_layout  # noqa: E402

#: setmaxnreg of the consumer warpgroup that is a worker partition (the other is the default partition)
CONSUMER_REGS = 240


class BwdConfig(NamedTuple):
    """One block configuration of the dK/dV kernel: a CTA owns ``BN`` keys, ``BN / NWG`` per warpgroup."""

    BM: int  # query rows per Q/dO tile (the N of S^T = K Q^T)
    BN: int  # keys per K/V tile (per CTA)
    STAGES: int  # depth of the Q/dO ring
    NWG: int = 2  # consumer warpgroups


#: Per head dim. Registers per consumer thread: dK + dV accumulators (BN/NWG x d fp32 each) + S^T and dP^T
#: (BN/NWG x BM fp32 each): d = 128 with 64-row Q tiles and d = 64 with 128-row tiles both hold 192 fp32
#: accumulator registers under the 240 of `CONSUMER_REGS`. Shared memory: 2 BN d (K, V) + STAGES 2 BM d
#: (Q, dO) elements (bench/sm90_resources.py --kernel bwd prints the compiled numbers).
CONFIGS = {128: BwdConfig(64, 128, 2), 64: BwdConfig(64, 128, 2)}


def config(d: int) -> BwdConfig:
    """The block configuration for head dim ``d`` (NotImplementedError if not built for it)."""
    if d not in CONFIGS:
        raise NotImplementedError(f"Hopper backward: head_dim {d} is not supported; supported: "
                                  f"{sorted(CONFIGS)}")
    return CONFIGS[d]


def supports(d: int, windowed: bool, softcap: float) -> bool:
    """Whether the kernel is built for head dim ``d`` with these score mods (sinks need no kernel support)."""
    return d in CONFIGS and not windowed and not softcap > 0


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
def _producer(desc_q, desc_k, desc_v, desc_do, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, q_empty,
              b, hk, group, start_n, lo, n_m, BM: gl.constexpr, BNW: gl.constexpr, STAGES: gl.constexpr,
              NWG: gl.constexpr):
    """K and V of the tile once, then (Q, dO) per query tile in the consumers' order: the group's heads,
    each from query tile ``lo`` on."""
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
        mbarrier.expect(q_ready.index(s), desc_q.block_type.nbytes + desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, m * BM, 0], q_ready.index(s), q_smem.index(s))
        tma.async_copy_global_to_shared(desc_do, [b, h, m * BM, 0], q_ready.index(s), do_smem.index(s))


@gluon.jit
def _step(dk, dv, kmat, vmat, q_smem, do_smem, q_ready, q_empty, it, m, masked, row_base, offs_n, LSE2, DELTA,
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
    offs_m = m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))  # query rows: S^T's columns
    row_ok = offs_m < NQ
    # LSE2, Delta and the mask enter as the accumulators' initial values (no registers of their own across
    # the MMAs): S^T - LSE2 / qk_scale (-inf past Nq and where masked: P = 0) and dP^T - Delta
    lse2 = gl.load(LSE2 + row_base + offs_m, mask=row_ok, other=float("inf"))
    init = gl.zeros([BNW, BM], gl.float32, s_layout) - (lse2 / qk_scale)[None, :]
    if masked:  # rows with no visible key (LSE = -inf: causal with Nq > Nk) are masked by the diagonal
        keep = offs_n[:, None] < NK
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :] + (NK - NQ))
        init = gl.where(keep, init, float("-inf"))
    st_tok = warpgroup_mma(kmat, q.permute((1, 0)), init, is_async=True)  # S^T = K Q^T (+ init)
    delta = gl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
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
def _consumer(desc_dk, desc_dv, LSE2, DELTA, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, q_empty, b, hk,
              H, HKV, group, start_n, lo, hi, n_m, NQ, NK, qk_scale, sm_scale, BM: gl.constexpr,
              BNW: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
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
        row_base = (b * H + hk * group + i // n) * NQ
        dk, dv = _step(dk, dv, kmat, vmat, q_smem, do_smem, q_ready, q_empty, i, m, m < hi, row_base, offs_n,
                       LSE2, DELTA, NQ, NK, qk_scale, s_layout, a_layout, BM, BNW, D, STAGES, CAUSAL)
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
def _attnscope_bwd_hopper_dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE2, DELTA, H, HKV,
                                      NQ, NK, qk_scale, sm_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                                      NWG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
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
        [(_consumer, (desc_dk, desc_dv, LSE2, DELTA, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                      q_empty, b, hk, H, HKV, group, start_n, lo, hi, n_m, NQ, NK, qk_scale, sm_scale, BM,
                      BNW, D, STAGES, 0, CAUSAL)),
         (_consumer, (desc_dk, desc_dv, LSE2, DELTA, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                      q_empty, b, hk, H, HKV, group, start_n, lo, hi, n_m, NQ, NK, qk_scale, sm_scale, BM,
                      BNW, D, STAGES, 1, CAUSAL)),
         (_producer, (desc_q, desc_k, desc_v, desc_do, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                      q_empty, b, hk, group, start_n, lo, n_m, BM, BNW, STAGES, NWG))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def signature(d: int, dtype: str):
    """Signature of the dK/dV kernel for ``triton.compile`` without a GPU (``dtype`` "fp16"/"bf16"):
    resource reports (bench/sm90_resources.py --kernel bwd)."""
    cfg = config(d)

    def ds(rows):
        elem = gl.bfloat16 if dtype == "bf16" else gl.float16
        lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], elem)
        return f"tensordesc<{dtype}[1,1,{rows},{d}],{lay!r}>"

    return {"desc_q": ds(cfg.BM), "desc_k": ds(cfg.BN // cfg.NWG), "desc_v": ds(cfg.BN // cfg.NWG),
            "desc_do": ds(cfg.BM), "desc_dk": ds(cfg.BN // cfg.NWG), "desc_dv": ds(cfg.BN // cfg.NWG),
            "LSE2": "*fp32", "DELTA": "*fp32",
            "H": "i32", "HKV": "i32", "NQ": "i32", "NK": "i32", "qk_scale": "fp32", "sm_scale": "fp32",
            **{n: "constexpr" for n in ("CAUSAL", "STAGES", "NWG", "CONSUMER_REGS", "num_warps")}}


def constexprs(d: int, causal: bool) -> dict:
    """The constexpr arguments of the dK/dV kernel for head dim ``d``."""
    cfg = config(d)
    return {"CAUSAL": causal, "STAGES": cfg.STAGES, "NWG": cfg.NWG, "CONSUMER_REGS": CONSUMER_REGS,
            "num_warps": NUM_WARPS}


def _tma_ready(t):
    """``t`` itself when a TMA descriptor can address it (16-byte aligned base and non-unit strides, none 0),
    else a contiguous copy."""
    es = t.element_size()
    ok = t.data_ptr() % 16 == 0 and all(s > 0 and s * es % 16 == 0 for s in t.stride()[:-1])
    return t if ok else t.contiguous()


def launch(q, k, v, do, lse2, delta, dk, dv, qk_scale: float, sm_scale: float, causal: bool):
    """dK and dV on checked inputs (kernels/bwd.py `flash_attention_backward` checks them and runs the
    preprocess and the dQ pass); writes ``dk``, ``dv`` (contiguous [B, Hkv, Nk, d]) in place.

    ``lse2``: the forward's LSE x log2(e), contiguous float32 [B, Hq, Nq]; ``delta``: rowsum(dO * O)
    (minus dLSE), contiguous float32 [B, Hq, Nq]; ``qk_scale``: the softmax scale x log2(e). Each
    (d, dtype, causal) compiles once per process. Returns the compiled kernel (``.n_regs``, ``.n_spills``,
    ``.metadata.shared``).
    """
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cfg = config(d)

    def desc(t, rows):
        t = _tma_ready(t)
        block = [1, 1, rows, d]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block, _layout(block, t.dtype))

    bnw = cfg.BN // cfg.NWG
    return _attnscope_bwd_hopper_dkdv_kernel[(triton.cdiv(Nk, cfg.BN), B * Hkv)](
        desc(q, cfg.BM), desc(k, bnw), desc(v, bnw), desc(do, cfg.BM), desc(dk, bnw), desc(dv, bnw), lse2,
        delta, Hq, Hkv, Nq, Nk, qk_scale, sm_scale, **constexprs(d, causal))
