#!/usr/bin/env bash
# One device call for issue 14 (<= 9.5 min): decode split counts in graph replay vs CUDNN, then the Flex peers
# (decode --quick with Flex at its point, chunked prefill, packed varlen). Logs and JSON under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/env.txt; python -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $O/env.txt
TAIL=20 step splits 170 python bench/decode_splits.py --json $O/splits.json
TAIL=30 step decode_flex 110 python bench/decode.py --quick --json $O/decode_flex.json
TAIL=30 step chunked 120 python bench/chunked.py --json $O/chunked.json
TAIL=40 step varlen 150 python bench/varlen.py --json $O/varlen.json
