"""Host-side cost of one eager decode call (no GPU work waited on): `DecodePlan.run` vs the one-line
`flash_decode` (a plan per call) vs SDPA, and where plan.run's time goes.

    PYTHONPATH=src python bench/host_overhead.py [--json out.json] [--markdown]

B = 1, Hq = 32, Hkv = 8, L = 4096, d = 128, bf16: the smallest decode shape of issue 14, where the kernel
runs for a few microseconds and an eager call is made of host time. Each call is made 500 times after
warm-up and the loop's wall time divided by 500 (the GPU finishes each kernel before the host issues the
next, so this is host time per call). Variants: plan.run (fused merge: one launch), plan.run writing
into a given ``out``, plan.run with the
separate merge (two launches), plan.run with one split, plan.run on a paged cache (pages of 16),
flash_decode with and without check_seqlens, SDPA FLASH / CUDNN in ``sdpa_kernel`` and default
dispatch. A cProfile of plan.run follows. Every plan's output is checked against float64 attention first
(`attnscope.checks.kernel_tolerance`). About 30 s on an H200.
"""

import argparse
import cProfile
import json
import pstats
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--markdown", action="store_true", help="print BENCHMARKS.md's table at the end")
    args = p.parse_args()
    import torch

    import attnscope
    from attnscope import checks

    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
    kp = k[0].transpose(0, 1).reshape(256, 16, 8, 128).contiguous()
    vp = v[0].transpose(0, 1).reshape(256, 16, 8, 128).contiguous()
    table = torch.arange(256, device="cuda", dtype=torch.int32).view(1, 256)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
    sep = attnscope.decode_plan(q, k, v, lens, check_seqlens=False, fuse_combine=False)
    one = attnscope.decode_plan(q, k, v, lens, check_seqlens=False, num_splits=1)
    paged = attnscope.decode_plan(q, kp, vp, lens, table, check_seqlens=False)
    # float64 attention, and the bound from SDPA's own error at bf16 (`checks.kernel_tolerance`)
    kk, vv = (t.double().repeat_interleave(4, 1) for t in (k, v))
    exact = torch.softmax((q.double() @ kk.transpose(-1, -2)) / 128 ** 0.5, -1) @ vv
    bound = checks.kernel_tolerance((sdpa(q, k, v, enable_gqa=True).double() - exact).abs().max().item())
    out = torch.empty_like(q)
    for pl, args_ in ((plan, (q, k, v, lens)), (sep, (q, k, v, lens)), (one, (q, k, v, lens)),
                      (paged, (q, kp, vp, lens, table))):
        err = (pl.run(*args_).double() - exact).abs().max().item()
        if not err <= bound:
            print(f"plan output error {err:.3g} > bound {bound:.3g} against float64: not timing", flush=True)
            return 1
    print(f"all results within {bound:.3g} of float64; splits={plan.num_splits} fused={plan.fuse}",
          flush=True)

    def pinned(backend):
        def call():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=True)
        return call

    calls = {
        "plan.run (fused merge, one launch)": lambda: plan.run(q, k, v, lens),
        "plan.run out= (no allocation)": lambda: plan.run(q, k, v, lens, out=out),
        "plan.run (separate merge, two launches)": lambda: sep.run(q, k, v, lens),
        "plan.run (num_splits=1)": lambda: one.run(q, k, v, lens),
        "plan.run (paged, page 16)": lambda: paged.run(q, kp, vp, lens, table),
        "flash_decode check_seqlens=False (plan per call)":
            lambda: attnscope.flash_decode(q, k, v, lens, check_seqlens=False),
        "flash_decode (checks lengths: a sync)": lambda: attnscope.flash_decode(q, k, v, lens),
        "sdpa FLASH in sdpa_kernel": pinned(SDPBackend.FLASH_ATTENTION),
        "sdpa CUDNN in sdpa_kernel": pinned(SDPBackend.CUDNN_ATTENTION),
        "sdpa default dispatch": lambda: sdpa(q, k, v, enable_gqa=True),
    }
    results = {}
    for name, fn in calls.items():
        try:
            for _ in range(50):
                fn()
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported
            print(f"{name}: n/a ({type(e).__name__})", flush=True)
            continue
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(500):
            fn()
        host = (time.perf_counter() - t) / 500 * 1e6
        torch.cuda.synchronize()
        results[name] = host
        print(f"{name}: {host:.1f} us host time per call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        plan.run(q, k, v, lens)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    if args.markdown:
        print("| call | µs |\n| --- | --- |\n" + "\n".join(f"| {k} | {v:.1f} |" for k, v in results.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "us": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
