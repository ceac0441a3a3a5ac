"""Warp-split decode (``KEY_GROUPS``): each warp its own online softmax over its own keys of every tile.

    PYTHONPATH=src python bench/decode_warps.py [--json PATH] [--rounds 3] [--points grid|parity]
    env -u TRITON_INTERPRET PYTHONPATH=src python bench/decode_warps.py --census   # sm_90, no GPU

With ``KEY_GROUPS = 1`` the decode kernel (`attnscope.kernels.decode`) computes S = Q K^T on a [16 rows,
BLOCK_N keys] tile with its warps side by side along the keys: every tile's row max and row sum cross the
warps, and P goes through shared memory to become the A operand of O += P V (whose warps split d): 9
``bar.sync`` per 128-key tile in the sm_90 loop. With ``KEY_GROUPS = W`` the tile is [W groups, 16 rows,
BLOCK_N / W keys], one group per warp (a batched ``tl.dot``): each warp keeps its own running max, sum and
O over its keys, with no cross-warp traffic in the loop (2 ``bar.sync``: the copy wait and the buffer
reuse), and the W states are merged once after it. Same loads, programs, splits and fused merge.

Each variant is a `DecodePlan` ``_config`` (BLOCK_N / warps / stages / KEY_GROUPS), checked against float64
(sequence 0) and the shipped plan (every row), then timed in CUDA-graph replay beside the shipped plan,
``kv_read`` (the loads alone) and SDPA CUDNN, in interleaved rounds (ratio of medians to CUDNN).
``--census`` prints each variant's registers, spill bytes, shared memory and barriers (compiled for
sm_90 on any machine).
"""

import sys

import attnscope
from attnscope.kernels import decode as dec

sys.path.insert(0, __file__.rsplit("/", 1)[0])

# name: (BLOCK_N, warps, stages, KEY_GROUPS, OFF32); "shipped" is whatever the plan picks
VARIANTS = {"i64 128/4/3": (128, 4, 3, 1, False), "w4 128/4/3": (128, 4, 3, 4, True),
            "w4 128/4/4": (128, 4, 4, 4, True), "w4 64/4/4": (64, 4, 4, 4, True),
            "w4 128/4/3 i64": (128, 4, 3, 4, False)}
PARITY = [(1, 32, 32, 131072), (1, 32, 32, 32768), (16, 32, 8, 32768), (16, 32, 8, 131072)]
GRID = [(b, hq, hkv, L) for b, hq, hkv in [(1, 32, 32), (1, 32, 8), (16, 32, 8), (64, 32, 8), (64, 32, 32)]
        for L in (4096, 32768, 131072) if b * hkv * L * 128 * 4 <= 100 * 2**30]


def config(bn, warps, stages, groups, off32):
    return {"BLOCK_N": bn, "num_warps": warps, "STAGES": stages, "num_stages": stages, "KEY_GROUPS": groups,
            "OFF32": off32}


def census():
    """Registers, spills, shared memory and barriers of each variant (decode tile, G = 4, fused merge)."""
    from decode_resources import compile_, ptxas
    types = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SEQLENS": "*i32", "BT": "*i32", "O_PART": "*fp32",
             "LSE_PART": "*fp32", "O": "*bf16", "LSE": "*fp32", "SEM": "*i32", "qk_scale": "fp32"}
    shipped = dec._block_config(16)
    for name, (bn, w, st, g, off32) in {"shipped": (shipped["BLOCK_N"], shipped["num_warps"],
                                                    shipped["STAGES"], 1, True), **VARIANTS}.items():
        cx = dict(GROUP=4, BLOCK_M=16, HEAD_DIM=128, BLOCK_N=bn, STAGES=st, USE_DOT=True,
                  EMULATE_BF16=False, SPLIT=True, FUSE=True, MERGE_M=16, MERGE_S=8, WRITE_LSE=False,
                  HAS_SEQLENS=True, PAGED=False, PAGE_SIZE=16, CHUNK=False, KEY_GROUPS=g, OFF32=off32)
        c = compile_(dec._attnscope_decode_split_kernel, types, [n for n, t in types.items() if t[0] == "*"],
                     cx, w, st)
        regs, spill = ptxas(c)
        print(f"{name:12s} registers {regs}, spill stores {spill} B, shared {c.metadata.shared} B, "
              f"bar.sync in the PTX {c.asm['ptx'].count('bar.sync')}")


def main():
    if "--census" in sys.argv:
        return census()
    from decode import each_point, graph_of, reference_error  # noqa: E402
    from decode_fill import bench_parser, check_beside, print_ratios, time_beside_peers  # noqa: E402
    p = bench_parser(__doc__)
    p.add_argument("--points", choices=["grid", "parity"], default="grid")
    a = p.parse_args()

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        nbytes = 2 * k.numel() * k.element_size()
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = plan.num_splits
        ref = plan.run(q, k, v, lens)
        err, bound = reference_error(ref, q, k, v)
        if not err <= bound:
            sys.exit(f"{point} shipped: MISMATCH {err:.2e} > {bound:.2e}")
        graphs = {"shipped": graph_of(lambda: plan.run(q, k, v, lens))}
        for name, cfg in VARIANTS.items():
            vp = attnscope.decode_plan(q, k, v, lens, check_seqlens=False, num_splits=s, _config=config(*cfg))
            check_beside(vp.run(q, k, v, lens), ref, q, k, v, f"{point} {name}")
            graphs[name] = graph_of(lambda vp=vp: vp.run(q, k, v, lens))
        times, med = time_beside_peers(graphs, q, k, v, s, a.rounds)
        print_ratios(f"B{B} Hq{Hq} Hkv{Hkv} L{L} s{s}", nbytes, med)
        return {"point": list(point), "splits": s, "bytes": nbytes, "ms": times}
    each_point(PARITY if a.points == "parity" else GRID, measure, a.json)


if __name__ == "__main__":
    main()
