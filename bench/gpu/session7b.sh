#!/usr/bin/env bash
# 2026-12-01 seventh session, second call: the persistent causal schedule's lockstep fix for an odd number of
# query tiles (kernels/fwd_hopper.py `_work`). GPU tests of the persistent variants (incl. the new odd-tile
# case), old vs new schedule timed (bench/persist_order.py; the old tree in .old/, `git archive` of the commit
# before the fix), and the bytes probe bench/grids/persist_probe.csv (development data for the estimate).
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p "$O"
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
TAIL=6 step persist_tests 220 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd_hopper.py -k persist
TAIL=12 step persist_order 260 python bench/persist_order.py --old .old --new . --rounds 2 --json $O/persist_order.json
TAIL=20 step persist_probe 110 python -m attnscope bytes --sweep bench/grids/persist_probe.csv --per-child 16 --json $O/persist_probe.json
