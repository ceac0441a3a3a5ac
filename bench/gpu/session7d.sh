#!/usr/bin/env bash
# 2026-12-01 seventh session, last call (<= 10 min, one H200): held-out grid 10 (issue 18), then the checks after
# this session's kernel-side changes (persistent causal schedule, hopper_wg3(_pp)_persist, HOPPER_VALIDATED run 5):
# the Gluon tests of every table variant, the portable/auto GPU tests, auto at the changed rows beside CUDNN,
# `verify --kernels on` and `bench --quick`.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
timeout 150 bash bench/gpu/bytes10.sh; echo "bytes10 rc=$?"
ROWS=$(python -c "from attnscope.kernels import fwd; print(' or '.join(sorted({r[-1] + '-' for r in fwd.HOPPER_VALIDATED})))")
TAIL=4 step hopper_rows 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd_hopper.py -k "$ROWS"
TAIL=4 step fwd_gpu 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd.py
TAIL=12 step prefill_rows 110 python bench/prefill.py --d 64 --n 4096 --rounds 3 --no-flex --no-first-call --no-hopper \
    --fp16 64:4096 --json $O/prefill_rows.json
TAIL=15 step verify 40 python -m attnscope verify --kernels on
TAIL=8 step bench 100 bash -c "python -m attnscope bench --quick --json $O/bench.json && python -m attnscope bench --from-json $O/bench.json"
cd $O && tar czf bytes10.tgz bytes10 && rm -rf bytes10 && ls
