#!/usr/bin/env bash
# 2-GPU call: ring GPU tests (NCCL fwd + bwd), the context-parallel bench, and the hopper GPU tests on GPU 0.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-12} $O/$name.log; }
TAIL=6 step dist_tests 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_distributed.py
TAIL=14 step cp 200 torchrun --nproc_per_node 2 bench/context_parallel.py --n 32768,65536,131072 --json $O/cp.json
TAIL=8 step hopper_tests 110 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fwd.py -k hopper
