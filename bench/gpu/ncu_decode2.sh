#!/usr/bin/env bash
# Issue 14: what cuDNN's decode kernel does differently at a 128-program parity point (B 16, Hq 32, Hkv 8,
# L 32k, bf16, d 128, one query), beside the shipped kernel and kv_read: launch statistics (registers,
# shared memory per CTA: how many K/V tiles it can hold), and how the loads are issued (cp.async LDGSTS,
# LDG, TMA, LDSM instruction counts), DRAM throughput. One device call, ~1 min. bash bench/gpu/ncu_decode2.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/ncu_decode2; mkdir -p "$O"
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum"
M="$M,smsp__inst_executed_op_ldgsts.sum,smsp__inst_executed_op_global_ld.sum,smsp__inst_executed_op_ldsm.sum"
M="$M,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum"
M="$M,l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"
M="$M,sm__cycles_active.avg,smsp__cycles_active.avg"
cat > "$O/point.py" <<'PY'
import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
sys.path.insert(0, "bench")
import attnscope
from decode import inputs
from decode_fill import _kv_read
B, Hq, Hkv, L = 16, 32, 8, 32768
q, k, v, lens = inputs(B, Hq, Hkv, L)
plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
s = plan.num_splits
part = torch.empty(B * Hkv * s, device="cuda")
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return sdpa(q, k, v, enable_gqa=True)
fns = [lambda: plan.run(q, k, v, lens), cudnn,
       lambda: _kv_read[(B * Hkv, s)](k, v, part, L, s, BLOCK_N=128, D=128, STAGES=3, num_warps=4)]
for f in fns:
    f()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for f in fns:
    f()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("point done")
PY
timeout 200 ncu --clock-control none --profile-from-start off --metrics "$M" --section LaunchStats \
    --section Occupancy python "$O/point.py" > "$O/ncu.txt" 2>&1
echo "ncu rc=$?" | tee "$O/summary.txt"
grep -vE "^==PROF==|^    -{5}|^\s*$" "$O/ncu.txt" | head -150 >> "$O/summary.txt"
tail -120 "$O/summary.txt"
