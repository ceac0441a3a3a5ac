"""FlashAttention forward for Hopper (sm_90) in Gluon: EXPERIMENTAL, compiled but not yet run on a GPU.

Algorithm: the online softmax of FlashAttention-2 (Dao, arXiv:2307.08691, Algorithm 1) with the
producer/consumer structure of FlashAttention-3 (Shah et al., arXiv:2407.08608, §3.1): a producer
partition of one warp (few registers, `gl.warp_specialize`'s ``worker_num_regs``) issues TMA copies of
K and V tiles into a ``STAGES``-deep shared-memory ring, signalling ``k_ready``/``v_ready`` mbarriers;
the consumer (default partition, two warpgroups = 8 warps, 64 query rows each of a 128-row tile) runs
S = Q K^T and O += P V on the tensor cores with `warpgroup_mma`, the base-2 online softmax in registers
(log2 e folded into the scale), and releases each ring slot through ``kv_empty``. Not yet in it (FA-3
§3.1-3.2): ping-pong scheduling between the two warpgroups and overlapping the softmax of one tile with
the next tile's QK^T.

Contract as `attnscope.kernels.fwd` (GQA, ragged N, bottom-right causal with Nq != Nk, empty rows 0 and
LSE -inf, LSE output, fp16/bf16, d 64/128, strided inputs through host-built 4-D TMA descriptors
``[B, H, N, d]``). Dispatch: `fwd.flash_attention(impl="hopper")` only; ``impl="auto"`` uses it for the
variants listed in `fwd.HOPPER_VALIDATED` (none until measured on the GPU).
"""

from __future__ import annotations

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

BLOCK_M = 128  # query rows per CTA: two consumer warpgroups x 64 rows
NUM_WARPS = 8  # the consumer (default) partition
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


def config(d: int):
    """(BLOCK_N, STAGES) per head dim: shared memory Q + STAGES x (K + V) tiles + O staging."""
    return (64, 3) if d == 128 else (128, 3)


@gluon.jit
def _kv_bounds(start_m, NQ, NK, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """``[0, lo)`` unmasked, ``[lo, hi)`` masked, rest skipped: the same closed form as fwd._kv_bounds."""
    hi = NK
    full = NK
    if CAUSAL:
        r_first = gl.maximum(start_m * BM + 1 + (NK - NQ), 0)
        r_last = gl.maximum(gl.minimum(start_m * BM + BM, NQ) + (NK - NQ), 0)
        hi = gl.minimum(gl.cdiv(r_last, BN) * BN, NK)
        full = (r_first // BN) * BN
    lo = gl.minimum(full, (NK // BN) * BN)
    return lo, hi


@gluon.jit
def _producer(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, kv_empty, b, hk, hi,
              BN: gl.constexpr, STAGES: gl.constexpr):
    n_tiles = gl.cdiv(hi, BN)
    for i in range(n_tiles):
        s = i % STAGES
        ph = (i // STAGES) & 1
        mbarrier.wait(kv_empty.index(s), ph ^ 1)  # a fresh barrier passes parity 1 at once
        mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [b, hk, i * BN, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [b, hk, i * BN, 0], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _tile(i, acc, l_i, m_i, q2, k_smem, v_smem, k_ready, v_ready, kv_empty, offs_m, qk_scale, NQ, NK,
          s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr,
          BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
          MASKED: gl.constexpr, CAUSAL: gl.constexpr):
    s_idx = i % STAGES
    ph = (i // STAGES) & 1
    mbarrier.wait(k_ready.index(s_idx), ph)
    kt = k_smem.index(s_idx).reshape([BN, D]).permute((1, 0))
    s = warpgroup_mma(q2, kt, gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    if MASKED:
        offs_n = i * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        keep = offs_n[None, :] < NK
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))
        s = gl.where(keep, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_new = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    m_i = m_new
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
    mbarrier.wait(v_ready.index(s_idx), ph)
    acc = warpgroup_mma(p_op, v_smem.index(s_idx).reshape([BN, D]), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(kv_empty.index(s_idx), count=1)
    return acc, l_i, m_i


@gluon.jit
def _consumer(desc_q, desc_o, LSE, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, v_ready, kv_empty,
              b, h, pid_bh, start_m, lo, hi, NQ, NK, qk_scale,
              BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, num_warps: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    offs_m = start_m * BM + gl.arange(0, BM, layout=row_layout)
    m_i = gl.full([BM], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BM], gl.float32, row_layout)
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)
    q2 = q_smem.reshape([BM, D])

    n_lo = lo // BN
    for i in range(0, n_lo):  # tiles every row sees whole: no mask
        acc, l_i, m_i = _tile(i, acc, l_i, m_i, q2, k_smem, v_smem, k_ready, v_ready, kv_empty, offs_m,
                              qk_scale, NQ, NK, s_layout, p_layout, o_layout, BM, BN, D, STAGES,
                              False, CAUSAL)
    for i in range(n_lo, gl.cdiv(hi, BN)):  # diagonal and ragged tiles: masked before the max
        acc, l_i, m_i = _tile(i, acc, l_i, m_i, q2, k_smem, v_smem, k_ready, v_ready, kv_empty, offs_m,
                              qk_scale, NQ, NK, s_layout, p_layout, o_layout, BM, BN, D, STAGES,
                              True, CAUSAL)

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    o_smem.reshape([BM, D]).store(o.to(desc_o.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_o, [b, h, start_m * BM, 0], o_smem)
    tma.store_wait(pendings=0)
    if STORE_LSE:
        lse = m_i * LN2 + gl.log(l_i)
        gl.store(LSE + pid_bh * NQ + offs_m, lse, mask=offs_m < NQ)


@gluon.jit
def _attnscope_fwd_hopper_kernel(desc_q, desc_k, desc_v, desc_o, LSE, H, HKV, NQ, NK, qk_scale,
                                 CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr,
                                 num_warps: gl.constexpr):
    BM: gl.constexpr = desc_q.block_type.shape[2]
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_q.block_type.shape[3]
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    start_m = pid_m
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - pid_m  # heaviest query tiles first
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // HKV)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, desc_q.block_type.shape, desc_q.layout)
    o_smem = gl.allocate_shared_memory(desc_o.dtype, desc_o.block_type.shape, desc_o.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=1)
    fence_async_shared()
    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [b, h, start_m * BM, 0], q_bar, q_smem)

    lo, hi = _kv_bounds(start_m, NQ, NK, BM, BN, CAUSAL)
    gl.warp_specialize(
        [(_consumer, (desc_q, desc_o, LSE, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, v_ready, kv_empty,
                      b, h, pid_bh, start_m, lo, hi, NQ, NK, qk_scale, BM, BN, D, STAGES, CAUSAL, STORE_LSE,
                      num_warps)),
         (_producer, (desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, kv_empty, b, hk, hi, BN, STAGES))],
        [1], [24])


def signature(d: int, dtype: str):
    """Signature for ``triton.compile`` without a GPU (``dtype`` "fp16"/"bf16"): resource reports."""
    bn, _ = config(d)

    def ds(rows):
        elem = gl.bfloat16 if dtype == "bf16" else gl.float16
        lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], elem)
        return f"tensordesc<{dtype}[1,1,{rows},{d}],{lay!r}>"

    return {"desc_q": ds(BLOCK_M), "desc_k": ds(bn), "desc_v": ds(bn), "desc_o": ds(BLOCK_M), "LSE": "*fp32",
            "H": "i32", "HKV": "i32", "NQ": "i32", "NK": "i32", "qk_scale": "fp32", "CAUSAL": "constexpr",
            "STORE_LSE": "constexpr", "STAGES": "constexpr", "num_warps": "constexpr"}


def constexprs(d: int, causal: bool, return_lse: bool):
    return {"CAUSAL": causal, "STORE_LSE": return_lse, "STAGES": config(d)[1], "num_warps": NUM_WARPS}


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def launch(q, k, v, o, lse, qk_scale: float, causal: bool, return_lse: bool):
    """Launch on checked inputs (fwd.launch checks them); writes ``o`` and ``lse`` in place."""
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bn, _ = config(d)

    def desc(t, rows):
        block = [1, 1, rows, d]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block, _layout(block, t.dtype))

    return _attnscope_fwd_hopper_kernel[(triton.cdiv(Nq, BLOCK_M), B * Hq)](
        desc(q, BLOCK_M), desc(k, bn), desc(v, bn), desc(o, BLOCK_M), lse, Hq, Hkv, Nq, Nk, qk_scale,
        **constexprs(d, causal, return_lse))
