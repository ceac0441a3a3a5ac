"""The draw of bench/grids/heldout15.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout15.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-15 share it), with its own seed, and with no N of heldout.csv .. heldout14.csv,
rerun7.csv, rerun10.csv, lockstep_probe.csv, spill_probe.csv, frames_probe.csv or persist_probe.csv.
Drawn 2026-12-01 ~12:52 UTC after r18w (FA-2 causal GQA split by the batch: `head_gap_rereads` with the
(B - 1) T launch offset), never measured on a fresh grid, before any measurement of these points.
"""

from _draw import draw, print_rows

print_rows(draw(20261215, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                           "heldout6.csv", "heldout7.csv", "heldout8.csv", "heldout9.csv", "heldout10.csv",
                           "heldout11.csv", "heldout12.csv", "heldout13.csv", "heldout14.csv",
                           "rerun7.csv", "rerun10.csv",
                           "lockstep_probe.csv", "spill_probe.csv", "frames_probe.csv", "persist_probe.csv"),
                flash_gqa=True))
