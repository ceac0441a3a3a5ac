"""Decode with cuDNN's load schedule: K and V copies staggered around the arithmetic (Gluon, experimental).

    PYTHONPATH=src python bench/decode_stagger.py [--json PATH] [--rounds 3] [--points all|parity]

ncu at B 16, Hkv 8, L 32k (bench/gpu/ncu_decode2.sh) shows cuDNN's decode kernel (sm80 wmma, 16 x 128 x 128
tile) with 86 KiB of shared memory per CTA: room for about one K and one V tile, so at most a tile or two
of copies in flight, against the shipped kernel's 136 KiB (Triton's pipeliner issues tile i + 2's K and V
together after tile i's arithmetic). cuDNN still matches or beats the shipped kernel at the 128-program
points. This kernel copies cuDNN's (FlashAttention-2's) order instead, in one warpgroup without warp
specialisation, with TMA copies and ``NK`` K / ``NV`` V buffers:

    wait K_i;  S^T = K_i Q^T (wgmma);  K_i's buffer is free: copy K_{i + NK};
    softmax;   wait V_i;  O^T += V_i^T P^T (wgmma);  V_i's buffer is free: copy V_{i + NV}

The MMAs are transposed (keys, then d, as wgmma's M = 128; the 16 query rows, G of them real, its N), so no
64-row query tile wastes work (the earlier Gluon decode, bench/decode_hopper.py, padded G to 64 rows).
Splits as the shipped plan picks them, merged by the portable combine kernel. Each config is checked
against float64 (sequence 0) and the shipped kernel (every row) first, then timed beside the shipped
plan, ``kv_read`` and SDPA CUDNN (CUDA-graph replay, ``--rounds`` interleaved rounds). bf16, d = 128,
one query token, dense cache, every sequence at full length.

Measured (fourteenth session, bench/results/h200-2026-12-01-s14-decode-stagger{,2}.*): 128/1/1 and 128/2/2
ran 0.999-1.015 x CUDNN at the four 128-program points, 0.1-0.6 % above the portable kernel in the same run;
at B 64 128/1/1 lost (0.92-0.95: three 74 KiB programs share an SM). Not shipped on its own.
"""

import math
import sys

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

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, POINTS, each_point, graph_of  # noqa: E402
from decode_fill import bench_parser, check_beside, plan_graphs, time_point  # noqa: E402
from decode_hopper import _layout, split_buffers  # noqa: E402

#: query rows per program: wgmma's N (the kv head's G rows, then other heads' or TMA's zeros)
BR = gl.constexpr(16)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def _copy(desc, smem, bar, b, hk, tile, BN: gl.constexpr, pred):
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, hk, tile * BN, 0], bar, smem, pred=pred)


@gluon.jit(do_not_specialize=["n_kv_heads", "l_max", "num_splits", "qk_scale"])
def _decode_stagger_kernel(desc_q, desc_k, desc_v, O_PART, LSE_PART, O, LSE, n_kv_heads, l_max, num_splits,
                           qk_scale, GROUP: gl.constexpr, NK: gl.constexpr, NV: gl.constexpr,
                           SPLIT: gl.constexpr, num_warps: gl.constexpr):
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_k.block_type.shape[3]
    pid = gl.program_id(0)  # b * Hkv + kv head
    split = gl.program_id(1)
    b = pid // n_kv_heads
    hk = pid % n_kv_heads
    seqlen = l_max
    per = gl.cdiv(gl.cdiv(seqlen, BN), num_splits)  # tiles per split
    t0 = split * per
    n_tiles = gl.maximum(gl.minimum(per, gl.cdiv(seqlen, BN) - t0), 0)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [1] + desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [NK] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [NV] + desc_v.block_type.shape, desc_v.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BR], desc_k.dtype)
    p_smem = gl.allocate_shared_memory(desc_k.dtype, [BN, BR], p_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [NK, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [NV, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar.index(0), count=1)
    for s in gl.static_range(NK):
        mbarrier.init(k_bar.index(s), count=1)
    for s in gl.static_range(NV):
        mbarrier.init(v_bar.index(s), count=1)
    fence_async_shared()
    gl.thread_barrier()  # every warp sees the initialised barriers before it waits on one

    mbarrier.expect(q_bar.index(0), desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [b, hk * GROUP, 0], q_bar.index(0), q_smem.index(0))
    for s in gl.static_range(NK):
        _copy(desc_k, k_smem.index(s), k_bar.index(s), b, hk, t0 + s, BN, s < n_tiles)
    for s in gl.static_range(NV):
        _copy(desc_v, v_smem.index(s), v_bar.index(s), b, hk, t0 + s, BN, s < n_tiles)

    # S^T [BN, BR] and O^T [D, BR]: one warpgroup on the 128 rows (keys, then d)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BR, 16])
    col: gl.constexpr = gl.SliceLayout(0, s_layout)  # [BR] per query row
    m_i = gl.full([BR], float("-inf"), gl.float32, col)
    l_i = gl.zeros([BR], gl.float32, col)
    acc = gl.zeros([D, BR], gl.float32, s_layout)
    qt = q_smem.index(0).reshape([BR, D]).permute((1, 0))  # [D, BR]: wgmma's B, K-major
    mbarrier.wait(q_bar.index(0), 0)
    hi = seqlen
    for i in range(n_tiles):
        sk = i % NK
        mbarrier.wait(k_bar.index(sk), (i // NK) & 1)
        kmat = k_smem.index(sk).reshape([BN, D])
        tok = warpgroup_mma(kmat, qt, gl.zeros([BN, BR], gl.float32, s_layout), use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        gl.thread_barrier()  # every warp's share of the MMA has read K_i before TMA overwrites it
        _copy(desc_k, k_smem.index(sk), k_bar.index(sk), b, hk, t0 + i + NK, BN, i + NK < n_tiles)
        offs_n = (t0 + i) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
        st = gl.where(offs_n[:, None] < hi, st * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(st, axis=0))
        m_new = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: p = 0, not NaN
        p = gl.exp2(st - m_new[None, :])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=0)
        m_i = m_new
        acc = acc * alpha[None, :]
        p_smem.store(p.to(desc_k.dtype))
        fence_async_shared()
        sv = i % NV
        mbarrier.wait(v_bar.index(sv), (i // NV) & 1)
        vt = v_smem.index(sv).reshape([BN, D]).permute((1, 0))  # [D, BN]: wgmma's A, M-major
        tok = warpgroup_mma(vt, p_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        gl.thread_barrier()  # likewise V_i
        _copy(desc_v, v_smem.index(sv), v_bar.index(sv), b, hk, t0 + i + NV, BN, i + NV < n_tiles)

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[None, :]  # [D, BR]
    lse2 = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(l_safe))  # base 2; -inf: no key
    offs_r = gl.arange(0, BR, layout=col)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(1, s_layout))
    rows = (pid * GROUP + offs_r).to(gl.int64)  # rows b * Hq + h of O for h = hk * G ..
    ok = offs_r < GROUP
    if SPLIT:
        part = rows * num_splits + split
        gl.store(O_PART + part[None, :] * D + offs_d[:, None], o, mask=ok[None, :])
        gl.store(LSE_PART + part, lse2, mask=ok)
    else:
        gl.store(O + rows[None, :] * D + offs_d[:, None], o.to(O.dtype.element_ty), mask=ok[None, :])


def tma_descriptors(q, k, v, block_n):
    """TMA descriptors of q's rows ([B, Hq, d], blocks of `BR` heads) and of K / V ([B, Hkv, L, d], blocks of
    ``block_n`` keys)."""
    d = q.shape[-1]
    q3 = q[:, :, 0, :]
    block_q = [1, BR.value, d]
    desc_q = TensorDescriptor(q3, list(q3.shape), list(q3.stride()), block_q, _layout(block_q, q.dtype))
    block = [1, 1, block_n, d]
    dk, dv = (TensorDescriptor(t, list(t.shape), list(t.stride()), block, _layout(block, t.dtype))
              for t in (k, v))
    return desc_q, dk, dv


def stagger_runner(q, k, v, splits, block_n, nk, nv):
    """A function running the kernel (and the combine when split) on q [B, Hq, 1, d], k/v [B, Hkv, L, d]."""
    B, Hq, _, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    o, lse, o_part, lse_part, combine = split_buffers(q, splits)
    qk_scale = d ** -0.5 * math.log2(math.e)
    desc_q, dk, dv = tma_descriptors(q, k, v, block_n)
    split = splits > 1

    def run():
        _decode_stagger_kernel[(B * Hkv, splits)](
            desc_q, dk, dv, o_part if split else o, lse_part if split else o, o, lse, Hkv, L, splits,
            qk_scale, GROUP=Hq // Hkv, NK=nk, NV=nv, SPLIT=split, num_warps=4)
        combine()
        return o
    return run


OTHERS = [p for p in POINTS if p not in PARITY]
#: (BN, NK, NV[, split multiple])
CONFIGS = [(128, 1, 1), (128, 2, 1), (128, 2, 2), (128, 3, 3), (64, 2, 2), (64, 4, 4)]


def main():
    p = bench_parser(__doc__)
    p.add_argument("--points", choices=("all", "parity"), default="all")
    p.add_argument("--configs", default=None, help="e.g. 128/1/1,128/1/1/2 (BN/NK/NV[/split multiple])")
    a = p.parse_args()
    configs = CONFIGS if not a.configs else [tuple(map(int, c.split("/"))) for c in a.configs.split(",")]

    def measure(point, q, k, v, lens):
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        graphs = plan_graphs(point, q, k, v, lens, {"shipped": plan}, runs=1)
        ref = plan.run(q, k, v, lens)
        for bn, nk, nv, *more in configs:
            times = more[0] if more else 1
            name = f"stagger {bn}/{nk}/{nv}" + (f" x{times}" if times > 1 else "")
            run = stagger_runner(q, k, v, s * times, bn, nk, nv)
            try:
                check_beside(run(), ref, q, k, v, f"{point} {name}")
            except SystemExit as e:  # a config that fails its check is reported and left out, never timed
                print(e, flush=True)
                continue
            graphs[name] = graph_of(run)
        return time_point(point, graphs, q, k, v, s, a.rounds, splits=s)
    each_point(PARITY + (OTHERS if a.points == "all" else []), measure, a.json)


if __name__ == "__main__":
    main()
