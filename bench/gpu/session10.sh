#!/usr/bin/env bash
# 2026-12-01 tenth session (<= 10 min, one H200). Earlier calls of this script ran, in turn (results in
# bench/results/h200-2026-12-01-decode-*): decode_prefetch, decode_coresident (3 runs: splits, P, --items),
# decode_balanced (2 runs + --same, with local15.sh), decode_tma2, decode_lens, decode_coresident --tail.
# This last call: the tail rule (decode._tail_splits) on shapes drawn after it was written
# (decode_coresident.py --tailcheck, seed 20261201), then the decode grid, then the decode tests on CUDA tensors.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/env.txt; git log -1 --format=%h >> $O/env.txt
TAIL=20 step decode_tailcheck 200 python bench/decode_coresident.py --tailcheck --rounds 5 --json $O/decode-tailcheck.json
TAIL=14 step decode_grid 150 python bench/decode.py --no-flex --json $O/decode-grid-s10.json
TAIL=6 step decode_tests 200 python -m pytest -q -x -rfE -p no:cacheprovider tests/test_decode.py
