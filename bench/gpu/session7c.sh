#!/usr/bin/env bash
# 2026-12-01 seventh session, third call (issue 15): the three-warpgroup tile in the persistent kernel
# (hopper_wg3_persist, hopper_wg3_pp_persist; d = 64): their GPU tests, then bench/prefill.py at d = 64,
# N 4k-16k, bf16 (+ fp16 4k), 3 interleaved rounds, beside the table's variants, SDPA CUDNN and FLASH.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O"
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
TAIL=6 step wg3p_tests 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd_hopper.py -k "wg3_persist or wg3_pp_persist"
TAIL=40 step prefill_d64 330 python bench/prefill.py --d 64 --n 4096 --n 8192 --n 16384 --rounds 3 --no-flex --no-first-call \
    --hopper-variants hopper_persist,hopper_pt_persist,hopper_wg3_pp,hopper_wg3_persist,hopper_wg3_pp_persist --fp16 64:4096 \
    --json $O/prefill_d64.json
