"""Prefill benchmark (issue 4): attnscope vs SDPA FLASH / CUDNN / EFFICIENT / naive, same inputs, same run.

    PYTHONPATH=src python bench/prefill.py [--quick] [--json out.json]

bf16, H = 32, B*N = 16,384, N in {512 .. 16k}, d in {64, 128}, causal and not; plus fp16 at N = 4096.
Each kernel is checked against float64 at the full shape before it is timed (measure/bench.py).
"""

import argparse
import sys

from attnscope.cli.gpu import add_bench_arguments
from attnscope.measure import bench

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(p)
    args = p.parse_args(["--kind", "prefill", *sys.argv[1:]])
    sys.exit(bench.run(args))
