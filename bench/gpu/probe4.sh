#!/usr/bin/env bash
# Issue 18 probe 4 (DEVELOPMENT data, <= 2 min on one H200, every step under `timeout`): does a K/V line read
# by CTAs on both L2 partitions cost the L2 two copies? bench/l2_reuse.py --share measures the miss fraction
# of a re-read at reuse distances W = 20.6-82.5 MiB three ways: mixed (= experiment A, the cyclic curve the
# model's capacity 0.580 x L2 comes from), private (each chunk always re-read by the same SM) and shared
# (every program reads the whole buffer each pass, as the CTAs of one head read its K/V). Run from the
# repository root:
#     bash bench/gpu/probe4.sh
# Writes under $OUT/probe4/: share.json (every launch: DRAM read/write, miss), share.log (the table and
# each way's fitted capacity and ramp: the L2_SHARE line), env.txt. Expected: ~40-80 s (36 launches).
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/probe4; mkdir -p "$O"
T0=$(date +%s)
{ git rev-parse HEAD; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; ncu --version | tail -1
  python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$O/env.txt" 2>&1
echo "=== share $(date -u +%T)"
timeout 110 python bench/l2_reuse.py --share --timeout 100 --json "$O/share.json" > "$O/share.log" 2>&1
echo "rc=$? share (t+$(( $(date +%s) - T0 )) s)"; tail -n 20 "$O/share.log"
