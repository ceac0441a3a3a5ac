"""Time the decode kernel per block config and split count, autotuner bypassed, beside SDPA CUDNN.

    PYTHONPATH=src python bench/tune_decode.py [--out FILE.json]

For choosing the config set and the num_splits heuristic in kernels/decode.py. bf16, d = 128, the issue's
(B, Hq, Hkv) x L grid; effective TB/s = K and V bytes / time.
"""

import argparse
import json
import sys

import torch
import triton

from attnscope.kernels import decode
from attnscope.measure.backends import sdpa
from attnscope.measure.bench import DECODE_GRID, DECODE_LS

CONFIGS = [(64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 4, 4), (256, 8, 2), (256, 8, 3), (64, 4, 3),
           (32, 4, 4)]
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    a = p.parse_args()
    cudnn = sdpa("cudnn")
    rows = []
    for b, hq, hkv in DECODE_GRID:
        for L in DECODE_LS:
            q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
            kv = 2 * k.numel() * 2

            def tbs(fn, kv=kv):
                return kv / triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") / 1e9

            ref = tbs(lambda q=q, k=k, v=v, g=hq != hkv: cudnn(q, k, v, False, gqa=g))
            auto = tbs(lambda q=q, k=k, v=v: decode.flash_decode(q, k, v))
            default_s = decode.default_num_splits(b, hkv, L)
            best = (0.0, None)
            for bn, w, st in CONFIGS:
                for s in SPLITS:
                    if L // s < 256 and s > 1:
                        continue
                    cfg = dict(BLOCK_N=bn, STAGES=st, num_warps=w, num_stages=st)
                    try:
                        t = tbs(lambda q=q, k=k, v=v, s=s, cfg=cfg: decode.flash_decode(q, k, v, num_splits=s,
                                                                                      _config=cfg))
                    except Exception as e:  # noqa: BLE001
                        print(f"   cfg {cfg} s={s} failed: {str(e)[:100]}")
                        continue
                    rows.append(dict(b=b, hq=hq, hkv=hkv, L=L, bn=bn, w=w, st=st, s=s, tbs=t))
                    if t > best[0]:
                        best = (t, (bn, w, st, s))
            print(f"B={b:2d} Hq={hq} Hkv={hkv:2d} L={L:6d}: cudnn {ref:.2f}  auto(s={default_s}) {auto:.2f}  "
                  f"best {best[0]:.2f} at (BN, warps, stages, splits)={best[1]}", flush=True)
            rows.append(dict(b=b, hq=hq, hkv=hkv, L=L, cudnn=ref, auto=auto, best=best))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
