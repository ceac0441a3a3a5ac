#!/usr/bin/env bash
# Issue 18, second device call (<= 4 min): the counter calibration with the copy stream on an SM kernel
# (run 1's copy_ was a copy-engine memcpy that ncu does not see), then the SECOND held-out grid
# (bench/grids/heldout2.csv, 42 points, drawn before any of them was measured) through `attnscope bytes
# --sweep`, the estimate frozen at this commit. Logs and JSON under $OUT; each step has a timeout and the
# sweep rewrites its JSON after every group of 14 points, so a run cut short keeps what it measured.
# Expected: ~25 s + ~190 s (about 3.5 s a point + 15 s a child process), then an optional ~25 s probe.
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=110 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
{ git rev-parse HEAD; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; ncu --version | tail -1; } > $O/env.txt 2>&1
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name $(date -u +%T)"; tail -${TAIL:-20} $O/$name.log; }
step calibrate 35 python -m attnscope bytes --calibrate --json $O/calibration.json
TAIL=8 step heldout2 205 python -m attnscope bytes --sweep bench/grids/heldout2.csv --per-child 14 --json $O/heldout2.json
# Last, only if time is left (the call may end here): where FLASH's extra writes come from. Run 1 measured
# SDPA FLASH causal writing 1.5-2.1 x O at N not a multiple of 128 (d 128), ~1 x O elsewhere: local memory
# (register spills) or a second O store? Local and global store sectors of one odd-N and one even-N call.
SPECS='[{"impl":"flash","heads":20,"n":14000,"d":128,"causal":true},{"impl":"flash","heads":20,"n":14080,"d":128,"causal":true},{"impl":"flash","heads":20,"n":14000,"d":128}]'
M=dram__bytes_write.sum,dram__bytes_read.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
TAIL=30 step flash_writes 30 ncu --metrics $M --cache-control none --clock-control none --profile-from-start off --csv --print-units base --log-file $O/flash_writes.csv python -m attnscope.measure.ncu --child "$SPECS"
grep -v spin_kernel $O/flash_writes.csv 2>/dev/null | awk -F'","' 'NF > 10 {print substr($5, 1, 60) " | " $(NF-2) " = " $NF}' | tail -20
