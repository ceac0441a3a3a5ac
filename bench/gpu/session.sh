#!/usr/bin/env bash
# One device call: the GPU tests of every kernel, then quick benches, each bounded; logs under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/env.txt; python -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $O/env.txt
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -4 $O/$name.log; }
step tests 170 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_bwd.py tests/test_decode.py tests/test_varlen.py tests/test_fwd.py -k "not hopper"
step hopper 60 python -m pytest -q -x -p no:cacheprovider tests/test_fwd.py -k hopper
step backward 110 python bench/backward.py --quick --json $O/backward.json
step decode 80 python bench/decode.py --quick --json $O/decode.json
step varlen 70 python bench/varlen.py --quick --no-flex --json $O/varlen.json
step train 100 python bench/train.py --json $O/train.json --plot $O/train_loss.png
