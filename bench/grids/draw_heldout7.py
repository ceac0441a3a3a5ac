"""The draw of bench/grids/heldout7.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout7.py`` prints the CSV rows. Same recipe as
draw_heldout6.py, another seed: 48 points round-robin over the five implementations; N of every fourth
point uniform in 16k-32,768 (12 points), the others log-uniform 1.5k-16k (70 % odd); odd heads; batch
1-5; d 64/128; fp16/bf16; half causal; GQA on flash, cuDNN unmasked and attnscope; size caps of _draw.py.
When none of the 48 drew FLASH with GQA, 2 more FLASH points continue the same draw, redrawn until GQA: one
log-uniform 1.5k-16k, one uniform 16k-32,768. No N shared with any earlier grid or probe: the development
grid (tests/data/measure/recorded: N 1k-16k powers of two), the issue's shapes, heldout.csv .. heldout6.csv,
spill_probe.csv.
"""

from _draw import draw, print_rows

print_rows(draw(20261207, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                   "heldout6.csv", "spill_probe.csv"), flash_gqa=True))
