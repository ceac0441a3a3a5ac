"""Decode benchmark (issue 14): attnscope split-KV decode, eager (`flash_decode` one-liner and `plan.run`)
and CUDA-graph replay, against SDPA FLASH and CUDNN (eager and graph), on the same inputs in one run;
paged caches (pages of 16 and 64, random page order) against the same kernel on the contiguous cache.

    PYTHONPATH=src python bench/decode.py [--quick] [--json out.json]

bf16, d = 128, (B, Hq, Hkv) in {(1,32,32), (1,32,8), (16,32,8), (64,32,8), (64,32,32)} x L in {4k, 32k,
128k}. Every point is checked first: sequence 0 of attnscope's output against float64 attention on the
GPU (bound: 2 x SDPA's own error + 1e-3) and the paged outputs against the contiguous one. TB/s is the
analytic byte count (`attnscope.kernels.decode.logical_bytes`) over the measured time. Points whose
caches do not fit the memory budget are reported as skipped. FlexAttention decoding is timed on the
contiguous cache with --flex (paged Flex is not set up: the script says so).
"""

import argparse
import json
import math
import sys

import torch
import triton

import attnscope
from attnscope.kernels.decode import logical_bytes

GRID = [(1, 32, 32), (1, 32, 8), (16, 32, 8), (64, 32, 8), (64, 32, 32)]
LENS = [4096, 32768, 131072]
D = 128
BUDGET = 100 * 2**30  # bytes of caches per point (K + V, plus a paged copy when made)
PAGED_MAX = 16 * 2**30  # paged copies only up to this cache size (memory and time)


def graph_of(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def ms(fn, rep):
    return triton.testing.do_bench(fn, warmup=max(5, rep // 4), rep=rep)


def check(o, q, k, v):
    """Sequence 0 against float64 attention; returns (err, bound)."""
    G = q.shape[1] // k.shape[1]
    kk = k[:1].double().repeat_interleave(G, 1)
    vv = v[:1].double().repeat_interleave(G, 1)
    s = (q[:1].double() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    ref = torch.softmax(s, -1) @ vv
    low = torch.nn.functional.scaled_dot_product_attention(q[:1], k[:1], v[:1], enable_gqa=True)
    return (o[:1].double() - ref).abs().max().item(), 2 * (low.double() - ref).abs().max().item() + 1e-3


def paged_copy(k, v, page):
    """[B, Hkv, L, d] -> pages [B * L / page, page, Hkv, d] in a random order, and the block table."""
    B, Hkv, L, d = k.shape
    n = B * L // page
    perm = torch.randperm(n, device=k.device)
    table = perm.view(B, L // page).to(torch.int32)
    kp = torch.empty(n, page, Hkv, d, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    kp[perm] = k.transpose(1, 2).reshape(n, page, Hkv, d)
    vp[perm] = v.transpose(1, 2).reshape(n, page, Hkv, d)
    return kp, vp, table


def flex_decoder():
    try:
        from torch.nn.attention.flex_attention import flex_attention
        return torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        print(f"FlexAttention not available: {e}", flush=True)
        return None


def point(B, Hq, Hkv, L, rep, flex):
    """Check, then time every variant at one point; returns the JSON row."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    name = f"B={B} Hq={Hq} Hkv={Hkv} L={L}"
    kv_bytes = 2 * B * Hkv * L * D * 2
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16).normal_()
    v = torch.empty(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16).normal_()
    lens_t = torch.full((B,), L, device="cuda", dtype=torch.int32)
    plan = attnscope.decode_plan(q, k, v, lens_t, check_seqlens=False)
    o = plan.run(q, k, v, lens_t)
    err, bound = check(o, q, k, v)
    ok = err <= bound and torch.equal(o, attnscope.flash_decode(q, k, v, lens_t))
    row = {"point": name, "B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "num_splits": plan.num_splits,
           "fused": plan.fuse, "max_err": err, "bound": bound, "ok": ok}
    nbytes = logical_bytes(B, Hq, Hkv, B * L, D, 2, plan.num_splits)["total"]
    row["bytes"] = nbytes
    t = {}
    t["attnscope flash_decode"] = ms(lambda: attnscope.flash_decode(q, k, v, lens_t), rep)
    t["attnscope plan.run"] = ms(lambda: plan.run(q, k, v, lens_t), rep)
    g = graph_of(lambda: plan.run(q, k, v, lens_t))
    t["attnscope graph"] = ms(g.replay, rep)
    for backend, label in ((SDPBackend.FLASH_ATTENTION, "sdpa FLASH"),
                           (SDPBackend.CUDNN_ATTENTION, "sdpa CUDNN")):
        def call(backend=backend):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=True)
        try:
            call()
            t[label] = ms(call, rep)
            t[label + " graph"] = ms(graph_of(call).replay, rep)
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported
            print(f"  {label}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})", flush=True)
    if flex is not None:
        try:
            flex(q, k, v, enable_gqa=True)
            t["flex (contiguous)"] = ms(lambda: flex(q, k, v, enable_gqa=True), rep)
        except Exception as e:  # noqa: BLE001
            print(f"  flex: n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})", flush=True)
    if kv_bytes <= PAGED_MAX:
        for page in (16, 64):
            kp, vp, table = paged_copy(k, v, page)
            pplan = attnscope.decode_plan(q, kp, vp, lens_t, table, check_seqlens=False)
            op = pplan.run(q, kp, vp, lens_t, table)
            same = (op.float() - o.float()).abs().max().item() <= 1e-2
            row["ok"] = row["ok"] and same
            def prun(pplan=pplan, kp=kp, vp=vp, table=table):
                return pplan.run(q, kp, vp, lens_t, table)
            t[f"attnscope paged {page} plan.run"] = ms(prun, rep)
            t[f"attnscope paged {page} graph"] = ms(graph_of(prun).replay, rep)
            print(f"  paged {page} / contiguous (plan.run): "
                  f"{t['attnscope plan.run'] / t[f'attnscope paged {page} plan.run']:.2f}x", flush=True)
            del kp, vp, pplan
    row["ms"] = t
    row["TB/s"] = {key: nbytes / (val * 1e-3) / 1e12 for key, val in t.items()}
    fl = t.get("sdpa FLASH")
    cu = t.get("sdpa CUDNN graph")
    print(f"{name} splits={plan.num_splits} fused={plan.fuse} err={err:.2e}<={bound:.2e} "
          f"{'ok' if row['ok'] else 'MISMATCH'}", flush=True)
    for key, val in t.items():
        print(f"  {key:32s} {val * 1e3:9.1f} us  {row['TB/s'][key]:5.2f} TB/s", flush=True)
    if fl:
        print(f"  eager plan.run / FLASH: {fl / t['attnscope plan.run']:.2f}x;  "
              f"graph / CUDNN graph: {(cu / t['attnscope graph']) if cu else float('nan'):.2f}x",
              flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="L = 4k and 32k, three shapes, short timing")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--flex", action="store_true",
                   help="also time FlexAttention (torch.compile per shape: adds minutes on a cold cache)")
    args = p.parse_args()
    grid = GRID[:3] if args.quick else GRID
    lens = LENS[:2] if args.quick else LENS
    rep = 20 if args.quick else 60
    flex = flex_decoder() if args.flex else None
    if flex is None:
        print("FlexAttention: not timed (pass --flex)", flush=True)
    print("paged FlexAttention (torch.nn.attention.experimental paged attention): not set up in this "
          "script; Flex is timed on the contiguous cache only", flush=True)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}",
          flush=True)
    rows, failures = [], 0
    for B, Hq, Hkv in grid:
        for L in lens:
            kv_bytes = 2 * B * Hkv * L * D * 2
            name = f"B={B} Hq={Hq} Hkv={Hkv} L={L}"
            if kv_bytes > BUDGET:
                print(f"{name}: skipped (K+V {kv_bytes / 2**30:.0f} GiB over the {BUDGET / 2**30:.0f} GiB "
                      f"budget)", flush=True)
                rows.append({"point": name, "skipped": "memory"})
                continue
            row = point(B, Hq, Hkv, L, rep, flex)
            failures += not row["ok"]
            rows.append(row)
            torch.cuda.empty_cache()
    print("all results match" if failures == 0 else f"{failures} points FAILED the correctness check",
          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "triton": triton.__version__,
                       "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
