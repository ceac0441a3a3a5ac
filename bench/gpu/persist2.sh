#!/usr/bin/env bash
# Issue 15 / 18: the persistent Gluon kernel with causal tiles in balanced pairs (fwd_hopper `_work`), on one
# H200, <= 9.5 min, every step under `timeout`. From the repo root: bash bench/gpu/persist2.sh
# 1. probes (float64 check, bf16 + fp16, causal and not) of the candidate variants in parallel processes: the
#    compiles step 4 reuses; 2. GPU schedule tests of the persistent variants (odd tile counts, several
#    rounds, Nq != Nk); 3. persist_check.sh's time and bytes at B = 2, H = 45, N = 13,653 and B = 1, H = 32,
#    N = 16k; 4. the table's 4k/8k rows: bench/prefill.py with the candidate variants, 3 rounds.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
O=${OUT:-/tmp/out}; mkdir -p $O
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
V="hopper hopper_nopp hopper_deep hopper_persist hopper_pt_persist hopper_persist_pp hopper_pt_nopp hopper_wg3_pp hopper_pt_wg3_pp"
echo "=== probes t+$(el)s"
for v in $V portable; do
    ( timeout 90 python bench/sm90_resources.py --gpu --variant $v --dtype bf16 --dtype fp16 > /tmp/probe_$v.log 2>&1
      echo "probe $v rc=$? $(grep -c ' ok$' /tmp/probe_$v.log) ok $(grep -c ' FAIL$' /tmp/probe_$v.log) FAIL" ) &
done | tee $O/probes.txt
wait
cat /tmp/probe_*.log >> $O/probes.txt
echo "=== tests t+$(el)s"
OMP_NUM_THREADS=8 timeout 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_fwd_hopper.py \
    -k "persist" > $O/tests.log 2>&1
echo "tests rc=$?: $(tail -n 1 $O/tests.log)"
echo "=== persist_check t+$(el)s"
mkdir -p /tmp/pc; OUT=/tmp/pc timeout 170 bash bench/gpu/persist_check.sh > /tmp/pc/persist_check.log 2>&1
echo "persist_check rc=$?"; tar czf $O/persist_check.tgz -C /tmp pc
grep -E "^(bf16|fp16)|summary|physical|measured" /tmp/pc/*.log | head -40
E=$(el); echo "=== table t+${E}s"
HV=$(echo $V | tr ' ' ',')
timeout $(( 560 - E )) python bench/prefill.py --no-flex --no-first-call --rounds 3 --hopper-variants $HV \
    --n 4096 --n 8192 --fp16 128:4096,128:8192,64:4096 --json $O/table.json > $O/table.log 2>&1
echo "table rc=$? t+$(el)s"
grep -E "^(bf16|fp16|summary)" $O/table.log
