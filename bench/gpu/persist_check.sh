#!/usr/bin/env bash
# Not yet run (written 2026-12-01 after the device time ran out). Issue 15 / 18: does the persistent Gluon kernel
# (fp16 d = 128 causal from 4k in HOPPER_VALIDATED) lose time where held-out grid 4 saw it re-read its K/V 2.8x
# (B = 2, H = 45, N = 13,653)? Times hopper_persist beside the non-persistent variants, portable and CUDNN at that
# shape and at the table's measured B x H = 32, N = 16k, 3 interleaved rounds, after the full-size float64 check;
# then the bytes of both shapes (`attnscope bytes`, auto = hopper_persist). <= 4 min on one H200.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
V=hopper_persist,hopper_nopp,hopper_pt_nopp
TAIL=8 step many_heads 100 python bench/prefill.py --no-flex --no-first-call --d 128 --n 13653 --tokens 27306 --heads 45 \
    --fp16 128:13653 --hopper-variants $V --rounds 3 --json $O/many_heads.json
TAIL=8 step table_shape 80 python bench/prefill.py --no-flex --no-first-call --d 128 --n 16384 --fp16 128:16384 \
    --hopper-variants $V --rounds 3 --json $O/table_shape.json
TAIL=12 step bytes 60 bash -c "python -m attnscope bytes --impl attnscope --batch 2 --heads 45 --n 13653 --dtype fp16 --causal && \
    python -m attnscope bytes --impl attnscope --batch 1 --heads 32 --n 16384 --dtype fp16 --causal"
