#!/usr/bin/env bash
# Issue 18, DEVELOPMENT probe (r18s, after grid 12): does FA-2's per-CTA spill frame change with N? FA-2 d 64
# causal MHA at N 2,055-29,481 (the class l2_dev under-estimates by 8-11 %), d 64 even N 16,384, two d 128 MQA
# controls. Local store sectors at L1 (all, and lookup misses = the frame `l2.FA2_FRAME` records), local load
# misses, L2 tex write sectors and read misses, DRAM bytes. ncu kernel replay (several passes): the DRAM columns
# are a cross-check only; the sector counts do not depend on the cache state. ~15 s on one H200. This is the
# command that ran (bench/results/h200-2026-12-01-spill-n-probe-local.csv).
export PYTHONPATH=src PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/local_metrics.sh"
probe "$(grid_json bench/grids/spill_n_probe.csv)" local
