#!/usr/bin/env bash
# Issue 15: bench/ncu_variants.py at the one bf16 must point still below CUDNN (d = 64 causal N = 4k, B 4, H 32),
# every variant incl. hopper_wg3_persist / hopper_wg3_pp_persist (added after ncu_variants.sh ran). ~1.5 min.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p "$O"
M=$(python bench/ncu_variants.py run --metrics)
ncu --query-metrics --chip gh100 > /tmp/ncu_metrics_all.txt 2>&1
M=$(for m in ${M//,/ }; do { [[ $m == launch__* ]] || grep -q "^${m%%.*}\b" /tmp/ncu_metrics_all.txt; } && echo "$m"; done | paste -sd, -)
# the tensor-pipe counters this ncu names (the table prints every metric with "tensor" in its name)
T=$(grep -oE "^(sm__pipe_tensor[a-z_]*_cycles_active|sm__inst_executed_pipe_tensor[a-z_]*)\b" /tmp/ncu_metrics_all.txt | sort -u | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
echo "tensor metrics: $T"; [ -n "$T" ] && M=$(echo "$M,$T" | tr "," "\n" | sort -u | paste -sd, -)
f="$O/bf16_d64_causal.csv"
timeout 250 ncu --clock-control none --profile-from-start off --csv --metrics "$M" \
    python bench/ncu_variants.py run --dtype bf16 --d 64 --causal > "$f" 2> "$f.err"
echo "rc=$?"; grep -E "check|FAIL|order" "$f.err" | tail -30; cat "$f.err" >> "$f"; rm -f "$f.err"
python bench/ncu_variants.py table "$f" | tee "$O/table.md"
