#!/usr/bin/env bash
# 2026-12-01 ninth session, second check (<= 10 min, one H200), after the decode loop's clamped K/V rows: the decode
# tests on CUDA tensors (with the four fixed tests and the never-read-past-the-length test), then the decode grid.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
TAIL=6 step decode_tests 240 python -m pytest -q -rfE -p no:cacheprovider tests/test_decode.py
TAIL=12 step decode_grid 240 python bench/decode.py --no-flex --json $O/decode-grid-s9b.json
