#!/usr/bin/env bash
# Issue 18 spill probe, one bounded device call (<= 5 min; every step under `timeout`): DEVELOPMENT data
# for the terms model/l2.py lacks (heldout2's misses). Run from the repository root:
#     bash bench/gpu/spill_probe.sh
# Writes under $OUT/spill1/ (7 files, key ones first):
#   probe.json / probe.log  `attnscope bytes --sweep bench/grids/spill_probe.csv`: DRAM read/write per kernel
#                            (ncu's plain 2-metric pass, the trusted numbers) beside the estimate (~150 s)
#   local.txt / local.csv    ncu on the FLASH points + EFFICIENT N=32001: DRAM bytes, local-memory load/store
#                            sectors at L1 (all, and L1 misses), L1<->L2 lg sectors, L2 tex-unit read/write
#                            sectors (+ write misses), global ld/st sectors, LaunchStats (registers, grid);
#                            several metric passes (kernel replay), so its DRAM column is a cross-check only
#   resusage.txt             cuobjdump -res-usage of torch's sm_90 FA-2 / mem-eff kernels: REG, STACK (the
#                            per-thread local frame the spills live in), SHARED
#   env.txt                  commit, GPU, driver, ncu, torch
# Expected: ~5 s + ~150 s + ~80 s + ~30 s (bounds 170 + 85 + 30 s).
export PYTHONPATH=src PYTHONUNBUFFERED=1 ATTNSCOPE_NCU_TIMEOUT_S=84 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}/spill1; mkdir -p "$O"
T0=$(date +%s)
{ git rev-parse HEAD; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; ncu --version | tail -1
  python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"; } > "$O/env.txt" 2>&1
step() {  # step NAME SECONDS CMD...: bounded, log to $O/NAME.log, print rc and the log's tail
    local name=$1 t=$2; shift 2
    echo "=== $name $(date -u +%T) (t+$(( $(date +%s) - T0 )) s)"
    timeout "$t" "$@" > "$O/$name.log" 2>&1; local rc=$?
    echo "rc=$rc $name$([ $rc = 124 ] && echo ' (TIMED OUT)')"; tail -n "${TAIL:-8}" "$O/$name.log"
}
# 1. the trusted DRAM bytes and the estimate, 13 points per ncu process (2 processes; the 4 attnscope
#    points, which compile Triton kernels from a cold cache, share the first)
TAIL=40 step probe 170 python -m attnscope bytes --sweep bench/grids/spill_probe.csv --per-child 13 --json "$O/probe.json"
# 2. where the extra bytes come from: local-memory (spill) traffic at L1 and L2 beside DRAM, one process
M=dram__bytes_read.sum,dram__bytes_write.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
M=$M,l1tex__m_l1tex2xbar_write_sectors_mem_lg_op_st.sum,l1tex__m_xbar2l1tex_read_sectors_mem_lg_op_ld.sum
M=$M,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__t_sectors_srcunit_tex_op_write_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
SPECS=$(python -c "
import json; from attnscope.measure import physical
s = physical.parse_grid('bench/grids/spill_probe.csv')
print(json.dumps([x for x in s if x['impl'] == 'flash' or (x['impl'] == 'efficient' and x['n'] == 32001 and not x['causal'])]))")
echo "=== local $(date -u +%T) (t+$(( $(date +%s) - T0 )) s)"
timeout 85 ncu --metrics "$M" --section LaunchStats --cache-control none --clock-control none --profile-from-start off \
    --csv --print-units base --log-file "$O/local.csv" python -m attnscope.measure.ncu --child "$SPECS" > "$O/local.log" 2>&1
echo "rc=$? local"; tail -n 3 "$O/local.log"
python - "$O/local.csv" "$SPECS" > "$O/local.txt" 2>&1 <<'PY'
import csv, io, json, sys
text = open(sys.argv[1], errors="replace").read().splitlines()
start = next(i for i, s in enumerate(text) if '"Kernel Name"' in s and '"Metric Value"' in s)
by = {}
for r in csv.DictReader(io.StringIO("\n".join(s for s in text[start:] if s.startswith('"')))):
    by.setdefault(int(r["ID"]), {"name": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
calls, specs = [], json.loads(sys.argv[2])
for k in (by[i] for i in sorted(by)):
    if "spin_kernel" in k["name"]:
        calls.append([])
    elif calls:
        calls[-1].append(k)
short = {"dram__bytes_read.sum": "dramR", "dram__bytes_write.sum": "dramW", "launch__registers_per_thread": "regs",
         "launch__grid_size": "grid", "launch__block_size": "block"}
for spec, ks in zip(specs, calls):
    print(json.dumps(spec))
    for k in ks:
        vals = {short.get(m, m.replace("l1tex__t_sectors_pipe_lsu_mem_", "l1_").replace(".sum", "")
                          .replace("l1tex__m_", "").replace("lts__t_sectors_srcunit_tex_", "l2tex_")): v
                for m, v in k.items() if m != "name" and (m in short or m.endswith(".sum"))}
        print("   ", k["name"][:90], json.dumps(vals))
PY
head -c 3000 "$O/local.txt"
# 3. the per-thread local frame (spill space) of the kernels torch ships for sm_90
echo "=== resusage $(date -u +%T) (t+$(( $(date +%s) - T0 )) s)"
LIB=$(python -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
for f in "$LIB"/libtorch_cuda.so "$LIB"/libflash_attention*.so; do
    [ -f "$f" ] && timeout 30 cuobjdump -arch sm_90 -res-usage "$f" 2>/dev/null \
        | grep -A1 -E "flash_fwd|fmha_cutlassF" | grep -v -- "^--" | cut -c1-700 | head -600
done > "$O/resusage.txt" 2>&1
echo "resusage: $(wc -l < "$O/resusage.txt") lines"; grep -c STACK "$O/resusage.txt"
echo "=== done $(date -u +%T) (t+$(( $(date +%s) - T0 )) s); files: $(ls "$O" | tr '\n' ' ')"
