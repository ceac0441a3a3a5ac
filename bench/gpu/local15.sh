#!/usr/bin/env bash
# Issue 18 probe (2026-12-01, tenth session): grid 15's two misses under ncu's local-memory and L2 sector counters
# (bench/gpu/local_metrics.sh): FA-2 B 5 H 45/1 N 10,095 d 64 fp16 causal (-12.5 %) and B 2 H 63 N 20,577
# d 128 bf16 unmasked (+18.9 %), plus the first at N 5,047 and 20,190 (the same heads, a half and twice the
# generations). ncu kernel replay: DRAM columns are a cross-check only; sector counts do not depend on cache state.
export PYTHONPATH=src PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/local_metrics.sh"
S='[{"impl":"flash","batch":5,"heads":45,"kv_heads":1,"n":10095,"d":64,"causal":true,"dtype":"fp16"},'
S=$S'{"impl":"flash","batch":5,"heads":45,"kv_heads":1,"n":5047,"d":64,"causal":true,"dtype":"fp16"},'
S=$S'{"impl":"flash","batch":5,"heads":45,"kv_heads":1,"n":20190,"d":64,"causal":true,"dtype":"fp16"},'
S=$S'{"impl":"flash","batch":2,"heads":63,"n":20577,"d":128,"causal":false,"dtype":"bf16"}]'
probe "$S" local15
