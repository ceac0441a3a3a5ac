#!/usr/bin/env bash
# Issue 15, one device call (~4-7 min expected; every step bounded by `timeout`, 590 s in all): the Gluon Hopper forward kernel's
# per-variant probe (launch + float64 check + loaded-kernel registers/spills/shared memory), its fast GPU
# tests, the prefill benchmark beside SDPA CUDNN/FLASH (variants that passed the probe only), and an ncu
# profile of one N = 8k, d = 128 point. Logs and JSON under $OUT.  Run from the repository root:
#     bash bench/gpu/hopper.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$O/env.txt" 2>&1
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" >> "$O/env.txt" 2>&1
cat "$O/env.txt"
step() {  # step NAME SECONDS CMD...: run bounded, log to $O/NAME.log, print rc and the log's tail
    local name=$1 t=$2; shift 2
    echo "=== $name $(date -u +%T) (t+$(( $(date +%s) - T0 )) s)"
    timeout "$t" "$@" > "$O/$name.log" 2>&1; local rc=$?
    echo "rc=$rc $name$([ $rc = 124 ] && echo ' (TIMED OUT: hang or too slow)')"; tail -n "${TAIL:-6}" "$O/$name.log"
    return $rc
}

# 1. Probe each variant in its own bounded process: a hang in one (an mbarrier deadlock) costs 40 s, not
#    the call; prints n_regs / n_spills / shared from the loaded kernel and the float64 check.
TAIL=4 step probe_portable 35 python bench/sm90_resources.py --gpu --variant portable
PASS=""
for v in hopper hopper_nopp hopper_deep; do
    TAIL=4 step "probe_$v" 40 python bench/sm90_resources.py --gpu --variant "$v" && PASS="$PASS,$v"
done
PASS=${PASS#,}; echo "hopper variants that passed the probe: ${PASS:-none}"

# 2. The fast GPU tests of the Gluon kernel (20 float64 cases + one compile per variant), < 40 s warm.
TAIL=8 step tests_hopper 75 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fwd.py -k hopper

# 3. Prefill: full-size float64 check of every implementation, then timing (N 1k-16k, d 64/128,
#    causal and not), first-call latency cold/warm. Only probe-passing hopper variants.
if [ -n "$PASS" ]; then
    TAIL=30 step prefill 250 python bench/prefill.py --no-flex --hopper-variants "$PASS" --json "$O/prefill.json"
else
    echo "no hopper variant passed the probe: prefill skipped (portable/SDPA alone were measured before)"
fi

# 4. ncu (optional): portable vs hopper at N = 8k, d = 128, unmasked; sections for issue-slot use,
#    pipe utilisation and stall reasons; then two named metrics (tensor pipe, issue slots) separately.
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ -x "$NCU" ] && [[ ",$PASS," == *",hopper,"* ]]; then
    TAIL=3 step ncu_sections 80 "$NCU" --clock-control none -k regex:_attnscope_fwd -s 2 -c 2 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python bench/gpu/ncu_point.py
    TAIL=12 step ncu_metrics 30 "$NCU" --clock-control none -k regex:_attnscope_fwd -s 2 -c 2 --metrics \
        sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__warps_issue_stalled_barrier_per_warp_active.pct,smsp__warps_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warps_issue_stalled_wait_per_warp_active.pct \
        python bench/gpu/ncu_point.py
else
    echo "ncu skipped (no ncu at $NCU, or impl='hopper' did not pass the probe)"
fi
echo "=== done $(date -u +%T) (t+$(( $(date +%s) - T0 )) s); logs: $(ls "$O" | tr '\n' ' ')"
