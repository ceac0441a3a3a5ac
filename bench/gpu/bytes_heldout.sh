#!/usr/bin/env bash
# Issue 18: one held-out grid through the frozen estimate, one bounded device call:
#     bash bench/gpu/bytes_heldout.sh NAME SWEEP_SECONDS     # e.g. heldout4 105
# The counter calibration line, then bench/grids/NAME.csv through `attnscope bytes --sweep` with the estimate at
# the commit this runs (env.txt records it). Writes under $OUT/<dir>/ (<dir> = bytes3 for heldout3, ...): NAME.json
# (rewritten after every group of 16 points, so a run cut short keeps what it measured), NAME.log (the table, the
# ±5/10/15 % counts, the worst points), calibration.json, calibrate.log, env.txt. Measured: 48 points ~45-55 s.
NAME=${1:?grid name, e.g. heldout4}; SWEEP_S=${2:-300}
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=${ATTNSCOPE_NCU_TIMEOUT_S:-120} PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/bytes${NAME#heldout}; mkdir -p "$O"
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
TAIL=16 step "$NAME" "$SWEEP_S" python -m attnscope bytes --sweep "bench/grids/$NAME.csv" --per-child 16 --json "$O/$NAME.json"
echo "=== done $(date -u +%T) (t+$(( $(date +%s) - T0 )) s); files: $(ls "$O" | tr '\n' ' ')"
