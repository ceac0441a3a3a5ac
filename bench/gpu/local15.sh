#!/usr/bin/env bash
# Issue 18 probe (2026-12-01, tenth session): grid 15's two misses under ncu's local-memory and L2 sector counters
# (the metrics of spill_n_probe.sh): FA-2 B 5 H 45/1 N 10,095 d 64 fp16 causal (-12.5 %) and B 2 H 63 N 20,577
# d 128 bf16 unmasked (+18.9 %), plus the first at N 5,047 and 20,190 (the same heads, a half and twice the
# generations). ncu kernel replay: DRAM columns are a cross-check only; sector counts do not depend on cache state.
export PYTHONPATH=src PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=dram__bytes_read.sum,dram__bytes_write.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum
M=$M,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
S='[{"impl":"flash","batch":5,"heads":45,"kv_heads":1,"n":10095,"d":64,"causal":true,"dtype":"fp16"},'
S=$S'{"impl":"flash","batch":5,"heads":45,"kv_heads":1,"n":5047,"d":64,"causal":true,"dtype":"fp16"},'
S=$S'{"impl":"flash","batch":5,"heads":45,"kv_heads":1,"n":20190,"d":64,"causal":true,"dtype":"fp16"},'
S=$S'{"impl":"flash","batch":2,"heads":63,"n":20577,"d":128,"causal":false,"dtype":"bf16"}]'
timeout 220 ncu --metrics "$M" --cache-control none --clock-control none --profile-from-start off --csv \
    --print-units base --log-file "$OUT/local15.csv" python -m attnscope.measure.ncu --child "$S" > "$OUT/local15.log" 2>&1
echo "rc=$?"; tail -3 "$OUT/local15.log"
