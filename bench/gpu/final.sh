#!/usr/bin/env bash
# Fourth-session checks after the last kernel-side and measurement-layer changes (<= 9 min): every one-GPU test but the
# per-variant Gluon tests hopper2.sh ran (-m gpu; dense chunk tiles through the page table, the new Hopper row), chunked prefill timed again, and the GPU paths of the
# measurement layer that changed (verify's kernel checks, which, bench --quick and its --from-json).
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
TAIL=12 step gpu_tests 280 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests --ignore=tests/test_distributed.py --ignore=tests/test_fwd_hopper.py
TAIL=4 step hopper_row 70 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd_hopper.py -k "hopper_pt_wg3_pp-"
TAIL=40 step chunked 60 python bench/chunked.py --no-flex --json $O/chunked.json
TAIL=15 step verify 40 python -m attnscope verify --kernels on
TAIL=6 step which 40 bash -c "python -m attnscope which --backend flash && python -m attnscope which --backend math --causal"
TAIL=12 step bench 120 bash -c "python -m attnscope bench --quick --json $O/bench.json && python -m attnscope bench --from-json $O/bench.json"
