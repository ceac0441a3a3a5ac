#!/usr/bin/env bash
# Issue 18 in one bounded device call (<= 9 min): counter calibration, the kernels' occupancy, the L2 reuse
# microbenchmark, then the held-out grid through `attnscope bytes --sweep`. Logs and JSON under $OUT; each
# step has a timeout, and the sweep rewrites its JSON after every group of points, so a run cut short
# keeps what it measured. Expected: ~30 s + ~20 s + ~60 s + ~200 s.
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=150 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; ncu --version | tail -1; } > $O/env.txt 2>&1
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name $(date -u +%T)"; tail -25 $O/$name.log; }
step calibrate 75 python -m attnscope bytes --calibrate --json $O/calibration.json
# CTAs per SM of each fused kernel (model/l2.py KERNELS.ctas_per_sm): ncu's launch and occupancy sections
OCC='[{"impl":"flash","heads":32,"n":8192,"d":128},{"impl":"efficient","heads":32,"n":8192,"d":128},{"impl":"cudnn","heads":32,"n":8192,"d":128},{"impl":"attnscope","heads":32,"n":8192,"d":128},{"impl":"flash","heads":32,"n":8192,"d":64,"causal":true},{"impl":"attnscope","heads":32,"n":8192,"d":64},{"impl":"attnscope","heads":32,"n":8192,"d":128,"causal":true}]'
step occupancy 45 ncu --section LaunchStats --section Occupancy --clock-control none --profile-from-start off --csv --log-file $O/occupancy.csv python -m attnscope.measure.ncu --child "$OCC"
grep -E '"(Block Limit Registers|Block Limit Shared Mem|Theoretical Occupancy|Achieved Occupancy|Waves Per SM|Registers Per Thread|Grid Size)"' $O/occupancy.csv | awk -F'","' '{print $(NF-2) " = " $NF " | " substr($5, 1, 90)}'
step l2_reuse 150 python bench/l2_reuse.py --json $O/l2_reuse.json --timeout 140
step heldout 260 python -m attnscope bytes --sweep bench/grids/heldout.csv --per-child 12 --json $O/heldout.json
