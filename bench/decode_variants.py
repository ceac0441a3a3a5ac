"""The fused merge against the separate combine kernel: a race check, then kernel and eager timings.

    PYTHONPATH=src python bench/decode_variants.py [--json FILE]

1. Race check: the fused merge hands partials between programs through an atomic ticket; a missing
   fence would show as a result that differs between identical calls. Each case is called 2,000 times
   on one stream and every output compared bit for bit with the first (and with float64 attention).
2. Timing, bf16, d = 128: `flash_decode` with ``fuse_combine`` True and False on the issue's grid and on
   MQA shapes (the fused merge's worst case: one program merges 32 heads' partials), as CUDA-graph
   replays and eagerly; which one `_fuse_by_default` picks is printed beside them.
"""

import argparse
import json
import sys

import torch
import triton

from attnscope.kernels import decode
from attnscope.measure.bench import DECODE_GRID, DECODE_LS


def race_check(log):
    out = []
    for b, hq, hkv, L, lens in ((1, 32, 8, 4096, None), (4, 32, 8, 8192, (8192, 1, 0, 5000)),
                                (2, 32, 32, 2048, None), (3, 8, 1, 20000, (20000, 300, 7))):
        torch.manual_seed(b * L)
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda") if lens else None
        s = decode.default_num_splits(b, hkv, max(lens) if lens else L, 132)
        first = decode.flash_decode(q, k, v, sl, fuse_combine=True, return_lse=True)
        bad = 0
        for _ in range(2000):
            o, lse = decode.flash_decode(q, k, v, sl, fuse_combine=True, return_lse=True)
            bad += int(not (torch.equal(o, first[0]) and torch.equal(lse, first[1])))
        sep = decode.flash_decode(q, k, v, sl, fuse_combine=False)
        ref_err = None
        n = torch.tensor(lens) if lens else torch.full((b,), L)
        kk, vv = k.double().repeat_interleave(hq // hkv, 1), v.double().repeat_interleave(hq // hkv, 1)
        errs = []
        for i in range(b):
            if int(n[i]) == 0:
                errs.append(float(first[0][i].abs().max()))
                continue
            ref = torch.nn.functional.scaled_dot_product_attention(q[i:i + 1].double(), kk[i:i + 1, :, :n[i]],
                                                                   vv[i:i + 1, :, :n[i]])
            errs.append(float((first[0][i:i + 1].double() - ref).abs().max()))
        ref_err = max(errs)
        diff = float((sep.float() - first[0].float()).abs().max())
        row = dict(b=b, hq=hq, hkv=hkv, L=L, lens=lens, splits=s, mismatches=bad, max_err_vs_f64=ref_err,
                   fused_vs_separate=diff)
        out.append(row)
        log(f"race check B={b} Hq={hq} Hkv={hkv} L={L} lens={lens} splits={s}: {bad} of 2000 calls differ "
            f"from the first; max err vs float64 {ref_err:.2e}; fused vs separate {diff:.2e}")
    return out


def timings(log):
    rows = []
    grid = [(b, hq, hkv, L) for b, hq, hkv in DECODE_GRID for L in DECODE_LS]
    grid += [(1, 32, 1, 32768), (1, 32, 1, 131072), (4, 32, 1, 32768)]
    for b, hq, hkv, L in grid:
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, L, 128, device="cuda", dtype=torch.bfloat16)
        kv = 2 * k.numel() * 2
        s = decode.default_num_splits(b, hkv, L, 132)
        row = dict(b=b, hq=hq, hkv=hkv, L=L, splits=s,
                   default_fused=s > 1 and decode._fuse_by_default(hq // hkv, s, 128))
        for fuse in (True, False):
            def fn(q=q, k=k, v=v, f=fuse):
                return decode.flash_decode(q, k, v, fuse_combine=f)

            g = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
            e = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            row[f"fused={fuse}"] = dict(graph_us=g * 1e3, eager_us=e * 1e3, graph_tbs=kv / g / 1e9)
        rows.append(row)
        f, n = row["fused=True"], row["fused=False"]
        dflt = "fused" if row["default_fused"] else "separate"
        log(f"B={b:2d} Hq={hq} Hkv={hkv:2d} L={L:6d} splits={s:3d} default={dflt}"
            f" | graph us fused {f['graph_us']:8.1f} separate {n['graph_us']:8.1f} | eager us fused "
            f"{f['eager_us']:8.1f} separate {n['eager_us']:8.1f}")
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    a = p.parse_args()

    def log(x):
        print(x, flush=True)

    res = {"race": race_check(log), "timings": timings(log)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
