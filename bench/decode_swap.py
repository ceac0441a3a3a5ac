"""Transposed ("swap AB") decode tiles beside the shipped ones, CUDA-graph replay, at the issue's decode grid.

    git checkout fc4b4c3 && PYTHONPATH=src python bench/decode_swap.py [--json PATH] [--rounds 3]

Rejected (fourteenth session, bench/results/h200-2026-12-01-s14-decode-swap.*): "swap 128/4/3" ran within
0.1 % of the shipped tiles at all 14 points; the ``SWAP`` constexpr was removed after fc4b4c3, where this
script runs.

The shipped split kernel computes S = Q K^T and O += P V with the few query rows (G x Nq, padded to 16) as
the MMA's M: Triton 3.6 then uses ``mma.sync`` (wgmma needs M >= 64), whose operands pass through
registers (``ldmatrix`` of every K and V tile). With ``SWAP`` the kernel computes S^T = K Q^T and
O^T += V^T P^T instead: the 128 keys (or d) are M, the 16 rows N, so Triton issues ``wgmma`` straight from
the K/V tiles the pipeline put in shared memory (ptxas, sm_90: 2 wgmma per iteration, no mma.sync). Each
variant (``_config``: BLOCK_N / warps / stages, SWAP) runs with the plan's split count and merge and is
checked against float64 (twice) before it is timed beside ``kv_read`` (the loads alone) and SDPA CUDNN in
``--rounds`` interleaved rounds; printed: K/V TB/s of each median and its ratio to CUDNN's.
"""

import sys

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import PARITY, POINTS, each_point  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402


def cfg(block_n, warps, stages, swap):
    return {"BLOCK_N": block_n, "num_warps": warps, "STAGES": stages, "num_stages": stages, "SWAP": swap}


VARIANTS = {
    "shipped": None,
    "swap 128/4/3": cfg(128, 4, 3, True),
    "swap 128/8/3": cfg(128, 8, 3, True),
    "swap 128/4/2": cfg(128, 4, 2, True),
    "swap 64/4/5": cfg(64, 4, 5, True),
    "swap 64/4/4": cfg(64, 4, 4, True),
}


def main():
    p = bench_parser(__doc__)
    p.add_argument("--points", choices=("all", "parity"), default="all")
    a = p.parse_args()

    def measure(point, q, k, v, lens):
        base = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        s = base.num_splits
        plans = {name: base if c is None else
                 attnscope.decode_plan(q, k, v, lens, check_seqlens=False, _config=c)
                 for name, c in VARIANTS.items()}
        graphs = plan_graphs(point, q, k, v, lens, plans, runs=2)
        return time_point(point, graphs, q, k, v, s, a.rounds, splits=s)
    each_point(PARITY if a.points == "parity" else POINTS, measure, a.json)


if __name__ == "__main__":
    main()
