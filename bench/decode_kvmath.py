"""Where do decode's last 1-2 % against its own loads go: the arithmetic, or the rest of the kernel?

    PYTHONPATH=src python bench/decode_kvmath.py [--json PATH] [--rounds 3]

``kv_read`` (bench/decode_fill.py) is decode's loads without its arithmetic: the same programs, split
boundaries, 128-key tiles and 3 stages, but addresses ``base + start * d + offsets`` with the row stride a
constant, no clamped rows, and one number stored per program. At the 128-program points it streams 0.6-1.7 %
faster than the shipped kernel. ``kv_math`` below is ``kv_read``'s loop with decode's whole online softmax
in it (S = Q K^T, the base-2 running max and sum, O += P V with ``tl.dot``), on a contiguous dense cache
whose length divides into whole tiles, one query per sequence; each program writes its unnormalised
partial and running max / sum (fp32), which the host merges to check against float64. If ``kv_math`` runs
at ``kv_read``'s speed, the shipped kernel loses its 1-2 % outside the arithmetic (addresses, clamping,
epilogue); if at the shipped kernel's speed, to the arithmetic itself. Timed beside the shipped plan,
``kv_read`` and SDPA CUDNN (CUDA-graph replay, ``--rounds`` interleaved rounds).

Measured (fourteenth session, bench/results/h200-2026-12-01-s14-decode-kvmath.*): at B 16 ``kv_math`` ran
exactly at the shipped kernel's speed (4.332 and 4.464 TB/s both), so the arithmetic, not the addressing.
"""

import math
import sys

import torch
import triton
import triton.language as tl

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, each_point, graph_of, reference_error  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402


@triton.jit
def _kv_math(Q, K, V, O_PART, M_PART, L_PART, L, num_splits, qk_scale, GROUP: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, STAGES: tl.constexpr):
    head, split = tl.program_id(0), tl.program_id(1)  # head: b * Hkv + kv head
    per = tl.cdiv(tl.cdiv(L, BLOCK_N), num_splits) * BLOCK_N
    lo = split * per
    hi = tl.minimum(lo + per, L)
    offs = tl.arange(0, BLOCK_N)[:, None] * D + tl.arange(0, D)[None, :]
    base = head.to(tl.int64) * L * D
    rows = tl.arange(0, BLOCK_M)
    q = tl.load(Q + (head * GROUP + rows)[:, None] * D + tl.arange(0, D)[None, :], mask=rows[:, None] < GROUP,
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        k = tl.load(K + base + start * D + offs)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base + start * D + offs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    out = (head * num_splits + split) * BLOCK_M + rows
    tl.store(O_PART + out[:, None] * D + tl.arange(0, D)[None, :], acc)
    tl.store(M_PART + out, m_i)
    tl.store(L_PART + out, l_i)


def kv_math_runner(q, k, v, splits):
    B, Hq, _, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    bm = max(16, triton.next_power_of_2(G))
    o_part = torch.empty(B * Hkv * splits * bm, d, device="cuda")
    m_part = torch.empty(B * Hkv * splits * bm, device="cuda")
    l_part = torch.empty_like(m_part)
    qk_scale = d ** -0.5 * math.log2(math.e)

    def run():
        _kv_math[(B * Hkv, splits)](q, k, v, o_part, m_part, l_part, L, splits, qk_scale, GROUP=G, BLOCK_M=bm,
                                    BLOCK_N=128, D=d, STAGES=3, num_warps=4)

    def result():  # the host merge of the partials: [B, Hq, 1, d]
        o = o_part.view(B, Hkv, splits, bm, d)[:, :, :, :G].double()
        m = m_part.view(B, Hkv, splits, bm)[:, :, :, :G].double()
        lsum = l_part.view(B, Hkv, splits, bm)[:, :, :, :G].double()
        w = torch.exp2(m - m.amax(2, keepdim=True))
        out = (o * w[..., None]).sum(2) / (lsum * w).sum(2)[..., None]
        return out.reshape(B, Hq, 1, d)
    return run, result


POINTS = PARITY + [(64, 32, 8, 32768)]  # and a point with four waves of programs


def main():
    p = bench_parser(__doc__)
    a = p.parse_args()

    def measure(point, q, k, v, lens):
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        graphs = plan_graphs(point, q, k, v, lens, {"shipped": plan}, runs=2)
        run, result = kv_math_runner(q, k, v, s)
        run()
        err, bound = reference_error(result(), q, k, v)
        if not err <= bound:
            sys.exit(f"{point} kv_math: MISMATCH {err:.2e} > {bound:.2e}")
        graphs["kv_math"] = graph_of(run)
        return time_point(point, graphs, q, k, v, s, a.rounds, splits=s)
    each_point(POINTS, measure, a.json)


if __name__ == "__main__":
    main()
