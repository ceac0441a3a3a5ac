"""The draw of bench/grids/heldout2.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout2.py`` prints the CSV rows.
"""
import random

from _draw import DEV_N, IMPLS, ISSUE_SHAPES, draw_n, fits, grid_rows, point, print_rows

rng = random.Random(20261130)
old = {(int(r["N"]), int(r["H"])) for r in grid_rows("heldout.csv")} | ISSUE_SHAPES
used_n = {n for n, _ in old} | DEV_N
rows = []
i = 0
while len(rows) < 42:
    impl = IMPLS[i % 5]
    long = rng.random() < 0.25  # N first: a quarter long (uniform 24k-32k), the rest log-uniform 1.5k-24k
    n = draw_n(rng, long, 24000)
    row = point(rng, impl, n)
    _, b, h, _, n, *_ = row
    if n in used_n or (n, h) in old or not fits(impl, b, h, n):
        continue
    rows.append(row)
    used_n.add(n)
    i += 1
print_rows(rows)
