#!/usr/bin/env bash
# Issue 18: same tensors vs fresh placements, with clocks (bench/variance_probe.py). ~1-2 min on one H200.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/variance; mkdir -p "$O"
M=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__cycles_elapsed.avg.per_second
timeout ${1:-240} ncu --clock-control none --cache-control none --profile-from-start off --metrics "$M" --csv \
    python bench/variance_probe.py --run > "$O/ncu.csv" 2> "$O/ncu.err"
echo "ncu rc=$?"; tail -3 "$O/ncu.err"
python bench/variance_probe.py --summary "$O/ncu.csv" | tee "$O/summary.txt"
