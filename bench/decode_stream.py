"""How far could a balanced, staggered decode go: every SM busy, no pipeline refill at item boundaries?

    PYTHONPATH=src python bench/decode_stream.py [--json PATH] [--rounds 3] [--points all|parity]

At B 16, Hkv 8 (and B 1, Hkv 32 with 4 splits) the shipped plan runs 128 programs, so 4 of the H200's 132
SMs idle; 132 programs of equal work stream 0.3-0.7 % faster (bench/decode_fill.py). The Triton balanced
split built to use them (tenth session) lost 3 %: a program crossing an item boundary drained its pipeline
and filled it again. Here (Gluon, the staggered copies of bench/decode_stagger.py) the items' key tiles are
laid end to end and program p of P streams tiles [p W / P, (p + 1) W / P) of the W; its TMA copies run
ahead across an item boundary like any other tile, and at a boundary the program writes that item's
partial (unnormalised by nothing: O_s and base-2 lse_s, fp32) into slot ``p - (first program of the
item)``, resets its softmax state and goes on; the next item's query rows were copied in at the previous
segment's start. This probe stops there: the partials are merged on the host for the float64 check and
the timed kernel does no merge (a fused merge would add the last program's merge of an item's 2-3
partials). Every sequence is at full length and L a multiple of the tile. Timed beside the shipped plan,
the even-split staggered kernel (128/2/2), ``kv_read`` and SDPA CUDNN (CUDA-graph replay, interleaved).

Measured (fourteenth session, bench/results/h200-2026-12-01-s14-decode-stream.*): 264 programs of one K and
one V buffer ran 1.009-1.131 x CUDNN at 13 points on a machine where the portable kernel ran 0.983-0.989 at
the parity points. With a real merge in the kernel the margin went (bench/decode_impls.py).
"""

import math
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, POINTS, each_point, graph_of, reference_error  # noqa: E402
from decode_fill import bench_parser, check_beside, plan_graphs, time_point  # noqa: E402
from decode_stagger import BR, stagger_runner, tma_descriptors  # noqa: E402


@gluon.jit
def _copy_tile(desc, smem, bar, g, T, n_kv_heads, BN: gl.constexpr, pred):
    item = g // T
    coord = [item // n_kv_heads, item % n_kv_heads, (g - item * T) * BN, 0]
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, coord, bar, smem, pred=pred)


@gluon.jit
def _copy_q(desc_q, smem, bar, item, n_kv_heads, GROUP: gl.constexpr, pred):
    mbarrier.expect(bar, desc_q.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc_q, [item // n_kv_heads, (item % n_kv_heads) * GROUP, 0], bar, smem,
                                    pred=pred)


@gluon.jit(do_not_specialize=["n_kv_heads", "T", "W", "P", "S_MAX", "qk_scale"])
def _decode_stream_kernel(desc_q, desc_k, desc_v, O_PART, LSE_PART, n_kv_heads, T, W, P, S_MAX, qk_scale,
                          GROUP: gl.constexpr, NK: gl.constexpr, NV: gl.constexpr, num_warps: gl.constexpr):
    BN: gl.constexpr = desc_k.block_type.shape[2]
    D: gl.constexpr = desc_k.block_type.shape[3]
    p = gl.program_id(0)
    lo = (p * W) // P
    hi = ((p + 1) * W) // P
    n = hi - lo

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [NK] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [NV] + desc_v.block_type.shape, desc_v.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BR], desc_k.dtype)
    p_smem = gl.allocate_shared_memory(desc_k.dtype, [BN, BR], p_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [NK, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [NV, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(q_bar.index(s), count=1)
    for s in gl.static_range(NK):
        mbarrier.init(k_bar.index(s), count=1)
    for s in gl.static_range(NV):
        mbarrier.init(v_bar.index(s), count=1)
    fence_async_shared()
    gl.thread_barrier()

    _copy_q(desc_q, q_smem.index(0), q_bar.index(0), lo // T, n_kv_heads, GROUP, n > 0)
    for s in gl.static_range(NK):
        _copy_tile(desc_k, k_smem.index(s), k_bar.index(s), lo + s, T, n_kv_heads, BN, s < n)
    for s in gl.static_range(NV):
        _copy_tile(desc_v, v_smem.index(s), v_bar.index(s), lo + s, T, n_kv_heads, BN, s < n)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BR, 16])
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    offs_r = gl.arange(0, BR, layout=col)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BR], float("-inf"), gl.float32, col)
    l_i = gl.zeros([BR], gl.float32, col)
    acc = gl.zeros([D, BR], gl.float32, s_layout)
    j = 0  # segments begun
    for i in range(n):
        g = lo + i
        item = g // T
        t = g - item * T
        if (i == 0) | (t == 0):  # a segment starts: its Q is in slot j % 2; the next one's goes to the other
            mbarrier.wait(q_bar.index(j % 2), (j // 2) & 1)
            _copy_q(desc_q, q_smem.index((j + 1) % 2), q_bar.index((j + 1) % 2), item + 1, n_kv_heads, GROUP,
                    (item + 1) * T < hi)
        qt = q_smem.index(j % 2).reshape([BR, D]).permute((1, 0))
        sk = i % NK
        mbarrier.wait(k_bar.index(sk), (i // NK) & 1)
        tok = warpgroup_mma(k_smem.index(sk).reshape([BN, D]), qt, gl.zeros([BN, BR], gl.float32, s_layout),
                            use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        gl.thread_barrier()
        _copy_tile(desc_k, k_smem.index(sk), k_bar.index(sk), g + NK, T, n_kv_heads, BN, i + NK < n)
        st = st * qk_scale
        m_new = gl.maximum(m_i, gl.max(st, axis=0))
        pt = gl.exp2(st - m_new[None, :])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(pt, axis=0)
        m_i = m_new
        acc = acc * alpha[None, :]
        p_smem.store(pt.to(desc_k.dtype))
        fence_async_shared()
        sv = i % NV
        mbarrier.wait(v_bar.index(sv), (i // NV) & 1)
        tok = warpgroup_mma(v_smem.index(sv).reshape([BN, D]).permute((1, 0)), p_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        gl.thread_barrier()
        _copy_tile(desc_v, v_smem.index(sv), v_bar.index(sv), g + NV, T, n_kv_heads, BN, i + NV < n)
        if (i == n - 1) | (t == T - 1):  # the segment ends: its partial into the item's slot of this program
            first = ((item * T + 1) * P - 1) // W  # program of the item's first tile
            rows = (item * GROUP + offs_r).to(gl.int64)
            part = rows * S_MAX + (p - first)
            ok = offs_r < GROUP
            gl.store(O_PART + part[None, :] * D + offs_d[:, None], acc / l_i[None, :], mask=ok[None, :])
            gl.store(LSE_PART + part, m_i + gl.log2(l_i), mask=ok)
            m_i = gl.full([BR], float("-inf"), gl.float32, col)
            l_i = gl.zeros([BR], gl.float32, col)
            acc = gl.zeros([D, BR], gl.float32, s_layout)
            j += 1


def first_program(g, P, W):
    return ((g + 1) * P - 1) // W


def stream_runner(q, k, v, programs, nk, nv, block_n=128):
    """(run, merged): ``run`` launches the kernel; ``merged()`` merges the partials on the host."""
    B, Hq, _, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    assert L % block_n == 0 and BR.value >= G
    items, T = B * Hkv, L // block_n
    W = items * T
    P = min(programs, W)
    s_max = max(first_program(i * T + T - 1, P, W) - first_program(i * T, P, W) + 1 for i in range(items))
    o_part = torch.zeros(items * G, s_max, d, device=q.device, dtype=torch.float32)
    lse_part = torch.full((items * G, s_max), float("-inf"), device=q.device, dtype=torch.float32)
    qk_scale = d ** -0.5 * math.log2(math.e)
    desc_q, dk, dv = tma_descriptors(q, k, v, block_n)

    def run():
        _decode_stream_kernel[(P,)](desc_q, dk, dv, o_part, lse_part, Hkv, T, W, P, s_max, qk_scale, GROUP=G,
                                    NK=nk, NV=nv, num_warps=4)

    def merged():
        lse = lse_part.double()
        w = torch.exp2(lse - lse.amax(1, keepdim=True))
        o = (o_part.double() * w[..., None]).sum(1) / w.sum(1)[:, None]
        return o.view(B, Hq, 1, d)
    return run, merged, s_max, P


OTHERS = [p for p in POINTS if p not in PARITY]
CONFIGS = [(132, 2, 2), (132, 1, 1), (264, 1, 1)]  # programs, NK, NV


def main():
    p = bench_parser(__doc__)
    p.add_argument("--points", choices=("all", "parity"), default="all")
    a = p.parse_args()

    def measure(point, q, k, v, lens):
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        graphs = plan_graphs(point, q, k, v, lens, {"shipped": plan}, runs=1)
        ref = plan.run(q, k, v, lens)
        run = stagger_runner(q, k, v, s, 128, 2, 2)
        check_beside(run(), ref, q, k, v, f"{point} stagger 128/2/2")
        graphs["stagger 128/2/2"] = graph_of(run)
        row = {}
        for progs, nk, nv in CONFIGS:
            run, merged, s_max, P = stream_runner(q, k, v, progs, nk, nv)
            name = f"stream {P}/{nk}/{nv}"
            run()
            o = merged()
            err, bound = reference_error(o, q, k, v)
            diff = (o - ref.double()).abs().max().item() / ref.double().abs().max().item()
            if not (err <= bound and diff <= 2e-2):
                print(f"{point} {name}: MISMATCH err {err:.2e} (bound {bound:.2e}), diff {diff:.2e}",
                      flush=True)
                continue
            row[name] = {"partials_per_item": s_max}
            graphs[name] = graph_of(run)
        return time_point(point, graphs, q, k, v, s, a.rounds, splits=s, stream=row)
    each_point(PARITY + (OTHERS if a.points == "all" else []), measure, a.json)


if __name__ == "__main__":
    main()
