#!/usr/bin/env bash
# Issue 18 in one bounded device call (<= 9 min): counter calibration, the L2 reuse microbenchmark, then
# the held-out grid through `attnscope bytes --sweep`. Logs and JSON under $OUT; each step has a timeout,
# and the sweep rewrites its JSON after every group of points, so a cut-short run keeps what it measured.
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=150
O=${OUT:-/tmp/out}; mkdir -p $O
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; (ncu --version || /usr/local/cuda/bin/ncu --version) | tail -1; } > $O/env.txt 2>&1
export PATH=$PATH:/usr/local/cuda/bin
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name $(date -u +%T)"; tail -25 $O/$name.log; }
step calibrate 75 python -m attnscope bytes --calibrate --json $O/calibration.json
step l2_reuse 160 python bench/l2_reuse.py --json $O/l2_reuse.json --timeout 150
step heldout 290 python -m attnscope bytes --sweep bench/grids/heldout.csv --per-child 12 --json $O/heldout.json
