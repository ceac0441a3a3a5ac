#!/usr/bin/env bash
# Fifth-session checks after the last kernel-side and measurement-layer changes (one H200, <= 9.5 min): every
# one-GPU test (-m gpu; the two-GPU test_distributed.py needs the x2 kind), the Gluon schedule tests of the table's
# variants, `verify --kernels on`, `which`, `bench --quick` and its `--from-json`, and `share` with its closed loop
# (measure/share.py and measure/decoder.py changed).
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
ROWS=$(python -c "from attnscope.kernels import fwd; print(' or '.join(sorted({r[-1] + '-' for r in fwd.HOPPER_VALIDATED})))")
TAIL=12 step gpu_tests 280 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests --ignore=tests/test_distributed.py --ignore=tests/test_fwd_hopper.py
TAIL=4 step hopper_rows 120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd_hopper.py -k "$ROWS"
TAIL=15 step verify 40 python -m attnscope verify --kernels on
TAIL=6 step which 40 bash -c "python -m attnscope which --backend flash && python -m attnscope which --backend math --causal"
TAIL=12 step bench 120 bash -c "python -m attnscope bench --quick --json $O/bench.json && python -m attnscope bench --from-json $O/bench.json"
TAIL=12 step share 90 python -m attnscope share --attention naive --project-to attnscope -P 4096 --reps 5
