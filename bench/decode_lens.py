"""What does reading ``cache_seqlens`` cost decode? The same kernel with and without lengths, at the grid.

    PYTHONPATH=src python bench/decode_lens.py [--json PATH] [--rounds R]

With ``cache_seqlens`` each program loads its sequence's length before it can compute its key range, so its
first K/V copies wait one more memory round trip; without lengths (every sequence L_max long, what SDPA is
given) the range is known at launch. Both plans are checked against float64, then timed (CUDA-graph replay,
interleaved rounds) beside ``kv_read`` and SDPA CUDNN at the decode grid of bench/decode.py. bf16, d = 128,
one query token.
"""

import sys

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import GRID, LENS, each_point  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402

BUDGET = 100 * 2**30


def main():
    a = bench_parser(__doc__).parse_args()
    points = [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS if 2 * B * Hkv * L * 128 * 2 <= BUDGET]

    def measure(point, q, k, v, lens):
        plans = {"lens": attnscope.decode_plan(q, k, v, lens, check_seqlens=False),
                 "no lens": attnscope.decode_plan(q, k, v, check_seqlens=False)}
        splits = plans["lens"].num_splits
        assert plans["no lens"].num_splits == splits
        return time_point(point, plan_graphs(point, q, k, v, lens, plans), q, k, v, splits, a.rounds,
                          splits=splits)

    each_point(points, measure, a.json)


if __name__ == "__main__":
    main()
