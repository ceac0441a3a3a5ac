"""Decode knobs the heuristics fix without a GPU measurement: FP8 pipeline depth, and splits at a small cache.

    PYTHONPATH=src python bench/decode_sweep.py [--rep 50]   # ~1 min on one H200

1. FP8 (e4m3, per-head scales) dense decode through `plan._tuned_plan` with ``config`` = BLOCK_N 128,
   4 or 8 warps, STAGES 3 or 5 (`heuristics._block_config` picks 8 warps, 5 stages for e4m3 dense tiles),
   at the points where the bf16 kernel streams at the DRAM ceiling; each checked against the default plan's
   output (|diff| <= 1e-2, FAIL otherwise); µs per ``plan.run``, TB/s of K/V bytes, and the bf16
   one-liner and the K/V tokens/s ratio FP8 / bf16 SDPA CUDNN (issue 37's must: >= 1.8 at L >= 32k).
2. Graph replay at B = 1, Hq = 64, Hkv = 8, L = 2k for num_splits 4 .. 32, fused and separate merge, against
   SDPA CUDNN's graph (the heuristic picks 8 splits there: 2048 // `MIN_KEYS_PER_SPLIT`).

Prints one line per measurement and PASS/FAIL per correctness check; exits 1 on a FAIL.
"""

# ruff: noqa: B023 - every timed closure is called (do_bench) inside the iteration that defines it
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/decode.py, also under runpy
from decode import graph_of, inputs, ms, sdpa_calls  # noqa: E402

import attnscope  # noqa: E402
from attnscope.kernels import decode as decode_kernels  # noqa: E402
from attnscope.kernels.decode import plan as plan_mod  # noqa: E402

FP8_POINTS = [(1, 32, 32, 131072), (16, 32, 8, 32768), (1, 32, 8, 131072), (64, 32, 8, 4096)]
GRAPH_POINT = (1, 64, 8, 2048)


def fp8_sweep(rep) -> bool:
    ok = True
    for B, Hq, Hkv, L in FP8_POINTS:
        q, k, v, lens = inputs(B, Hq, Hkv, L)
        k8, ks = attnscope.quantize_kv(k)
        v8, vs = attnscope.quantize_kv(v)
        kw = dict(k_scale=ks, v_scale=vs)
        ref = attnscope.flash_decode(q, k8, v8, lens, **kw)
        bf16 = ms(lambda: attnscope.flash_decode(q, k, v, cache_seqlens=lens), rep) * 1e3
        cudnn = ms(sdpa_calls(q, k, v)["CUDNN"], rep) * 1e3
        kv_bytes = 2 * B * Hkv * L * 128  # e4m3: one byte per element
        print(f"[{B}, {Hq}, {Hkv}, {L}] bf16 one-liner {bf16:.1f} us, CUDNN bf16 {cudnn:.1f} us", flush=True)
        for warps, stages in ((4, 3), (4, 5), (8, 3), (8, 5)):
            cfg = {"BLOCK_N": 128, "num_warps": warps, "STAGES": stages, "num_stages": stages}
            plan = plan_mod._tuned_plan(q, k8, v8, lens, config=cfg, **kw)
            o = plan.run(q, k8, v8, lens, **kw)
            diff = (o.float() - ref.float()).abs().max().item()
            good = diff <= 1e-2
            ok &= good
            us = ms(lambda: plan.run(q, k8, v8, lens, **kw), rep) * 1e3
            print(f"  {'PASS' if good else 'FAIL'} fp8 {warps} warps, STAGES {stages}: {us:8.1f} us  "
                  f"{kv_bytes / us / 1e6:5.2f} TB/s  fp8 / bf16 {bf16 / us:5.3f}x  tokens/s vs CUDNN bf16 "
                  f"{cudnn / us:5.3f}x  (|diff| {diff:.2g})", flush=True)
        decode_kernels.check_errors()
        q = k = v = k8 = v8 = plan = None
        torch.cuda.empty_cache()
    return ok


def graph_sweep(rep) -> bool:
    q, k, v, lens = inputs(*GRAPH_POINT)
    ref = attnscope.flash_decode(q, k, v, lens)
    cudnn = graph_of(sdpa_calls(q, k, v)["CUDNN"])
    base = ms(cudnn.replay, rep) * 1e3
    print(f"{list(GRAPH_POINT)} CUDNN graph {base:.2f} us; default plan: "
          f"{attnscope.decode_plan(q, k, v, lens).num_splits} splits", flush=True)
    ok = True
    for splits in (4, 8, 16, 32):
        for fuse in (True, False):
            plan = plan_mod._tuned_plan(q, k, v, lens, num_splits=splits, fuse_combine=fuse)
            diff = (plan.run(q, k, v, lens).float() - ref.float()).abs().max().item()
            good = diff <= 1e-2
            ok &= good
            g = graph_of(lambda: plan.run(q, k, v, lens))
            us = ms(g.replay, rep) * 1e3
            print(f"  {'PASS' if good else 'FAIL'} splits {splits:2d} {'fused' if fuse else 'separate'}: "
                  f"{us:6.2f} us graph, {base / us:5.3f}x CUDNN graph", flush=True)
    decode_kernels.check_errors()
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rep", type=int, default=50, help="do_bench time per measurement, ms")
    a = p.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    ok = fp8_sweep(a.rep)
    ok &= graph_sweep(a.rep)
    print("PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
