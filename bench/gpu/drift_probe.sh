#!/usr/bin/env bash
# Issue 18: how far FA-2's CTAs drift out of lockstep over waves. SDPA FLASH, fp16, d 128, unmasked, N = 16,896:
# 132 query tiles of 128 rows per head, 2 CTAs per SM, so two heads are exactly one wave of 264 CTAs. B = 1 with
# H = 2, 16, 64, 128, and B = 5 with H = 32: 1, 8, 32, 64 and 80 whole waves, no partial last wave. Per kernel,
# profiled twice: min / mean / max of the SMs' active cycles (the spread of per-SM busy time after w waves),
# elapsed cycles, duration, DRAM bytes read. One device call, ~1 min. From the repo root:
#   bash bench/gpu/drift_probe.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/drift; mkdir -p "$O"
M="sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max,gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active"
cat > "$O/point.py" <<'PY'
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
N = 16896
shapes = [(1, h) for h in (2, 16, 64, 128)] + [(5, 32)]
ins = [[torch.randn(b, h, N, 128, device="cuda", dtype=torch.float16) for _ in range(3)] for b, h in shapes]
def run(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sdpa(q, k, v)
for t in ins:
    run(*t)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for t in ins:
    run(*t)
    run(*t)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("shapes (B, H):", shapes, "each profiled twice")
PY
timeout 300 ncu --clock-control none --profile-from-start off --metrics "$M" --csv python "$O/point.py" > "$O/ncu.csv" 2> "$O/ncu.err"
echo "ncu rc=$?"
grep '^"' "$O/ncu.csv" | python -c "
import csv, sys
by = {}
for r in csv.DictReader(sys.stdin):
    by.setdefault(int(r['ID']), {})[r['Metric Name']] = float(r['Metric Value'].replace(',', '') or 0)
for i, m in sorted(by.items()):
    lo, avg, hi = (m['sm__cycles_active.' + s] for s in ('min', 'avg', 'max'))
    print(i, 'grid', int(m['launch__grid_size']), 'us', m['gpu__time_duration.sum'] / 1e3,
          'SM active cycles min/avg/max', lo, avg, hi, '(max - min) / avg %.5f' % ((hi - lo) / avg))
" | tee "$O/summary.txt"
