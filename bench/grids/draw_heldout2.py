"""The draw of bench/grids/heldout2.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout2.py`` prints the CSV rows.
"""
import csv
import math
import random

rng = random.Random(20261130)
GQA = ("flash", "cudnn", "attnscope")  # measured with GQA in run 1 (EFFICIENT refused one)
HEADS = [3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 33, 35, 37, 41, 45, 51, 57, 63]
with open('bench/grids/heldout.csv') as f:
    old = {(int(r['N']), int(r['H'])) for r in csv.DictReader(line for line in f if not line.startswith('#'))}
old |= {(3000, 12), (6144, 24), (12288, 40), (24576, 8)}  # the shapes
used_n = {n for n, _ in old} | {1024, 2048, 4096, 8192, 16384}  # + the development grid's N
impls = ["naive", "flash", "cudnn", "efficient", "attnscope"]
rows = []
i = 0
while len(rows) < 42:
    impl = impls[i % 5]
    long = rng.random() < 0.25  # N first: a quarter long (uniform 24k-32k), the rest log-uniform 1.5k-24k
    lo_hi = (math.log(1500), math.log(24000))
    n = int(rng.uniform(24000, 32768)) if long else int(math.exp(rng.uniform(*lo_hi)))
    n |= 1 if rng.random() < 0.7 else 0
    b = rng.choice([1, 1, 1, 2, 2, 3, 4, 5])
    cap = 2.5e9 / (b * n * n) if impl == "naive" else 3e6 / (b * n)  # size caps (memory, run time)
    hs = [h for h in HEADS if h <= cap] or [min(HEADS)]
    h = rng.choice(hs)
    d = 128 if rng.random() < 0.7 else 64
    causal = rng.random() < 0.5
    dtype = "bf16" if rng.random() < 0.35 else "fp16"
    hkv = h
    if impl != "naive" and impl in GQA and rng.random() < 0.25 and not (impl == "cudnn" and causal):
        divs = [x for x in range(1, h) if h % x == 0]
        if divs:
            hkv = rng.choice(divs)
    if n in used_n or (n, h) in old:
        continue
    if b * h * n * (n if impl == "naive" else 1) > (2.5e9 if impl == "naive" else 3e6):
        continue
    rows.append((impl, b, h, hkv, n, d, str(causal).lower(), dtype))
    used_n.add(n)
    i += 1
for r in rows:
    print(",".join(map(str, r)))
