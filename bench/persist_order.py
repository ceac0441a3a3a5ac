"""Issue 18 (and 15): the persistent causal schedule before and after the lockstep fix for an odd number of
query tiles (kernels/fwd_hopper.py ``_work``, `model.tiles.persistent_item`), timed on the same GPU.

    python bench/persist_order.py --old DIR --new DIR [--rounds 2] [--json FILE]

DIR: a source tree (its ``src`` goes on PYTHONPATH of a child process). Each round runs the old tree's child
and the new one's, old first in even rounds and new first in odd ones; each child checks every point against
float64 (`measure.bench._ref_error`, bf16/fp16 tolerance 0.05) before timing
``attnscope.flash_attention(impl="auto")`` and SDPA CUDNN with `triton.testing.do_bench` (median), and prints
one JSON line per point. Points: causal, where
``impl="auto"`` runs ``hopper_persist`` (model/dispatch.py), with an odd number of 128-row
tiles (where the schedule changed) and one even control.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

POINTS = [  # (B, H, N, d, dtype): 128-row tiles T = ceil(N / 128)
    (5, 13, 27163, 128, "fp16"),  # T 213 (held-out grid 9's point)
    (2, 45, 13653, 128, "fp16"),  # T 107
    (4, 32, 4224, 128, "fp16"),  # T 33
    (4, 32, 4224, 128, "bf16"),  # T 33
    (4, 32, 4224, 64, "bf16"),  # T 33
    (4, 32, 4096, 128, "fp16"),  # T 32: even, the schedule did not change
]


def child() -> int:
    import math

    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import attnscope
    from attnscope.measure.bench import _ref_error
    from attnscope.model import dispatch

    def timings(q, k, v):
        ms = triton.testing.do_bench(lambda: attnscope.flash_attention(q, k, v, causal=True, impl="auto"))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cu = triton.testing.do_bench(lambda: sdpa(q, k, v, is_causal=True))
        return ms, cu

    for b, h, n, d, dt in POINTS:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
        variant = dispatch.hopper_variant(d, True, q.shape[0], q.shape[1], k.shape[1], n, n)
        out = attnscope.flash_attention(q, k, v, causal=True, impl="auto")
        err = _ref_error(torch, out, q, k, v, True)
        if not err < 0.05:
            print(json.dumps({"point": [b, h, n, d, dt], "error": err, "fail": True}), flush=True)
            return 1
        ms, cu = timings(q, k, v)
        flop = 4 * b * h * n * n * d / 2
        print(json.dumps({"point": [b, h, n, d, dt], "tiles": math.ceil(n / 128), "variant": variant,
                          "error": err, "ms": ms, "tflops": flop / ms / 1e9, "cudnn_ms": cu}), flush=True)
        del q, k, v, out
        torch.cuda.empty_cache()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old")
    p.add_argument("--new")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--child", action="store_true")
    a = p.parse_args()
    if a.child:
        return child()
    runs = {"old": [], "new": []}
    for i in range(a.rounds):  # the order alternates between rounds
        for tag, tree in (("old", a.old), ("new", a.new))[::1 if i % 2 == 0 else -1]:
            env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "src"))
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                               capture_output=True, text=True, timeout=400)
            rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
            if r.returncode or any(x.get("fail") for x in rows):
                print(f"{tag}: rc {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}")
                return 1
            runs[tag].append(rows)
    print("| B, H, N, d, dtype | tiles | variant | old TFLOP/s | new TFLOP/s | new / old | new / CUDNN |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, pt in enumerate(POINTS):
        old = statistics.median(r[i]["ms"] for r in runs["old"])
        new = statistics.median(r[i]["ms"] for r in runs["new"])
        cu = statistics.median(r[i]["cudnn_ms"] for r in runs["new"] + runs["old"])
        row = runs["new"][0][i]
        flop = row["tflops"] * row["ms"]
        print(f"| {', '.join(map(str, pt))} | {row['tiles']} | {row['variant']} | {flop / old:.1f} | "
              f"{flop / new:.1f} | {old / new:.3f} | {cu / new:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
