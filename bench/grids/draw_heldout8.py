"""The draw of bench/grids/heldout8.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout8.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-8 share it), with its own seed, and with no N of heldout.csv .. heldout7.csv,
rerun7.csv, lockstep_probe.csv or spill_probe.csv.
"""

from _draw import draw, print_rows

print_rows(draw(20261208, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                   "heldout6.csv", "heldout7.csv", "rerun7.csv", "lockstep_probe.csv", "spill_probe.csv"),
                flash_gqa=True))
