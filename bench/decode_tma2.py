"""Decode K/V tiles through in-kernel TMA descriptors, against the shipped pointer loads, at the decode grid.

    git checkout d6f4881 && PYTHONPATH=src python bench/decode_tma2.py [--json PATH] [--rounds R]

Rejected (14:05 UTC 2026-12-01, bench/results/h200-2026-12-01-decode-tma2.*): no better than the pointer loads
at the points where those tie with CUDNN, 1-8 % slower at short caches. The knob was removed after d6f4881.

Branch r14e (2026-12-01, 05:17 UTC; BENCHMARKS.md "Decode K/V loads through TMA") was ahead of the
then-shipped kernel by 0.1-1.1 % at the long points and behind at small caches. Since then the shipped loop
clamps its rows (+0.2-0.6 %). ``_config["TMA"]`` (kernels/decode.py; dense cache, Nq = 1) builds one
descriptor per program for its K and V rows ``[0, hi)``, so rows past the split's end load as zeros and
nothing past a length is read.
Each variant is checked against float64, then timed (CUDA-graph replay, interleaved rounds) beside
``kv_read`` and SDPA CUDNN. bf16, d = 128, one query token.
"""

import sys

import torch
import triton

import attnscope
from attnscope.kernels.decode import _block_config

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import GRID, LENS, each_point  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402

BUDGET = 100 * 2**30
VARIANTS = {
    "ship": None,
    "tma 128/4/3": {**_block_config(16, 0), "TMA": True},
    "tma 128/4/4": {"BLOCK_N": 128, "num_warps": 4, "STAGES": 4, "num_stages": 4, "TMA": True},
}


def main():
    a = bench_parser(__doc__).parse_args()
    # in-kernel descriptors need a global scratch per launch (under graph capture: from the graph's pool)
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    points = [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS if 2 * B * Hkv * L * 128 * 2 <= BUDGET]

    def measure(point, q, k, v, lens):
        plans = {name: attnscope.decode_plan(q, k, v, lens, check_seqlens=False, _config=config)
                 for name, config in VARIANTS.items()}
        splits = plans["ship"].num_splits
        return time_point(point, plan_graphs(point, q, k, v, lens, plans), q, k, v, splits, a.rounds,
                          splits=splits)

    each_point(points, measure, a.json)


if __name__ == "__main__":
    main()
