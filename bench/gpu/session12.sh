#!/usr/bin/env bash
# 2026-12-01 twelfth session (<= 10 min a call, one H200): bash bench/gpu/session12.sh CALL
#   1: held-out grid 18 (drawn after E-wide's parameters, `L2Params.for_wide`) with --repeat 3, after the
#      counter calibration.
#   2: held-out grid 19 (drawn after the ncu child's primer range; grid 18's estimate) with --repeat 3, after the
#      counter calibration.
#   3: held-out grid 20 (drawn after dirty O's retention moved to the re-read model's room) with --repeat 3.
#   4: held-out grid 21 (drawn after FA-2's d 64 causal frames as the L2 fills) with --repeat 3.
#   5: held-out grid 22 (grid 21's estimate unchanged: a replication) with --repeat 3.
# Between them, single commands through the device tool (BENCHMARKS.md, twelfth session): bytes --kv-heads,
# bench/gpu/l2_counters_probe.sh, bench/gpu/first_spec_probe.sh, the first_probe.csv sweep, bench/l2_reuse.py --hot.
source "$(dirname "$0")/_session_env.sh"
# grid N: the counter calibration, then held-out grid N with --repeat 3 (16 points a child)
grid() {
    TAIL=30 step calibrate 40 python -m attnscope bytes --calibrate --json $O/calibration.json
    TAIL=40 step heldout$1 500 python -m attnscope bytes --sweep bench/grids/heldout$1.csv --repeat 3 --per-child 16 \
        --json $O/heldout$1.json
}
case ${1:?call 1-5} in
1) grid 18 ;;
2) grid 19 ;;
3) grid 20 ;;
4) grid 21 ;;
5) grid 22 ;;
esac
