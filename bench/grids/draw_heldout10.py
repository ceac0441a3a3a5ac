"""The draw of bench/grids/heldout10.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout10.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-10 share it), with its own seed, and with no N of heldout.csv .. heldout9.csv,
rerun7.csv, lockstep_probe.csv, spill_probe.csv, frames_probe.csv or persist_probe.csv. Drawn 2026-12-01
~10:10 UTC after the model learned attnscope's persistent causal schedule (`l2.paired_rereads`), before any
measurement of these points.
"""

from _draw import draw, print_rows

print_rows(draw(20261210, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                   "heldout6.csv", "heldout7.csv", "heldout8.csv", "heldout9.csv", "rerun7.csv",
                   "lockstep_probe.csv", "spill_probe.csv", "frames_probe.csv", "persist_probe.csv"),
                flash_gqa=True))
