#!/usr/bin/env bash
# 2026-12-01 ninth session (<= 10 min, one H200): the checks after the decode kernel's int32 offsets (OFF32): the
# decode tests on CUDA tensors (pages, chunks, graphs, every documented error), `verify --kernels on`, then the
# full decode grid (issue 14; bench/decode.py, Flex at its one default point).
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
{ git rev-parse HEAD; nvidia-smi --query-gpu=name,driver_version --format=csv; python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"; } > $O/env.txt 2>&1
TAIL=4 step decode_tests 240 python -m pytest -q -rfE -p no:cacheprovider tests/test_decode.py
TAIL=12 step verify 60 python -m attnscope verify --kernels on
TAIL=60 step decode_grid 240 python bench/decode.py --json $O/decode-grid-s9.json
