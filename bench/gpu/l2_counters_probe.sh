#!/usr/bin/env bash
# Issue 18 development probe (2026-12-01, twelfth session): which L2 counters the H200's ncu exposes for evictions,
# write-backs and traffic between the two L2 partitions (the "fabric"), and those counters over
# bench/grids/l2_counters_probe.csv (FA-2 causal, the spill-frame write-back class; see that file). Step 1 lists
# every lts__ / dram__ metric whose name says evict, fabric, fill, writeback or dirty ($OUT/l2-metrics.txt). Step 2
# runs the attnscope ncu child under local_metrics.sh's metrics plus every candidate below that step 1 found
# ($OUT/l2counters.csv). ncu kernel replay: DRAM columns are a cross-check only.
export PYTHONPATH=src PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/local_metrics.sh"
ncu --query-metrics > "$OUT/all-metrics.txt" 2>&1
grep -E "^[[:space:]]*(lts|dram|ltc)__" "$OUT/all-metrics.txt" | grep -i -E "evict|fabric|fill|writeback|dirty|srcunit|srcnode" \
    > "$OUT/l2-metrics.txt"
wc -l "$OUT/all-metrics.txt" "$OUT/l2-metrics.txt"
CANDIDATES="lts__t_sectors_srcunit_ltcfabric lts__t_sectors_srcunit_ltcfabric_op_read lts__t_sectors_srcunit_ltcfabric_op_write
lts__t_sectors_srcunit_ltcfabric_lookup_miss lts__t_sectors_srcunit_ltcfabric_lookup_hit
lts__t_sectors_srcunit_tex_op_write_lookup_miss lts__t_sectors_srcunit_tex_op_write_lookup_hit
lts__t_sectors_srcunit_tex_op_read_lookup_hit lts__t_sectors_srcnode_ltcfabric lts__t_sectors_srcnode_gpc
lts__d_sectors_fill_device lts__d_sectors_fill_sysmem lts__t_sectors_evict lts__d_sectors_evict
lts__t_sectors_op_write lts__t_sectors_op_read lts__t_sectors_lookup_miss lts__t_requests_srcunit_ltcfabric"
for m in $CANDIDATES $(grep -o -E "lts__[a-z0-9_]*evict[a-z0-9_]*" "$OUT/l2-metrics.txt" | sort -u | head -6); do
    if grep -q -E "(^|[[:space:]])$m([[:space:]]|$)" "$OUT/all-metrics.txt" && [[ ",$M," != *",$m.sum,"* ]]; then M=$M,$m.sum; fi
done
echo "metrics: $M" | tee "$OUT/l2counters-metrics.txt"
probe "$(grid_json bench/grids/l2_counters_probe.csv)" l2counters
