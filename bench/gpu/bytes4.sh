#!/usr/bin/env bash
# Issue 18, the FOURTH held-out grid (<= 2.5 min on one H200, every step under `timeout`): the counter
# calibration line, then bench/grids/heldout4.csv (48 points, drawn 2026-12-01 ~03:40 UTC before any
# measurement of them and before r18d's model changes) through `attnscope bytes --sweep`, with the estimate frozen at the
# commit this runs (env.txt records it). Run from the repository root:
#     bash bench/gpu/bytes4.sh
# Writes under $OUT/bytes4/: heldout4.json (rewritten after every group of 16 points, so a run cut short keeps
# what it measured), heldout4.log (the table, the ±5/10/15 % counts, the worst points), calibration.json,
# calibrate.log, env.txt. Expected: ~25 s + ~50 s (grid 3's 48 points took ~45 s, with the first compile of
# attnscope's kernels from a cold Triton cache); bounds 40 + 105 s.
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=100 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/bytes4; mkdir -p "$O"
T0=$(date +%s)
{ git rev-parse HEAD; git status --short | head -5; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  ncu --version | tail -1; python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"; } > "$O/env.txt" 2>&1
step() {  # step NAME SECONDS CMD...: bounded, log to $O/NAME.log, print rc and the log's tail
    local name=$1 t=$2; shift 2
    echo "=== $name $(date -u +%T) (t+$(( $(date +%s) - T0 )) s)"
    timeout "$t" "$@" > "$O/$name.log" 2>&1; local rc=$?
    echo "rc=$rc $name$([ $rc = 124 ] && echo ' (TIMED OUT)')"; tail -n "${TAIL:-8}" "$O/$name.log"
}
step calibrate 40 python -m attnscope bytes --calibrate --json "$O/calibration.json"
TAIL=16 step heldout4 105 python -m attnscope bytes --sweep bench/grids/heldout4.csv --per-child 16 --json "$O/heldout4.json"
echo "=== done $(date -u +%T) (t+$(( $(date +%s) - T0 )) s); files: $(ls "$O" | tr '\n' ' ')"
