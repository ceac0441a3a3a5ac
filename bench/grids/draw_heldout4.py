"""The draw of bench/grids/heldout4.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout4.py`` prints the CSV rows. Recipe: 48
points round-robin over the five implementations; N of every fourth point uniform in 16k-32,768, the
others log-uniform 1.5k-16k (70 % odd); odd heads; batch 1-5; d 64/128; fp16/bf16; half causal; GQA on
flash, cuDNN unmasked and attnscope; size caps as in draw_heldout3.py (the naive baseline's 3 B H N^2
scores). No N shared with any earlier grid or probe: the development grid (tests/data/measure/recorded:
N 1k-16k powers of two), the issue's shapes, heldout.csv, heldout2.csv, heldout3.csv, spill_probe.csv.
"""
import csv
import math
import random

rng = random.Random(20261204)
GQA = ("flash", "cudnn", "attnscope")
HEADS = [3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 33, 35, 37, 41, 45, 51, 57, 63]
used_n = {1024, 2048, 4096, 8192, 16384, 3000, 6144, 12288, 24576}  # development grid, issue shapes
for f in ("heldout.csv", "heldout2.csv", "heldout3.csv", "spill_probe.csv"):
    with open("bench/grids/" + f) as fh:
        used_n |= {int(r["N"]) for r in csv.DictReader(line for line in fh if not line.startswith("#"))}
impls = ["naive", "flash", "cudnn", "efficient", "attnscope"]
NAIVE_CAP, FUSED_CAP = 2.5e9, 3e6  # B H N^2 (naive: memory, run time), B H N (fused kernels: run time)
rows = []
i = 0
while len(rows) < 48:
    impl = impls[i % 5]
    long = len(rows) % 4 == 3  # exactly a quarter, spread over the implementations (5 and 4 coprime)
    lo_hi = (math.log(1500), math.log(16000))
    n = int(rng.uniform(16000, 32768)) if long else int(math.exp(rng.uniform(*lo_hi)))
    n |= 1 if rng.random() < 0.7 else 0
    b = rng.choice([1, 1, 1, 2, 2, 3, 4, 5])
    cap = NAIVE_CAP / (b * n * n) if impl == "naive" else FUSED_CAP / (b * n)
    hs = [h for h in HEADS if h <= cap] or [min(HEADS)]
    h = rng.choice(hs)
    d = 128 if rng.random() < 0.7 else 64
    causal = rng.random() < 0.5
    dtype = "bf16" if rng.random() < 0.35 else "fp16"
    hkv = h
    if impl in GQA and rng.random() < 0.25 and not (impl == "cudnn" and causal):
        divs = [x for x in range(1, h) if h % x == 0]
        if divs:
            hkv = rng.choice(divs)
    size, size_cap = (b * h * n * n, NAIVE_CAP) if impl == "naive" else (b * h * n, FUSED_CAP)
    if n in used_n or size > size_cap:
        continue  # redraw the same implementation
    rows.append((impl, b, h, hkv, n, d, str(causal).lower(), dtype))
    used_n.add(n)
    i += 1
for r in rows:
    print(",".join(map(str, r)))
