#!/usr/bin/env bash
# Issue 18 development probe (twelfth session): bench/first_spec_probe.py under ncu, each scratch variant and spec
# in its own process; prints MiB per head of DRAM writes of the measured call at positions 0, 1, 2.
export PYTHONPATH=src PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for spec in 0 1; do
  for v in ${VARIANTS:-fill nofill fill-flush primer}; do
    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum --cache-control none --clock-control none \
        --profile-from-start off --csv --print-units base --log-file /tmp/first-$v-$spec.csv \
        python bench/first_spec_probe.py $v $spec > /tmp/first.log 2>&1
    python - /tmp/first-$v-$spec.csv $v $spec <<'PY'
import csv, io, sys
rows = [r for r in csv.DictReader(io.StringIO("\n".join(l for l in open(sys.argv[1]) if l.startswith('"'))))]
val = lambda r: float(r["Metric Value"].replace(",", ""))
call = [r for r in rows if "spin_kernel" not in r["Kernel Name"] and "reduce" not in r["Kernel Name"]]
w = [val(r) for r in call if r["Metric Name"] == "dram__bytes_write.sum"]
rd = [val(r) for r in call if r["Metric Name"] == "dram__bytes_read.sum"]
bh = 68 if sys.argv[3] == "0" else 25
print(sys.argv[2], "spec", sys.argv[3], "write MiB/head", [round(x / bh / 2**20, 3) for x in w], "read", [round(x / bh / 2**20, 3) for x in rd])
PY
    cp /tmp/first-$v-$spec.csv "$OUT/"
  done
done
