#!/usr/bin/env bash
# 2026-12-01 thirteenth session (<= 10 min a call, one H200): bash bench/gpu/session13.sh CALL
#   1: the counter calibration, then the hot-set probe (bench/grids/hot_probe.csv: FA-2's causal GQA/MQA at
#      B > 1, development data) with --repeat 2.
#   2: the counter calibration, then held-out grids 23 and 24 (drawn after the hot-set term) with --repeat 3.
#   3: the counter calibration, then the head-count probe (bench/grids/heads_probe.csv: FA-2's causal MHA at B = 1
#      and fixed N, development data) with --repeat 2.
#   4: the counter calibration, then held-out grids 25 and 26 (drawn after the launch-fill share) with --repeat 3.
#   5: the counter calibration, then held-out grids 27 and 28 (grid 25's estimate again) with --repeat 3.
#   6: the counter calibration, then held-out grids 29 and 30 (drawn after the d 64 hot-set share) with --repeat 3.
source "$(dirname "$0")/_session_env.sh"
calibrate() { TAIL=30 step calibrate 40 python -m attnscope bytes --calibrate --json $O/calibration.json; }
# sweep NAME CSV REPEAT SECONDS: one measured sweep (16 points a child)
sweep() {
    TAIL=40 step $1 $4 python -m attnscope bytes --sweep $2 --repeat $3 --per-child 16 --json $O/$1.json
}
case ${1:?call 1-6} in
1) calibrate; sweep hot_probe bench/grids/hot_probe.csv 2 400 ;;
2) calibrate; sweep heldout23 bench/grids/heldout23.csv 3 270; sweep heldout24 bench/grids/heldout24.csv 3 270 ;;
3) calibrate; sweep heads_probe bench/grids/heads_probe.csv 2 400 ;;
4) calibrate; sweep heldout25 bench/grids/heldout25.csv 3 270; sweep heldout26 bench/grids/heldout26.csv 3 270 ;;
5) calibrate; sweep heldout27 bench/grids/heldout27.csv 3 270; sweep heldout28 bench/grids/heldout28.csv 3 270 ;;
6) calibrate; sweep heldout29 bench/grids/heldout29.csv 3 270; sweep heldout30 bench/grids/heldout30.csv 3 270 ;;
esac
