#!/usr/bin/env bash
# Issue 15: where the time goes at bf16 d = 64 causal N = 4k (B 4, H 32), the one bf16 must point still below
# SDPA CUDNN: ncu of the table's pick (hopper_persist) beside CUDNN's kernel, and the same two at d = 128 causal 4k
# (where hopper_persist is >= CUDNN) for contrast. Per-pipe utilisation (tensor/MUFU(xu)/FMA/ALU), issue slots,
# stall reasons. One device call, ~1-2 min. From the repo root:  bash bench/gpu/ncu_d64.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/ncu_d64; mkdir -p "$O"
ncu --query-metrics --chip gh100 > "$O/metrics_all.txt" 2>&1
M=$(grep -oE "^(sm__inst_executed_pipe_(xu|fma|alu|fmaheavy|fp16|uniform|lsu)|sm__pipe_(tensor_op_gmma|tensor_op_hmma|xu|fma|alu|shared)_cycles_active|sm__pipe_fmaheavy_cycles_active|sm__issue_active|sm__inst_executed)\b" \
      "$O/metrics_all.txt" | sort -u | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
S=$(grep -oE "^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\b" "$O/metrics_all.txt" | sort -u | sed 's/$/.ratio/' | paste -sd, -)
[ -n "$S" ] && M="$M,$S"
echo "metrics: $M" | tee "$O/summary.txt"
cat > "$O/point.py" <<'PY'
import math
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from attnscope.kernels import fwd, fwd_hopper as h
inputs = {d: [torch.randn(4, 32, 4096, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for d in (64, 128)}
def ours(q, k, v):
    o, lse = torch.empty_like(q), torch.empty(1, device="cuda", dtype=torch.float32)
    h.launch(q, k, v, o, lse, fwd.LOG2E / math.sqrt(q.shape[-1]), True, False, "hopper_persist")
def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        sdpa(q, k, v, is_causal=True)
for d in (64, 128):  # compile / plan outside the profiled range
    for f in (ours, cudnn):
        f(*inputs[d])
torch.cuda.synchronize()
torch.cuda.profiler.start()
for d in (64, 128):
    for f in (ours, cudnn):
        f(*inputs[d])
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("point done")
PY
timeout 150 ncu --clock-control none --profile-from-start off --metrics "$M" \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
    python "$O/point.py" > "$O/ncu.txt" 2>&1
echo "ncu rc=$?" | tee -a "$O/summary.txt"
grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|Stall|stalled|pct_of_peak|Executed Ipc|Registers" \
    "$O/ncu.txt" | head -260 | tee -a "$O/summary.txt"
rm -f "$O/metrics_all.txt"
