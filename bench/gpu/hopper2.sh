#!/usr/bin/env bash
# Issue 15 (r15c): the barrier-light Gluon Hopper variants on the H200. One device call of at most 8 min: every
# step is bounded by `timeout` (80 + 130 + 220 + what is left below 465 s); ~5-6 min expected. From the repo root:
#     bash bench/gpu/hopper2.sh
# 1. Probes, one process per variant, all at once (a hang costs that probe's 80 s, not the call): launch and
#    float64 check of each new variant (fwd_hopper.VARIANTS with release "one"/"thread") and of each variant
#    impl="auto" runs (fwd.HOPPER_VALIDATED), and of the portable kernel, bf16 and fp16: the compiles
#    bench/prefill.py then reuses (its step 3 compiles nothing new).
# 2. GPU tests of the new variants that passed (tests/test_fwd_hopper.py: every schedule path vs float64,
#    determinism), one pytest process per variant, all at once.
# 3. bench/prefill.py: those variants beside impl="auto", portable, SDPA CUDNN and FLASH on the must grid
#    (bf16 d 64/128 x causal/not x N 4k/8k/16k; fp16 d 128 16k, d 64 4k/16k), 3 interleaved rounds per point
#    (median; ratios to CUDNN timed in the same round). Full-size float64 check first.
# 4. If time is left: ncu of the new variant with the best ratio at bf16 d=128 N=8k unmasked, beside
#    hopper_nopp (auto's pick there): SOL, compute workload (tensor pipe), scheduler (issue slots), warp states.
# Files under $OUT (7): 1_summary.txt (every step's verdict lines), 2_prefill.json, 3_prefill.log, 4_tests.log,
# 5_probes.log, 6_ncu.txt, 7_env.txt.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O"
T=$(mktemp -d)
T0=$(date +%s)
S="$O/1_summary.txt"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "$*" | tee -a "$S"; }

{ git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"
} > "$O/7_env.txt" 2>&1
cat "$O/7_env.txt"

# 1. probes
NEW=$(python -c "from attnscope.kernels import fwd_hopper as h
print(' '.join(n for n, v in h.VARIANTS.items() if v.release != 'split'))")
AUTO=$(python -c "from attnscope.kernels import fwd; print(' '.join(sorted({r[-1] for r in fwd.HOPPER_VALIDATED})))")
say "=== probes t+$(el)s: new: $NEW | auto's: $AUTO | portable"
for v in $NEW $AUTO portable; do
    ( timeout 80 python bench/sm90_resources.py --gpu --variant "$v" --dtype bf16 --dtype fp16 > "$T/probe_$v.log" 2>&1
      echo $? > "$T/probe_$v.rc" ) &
done
wait
PASS=""
for v in $NEW $AUTO portable; do
    rc=$(cat "$T/probe_$v.rc")
    { echo "--- probe $v rc=$rc"; cat "$T/probe_$v.log"; } >> "$O/5_probes.log"
    say "probe $v rc=$rc$([ "$rc" = 124 ] && echo ' (TIMED OUT: hang?)'): $(grep -c ' ok$' "$T/probe_$v.log") ok," \
        "$(grep -c ' FAIL$' "$T/probe_$v.log") FAIL"
    case " $NEW " in *" $v "*) if [ "$rc" = 0 ]; then PASS="$PASS $v"; fi;; esac
done
PASS=${PASS# }
say "new variants that passed the probe: ${PASS:-none} (t+$(el)s)"

# 2. GPU tests of the new variants (numpy's float64 reference: 2 threads per process)
say "=== GPU tests t+$(el)s"
for v in $PASS; do
    ( OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 timeout 130 python -m pytest -q -rfE \
        -p no:cacheprovider -m gpu tests/test_fwd_hopper.py -k "$v-" > "$T/tests_$v.log" 2>&1
      echo $? > "$T/tests_$v.rc" ) &
done
wait
for v in $PASS; do
    rc=$(cat "$T/tests_$v.rc")
    { echo "--- tests $v rc=$rc"; cat "$T/tests_$v.log"; } >> "$O/4_tests.log"
    say "tests $v rc=$rc$([ "$rc" = 124 ] && echo ' (TIMED OUT)'): $(tail -n 1 "$T/tests_$v.log")"
done

# 3. prefill, the must grid, 3 interleaved rounds
HV=$(echo "$PASS" | tr ' ' ',')
if [ -n "$HV" ]; then
    say "=== prefill t+$(el)s: $HV, auto, portable, cudnn, flash"
    timeout 220 python bench/prefill.py --no-flex --no-first-call --rounds 3 --hopper-variants "$HV" \
        --n 4096 --n 8192 --n 16384 --fp16 128:16384,64:4096,64:16384 --json "$O/2_prefill.json" \
        > "$O/3_prefill.log" 2>&1
    rc=$?
    say "prefill rc=$rc$([ "$rc" = 124 ] && echo ' (TIMED OUT: the JSON holds the points timed so far)')"
    grep -E "^(bf16|fp16|summary|  FAIL|all results|[0-9]+ check)" "$O/3_prefill.log" >> "$S"
else
    say "no new variant passed the probe: prefill and ncu skipped"
fi

# 4. ncu of the best new variant at bf16 d=128 N=8k unmasked, beside hopper_nopp
E=$(el)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ -n "$HV" ] && [ "$E" -lt 390 ] && [ -x "$NCU" ]; then
    BEST=$(python - "$O/2_prefill.json" "$HV" <<'EOF'
import json, sys
names = sys.argv[2].split(",")
try:
    rows = json.load(open(sys.argv[1]))["prefill"]
    row = next(r for r in rows if (r["dtype"], r["d"], r["causal"], r["n"]) == ("bfloat16", 128, False, 8192))
    ratio = row.get("cudnn_ratio", {})
    print(max((n for n in names if n in ratio), key=ratio.get))
except Exception:  # no timed row: the first new variant built at d = 128
    print(next(n for n in names if "wg3" not in n))
EOF
)
    cat > "$T/ncu_point.py" <<'EOF'
import math, sys
import torch
from attnscope.kernels import fwd, fwd_hopper as h
names = sys.argv[1:]
q, k, v = (torch.randn(2, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
def run(name, q, k, v):
    o, lse = torch.empty_like(q), torch.empty(1, device="cuda", dtype=torch.float32)
    h.launch(q, k, v, o, lse, fwd.LOG2E / math.sqrt(128), False, False, name)
for n in names:  # compile: the launches ncu skips (-s)
    run(n, *(t[:, :1, :256].contiguous() for t in (q, k, v)))
torch.cuda.synchronize()
for n in names:  # the profiled launches
    run(n, q, k, v)
torch.cuda.synchronize()
print("ncu point done:", names)
EOF
    say "=== ncu t+${E}s: $BEST then hopper_nopp, bf16 B 2 H 32 N 8192 d 128 unmasked"
    timeout $(( 465 - E )) "$NCU" --clock-control none -k regex:_attnscope_fwd_hopper -s 2 -c 2 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
        python "$T/ncu_point.py" "$BEST" hopper_nopp > "$O/6_ncu.txt" 2>&1
    say "ncu rc=$?"
    grep -E "_attnscope_fwd|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|Stall|barrier|Barrier|Tensor|Executed Ipc" \
        "$O/6_ncu.txt" | head -60 >> "$S"
else
    say "ncu skipped (t+${E}s; ncu at $NCU)"
fi
say "=== done t+$(el)s; files: $(ls "$O" | tr '\n' ' ')"
