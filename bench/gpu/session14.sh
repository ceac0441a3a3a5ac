#!/usr/bin/env bash
# 2026-12-01 fourteenth session (<= 10 min a call, one H200): bash bench/gpu/session14.sh CALL
#   1: bench/decode_swap.py (transposed decode tiles vs the shipped ones, kv_read and CUDNN) at all 14 grid points.
#   2: bench/decode_kvmath.py (kv_read's loop with decode's arithmetic in it) at the 128-program points.
#   4: bench/decode_stagger.py (Gluon: cuDNN's staggered K/V copies, transposed wgmma) at all 14 grid points.
#   5: bench/decode_stagger.py again after the barrier fix, 5 rounds at the 4 parity points (+ 2 x splits).
#   6: bench/decode_stream.py (balanced staggered Gluon decode over 132 or 264 programs, host merge), 13 points.
#   (calls 1, 7, 8, 9 ran the code of fc4b4c3, 1a52c90, 78676f3, 0307294; at 3b966a1 call 7's "auto" ran the
#   portable kernel, a bug fixed in 1a52c90: that run is the portable grid of -s14-decode-grid-portable.*)
#   7: the Gluon decode kernel's GPU tests, then bench/decode_impls.py (the plan's kernels vs CUDNN, 14 points).
#   8: bench/decode_impls.py --diag at the parity points (the shipped Gluon kernel against its ceiling probe).
#   9: after the tickets moved past the stream and the merge went one row at a time: the tests, then call 8.
#   3: bench/decode_l2state.py (decode, kv_read, plain loads with and without evict_first, CUDNN under three L2 states).
source "$(dirname "$0")/_session_env.sh"
case ${1:?call} in
1) TAIL=40 step decode_swap 540 python bench/decode_swap.py --rounds 3 --json $O/decode-swap.json ;;
2) TAIL=20 step decode_kvmath 300 python bench/decode_kvmath.py --rounds 5 --json $O/decode-kvmath.json ;;
3) TAIL=20 step decode_l2state 400 python bench/decode_l2state.py --rounds 3 --json $O/decode-l2state.json ;;
4) TAIL=30 step decode_stagger 540 python bench/decode_stagger.py --rounds 3 --json $O/decode-stagger.json ;;
5) TAIL=30 step decode_stagger2 400 python bench/decode_stagger.py --rounds 5 --points parity \
       --configs 128/1/1,128/1/1/2,128/2/1,128/2/2 --json $O/decode-stagger2.json ;;
6) TAIL=30 step decode_stream 500 python bench/decode_stream.py --rounds 3 --json $O/decode-stream.json ;;
7) TAIL=40 step stream_tests 240 python -m pytest -q -x -m gpu tests/test_decode_stream.py
   TAIL=40 step decode_impls 300 python bench/decode_impls.py --rounds 3 --json $O/decode-impls.json ;;
8) TAIL=40 step decode_diag 300 python bench/decode_impls.py --diag --points parity --rounds 3 \
       --json $O/decode-diag.json ;;
9) TAIL=15 step stream_tests 240 python -m pytest -q -m gpu tests/test_decode_stream.py
   TAIL=40 step decode_diag2 300 python bench/decode_impls.py --diag --points parity --rounds 3 \
       --json $O/decode-diag2.json ;;
esac
