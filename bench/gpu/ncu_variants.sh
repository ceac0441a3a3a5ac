#!/usr/bin/env bash
# Issue 15: ncu of every prefill variant (portable + each Gluon variant built for the point) beside SDPA CUDNN and
# FLASH at the points where the must is missed: bf16 and fp16 d = 64 causal N = 4k, fp16 d = 128 unmasked 4k
# (B 4, H 32). bench/ncu_variants.py checks each against float64 first. Writes $OUT/ncu_variants/*.csv and
# tables.md. ~3-4 min on a fresh H200 (cold compiles). From the repo root:  bash bench/gpu/ncu_variants.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/ncu_variants; mkdir -p "$O"
M=$(python bench/ncu_variants.py run --metrics)
# keep only metrics this ncu knows (an unknown name fails the whole run)
ncu --query-metrics --chip gh100 > /tmp/ncu_metrics_all.txt 2>&1
M=$(for m in ${M//,/ }; do { [[ $m == launch__* ]] || grep -q "^${m%%.*}\b" /tmp/ncu_metrics_all.txt; } && echo "$m"; done | paste -sd, -)
T=$(grep -oE "^(sm__pipe_tensor[a-z_]*_cycles_active|sm__inst_executed_pipe_tensor[a-z_]*)\b" /tmp/ncu_metrics_all.txt | sort -u | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
[ -n "$T" ] && M=$(echo "$M,$T" | tr "," "\n" | sort -u | paste -sd, -)
echo "metrics: $M"
for pt in "bf16 64 --causal" "fp16 64 --causal" "fp16 128"; do
    set -- $pt
    f="$O/$1_d$2${3:+_causal}.csv"
    echo "=== $pt $(date -u +%T)"
    timeout 200 ncu --clock-control none --profile-from-start off --csv --metrics "$M" \
        python bench/ncu_variants.py run --dtype "$1" --d "$2" $3 > "$f" 2> "$f.err"
    echo "rc=$?"; grep -E "check|FAIL|order|Error|error" "$f.err" | tail -30; cat "$f.err" >> "$f"; rm -f "$f.err"
done
python bench/ncu_variants.py table "$O"/*.csv | tee "$O/tables.md"
