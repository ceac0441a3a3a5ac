"""An experimental Gluon decode kernel beside the portable one and SDPA CUDNN, CUDA-graph replay.

    PYTHONPATH=src python bench/decode_hopper.py [--json PATH] [--rounds 3] [--points all|parity]

At each point (bf16, d = 128, one query token, dense cache, every length L) each Gluon config (BLOCK_N /
STAGES) runs with the split count the portable plan picks and the portable merge kernel. Each output is
checked first: sequence 0 against float64 (2 x SDPA's error + 1e-3), every row against the portable
kernel (within 2 % of its largest |value|). Then CUDA-graph replays of all of them, CUDNN's graph and
``kv_read`` (bench/decode_fill.py: the loads alone) are timed in ``--rounds`` interleaved rounds;
printed: K/V TB/s of the median and the ratio to CUDNN's median.

The kernel (not shipped: slower than the portable kernel at every point timed, BENCHMARKS.md):

The same algorithm as `attnscope.kernels.decode` (Flash-Decoding: program (batch x kv head, split) streams
one contiguous chunk of keys through the online softmax; the splits are merged by the logsumexp), on a
dense cache ``[B, Hkv, L_max, d]`` with one new query per sequence. What differs is who issues the loads.
The portable kernel's warps issue their own ``cp.async`` copies between their arithmetic, so each
iteration's softmax delays the next copies; at the bandwidth ceiling that costs 1–4 % against the same
loads without arithmetic (bench/decode_fill.py). Here (`gl.warp_specialize`):

- producer (1 warp, `PRODUCER_REGS` registers): TMA loads of the G query rows, then of K and V tiles into
  a ``STAGES``-deep shared-memory ring; ``ready`` mbarriers (TMA byte counts) hand a slot over, ``empty``
  (one arrival) hands it back after O += P V has read it.
- consumer (one warpgroup): S = Q K^T and O += P V with `warpgroup_mma` on a 64-row tile whose first G rows
  are the kv head's query heads (the rest are other heads' rows or TMA's zeros: computed, never stored),
  base-2 online softmax, keys past the sequence's length masked.

Partials go to the portable kernel's buffers (O_s fp32 [R, S, d], base-2 lse_s [R, S]) and its separate
merge kernel; with one split the final O and LSE are written directly.
"""

import math
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

import attnscope
from attnscope.kernels import decode as dec
from attnscope.kernels.fwd_hopper import wgmma_layout

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, each_point, graph_of  # noqa: E402
from decode_fill import bench_parser, check_beside, print_ratios, time_beside_peers  # noqa: E402

PRODUCER_REGS = gl.constexpr(24)
BM = 64  # query rows of the wgmma tile (G <= 64 used)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, ready, empty, b, hk, q_row, t0, n_tiles,
              BN: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(q_bar.index(0), desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [b, q_row, 0], q_bar.index(0), q_smem.index(0))
    for i in range(n_tiles):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
        mbarrier.expect(ready.index(s), desc_k.block_type.nbytes + desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [b, hk, (t0 + i) * BN, 0], ready.index(s), k_smem.index(s))
        tma.async_copy_global_to_shared(desc_v, [b, hk, (t0 + i) * BN, 0], ready.index(s), v_smem.index(s))


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_bar, ready, empty, O_PART, LSE_PART, O, LSE, out_row0, group, hi, t0,
              n_tiles, split, num_splits, qk_scale, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
              SPLIT: gl.constexpr, WRITE_LSE: gl.constexpr):
    s_layout: gl.constexpr = wgmma_layout(BN)
    o_layout: gl.constexpr = wgmma_layout(D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    m_i = gl.full([64], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([64], gl.float32, row_layout)
    acc = gl.zeros([64, D], gl.float32, o_layout)
    q = q_smem.index(0).reshape([64, D])
    mbarrier.wait(q_bar.index(0), 0)
    for i in range(n_tiles):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        kmat = k_smem.index(s).reshape([BN, D]).permute((1, 0))
        s_tok = warpgroup_mma(q, kmat, gl.zeros([64, BN], gl.float32, s_layout), use_acc=False, is_async=True)
        sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        offs_n = (t0 + i) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        sc = gl.where(offs_n[None, :] < hi, sc * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        m_new = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: p = 0, not NaN
        p = gl.exp2(sc - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(s).reshape([BN, D]), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        mbarrier.arrive(empty.index(s))

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    lse2 = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(l_safe))  # base 2; -inf: no key
    offs_r = gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    rows = (out_row0 + offs_r).to(gl.int64)
    ok = offs_r < group
    lse_r = gl.convert_layout(lse2, gl.SliceLayout(1, o_layout))
    if SPLIT:
        part = rows * num_splits + split
        gl.store(O_PART + part[:, None] * D + offs_d[None, :], o, mask=ok[:, None])
        gl.store(LSE_PART + part, lse_r, mask=ok)
    else:
        gl.store(O + rows[:, None] * D + offs_d[None, :], o.to(O.dtype.element_ty), mask=ok[:, None])
        if WRITE_LSE:
            gl.store(LSE + rows, lse_r * LN2, mask=ok)


@gluon.jit(do_not_specialize=["n_kv_heads", "l_max", "num_splits", "qk_scale"])
def _attnscope_decode_hopper_kernel(desc_q, desc_k, desc_v, SEQLENS, O_PART, LSE_PART, O, LSE, n_kv_heads,
                                    l_max, num_splits, qk_scale, GROUP: gl.constexpr, STAGES: gl.constexpr,
                                    HAS_SEQLENS: gl.constexpr, SPLIT: gl.constexpr, WRITE_LSE: gl.constexpr,
                                    num_warps: gl.constexpr):
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_k.block_type.shape[3]
    pid = gl.program_id(0)  # b * Hkv + kv head
    split = gl.program_id(1)
    b = pid // n_kv_heads
    hk = pid % n_kv_heads
    seqlen = l_max
    if HAS_SEQLENS:
        seqlen = gl.load(SEQLENS + b)
    per = gl.cdiv(gl.cdiv(seqlen, BN), num_splits)  # tiles per split
    t0 = split * per
    n_tiles = gl.maximum(gl.minimum(per, gl.cdiv(seqlen, BN) - t0), 0)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [1] + desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar.index(0), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    out_row0 = pid * GROUP  # rows (b * Hq + h) of O for h = hk * G ..: the kv head's query heads
    gl.warp_specialize(
        [(_consumer, (q_smem, k_smem, v_smem, q_bar, ready, empty, O_PART, LSE_PART, O, LSE, out_row0, GROUP,
                      seqlen, t0, n_tiles, split, num_splits, qk_scale, BN, D, STAGES, SPLIT, WRITE_LSE)),
         (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, ready, empty, b, hk, hk * GROUP,
                      t0, n_tiles, BN, STAGES))],
        [1], [PRODUCER_REGS])


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def launch(q, k, v, cache_seqlens, num_splits: int, qk_scale: float, o_part, lse_part, o, lse, *, block_n=128,
           stages=3, return_lse=False):
    """Phase 1 on a dense cache (checked by the caller): q [B, Hq, 1, d], k/v [B, Hkv, L_max, d] (unit last
    stride, 16-byte aligned strides), ``o`` [B, Hq, 1, d] contiguous, ``lse`` [B, Hq, 1] fp32. With
    ``num_splits > 1`` writes the partials ``o_part`` [B Hq, S, d], ``lse_part`` [B Hq, S] (fp32, base 2)
    for `attnscope.kernels.decode`'s merge kernel. ``qk_scale``: the softmax scale times log2 e."""
    B, Hq, _, d = q.shape
    Hkv, L_max = k.shape[1], k.shape[2]
    q3 = q[:, :, 0, :]
    desc_q = TensorDescriptor(q3, list(q3.shape), list(q3.stride()), [1, BM, d], _layout([1, BM, d], q.dtype))

    def desc(t):
        block = [1, 1, block_n, d]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block, _layout(block, t.dtype))

    split = num_splits > 1
    return _attnscope_decode_hopper_kernel[(B * Hkv, num_splits)](
        desc_q, desc(k), desc(v), cache_seqlens if cache_seqlens is not None else o, o_part if split else o,
        lse_part if split else o, o, lse, Hkv, L_max, num_splits, qk_scale, GROUP=Hq // Hkv, STAGES=stages,
        HAS_SEQLENS=cache_seqlens is not None, SPLIT=split, WRITE_LSE=return_lse, num_warps=4)


SMALL = [(1, 32, 32, 4096), (1, 32, 8, 4096), (1, 32, 8, 32768), (64, 32, 8, 4096), (16, 32, 8, 4096),
         (1, 32, 8, 131072), (64, 32, 8, 32768)]
CONFIGS = [(128, 3), (64, 6), (64, 4), (128, 2)]


def split_buffers(q, splits):
    """(o, lse, o_part, lse_part, combine) for an experimental phase 1 with ``splits`` splits: the outputs,
    the partials in the portable kernel's layout, and ``combine()``, its separate merge (nothing when 1)."""
    B, Hq, _, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B * Hq, device=q.device, dtype=torch.float32)
    o_part = torch.empty(B * Hq, splits, d, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(B * Hq, splits, device=q.device, dtype=torch.float32)

    def combine():
        if splits > 1:
            dec._attnscope_decode_combine_kernel[(B * Hq,)](
                o_part, lse_part, o, lse, splits, HEAD_DIM=d, BLOCK_S=min(16, triton.next_power_of_2(splits)),
                EMULATE_BF16=False)
    return o, lse, o_part, lse_part, combine


def gluon_runner(q, k, v, lens, splits, block_n, stages):
    o, lse, o_part, lse_part, combine = split_buffers(q, splits)
    qk_scale = q.shape[-1] ** -0.5 * math.log2(math.e)

    def run():
        launch(q, k, v, lens, splits, qk_scale, o_part, lse_part, o, lse, block_n=block_n, stages=stages)
        combine()
        return o
    return run


def main():
    p = bench_parser(__doc__)
    p.add_argument("--points", choices=("all", "parity"), default="all")
    a = p.parse_args()

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        nbytes = 2 * k.numel() * k.element_size()
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        ref = plan.run(q, k, v, lens)
        graphs = {"portable": graph_of(lambda: plan.run(q, k, v, lens))}
        for bn, st in CONFIGS:
            run = gluon_runner(q, k, v, lens, s, bn, st)
            check_beside(run(), ref, q, k, v, f"B={B} Hkv={Hkv} L={L} gluon {bn}/{st}")
            graphs[f"gluon {bn}/{st}"] = graph_of(run)
        times, med = time_beside_peers(graphs, q, k, v, s, a.rounds)
        print_ratios(f"B={B:2d} Hkv={Hkv:2d} L={L:6d} s={s:2d}", nbytes, med)
        return {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "splits": s, "bytes": nbytes, "ms": times}
    each_point(PARITY + (SMALL if a.points == "all" else []), measure, a.json)


if __name__ == "__main__":
    main()
