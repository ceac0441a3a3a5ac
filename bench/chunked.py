"""Chunked-prefill benchmark (issue 14): a chunk of Nq in {512, 1024, 2048} new queries against a 32k
cache (the chunk's keys included), causal bottom-right: attnscope (`decode_plan(...).run`, dense and
paged 64) vs FlexAttention (a bottom-right causal block mask) and SDPA with an explicit boolean mask
(K/V expanded to Hq heads, so SDPA's fused kernel runs), on
the same inputs in one run.

    PYTHONPATH=src python bench/chunked.py [--quick] [--json out.json] [--no-flex]

bf16, B = 1, Hq = 32, Hkv = 8, d = 128. Checked first: 64 sampled query rows of attnscope's output
against float64 attention (bound 2 x SDPA's own error + 1e-3). TFLOP/s from
`attnscope.model.flops.attention_flops` (exact bottom-right pairs).
"""

# ruff: noqa: B023 - every timed closure is called (do_bench) inside the iteration that defines it
import argparse
import json
import math
import sys

import torch
import triton

import attnscope
from attnscope.model.flops import attention_flops

B, HQ, HKV, D, L = 1, 32, 8, 128, 32768


def check(o, q, k, v, nq, rows):
    G = HQ // HKV
    pos = L - nq + rows  # positions of the sampled queries
    kk = k[0].double().repeat_interleave(G, 0)
    vv = v[0].double().repeat_interleave(G, 0)
    s = (q[0][:, rows].double() @ kk.transpose(-1, -2)) / math.sqrt(D)  # [Hq, r, L]
    s = s.masked_fill(torch.arange(L, device=s.device)[None, None, :] > pos[None, :, None], -math.inf)
    ref = torch.softmax(s, -1) @ vv
    mask = torch.arange(L, device=q.device)[None, :] <= pos[:, None]
    low = torch.nn.functional.scaled_dot_product_attention(q[:, :, rows], k, v, attn_mask=mask,
                                                           enable_gqa=True)
    err = (o[0][:, rows].double() - ref).abs().max().item()
    return err, 2 * (low[0].double() - ref).abs().max().item() + 1e-3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="Nq = 512 only, short timing")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (torch.compile)")
    args = p.parse_args()
    rep = 20 if args.quick else 100
    flex = create_block_mask = None
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001 - reported
            print(f"FlexAttention not available: {e}", flush=True)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}",
          flush=True)
    torch.manual_seed(0)
    k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    k_rep, v_rep = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    page = 64
    perm = torch.randperm(L // page, device="cuda")
    table = perm.view(1, -1).to(torch.int32)
    kp = torch.empty(L // page, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    vp = torch.empty_like(kp)
    kp[perm] = k[0].transpose(0, 1).reshape(L // page, page, HKV, D)
    vp[perm] = v[0].transpose(0, 1).reshape(L // page, page, HKV, D)
    rows_out, failures = [], 0
    for nq in ((512,) if args.quick else (512, 1024, 2048)):
        q = torch.randn(B, HQ, nq, D, device="cuda", dtype=torch.bfloat16)
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        pplan = attnscope.decode_plan(q, kp, vp, lens, table, check_seqlens=False)
        o = plan.run(q, k, v, lens)
        sample = torch.randperm(nq, device="cuda")[:64].sort().values
        err, bound = check(o, q, k, v, nq, sample)
        same = (pplan.run(q, kp, vp, lens, table).float() - o.float()).abs().max().item() <= 1e-2
        ok = err <= bound and same
        failures += not ok
        print(f"Nq={nq}: splits={plan.num_splits} err={err:.2e}<={bound:.2e} paged==dense {same} "
              f"{'ok' if ok else 'MISMATCH'}", flush=True)
        mask = torch.arange(L, device="cuda")[None, :] <= (L - nq + torch.arange(nq, device="cuda"))[:, None]
        t = {"attnscope plan.run": triton.testing.do_bench(lambda: plan.run(q, k, v, lens), rep=rep),
             "attnscope paged 64": triton.testing.do_bench(lambda: pplan.run(q, kp, vp, lens, table),
                                                           rep=rep),
             # K/V expanded to Hq heads: with a mask, SDPA's fused (memory-efficient) kernel takes no GQA
             "sdpa explicit mask": triton.testing.do_bench(
                 lambda: torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask),
                 rep=rep)}
        if flex is not None:
            try:
                off = L - nq

                def causal(b, h, qi, kv, off=off):
                    return kv <= qi + off
                bm = create_block_mask(causal, B, None, nq, L, device="cuda")
                of = flex(q, k, v, block_mask=bm, enable_gqa=True)
                diff = (of.float() - o.float()).abs().max().item()
                print(f"  flex vs attnscope max diff {diff:.2e}", flush=True)
                t["flex block mask"] = triton.testing.do_bench(
                    lambda: flex(q, k, v, block_mask=bm, enable_gqa=True), rep=rep)
            except Exception as e:  # noqa: BLE001 - reported
                print(f"  flex: n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})", flush=True)
        flops = attention_flops(B, HQ, nq, L, D, True, "forward")
        for key, val in t.items():
            print(f"  {key:22s} {val * 1e3:9.1f} us  {flops / (val * 1e-3) / 1e12:6.1f} TFLOP/s", flush=True)
        rows_out.append({"nq": nq, "L": L, "ok": ok, "max_err": err, "bound": bound, "ms": t, "flops": flops})
    print("all results match" if failures == 0 else f"{failures} chunk sizes FAILED", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows_out},
                      f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
