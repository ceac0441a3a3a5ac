"""Chunked-prefill benchmark (issue 14): a chunk of Nq in {512, 1024, 2048} new queries against a 32k
cache (the chunk's keys included), causal bottom-right: attnscope (`decode_plan(...).run`, dense and
paged with pages of 16 and 64) vs FlexAttention (a bottom-right causal block mask) and SDPA with an
explicit boolean mask (K/V expanded to Hq heads, so SDPA's fused kernel runs), on the same inputs in one
run.

    PYTHONPATH=src python bench/chunked.py [--quick] [--json out.json] [--no-flex]

bf16, B = 1, Hq = 32, Hkv = 8, d = 128. Two passes: every chunk size is checked first (64 sampled query
rows of attnscope's dense output against float64 attention, bound 2 x SDPA's own error + 1e-3; the paged
outputs and Flex's against the dense one), "all results match, starting benchmarks", then timed with
``triton.testing.do_bench``. TFLOP/s from `attnscope.model.flops.attention_flops` (exact bottom-right
pairs). Flex compiles once per chunk size (dynamic=False). Run time on one H200 with a cold cache:
about 1.5 min (--quick: Nq = 512 only, ~40 s; --no-flex: ~30 s); each run prints its own.
``--markdown`` prints BENCHMARKS.md's chunked-prefill table (its columns, in its order).
"""

# ruff: noqa: B023 - every timed closure is called (do_bench) inside the iteration that defines it
import argparse
import json
import math
import sys
import time

B, HQ, HKV, D, L = 1, 32, 8, 128, 32768
PAGES = (16, 64)


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
    return err, checks.kernel_tolerance((low[0].double() - ref).abs().max().item())


def paged(k, v, page):
    perm = torch.randperm(L // page, device="cuda", generator=torch.Generator("cuda").manual_seed(page))
    table = perm.view(1, -1).to(torch.int32)
    kp = torch.empty(L // page, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    vp = torch.empty_like(kp)
    kp[perm] = k[0].transpose(0, 1).reshape(L // page, page, HKV, D)
    vp[perm] = v[0].transpose(0, 1).reshape(L // page, page, HKV, D)
    return kp, vp, table


MD_COLUMNS = ("attnscope plan.run", "attnscope paged 16", "attnscope paged 64", "sdpa explicit mask",
              "flex block mask")


def markdown(rows) -> str:
    """BENCHMARKS.md's table: TFLOP/s per chunk size, attnscope dense / paged against the peers."""
    lines = ["| Nq | attnscope dense | paged 16 | paged 64 | SDPA explicit mask | Flex block mask "
             "| dense / SDPA | dense / Flex |", "|" + " --- |" * 8]
    for r in rows:
        tf = r["TFLOP/s"]
        cells = [f"{tf[c]:.1f}" if c in tf else "n/a" for c in MD_COLUMNS]
        ratios = [f"{tf[MD_COLUMNS[0]] / tf[c]:.2f}" if c in tf else "n/a" for c in MD_COLUMNS[3:]]
        lines.append(f"| {r['nq']} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="Nq = 512 only, short timing")
    p.add_argument("--json", metavar="PATH", help="write checks, times and TFLOP/s as JSON")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (torch.compile)")
    p.add_argument("--markdown", action="store_true", help="print BENCHMARKS.md's chunked table at the end")
    args = p.parse_args()
    global torch, triton, attnscope, checks, attention_flops
    import torch
    import triton

    import attnscope
    from attnscope import checks
    from attnscope.model.flops import attention_flops

    t0 = time.time()
    rep = 20 if args.quick else 100
    flex = create_block_mask = None
    flex_record = "not run (--no-flex)"
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            flex_record = "available"
        except Exception as e:  # noqa: BLE001 - reported
            flex_record = f"FlexAttention not available: {type(e).__name__}: {e}"
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}; "
          f"Flex: {flex_record}", flush=True)
    torch.manual_seed(0)
    k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    k_rep, v_rep = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    pages = {page: paged(k, v, page) for page in PAGES}

    cases, failures = [], 0
    for nq in ((512,) if args.quick else (512, 1024, 2048)):  # pass 1: every chunk size checked
        q = torch.randn(B, HQ, nq, D, device="cuda", dtype=torch.bfloat16)
        plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
        pplans = {page: attnscope.decode_plan(q, kp, vp, lens, table, check_seqlens=False)
                  for page, (kp, vp, table) in pages.items()}
        o = plan.run(q, k, v, lens)
        sample = torch.randperm(nq, device="cuda")[:64].sort().values
        err, bound = check(o, q, k, v, nq, sample)
        diffs = {page: (pplans[page].run(q, kp, vp, lens, table).float() - o.float()).abs().max().item()
                 for page, (kp, vp, table) in pages.items()}
        ok = err <= bound and all(d <= 1e-2 for d in diffs.values())
        row = {"nq": nq, "L": L, "num_splits": plan.num_splits, "ok": ok, "max_err": err, "bound": bound,
               "paged_max_diff": diffs}
        bm = None
        if flex is not None:
            try:
                off = L - nq

                def causal(b, h, qi, kv, off=off):
                    return kv <= qi + off
                bm = create_block_mask(causal, B, None, nq, L, device="cuda")
                of = flex(q, k, v, block_mask=bm, enable_gqa=True)  # the compile for this Nq
                row["flex_max_diff"] = (of.float() - o.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001 - reported
                row["flex"] = f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
                bm = None
        failures += not ok
        print(f"Nq={nq}: splits={plan.num_splits} err={err:.2e}<={bound:.2e} paged diffs {diffs} "
              f"flex diff {row.get('flex_max_diff', row.get('flex', '-'))} {'ok' if ok else 'MISMATCH'}",
              flush=True)
        cases.append((row, q, plan, pplans, bm))
    if failures:
        print(f"{failures} chunk sizes FAILED the correctness check: not timing", flush=True)
    else:
        print(f"all results match, starting benchmarks ({time.time() - t0:.0f} s of checks and compiles)",
              flush=True)
    for row, q, plan, pplans, bm in ([] if failures else cases):  # pass 2
        nq = row["nq"]
        mask = torch.arange(L, device="cuda")[None, :] <= (L - nq + torch.arange(nq, device="cuda"))[:, None]
        t = {"attnscope plan.run": triton.testing.do_bench(lambda: plan.run(q, k, v, lens), rep=rep)}
        for page, (kp, vp, table) in pages.items():
            t[f"attnscope paged {page}"] = triton.testing.do_bench(
                lambda: pplans[page].run(q, kp, vp, lens, table), rep=rep)
        # K/V expanded to Hq heads: with a mask, SDPA's fused (memory-efficient) kernel takes no GQA
        sdpa = torch.nn.functional.scaled_dot_product_attention
        t["sdpa explicit mask"] = triton.testing.do_bench(lambda: sdpa(q, k_rep, v_rep, attn_mask=mask),
                                                          rep=rep)
        if bm is not None:
            t["flex block mask"] = triton.testing.do_bench(
                lambda: flex(q, k, v, block_mask=bm, enable_gqa=True), rep=rep)
        flops = attention_flops(B, HQ, nq, L, D, True, "forward")
        print(f"Nq={nq}", flush=True)
        for key, val in t.items():
            print(f"  {key:22s} {val * 1e3:9.1f} us  {flops / (val * 1e-3) / 1e12:6.1f} TFLOP/s", flush=True)
        base = t["attnscope plan.run"]
        ratios = {}
        for key, val in t.items():
            if key.startswith("attnscope paged"):
                ratios[f"paged {key.split()[-1]} / contiguous (speed)"] = base / val
            elif key != "attnscope plan.run":
                ratios[f"attnscope speedup over {key}"] = val / base
        for key, val in ratios.items():
            print(f"  {key:34s} {val:5.2f}x", flush=True)
        row.update({"ms": t, "flops": flops, "ratios": ratios,
                    "TFLOP/s": {key: flops / (val * 1e-3) / 1e12 for key, val in t.items()}})
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    if args.markdown and not failures:
        print(markdown([c[0] for c in cases]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "triton": triton.__version__,
                       "device": torch.cuda.get_device_name(), "flex": flex_record,
                       "rows": [c[0] for c in cases], "seconds": time.time() - t0}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
