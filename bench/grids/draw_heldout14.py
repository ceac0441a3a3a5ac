"""The draw of bench/grids/heldout14.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout14.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-14 share it), with its own seed, and with no N of heldout.csv .. heldout13.csv,
rerun7.csv, rerun10.csv, lockstep_probe.csv, spill_probe.csv, frames_probe.csv or persist_probe.csv.
Drawn 2026-12-01 ~11:53 UTC after `l2.mean_miss` learned to take its interval in either order, before
any measurement of these points.
"""

from _draw import draw, print_rows

print_rows(draw(20261214, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                           "heldout6.csv", "heldout7.csv", "heldout8.csv", "heldout9.csv", "heldout10.csv",
                           "heldout11.csv", "heldout12.csv", "heldout13.csv", "rerun7.csv", "rerun10.csv",
                           "lockstep_probe.csv", "spill_probe.csv", "frames_probe.csv", "persist_probe.csv"),
                flash_gqa=True))
