#!/usr/bin/env bash
# Issue 14: the decode kernel beside SDPA CUDNN's and kv_read (its loads alone, bench/decode_fill.py) under ncu
# at two graph-replay parity points (bf16, d 128, one query): DRAM bytes read (any over K + V?), DRAM
# throughput, duration, stall reasons. One device call, ~1 min. From the repo root: bash bench/gpu/ncu_decode.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/ncu_decode; mkdir -p "$O"
M="dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active"
cat > "$O/point.py" <<'PY'
import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
sys.path.insert(0, "bench")
import attnscope
from decode import inputs
from decode_fill import _kv_read
points = [(16, 32, 8, 131072), (1, 32, 32, 131072)]
runs = []
for B, Hq, Hkv, L in points:
    q, k, v, lens = inputs(B, Hq, Hkv, L)
    plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
    s = plan.num_splits
    part = torch.empty(B * Hkv * s, device="cuda")
    def cudnn(q=q, k=k, v=v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, enable_gqa=True)
    fns = [lambda plan=plan, t=(q, k, v, lens): plan.run(*t), cudnn,
           lambda k=k, v=v, part=part, s=s, B=B, Hkv=Hkv, L=L: _kv_read[(B * Hkv, s)](
               k, v, part, L, s, BLOCK_N=128, D=128, STAGES=3, num_warps=4)]
    for f in fns:
        f()
    runs.append((fns, 2 * k.numel() * 2))
    print(f"B={B} Hkv={Hkv} L={L} s={s}: K+V bytes {2 * k.numel() * 2}", flush=True)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for fns, _ in runs:
    for f in fns:
        f()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("point done")
PY
timeout 200 ncu --clock-control none --profile-from-start off --metrics "$M" \
    --section WarpStateStats python "$O/point.py" > "$O/ncu.txt" 2>&1
echo "ncu rc=$?" | tee "$O/summary.txt"
grep -E "K\+V bytes|^  [a-zA-Z_].*\(|dram__|gpu__time|lts__|sm__warps|Stall|Warp Cycles Per Issued" "$O/ncu.txt" | head -120 | tee -a "$O/summary.txt"
