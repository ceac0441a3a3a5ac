"""The draw of bench/grids/heldout6.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout6.py`` prints the CSV rows. Same recipe as
draw_heldout5.py, another seed: 48 points round-robin over the five implementations; N of every fourth
point uniform in 16k-32,768 (12 points), the others log-uniform 1.5k-16k (70 % odd); odd heads; batch
1-5; d 64/128; fp16/bf16; half causal; GQA on flash, cuDNN unmasked and attnscope; size caps of _draw.py.
When none of the 48 drew FLASH with GQA, 2 more FLASH points continue the same draw, redrawn until GQA: one
log-uniform 1.5k-16k, one uniform 16k-32,768. No N shared with any earlier grid or probe: the development
grid (tests/data/measure/recorded: N 1k-16k powers of two), the issue's shapes, heldout.csv .. heldout5.csv,
spill_probe.csv.
"""
import random

from _draw import DEV_N, IMPLS, ISSUE_SHAPES, draw_n, fits, grid_rows, point, print_rows

rng = random.Random(20261206)
used_n = DEV_N | {n for n, _ in ISSUE_SHAPES} | {int(r["N"]) for r in grid_rows(
    "heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv", "spill_probe.csv")}
rows = []
i = 0
while len(rows) < 48:
    impl = IMPLS[i % 5]
    long = len(rows) % 4 == 3  # a quarter, spread over the implementations (5 and 4 coprime)
    n = draw_n(rng, long, 16000)
    row = point(rng, impl, n)
    _, b, h, _, n, *_ = row
    if n in used_n or not fits(impl, b, h, n):
        continue  # redraw the same implementation
    rows.append(row)
    used_n.add(n)
    i += 1
if not any(impl == "flash" and hkv != h for impl, _, h, hkv, *_ in rows):
    for long in (False, True):  # FLASH with GQA: redrawn until GQA
        while True:
            row = point(rng, "flash", draw_n(rng, long, 16000))
            _, b, h, hkv, n, *_ = row
            if hkv != h and n not in used_n and fits("flash", b, h, n):
                break
        rows.append(row)
        used_n.add(n)
print_rows(rows)
