#!/usr/bin/env bash
# Issue 18 probe (2026-12-01, tenth session): grid 15's two misses under ncu's local-memory and L2 sector counters
# (bench/gpu/local_metrics.sh): FA-2 B 5 H 45/1 N 10,095 d 64 fp16 causal (-12.5 %) and B 2 H 63 N 20,577
# d 128 bf16 unmasked (+18.9 %), plus the first at N 5,047 and 20,190 (the same heads, a half and twice the
# generations). ncu kernel replay: DRAM columns are a cross-check only; sector counts do not depend on cache state.
export PYTHONPATH=src PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/local_metrics.sh"
probe "$(grid_json bench/grids/local15_probe.csv)" local15
