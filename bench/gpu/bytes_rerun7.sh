#!/usr/bin/env bash
# Issue 18, DEVELOPMENT data after grid 7 (bench/grids/rerun7.csv: grid 7's FA-2 and attnscope-causal points again,
# its four misses three times each: run-to-run spread of one shape), then the lockstep probe. ~2.5 min on one H200.
B=$(dirname "$0")
ATTNSCOPE_NCU_TIMEOUT_S=90 bash "$B/bytes_heldout.sh" rerun7 110
ATTNSCOPE_NCU_TIMEOUT_S=90 bash "$B/bytes_heldout.sh" lockstep_probe 100
