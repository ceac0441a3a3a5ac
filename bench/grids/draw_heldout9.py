"""The draw of bench/grids/heldout9.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout9.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-9 share it), with its own seed, and with no N of heldout.csv .. heldout8.csv,
rerun7.csv, lockstep_probe.csv, spill_probe.csv or frames_probe.csv. Drawn 2026-12-01 with the model as at
8574813 (unchanged since grid 7), to test that same model a third time.
"""

from _draw import draw, print_rows

print_rows(draw(20261209, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                   "heldout6.csv", "heldout7.csv", "heldout8.csv", "rerun7.csv", "lockstep_probe.csv",
                   "spill_probe.csv", "frames_probe.csv"),
                flash_gqa=True))
