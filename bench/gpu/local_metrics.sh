# ncu metrics of the local-memory probes (sourced by spill_n_probe.sh and local15.sh): DRAM bytes, local store
# sectors at L1 (all, and lookup misses = the frames touched), local load misses, L2 tex write sectors and read misses.
M=dram__bytes_read.sum,dram__bytes_write.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum
M=$M,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
# grid_json GRID: a grid CSV (bench/grids/) as the ncu child's JSON spec list (the specs `bytes --sweep` measures)
grid_json() {
    python -c 'import json, sys; from attnscope.measure import physical; print(json.dumps(physical.parse_grid(sys.argv[1])))' "$1"
}
# probe SPEC_JSON LOGNAME: the attnscope ncu child under those metrics, kernel replay, CSV in $OUT/LOGNAME.csv
probe() {
    timeout 220 ncu --metrics "$M" --cache-control none --clock-control none --profile-from-start off --csv \
        --print-units base --log-file "$OUT/$2.csv" python -m attnscope.measure.ncu --child "$1" > "$OUT/$2.log" 2>&1
    echo "rc=$?"; tail -3 "$OUT/$2.log"
}
