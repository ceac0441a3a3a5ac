"""The draw of bench/grids/heldout30.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout30.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-30 share it), with its own seed, and with no N of heldout.csv .. heldout29.csv,
rerun7.csv, rerun10.csv, rerun17.csv, lockstep_probe.csv, spill_probe.csv, frames_probe.csv,
persist_probe.csv, repeat_smoke.csv, spill_n_probe.csv, local15_probe.csv, decay_probe.csv,
l2_counters_probe.csv, first_probe.csv, hot_probe.csv or heads_probe.csv.
Drawn 2026-12-01 ~18:05 UTC with grid 29's estimate unchanged (a replication of grid 29's test), before
any measurement of these points; measured with ``--repeat 3``.
"""

from _draw import draw, print_rows

print_rows(draw(20261230, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                           "heldout6.csv", "heldout7.csv", "heldout8.csv", "heldout9.csv", "heldout10.csv",
                           "heldout11.csv", "heldout12.csv", "heldout13.csv", "heldout14.csv",
                           "heldout15.csv", "heldout16.csv", "heldout17.csv", "heldout18.csv",
                           "heldout19.csv", "heldout20.csv", "heldout21.csv", "heldout22.csv",
                           "heldout23.csv", "heldout24.csv", "heldout25.csv", "heldout26.csv",
                           "heldout27.csv", "heldout28.csv", "heldout29.csv", "rerun7.csv", "rerun10.csv",
                           "rerun17.csv", "lockstep_probe.csv", "spill_probe.csv", "frames_probe.csv",
                           "persist_probe.csv", "repeat_smoke.csv", "spill_n_probe.csv", "local15_probe.csv",
                           "decay_probe.csv", "l2_counters_probe.csv", "first_probe.csv", "hot_probe.csv",
                           "heads_probe.csv"),
                flash_gqa=True))
