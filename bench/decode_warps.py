"""Warp-split decode: each warp runs its own online softmax over its own keys of every tile. Faster?

    PYTHONPATH=src python bench/decode_warps.py [--json PATH] [--rounds 3]
    env -u TRITON_INTERPRET PYTHONPATH=src python bench/decode_warps.py --ptx   # sm_90 loop census, no GPU

The portable decode kernel (`attnscope.kernels.decode`) computes S = Q K^T on a [16 rows, 128 keys] tile
with its 4 warps side by side along the keys. Every tile then needs cross-warp reductions (the row max,
the row sum) and P goes through shared memory to become the A operand of O += P V, whose warps split d:
9 ``bar.sync`` per 128-key tile in its sm_90 loop. Here the tile is [W groups, 16 rows, 128 / W keys] and
each warp owns one group (a batched ``tl.dot``): its own running max, sum and O accumulator over the keys
it holds, no cross-warp traffic inside the loop; the W states are merged once at the end (the logsumexp
merge, as between splits). Same loads, same programs and splits as the portable plan.

Experiment only: dense cache, one query, every sequence full. Checked against float64 (sequence 0) and
against the portable kernel (every row), then timed in CUDA-graph replay beside the portable plan,
kv_read and SDPA CUDNN (interleaved rounds; ratio of medians to CUDNN).
"""

import sys

import torch
import triton
import triton.language as tl

import attnscope
from attnscope.kernels import decode as dec

sys.path.insert(0, __file__.rsplit("/", 1)[0])


@triton.jit
def _warpsplit_kernel(Q, K, V, O_PART, LSE_PART, O, L, n_kv_heads, num_splits, qk_scale,
                      stride_kb, stride_kh, stride_kn, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                      D: tl.constexpr, BLOCK_N: tl.constexpr, W: tl.constexpr, STAGES: tl.constexpr,
                      SPLIT: tl.constexpr):
    KW: tl.constexpr = BLOCK_N // W  # keys per warp group per tile
    pid = tl.program_id(0)  # b * Hkv + kv head
    split = tl.program_id(1)
    b = (pid // n_kv_heads).to(tl.int64)
    h = (pid % n_kv_heads).to(tl.int64)
    per = tl.cdiv(tl.cdiv(L, BLOCK_N), num_splits) * BLOCK_N
    lo = split * per
    hi = tl.minimum(lo + per, L)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    m_mask = offs_m < GROUP
    q = tl.load(Q + ((b * n_kv_heads + h) * GROUP + offs_m)[:, None] * D + offs_d[None, :],
                mask=m_mask[:, None], other=0.0)  # [BLOCK_M, D]
    q3 = tl.broadcast_to(q[None, :, :], (W, BLOCK_M, D))
    g3 = tl.arange(0, W)[:, None, None]
    j3 = tl.arange(0, KW)[None, :, None]
    d3 = tl.arange(0, D)[None, None, :]
    key3 = g3 * KW + j3  # [W, KW, 1] key offset in the tile
    keyrow = (tl.arange(0, W)[:, None] * KW + tl.arange(0, KW)[None, :])[:, None, :]  # [W, 1, KW]
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_kb + h * stride_kh
    m_i = tl.full([W, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([W, BLOCK_M], tl.float32)
    acc = tl.zeros([W, BLOCK_M, D], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        rows = start + key3
        ok = rows < hi
        off = rows.to(tl.int64) * stride_kn + d3
        k = tl.load(k_base + off, mask=ok, other=0.0)  # [W, KW, D]
        s = tl.dot(q3, tl.trans(k, (0, 2, 1))) * qk_scale  # [W, BLOCK_M, KW]
        s = tl.where(start + keyrow < hi, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, :, None])
        l_i = l_i * alpha + tl.sum(p, 2)
        v = tl.load(v_base + off, mask=ok, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, :, None])
        m_i = m_new
    # merge the W warp states (base 2): the logsumexp merge over the group axis
    m = tl.max(m_i, 0)  # [BLOCK_M]
    m_s = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(m_i - m_s[None, :])  # [W, BLOCK_M]; 0 for an empty group
    l = tl.sum(l_i * w, 0)
    o = tl.sum(acc * w[:, :, None], 0)  # [BLOCK_M, D]
    l_safe = tl.where(l == 0.0, 1.0, l)
    o = o / l_safe[:, None]
    lse2 = tl.where(l == 0.0, float("-inf"), m_s + tl.log2(l_safe))
    out_rows = (b * n_kv_heads + h) * GROUP + offs_m
    if SPLIT:
        part = out_rows * num_splits + split
        tl.store(O_PART + part[:, None] * D + offs_d[None, :], o, mask=m_mask[:, None])
        tl.store(LSE_PART + part, lse2, mask=m_mask)
    else:
        tl.store(O + out_rows[:, None] * D + offs_d[None, :], o.to(O.dtype.element_ty), mask=m_mask[:, None])


def runner(q, k, v, splits, *, block_n=128, warps=4, stages=3):
    """A graph-capturable closure: phase 1 (+ the portable combine kernel when ``splits > 1``)."""
    B, Hq, _, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    o = torch.empty_like(q)
    o_part = torch.empty(B * Hq, splits, d, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(B * Hq, splits, device=q.device, dtype=torch.float32)
    lse = torch.empty(B * Hq, device=q.device, dtype=torch.float32)
    qk_scale = d ** -0.5 * 1.4426950408889634
    assert k.is_contiguous() and v.is_contiguous() and q.is_contiguous()

    def run():
        _warpsplit_kernel[(B * Hkv, splits)](
            q, k, v, o_part, lse_part, o, L, Hkv, splits, qk_scale, k.stride(0), k.stride(1), k.stride(2),
            GROUP=G, BLOCK_M=max(16, triton.next_power_of_2(G)), D=d, BLOCK_N=block_n, W=warps,
            STAGES=stages, SPLIT=splits > 1, num_warps=warps, num_stages=stages)
        if splits > 1:
            dec._attnscope_decode_combine_kernel[(B * Hq,)](o_part, lse_part, o, lse, splits, HEAD_DIM=d,
                                                            BLOCK_S=triton.next_power_of_2(min(splits, 16)),
                                                            EMULATE_BF16=False)
        return o
    return run


POINTS = [(1, 32, 32, 131072), (1, 32, 32, 32768), (16, 32, 8, 32768), (16, 32, 8, 131072),
          (64, 32, 8, 4096), (64, 32, 32, 4096), (1, 32, 8, 32768), (1, 32, 32, 4096)]
# keys / warps / stages / x the plan's splits
CONFIGS = [(128, 4, 3, 1), (128, 8, 3, 1), (64, 4, 4, 1), (128, 4, 4, 1), (64, 4, 4, 2)]


def ptx_census():
    """Compile for sm_90 on this machine and count the loop's barriers, MMAs and exponentials."""
    import inspect
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(inspect.signature(_warpsplit_kernel.fn).parameters)
    ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O_PART": "*fp32", "LSE_PART": "*fp32", "O": "*bf16",
            "qk_scale": "fp32"}
    for bn, w, st, _ in CONFIGS:
        cx = dict(GROUP=4, BLOCK_M=16, D=128, BLOCK_N=bn, W=w, STAGES=st, SPLIT=True)
        sig = {n: "constexpr" if n in cx else ptrs.get(n, "i32") for n in names}
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if n in ("Q", "K", "V", "O_PART", "LSE_PART", "O", "stride_kb", "stride_kh", "stride_kn")}
        c = triton.compile(ASTSource(_warpsplit_kernel, sig, constexprs=cx, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": w, "num_stages": st})
        ptx = c.asm["ptx"]
        loops = re.split(r"\n\$L__BB0_\d+:", ptx)
        body = max(loops, key=lambda s: s.count("mma.sync"))
        counts = {key: body.count(key) for key in ("bar.sync", "mma.sync", "ex2.approx", "cp.async.cg",
                                                   "ldmatrix", "shfl.sync")}
        print(f"{bn}/{w}/{st}: smem {c.metadata.shared} B, loop {counts}")


def main():
    if "--ptx" in sys.argv:
        return ptx_census()
    from decode import each_point, graph_of, reference_error  # noqa: E402
    from decode_fill import bench_parser, check_beside, print_ratios, time_beside_peers  # noqa: E402
    a = bench_parser(__doc__).parse_args()

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        nbytes = 2 * k.numel() * k.element_size()
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        ref = plan.run(q, k, v, lens)
        err, bound = reference_error(ref, q, k, v)
        if not err <= bound:
            sys.exit(f"{point} portable: MISMATCH {err:.2e} > {bound:.2e}")
        graphs = {"portable": graph_of(lambda: plan.run(q, k, v, lens))}
        for bn, w, st, x in CONFIGS:
            run = runner(q, k, v, s * x, block_n=bn, warps=w, stages=st)
            check_beside(run(), ref, q, k, v, f"{point} warps {bn}/{w}/{st} x{x}")
            graphs[f"ws{bn}/{w}/{st}" + (f"x{x}" if x > 1 else "")] = graph_of(run)
        times, med = time_beside_peers(graphs, q, k, v, s, a.rounds)
        print_ratios(f"B{B} Hq{Hq} Hkv{Hkv} L{L} s{s}", nbytes, med)
        return {"point": list(point), "splits": s, "bytes": nbytes, "ms": times}
    each_point(POINTS, measure, a.json)


if __name__ == "__main__":
    main()
