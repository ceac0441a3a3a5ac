#!/usr/bin/env bash
# Issue 18 frames probe (DEVELOPMENT data; run AFTER bytes8.sh, never before a held-out grid's run): FA-2's spill
# write-back at GQA over N, batch vs heads at one causal geometry (twice each), d 64 causal spills, attnscope causal
# GQA at N = 24973 (bench/grids/frames_probe.csv says why), through bytes_heldout.sh: calibration, then 22 points.
# ~1.5-2 min on one H200 (sweep bounded at 120 s). Writes $OUT/bytesframes_probe/: frames_probe.json,
# frames_probe.log, calibration.json, calibrate.log, env.txt.
ATTNSCOPE_NCU_TIMEOUT_S=100 exec bash "$(dirname "$0")/bytes_heldout.sh" frames_probe 120
