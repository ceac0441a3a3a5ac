"""Decode benchmark (issue 5): attnscope split-KV vs attnscope 1-split vs SDPA FLASH / CUDNN, plus a
read-only streaming ceiling measured in the same run.

    PYTHONPATH=src python bench/decode.py [--quick] [--json out.json]

bf16, d = 128, (B, Hq, Hkv) in {(1,32,32), (1,32,8), (16,32,8), (64,32,8)}, L in {4k, 32k, 128k}.
"""

import argparse
import sys

from attnscope.cli.gpu import add_bench_arguments
from attnscope.measure import bench

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(p)
    args = p.parse_args(["--kind", "decode", *sys.argv[1:]])
    sys.exit(bench.run(args))
