"""The draw of bench/grids/heldout29.csv (seeded; run once, before any measurement of these points).

Run from the repository root: ``python bench/grids/draw_heldout29.py`` prints the CSV rows. The recipe is
`_draw.draw`'s (grids 4-29 share it), with its own seed, and with no N of heldout.csv .. heldout28.csv,
rerun7.csv, rerun10.csv, rerun17.csv, lockstep_probe.csv, spill_probe.csv, frames_probe.csv,
persist_probe.csv, repeat_smoke.csv, spill_n_probe.csv, local15_probe.csv, decay_probe.csv,
l2_counters_probe.csv, first_probe.csv, hot_probe.csv or heads_probe.csv.
Drawn 2026-12-01 ~18:05 UTC after FA-2's d 64 hot-set share (`L2Params.hot_d64`, commit f21e61e), before
any measurement of these points; measured with ``--repeat 3``.
"""

from _draw import draw, print_rows

print_rows(draw(20261229, ("heldout.csv", "heldout2.csv", "heldout3.csv", "heldout4.csv", "heldout5.csv",
                           "heldout6.csv", "heldout7.csv", "heldout8.csv", "heldout9.csv", "heldout10.csv",
                           "heldout11.csv", "heldout12.csv", "heldout13.csv", "heldout14.csv",
                           "heldout15.csv", "heldout16.csv", "heldout17.csv", "heldout18.csv",
                           "heldout19.csv", "heldout20.csv", "heldout21.csv", "heldout22.csv",
                           "heldout23.csv", "heldout24.csv", "heldout25.csv", "heldout26.csv",
                           "heldout27.csv", "heldout28.csv", "rerun7.csv", "rerun10.csv", "rerun17.csv",
                           "lockstep_probe.csv", "spill_probe.csv", "frames_probe.csv", "persist_probe.csv",
                           "repeat_smoke.csv", "spill_n_probe.csv", "local15_probe.csv", "decay_probe.csv",
                           "l2_counters_probe.csv", "first_probe.csv", "hot_probe.csv", "heads_probe.csv"),
                flash_gqa=True))
