"""Does a balanced (stream-K) split that keeps all 132 SMs busy beat the even split at one-wave points?

    git checkout a0fbc72 && PYTHONPATH=src python bench/decode_balanced.py [--json PATH] [--rounds R] [--same]

Rejected (2026-12-01, bench/results/h200-2026-12-01-decode-balanced*): 132 balanced programs ran 0.95-0.97 x
the even split at every long point, and 128 balanced programs doing the even split's exact work 0.997 x. The
balanced path was removed after a0fbc72, where this script runs.

With fewer (batch, kv head) items than SMs the plan splits each item's keys evenly: B = 1, Hkv = 32 gets 4
splits, 128 programs, and 4 SMs idle (B = 16, Hkv = 8: 128 items, 1 split). The balanced split
(``_config["PROGRAMS"] = P``, kernels/decode.py) lays the items' key tiles end to end and gives each of P
programs the same number of tiles; a program crosses at most one item boundary, and the last program to
finish an item merges its partials. Measured ceiling (2026-12-01, bench/decode_fill.py): +0.3-0.7 % from
132 vs 128 programs of equal work. Each variant is checked against float64, then timed (CUDA-graph replay,
interleaved rounds) beside ``kv_read`` and SDPA CUDNN at the decode grid points with fewer items than SMs.
bf16, d = 128, one query token.
"""

import sys

import attnscope
from attnscope.kernels.decode.heuristics import _block_config

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import GRID, LENS, each_point  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402

# name: block config (None: the plan's own, even split)
VARIANTS = {
    "ship": None,
    "bal132": {**_block_config(16, 0), "PROGRAMS": 132},
    "bal264": {**_block_config(16, 0), "PROGRAMS": 264},
    "bal396 128/4/2": {"BLOCK_N": 128, "num_warps": 4, "STAGES": 2, "num_stages": 2, "PROGRAMS": 396},
}


# --same: 128 balanced programs do exactly the even split's work at these points (the code's own cost)
SAME = {"ship": None, "bal128": {**_block_config(16, 0), "PROGRAMS": 128},
        "bal132": {**_block_config(16, 0), "PROGRAMS": 132}}


def main():
    p = bench_parser(__doc__)
    p.add_argument("--same", action="store_true", help="SAME at two 128-item L = 128k points")
    a = p.parse_args()
    variants = SAME if a.same else VARIANTS
    points = [(1, 32, 32, 131072), (16, 32, 8, 131072)] if a.same else [
        (B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS if B * Hkv < 132]

    def measure(point, q, k, v, lens):
        base = attnscope.decode_plan(q, k, v, lens, check_seqlens=False).num_splits
        plans = {name: attnscope.decode_plan(q, k, v, lens, check_seqlens=False, _config=config)
                 for name, config in variants.items()}
        graphs = plan_graphs(point, q, k, v, lens, plans, runs=2)
        return time_point(point, graphs, q, k, v, base, a.rounds,
                          slots={name: plan.num_splits for name, plan in plans.items()})

    each_point(points, measure, a.json)


if __name__ == "__main__":
    main()
