"""Time candidate block configurations of the prefill kernel (``config=`` bypasses the table), beside SDPA.

    PYTHONPATH=src python bench/tune_prefill.py --d 128 --n 4096 --n 16384 [--out FILE.json]

For picking the rows of kernels/fwd.py's CONFIG_TABLE: each config is checked against SDPA FLASH's
output (max abs diff) and timed (median, CUDA events); peers SDPA FLASH and CUDNN on the same tensors.
"""

import argparse
import itertools
import json
import sys
import time

import torch
import triton

from attnscope.kernels import fwd
from attnscope.measure.backends import sdpa


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, action="append")
    p.add_argument("--n", type=int, action="append")
    p.add_argument("--causal", type=int, action="append")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--bm", type=int, action="append")
    p.add_argument("--bn", type=int, action="append")
    p.add_argument("--warps", type=int, action="append")
    p.add_argument("--stages", type=int, action="append")
    p.add_argument("--out")
    a = p.parse_args()
    results = []
    flash, cudnn = sdpa("flash"), sdpa("cudnn")
    for d, causal, n in itertools.product(a.d or [128], a.causal or [0, 1], a.n or [4096, 16384]):
        b = max(1, a.tokens // n)
        q, k, v = (torch.randn(b, a.heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * a.heads * n * n * d * (0.5 if causal else 1)
        ref = flash(q, k, v, bool(causal))
        peers = {}
        for name, fn in (("flash", flash), ("cudnn", cudnn)):
            ms = triton.testing.do_bench(lambda fn=fn, q=q, k=k, v=v, c=bool(causal): fn(q, k, v, c),
                                         warmup=25, rep=100, return_mode="median")
            peers[name] = flops / ms / 1e9
        print(f"d={d} causal={causal} N={n} B={b}: flash {peers['flash']:.0f} "
              f"cudnn {peers['cudnn']:.0f} TFLOP/s", flush=True)
        for bm, bn, w, s in itertools.product(a.bm or [128], a.bn or [64, 128], a.warps or [4, 8],
                                              a.stages or [2, 3, 4]):
            cfg = fwd.FwdConfig(bm, bn, w, s)
            t0 = time.time()
            try:
                o = fwd.flash_attention(q, k, v, bool(causal), config=cfg)
                torch.cuda.synchronize()
                diff = (o.float() - ref.float()).abs().max().item()
                ms = triton.testing.do_bench(
                    lambda cfg=cfg, q=q, k=k, v=v, c=bool(causal): fwd.flash_attention(q, k, v, c,
                                                                                        config=cfg),
                    warmup=25, rep=100, return_mode="median")
                tf = flops / ms / 1e9
                row = dict(d=d, causal=causal, n=n, cfg=cfg._asdict(), tflops=tf, diff=diff,
                           vs_cudnn=tf / peers["cudnn"], vs_flash=tf / peers["flash"])
                print(f"  bm={bm} bn={bn} w={w} s={s}: {tf:6.1f} TFLOP/s  "
                      f"/cudnn {tf / peers['cudnn']:.3f} /flash {tf / peers['flash']:.3f}  "
                      f"maxdiff {diff:.2e}  "
                      f"({time.time() - t0:.1f}s)", flush=True)
            except Exception as e:  # noqa: BLE001
                row = dict(d=d, causal=causal, n=n, cfg=cfg._asdict(),
                           error=f"{type(e).__name__}: {str(e)[:200]}")
                print(f"  bm={bm} bn={bn} w={w} s={s}: FAILED {row['error'][:150]}",
                      flush=True)
            results.append(row)
        results.append(dict(d=d, causal=causal, n=n, peers=peers))
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
