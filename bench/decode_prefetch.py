"""Does an L2 bulk prefetch ahead of the pipelined K/V loads make decode stream faster?

    git checkout 9781b58 && PYTHONPATH=src python bench/decode_prefetch.py [--json PATH] [--rounds R]

Rejected (13:45 UTC 2026-12-01, bench/results/h200-2026-12-01-decode-prefetch.*: 0.56-0.93 x CUDNN at
distances 3-8, worse the further ahead); the knob was removed after 9781b58, where this script runs.

The decode loop's cp.async copies for tile i + STAGES - 1 are issued only after tile i's arithmetic, so
the DRAM requests in flight dip with every tile. ``PREFETCH = D`` (kernels/decode.py, dense caches with
contiguous rows) has one thread per program issue ``cp.async.bulk.prefetch.L2`` for the K and V tiles D
tiles ahead: DRAM requests that neither wait for the arithmetic nor hold registers or shared memory; the
copies then hit L2. Each variant is checked against float64, then all are timed (CUDA-graph replay,
interleaved rounds) beside ``kv_read`` (decode's loads alone, with and without the prefetch) and SDPA
CUDNN, at the decode grid of bench/decode.py. bf16, d = 128, one query token.
"""

import sys

import torch

import attnscope
from attnscope.kernels.decode.heuristics import _block_config

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import GRID, LENS, each_point, graph_of  # noqa: E402
from decode_fill import _kv_read, bench_parser, plan_graphs, time_point  # noqa: E402

DISTANCES = (0, 3, 4, 6, 8)
MISSES = [(1, 32, 32, 131072), (16, 32, 8, 131072), (64, 32, 32, 4096)]  # the ninth session's CUDNN misses
BUDGET = 100 * 2**30


def main():
    p = bench_parser(__doc__)
    p.add_argument("--quick", action="store_true", help="only the three points below CUDNN on 2026-12-01")
    a = p.parse_args()
    points = MISSES if a.quick else [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS
                                     if 2 * B * Hkv * L * 128 * 2 <= BUDGET]

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        plans = {f"pf{dist}": attnscope.decode_plan(q, k, v, lens, check_seqlens=False,
                                                    _config={**_block_config(16, 0), "PREFETCH": dist})
                 for dist in DISTANCES}
        graphs = plan_graphs(point, q, k, v, lens, plans)
        splits = plans["pf0"].num_splits
        part = torch.zeros(B * Hkv * splits, device="cuda")
        want = (k.float().sum() + v.float().sum()).item()
        for dist in (4, 8):
            part.zero_()
            _kv_read[(B * Hkv, splits)](k, v, part, L, splits, BLOCK_N=128, D=128, STAGES=3, PREFETCH=dist,
                                        num_warps=4)
            assert abs(part.sum().item() - want) <= 1e-3 * abs(want) + 10, "kv_read+pf mismatch"
            graphs[f"kv_read_pf{dist}"] = graph_of(lambda dist=dist: _kv_read[(B * Hkv, splits)](
                k, v, part, L, splits, BLOCK_N=128, D=128, STAGES=3, PREFETCH=dist, num_warps=4))
        return time_point(point, graphs, q, k, v, splits, a.rounds, splits=splits)

    each_point(points, measure, a.json)


if __name__ == "__main__":
    main()
