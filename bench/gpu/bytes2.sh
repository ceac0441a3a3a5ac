#!/usr/bin/env bash
# Issue 18, second device call (<= 4 min): the counter calibration with the copy stream on an SM kernel
# (run 1's copy_ was a copy-engine memcpy that ncu does not see), then the SECOND held-out grid
# (bench/grids/heldout2.csv, 42 points, drawn before any of them was measured) through `attnscope bytes
# --sweep`, the estimate frozen at this commit. Logs and JSON under $OUT; each step has a timeout and the
# sweep rewrites its JSON after every group of 14 points, so a run cut short keeps what it measured.
# Expected: ~30 s + ~190 s (about 3.5 s a point + 15 s a child process).
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=110 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
{ git rev-parse HEAD; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; ncu --version | tail -1; } > $O/env.txt 2>&1
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name $(date -u +%T)"; tail -${TAIL:-20} $O/$name.log; }
step calibrate 40 python -m attnscope bytes --calibrate --json $O/calibration.json
TAIL=8 step heldout2 195 python -m attnscope bytes --sweep bench/grids/heldout2.csv --per-child 14 --json $O/heldout2.json
