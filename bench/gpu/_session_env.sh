# Sourced by bench/gpu/session11.sh and later: the environment, $O (logs), `step NAME SECONDS CMD...` (a bounded
# step whose log goes to $O/NAME.log and whose last ${TAIL:-25} lines are printed) and $O/env.txt.
export PYTHONPATH=src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin ATTNSCOPE_NCU_TIMEOUT_S=150
O=${OUT:-/tmp/out}; mkdir -p $O
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -${TAIL:-25} $O/$name.log; }
{ git log -1 --format=%h; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; ncu --version | tail -1
  python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"; } > $O/env.txt 2>&1
