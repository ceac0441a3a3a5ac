#!/usr/bin/env bash
# Issue 18 lockstep probe (DEVELOPMENT data; run AFTER bytes7.sh, never before a held-out grid's run): FA-2's
# remaining misses beside partners that change one factor (bench/grids/lockstep_probe.csv says which), through
# bytes_heldout.sh: calibration, then 17 points. ~1-1.5 min on one H200 (sweep bounded at 100 s). Writes
# $OUT/byteslockstep_probe/: lockstep_probe.json, lockstep_probe.log, calibration.json, calibrate.log, env.txt.
ATTNSCOPE_NCU_TIMEOUT_S=90 exec bash "$(dirname "$0")/bytes_heldout.sh" lockstep_probe 100
