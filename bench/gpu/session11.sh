#!/usr/bin/env bash
# 2026-12-01 eleventh session (<= 10 min a call, one H200): bash bench/gpu/session11.sh CALL
#   1: issue 18's wave-count probe (bench/grids/decay_probe.csv through `attnscope bytes --sweep --repeat 2`), then
#      the varlen and dense-forward GPU tests (the kernels' shared softmax step and varlen's large-scale path changed
#      last session, CPU-tested only). Ran at 15:26 UTC; the forward tests hit their 110 s limit at 42 %+.
#   2: the counter-variance probe (bench/gpu/variance_probe.sh), then held-out grid 16 with --repeat 3.
#   3: E with more readers per set than programs (bench/l2_reuse.py --stream-wide, its fit), then the dense-forward
#      GPU tests, whole.
#   4: held-out grid 17 (drawn after the lockstep parameters) with --repeat 3.
#   5: the decode tests on CUDA tensors after the raw-score path for huge scales (decode.RAW_SCORES_ABOVE): the
#      scale tests first, then the whole file.
#   6: grid 17's misses again, five runs each (bench/grids/rerun17.csv, --repeat 5).
source "$(dirname "$0")/_session_env.sh"
case ${1:?call 1, 2 or 3} in
1)  TAIL=30 step decay_probe 330 python -m attnscope bytes --sweep bench/grids/decay_probe.csv --repeat 2 --json $O/decay-probe.json
    TAIL=8 step varlen_tests 120 python -m pytest -q -x -rfE -p no:cacheprovider tests/test_varlen.py
    TAIL=8 step fwd_tests 110 python -m pytest -q -x -rfE -p no:cacheprovider tests/test_fwd.py ;;
2)  TAIL=30 step variance 170 bash bench/gpu/variance_probe.sh 160
    TAIL=30 step calibrate 40 python -m attnscope bytes --calibrate --json $O/calibration.json
    TAIL=40 step heldout16 400 python -m attnscope bytes --sweep bench/grids/heldout16.csv --repeat 3 --per-child 16 \
        --json $O/heldout16.json ;;
3)  TAIL=24 step stream_wide 250 python bench/l2_reuse.py --stream-wide --timeout 230 --json $O/l2-reuse-wide.json
    TAIL=8 step fwd_tests 300 python -m pytest -q -rfE -p no:cacheprovider tests/test_fwd.py ;;
4)  TAIL=30 step calibrate 40 python -m attnscope bytes --calibrate --json $O/calibration.json
    TAIL=40 step heldout17 400 python -m attnscope bytes --sweep bench/grids/heldout17.csv --repeat 3 --per-child 16 \
        --json $O/heldout17.json ;;
5)  TAIL=8 step decode_scale_tests 150 python -m pytest -q -rfE -p no:cacheprovider tests/test_decode.py \
        -k "huge_scale or ordinary_scales or flags_scale or scale_and_return or public_entry"
    TAIL=8 step decode_tests 380 python -m pytest -q -rfE -p no:cacheprovider tests/test_decode.py ;;
6)  TAIL=24 step rerun17 200 python -m attnscope bytes --sweep bench/grids/rerun17.csv --repeat 5 --per-child 25 \
        --json $O/rerun17.json ;;
esac
