"""Does decode stream faster with two or three programs resident per SM (cuDNN's layout at B = 1)?

    PYTHONPATH=src python bench/decode_coresident.py [--json PATH] [--rounds R] [--quick]

The shipped decode config (128-key tiles, 4 warps, 3 stages) takes 136 KiB of shared memory, so one program
runs per SM and its loads for the next tiles wait for its own arithmetic. ncu showed cuDNN at B = 1, Hkv = 32,
L = 128k running 256 CTAs of the same 16 x 128 tile, two per SM. Here each variant is a block config (keys /
warps / stages; 2 stages or 64-key tiles take 40-100 KiB, so 2-5 programs fit) and a multiple of the
default split count. Each is checked against float64, then all are timed (CUDA-graph replay, interleaved
rounds) beside ``kv_read`` and SDPA CUDNN at the decode grid of bench/decode.py. bf16, d = 128, one query.
"""

import random
import sys

import attnscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode import GRID, LENS, each_point  # noqa: E402
from decode_fill import bench_parser, plan_graphs, time_point  # noqa: E402

BUDGET = 100 * 2**30
MISSES = [(1, 32, 32, 131072), (16, 32, 8, 131072), (64, 32, 32, 4096)]  # below CUDNN on 2026-12-01


def cfg(block_n, warps, stages):
    return {"BLOCK_N": block_n, "num_warps": warps, "STAGES": stages, "num_stages": stages}


# name: (block config or None for the plan's own, split multiple or "P<n>": about n programs)
VARIANTS = {
    "ship": (None, 1),
    "128/4/2 P2048": (cfg(128, 4, 2), "P2048"),
    "128/4/2 P4096": (cfg(128, 4, 2), "P4096"),
    "128/4/2 P8192": (cfg(128, 4, 2), "P8192"),
    "64/4/2 P4096": (cfg(64, 4, 2), "P4096"),
    "128/8/2 P2048": (cfg(128, 8, 2), "P2048"),
}
# The first run (13:48 UTC, h200-2026-12-01-decode-coresident.*) had 128/4/2 at 1-3 x the splits, 64/4/3 at
# 2-3 x and 64/4/4 at 2 x; the second (13:51 UTC, -p.*) the P variants above.
# --items: at how many (batch, kv head) items do co-resident programs (no extra splits) win?
ITEM_VARIANTS = {"ship": (None, 1), "128/4/2": (cfg(128, 4, 2), 1), "64/4/3": (cfg(64, 4, 3), 1),
                 "128/8/2": (cfg(128, 8, 2), 1)}
# --tail: many items, the shipped config with 1-4 splits (a last wave that is mostly empty, split finer)
TAIL_VARIANTS = {"ship": (None, 1), "x2": (None, 2), "x3": (None, 3), "x4": (None, 4)}
TAIL_POINTS = [(64, 32, 32, 4096), (64, 32, 32, 32768), (96, 32, 32, 16384), (40, 32, 32, 8192),
               (34, 32, 32, 32768), (160, 32, 8, 16384), (64, 32, 8, 4096)]
# --tailcheck: the tail rule (`decode._tail_splits`, fitted on TAIL_POINTS) on shapes drawn after it was
# written: the plan's default splits against 1 split
CHECK_VARIANTS = {"default": (None, 1), "1 split": (None, "S1")}


def tail_draw(seed=20261201, n=10):
    """n (B, 32, Hkv, L) shapes: at least 132 items, long keys (where the rule may act), K + V <= 48 GiB."""
    rng, points = random.Random(seed), []
    while len(points) < n:
        hkv, b = rng.choice([8, 32]), rng.randint(5, 200)
        seq = rng.choice([16384, 24576, 32768, 49152, 65536])
        if b * hkv >= 132 and 2 * b * hkv * seq * 256 <= 48 * 2**30:
            points.append((b, 32, hkv, seq))
    return points


ITEM_POINTS = [(16, 32, 32, 4096), (32, 32, 32, 4096), (48, 32, 32, 4096), (64, 32, 32, 2048),
               (128, 32, 32, 2048), (32, 32, 32, 16384), (40, 32, 32, 8192), (96, 32, 32, 16384),
               (128, 32, 8, 4096), (192, 32, 8, 4096), (256, 32, 8, 2048), (256, 32, 8, 8192)]


def splits_for(spec, base, items, seqlen):
    """A split multiple, "S<n>" n splits, or for "P<n>" the splits that give about n programs (items =
    B * Hkv), each split at least 256 keys."""
    if isinstance(spec, int):
        return base * spec
    if spec[0] == "S":
        return int(spec[1:])
    return max(1, min(round(int(spec[1:]) / items), seqlen // 256, 1024))


def main():
    p = bench_parser(__doc__)
    p.add_argument("--quick", action="store_true", help="only the three points below CUDNN on 2026-12-01")
    p.add_argument("--items", action="store_true", help="ITEM_VARIANTS at ITEM_POINTS (no splits)")
    p.add_argument("--tail", action="store_true", help="TAIL_VARIANTS at TAIL_POINTS")
    p.add_argument("--tailcheck", action="store_true", help="CHECK_VARIANTS at tail_draw()'s shapes")
    a = p.parse_args()
    variants = CHECK_VARIANTS if a.tailcheck else TAIL_VARIANTS if a.tail else ITEM_VARIANTS if a.items \
        else VARIANTS
    grid = [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS if 2 * B * Hkv * L * 128 * 2 <= BUDGET]
    points = tail_draw() if a.tailcheck else TAIL_POINTS if a.tail else ITEM_POINTS if a.items \
        else MISSES if a.quick else grid

    def measure(point, q, k, v, lens):
        B, Hq, Hkv, L = point
        base = attnscope.decode_plan(q, k, v, lens, check_seqlens=False).num_splits
        plans = {name: attnscope.decode_plan(q, k, v, lens, check_seqlens=False, _config=config,
                                             num_splits=splits_for(spec, base, B * Hkv, L))
                 for name, (config, spec) in variants.items()}
        graphs = plan_graphs(point, q, k, v, lens, plans)
        splits = {name: plan.num_splits for name, plan in plans.items()}
        row = time_point(point, graphs, q, k, v, base, a.rounds, splits=splits)
        print("  splits: " + ", ".join(f"{n} {s}" for n, s in splits.items()), flush=True)
        return row

    each_point(points, measure, a.json)


if __name__ == "__main__":
    main()
