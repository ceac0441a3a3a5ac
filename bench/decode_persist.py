"""A persistent decode kernel for many (batch, kv head) items: does one flat pipelined loop beat a CTA grid?

    PYTHONPATH=src python bench/decode_persist.py [--json PATH] [--rounds 3]

At B = 64 the portable decode kernel launches one CTA per (batch, kv head) — 512 or 2,048 of them, 4–16
waves on 132 SMs — and each CTA pays its software pipeline's fill and drain. Here one CTA per SM walks
its items (``item = pid + i * P``) in ONE loop over (item, key block): the loads of the next item's first
blocks are issued while the current item finishes, and the item's output is stored (masked) and its
online-softmax state reset at its last block. An experiment: dense caches whose sequences are all full
(no ``cache_seqlens``), Nq = 1, no split. Checked against float64 (sequence 0) and against the portable
kernel (every row), then timed in CUDA-graph replay beside the portable plan, kv_read and SDPA CUDNN.
"""

import math
import sys

import torch
import triton
import triton.language as tl

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import each_point, graph_of  # noqa: E402
from decode_fill import bench_parser, check_beside, print_ratios, time_beside_peers  # noqa: E402

POINTS = [(64, 32, 8, 4096), (64, 32, 32, 4096), (16, 32, 8, 4096), (64, 32, 8, 32768), (16, 32, 8, 32768)]


@triton.jit
def _persist_kernel(Q, K, V, O, n_items, n_kv_heads, L, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, qk_scale, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                    D: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    n_blocks = tl.cdiv(L, BLOCK_N)
    my_items = tl.cdiv(n_items - pid, P)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = offs_m < GROUP
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for t in tl.range(0, my_items * n_blocks, num_stages=STAGES):
        item = pid + (t // n_blocks) * P
        j = t % n_blocks
        b = (item // n_kv_heads).to(tl.int64)
        h = (item % n_kv_heads).to(tl.int64)
        q = tl.load(Q + b * stride_qb + (h * GROUP + offs_m)[:, None] * stride_qh + offs_d[None, :],
                    mask=m_mask[:, None], other=0.0)
        rows = j * BLOCK_N + offs_n
        n_mask = rows < L
        r64 = rows[:, None].to(tl.int64)
        k = tl.load(K + b * stride_kb + h * stride_kh + r64 * stride_kn + offs_d[None, :],
                    mask=n_mask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * stride_vb + h * stride_vh + r64 * stride_vn + offs_d[None, :],
                    mask=n_mask[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
        last = j == n_blocks - 1
        o = acc / l_i[:, None]
        out_rows = item * GROUP + offs_m  # rows (b * Hq + h * G + g) of O [B Hq, d]
        tl.store(O + out_rows[:, None].to(tl.int64) * D + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=m_mask[:, None] & last)
        m_i = tl.where(last, float("-inf"), m_i)
        l_i = tl.where(last, 0.0, l_i)
        acc = tl.where(last, 0.0, acc)


def runner(q, k, v, programs, block_n=128, stages=3, warps=4):
    B, Hq, _, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    o = torch.empty_like(q)
    qk_scale = d ** -0.5 * math.log2(math.e)

    def run():
        _persist_kernel[(programs,)](
            q, k, v, o, B * Hkv, Hkv, L, q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), qk_scale, GROUP=G,
            BLOCK_M=max(16, triton.next_power_of_2(G)), D=d, BLOCK_N=block_n, STAGES=stages, num_warps=warps,
            num_stages=stages)
        return o
    return run


def main():
    p = bench_parser(__doc__)
    a = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        nbytes = 2 * k.numel() * k.element_size()
        plan = attnscope.decode_plan(q, k, v, None, check_seqlens=False)
        ref = plan.run(q, k, v)
        graphs = {f"portable s={plan.num_splits}": graph_of(lambda: plan.run(q, k, v))}
        for programs in (sms, 2 * sms):
            for stages in (3, 4):
                run = runner(q, k, v, programs, stages=stages)
                what = f"B={B} Hkv={Hkv} L={L} persist P={programs} stages={stages}"
                check_beside(run(), ref, q, k, v, what)
                graphs[f"persist P={programs} st={stages}"] = graph_of(run)
        times, med = time_beside_peers(graphs, q, k, v, 1, a.rounds)
        print_ratios(f"B={B:2d} Hkv={Hkv:2d} L={L:6d}", nbytes, med)
        return {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "bytes": nbytes, "ms": times}
    each_point(POINTS, measure, a.json)


if __name__ == "__main__":
    main()
