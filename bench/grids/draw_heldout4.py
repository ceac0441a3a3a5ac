"""The draw of bench/grids/heldout4.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout4.py`` prints the CSV rows. Recipe: 48
points round-robin over the five implementations; N of every fourth point uniform in 16k-32,768, the
others log-uniform 1.5k-16k (70 % odd); odd heads; batch 1-5; d 64/128; fp16/bf16; half causal; GQA on
flash, cuDNN unmasked and attnscope; size caps as in draw_heldout3.py (the naive baseline's 3 B H N^2
scores). No N shared with any earlier grid or probe: the development grid (tests/data/measure/recorded:
N 1k-16k powers of two), the issue's shapes, heldout.csv, heldout2.csv, heldout3.csv, spill_probe.csv.
"""

from _draw import draw, print_rows

print_rows(draw(20261204, ("heldout.csv", "heldout2.csv", "heldout3.csv", "spill_probe.csv")))
