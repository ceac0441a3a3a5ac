#!/usr/bin/env bash
# One device call on nvidia-h200-x2: distributed tests, the context-parallel bench (quick then full),
# then the single-GPU Hopper check and prefill baseline on GPU 0; each step bounded; logs under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/env.txt; nvidia-smi topo -m >> $O/env.txt
python -c "import torch,triton;print(torch.__version__,triton.__version__, torch.backends.cudnn.version())" >> $O/env.txt
step() { name=$1; t=$2; shift 2; echo "=== $name $(date -u +%T)"; timeout $t "$@" > $O/$name.log 2>&1; echo "rc=$? $name"; tail -6 $O/$name.log; }
step dist_tests 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_distributed.py  # the CPU cases need numpy<2.4 (the GPU image has 2.4)
step cp_quick 120 torchrun --nproc_per_node 2 bench/context_parallel.py --quick --json $O/cp_quick.json
step cp_full ${CP_FULL_T:-240} torchrun --nproc_per_node 2 bench/context_parallel.py --json $O/cp_full.json
