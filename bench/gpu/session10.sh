#!/usr/bin/env bash
# 2026-12-01 tenth session, first check (<= 10 min, one H200): decode with an L2 bulk prefetch ahead of the
# pipelined K/V loads (bench/decode_prefetch.py: rejected, results bench/results/h200-2026-12-01-decode-prefetch.*); then
# two or three programs resident per SM (bench/decode_coresident.py), every grid point, beside kv_read and CUDNN.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/env.txt; git log -1 --format=%h >> $O/env.txt
TAIL=20 step decode_tail 420 python bench/decode_coresident.py --tail --rounds 5 --json $O/decode-tail.json

