"""Prefill benchmark: attnscope vs SDPA FLASH / CUDNN / EFFICIENT / naive, same inputs, same run; then the
first-call latency of every kernel variant with a cold and a warm Triton cache.

    PYTHONPATH=src python bench/prefill.py [--quick] [--json out.json] [--no-first-call]

Sweep (measure/bench.py): bf16, H = 32, B*N = 16,384, N in {1k .. 16k}, d in {64, 128}, causal and not;
each kernel is checked against float64 at the full shape before it is timed.

First call: a child process per cache state runs each variant (d in {64, 128} x causal x {fp16, bf16})
once and times that first call (host wall clock to completion; compile included), after CUDA is already
initialised. "cold": TRITON_CACHE_DIR is a fresh empty directory; "warm": a second process with the same
directory. The kernels pick their configs from a measured table, so no call runs an autotuning sweep.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from attnscope.measure import bench

# Runs in a child process; prints one JSON line.
_FIRST_CALL = r"""
import json, time, torch
import attnscope
torch.zeros(1, device="cuda"); torch.cuda.synchronize()  # CUDA context outside the timed calls
rows = []
for d in (128, 64):
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            q, k, v = (torch.randn(2, 32, 1024, d, device="cuda", dtype=dtype) for _ in range(3))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            attnscope.flash_attention(q, k, v, causal=causal)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            attnscope.flash_attention(q, k, v, causal=causal)
            torch.cuda.synchronize()
            rows.append(dict(d=d, dtype=str(dtype).split(".")[-1], causal=causal,
                             first_s=t1 - t0, second_s=time.perf_counter() - t1))
print(json.dumps(rows))
"""


def first_call_latency(log=print) -> list[dict]:
    """First-call seconds per variant, cold and warm Triton cache (two child processes, one cache dir)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="attnscope-triton-cache-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        for state in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True,
                               timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"first-call child ({state}) failed:\n{r.stderr[-3000:]}")
            for row in json.loads(r.stdout.strip().splitlines()[-1]):
                row["cache"] = state
                out.append(row)
                log(f"first call, {state} cache: d={row['d']} {row['dtype']} causal={int(row['causal'])}: "
                    f"{row['first_s']:.2f} s (second call {row['second_s'] * 1e3:.1f} ms)")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(p)
    p.add_argument("--no-first-call", action="store_true", help="skip the first-call latency children")
    args = p.parse_args(["--kind", "prefill", *sys.argv[1:]])
    if not args.n and not args.quick:
        args.n = [1024, 2048, 4096, 8192, 16384]
    rc = bench.run(args)
    if rc or args.from_json or args.no_first_call:
        sys.exit(rc)
    rows = first_call_latency()
    if args.json:
        with open(args.json) as f:
            recorded = json.load(f)
        recorded["first_call"] = rows
        with open(args.json, "w") as f:
            json.dump(recorded, f, indent=1)
    sys.exit(0)
