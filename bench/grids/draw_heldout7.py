"""The draw of bench/grids/heldout7.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout7.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-7 share it), with its own seed, and with no N of heldout.csv .. heldout6.csv or
spill_probe.csv.
"""

from _draw import draw, print_rows

print_rows(draw(20261207, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                   "heldout6.csv", "spill_probe.csv"), flash_gqa=True))
