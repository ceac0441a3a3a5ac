#!/usr/bin/env bash
# One device call (issue 15 + 14): bench/gpu/hopper.sh, then the GPU decode/varlen tests and the decode grid.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O/hopper
OUT=$O/hopper bash bench/gpu/hopper.sh 2>&1 | tail -40
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
TAIL=5 step decode_tests 70 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_decode.py
TAIL=40 step decode 150 python bench/decode.py --no-flex --json $O/decode.json
