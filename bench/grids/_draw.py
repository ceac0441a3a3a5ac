"""What the held-out draws (draw_heldout2..6.py) share: the head and implementation lists, the size caps,
the N already used by earlier grids, one point's draw after its N, and grids 4-7's whole draw (the RNG calls
in a fixed order, so each script reproduces its committed CSV)."""
import csv
import math
import random

IMPLS = ["naive", "flash", "cudnn", "efficient", "attnscope"]
GQA = ("flash", "cudnn", "attnscope")  # with GQA (EFFICIENT refused one in run 1; cuDNN unmasked only)
HEADS = [3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 33, 35, 37, 41, 45, 51, 57, 63]
NAIVE_CAP, FUSED_CAP = 2.5e9, 3e6  # B H N^2 (naive: memory, run time), B H N (fused kernels: run time)
DEV_N = {1024, 2048, 4096, 8192, 16384}  # the development grid (tests/data/measure/recorded)
ISSUE_SHAPES = {(3000, 12), (6144, 24), (12288, 40), (24576, 8)}  # (N, H) named in issue 18


def grid_rows(*names):
    """The rows of earlier grids under bench/grids/ (comment lines skipped)."""
    for name in names:
        with open("bench/grids/" + name) as fh:
            yield from csv.DictReader(line for line in fh if not line.startswith("#"))


def draw_n(rng, long, split):
    """N: uniform in split..32,768 when ``long``, else log-uniform 1,500..split."""
    if long:
        return int(rng.uniform(split, 32768))
    return int(math.exp(rng.uniform(math.log(1500), math.log(split))))


def fits(impl, b, h, n):
    """Within the size cap of its implementation."""
    return b * h * n * n <= NAIVE_CAP if impl == "naive" else b * h * n <= FUSED_CAP


def point(rng, impl, n):
    """The rest of a point once its N is drawn: N made odd 70 % of the time, batch, heads under the size cap,
    d, mask, dtype, and (25 % on GQA implementations) a divisor of the heads as kv heads.
    Returns (impl, b, h, hkv, n, d, causal, dtype)."""
    n |= 1 if rng.random() < 0.7 else 0
    b = rng.choice([1, 1, 1, 2, 2, 3, 4, 5])
    cap = NAIVE_CAP / (b * n * n) if impl == "naive" else FUSED_CAP / (b * n)
    h = rng.choice([x for x in HEADS if x <= cap] or [min(HEADS)])
    d = 128 if rng.random() < 0.7 else 64
    causal = rng.random() < 0.5
    dtype = "bf16" if rng.random() < 0.35 else "fp16"
    hkv = h
    if impl in GQA and rng.random() < 0.25 and not (impl == "cudnn" and causal):
        divs = [x for x in range(1, h) if h % x == 0]
        if divs:
            hkv = rng.choice(divs)
    return impl, b, h, hkv, n, d, causal, dtype


def print_rows(rows):
    for impl, b, h, hkv, n, d, causal, dtype in rows:
        print(",".join(map(str, (impl, b, h, hkv, n, d, str(causal).lower(), dtype))))


def draw(seed, earlier, flash_gqa=False, points=48):
    """Grids 4-7: ``points`` rows round-robin over IMPLS, every fourth N long (16k-32,768), no N of the
    development grid, the issue's shapes or the ``earlier`` CSVs; with ``flash_gqa``, when no FLASH row drew
    GQA, 2 more FLASH rows (one short, one long) continue the draw, redrawn until GQA."""
    rng = random.Random(seed)
    used_n = DEV_N | {n for n, _ in ISSUE_SHAPES} | {int(r["N"]) for r in grid_rows(*earlier)}
    rows = []
    while len(rows) < points:
        impl = IMPLS[len(rows) % 5]
        long = len(rows) % 4 == 3  # exactly a quarter, spread over the implementations (5 and 4 coprime)
        row = point(rng, impl, draw_n(rng, long, 16000))
        _, b, h, _, n, *_ = row
        if n in used_n or not fits(impl, b, h, n):
            continue  # redraw the same implementation
        rows.append(row)
        used_n.add(n)
    if flash_gqa and not any(impl == "flash" and hkv != h for impl, _, h, hkv, *_ in rows):
        for long in (False, True):
            while True:
                row = point(rng, "flash", draw_n(rng, long, 16000))
                _, b, h, hkv, n, *_ = row
                if hkv != h and n not in used_n and fits("flash", b, h, n):
                    break
            rows.append(row)
            used_n.add(n)
    return rows


#: The development probes under bench/grids/ whose N no later held-out grid may reuse (sessions 7-13)
PROBES = ("rerun7.csv", "rerun10.csv", "rerun17.csv", "lockstep_probe.csv", "spill_probe.csv",
          "frames_probe.csv", "persist_probe.csv", "repeat_smoke.csv", "spill_n_probe.csv",
          "local15_probe.csv", "decay_probe.csv", "l2_counters_probe.csv", "first_probe.csv", "hot_probe.csv",
          "heads_probe.csv")


def print_grid(n):
    """Print held-out grid ``n``'s rows (grids 23 on): `draw`'s recipe with seed 20261200 + ``n``, no N of
    heldout.csv .. heldout{n - 1}.csv or of the `PROBES` committed before it, 2 more FLASH GQA rows where none
    drew GQA."""
    earlier = ("heldout.csv", *(f"heldout{i}.csv" for i in range(2, n)))
    probes = PROBES[:-2] if n < 23 else PROBES[:-1] if n < 25 else PROBES
    print_rows(draw(20261200 + n, earlier + probes, flash_gqa=True))
