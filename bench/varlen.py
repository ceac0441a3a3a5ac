"""Packed training attention (issue 36): attnscope varlen forward and forward+backward against FlexAttention
with a document mask (compiled) and a Python loop of SDPA CUDNN calls, one per prompt, on the same inputs
in the same run.

    PYTHONPATH=src python bench/varlen.py [--markdown] [--no-flex] [--json out.json]
    PYTHONPATH=src python bench/sm90_resources.py --kernel varlen   # no GPU: sm_90 registers / spills / smem

The packed batch: 16 prompts with lengths drawn uniformly from 128 to 4,096 tokens (seed 0), causal,
Hq = 32, Hkv = 8, d = 128, bf16. TFLOP/s count useful FLOPs (`model.flops.attention_flops` summed per
prompt; forward+backward = 3.5 x forward). Peers:

- flex: FlexAttention on [1, H, total, d] with a document-causal mask_mod, torch.compile'd, GQA by
  ``enable_gqa``; the block mask is built once, outside the timing;
- sdpa-cudnn-loop: for each prompt, SDPA with the CUDNN backend on [1, H, n, d] views (K/V expanded to Hq
  heads beforehand, untimed), outputs written into one packed tensor.

attnscope is timed as users call it: `flash_attention_varlen` with its defaults (no host sync; the
cu_seqlens check is on the device; on sm_90 the backward runs the Gluon kernels of
kernels/varlen_bwd_hopper.py, as `kernels.varlen_bwd.pick_impl` chooses: the line before the table says
which); ``attnscope-portable-bwd`` runs the portable Triton backward instead, and ``attnscope-atomic-dq``
the portable one with `kernels.bwd.ATOMIC_DQ_BY_DEFAULT` set True (dQ by fp32 atomics in the dK/dV
kernel), so the switch can follow the measurement. ``--sweep`` adds forward variants (`_sweep`). Every
call is timed in ``--rounds`` interleaved rounds, the order rotated round to round (the median).
Correctness first: before timing, the output and dQ, dK, dV of every implementation are compared with
float64 autograd on four sampled prompts (shortest, longest, two random; query heads 0 and 1): attnscope
must be within 2 x (output) / 3 x (gradients) PyTorch's own error (SDPA at bf16 on the same prompt)
+ 1e-3, else it is not timed and the exit code is 1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time

HQ, HKV, D = 32, 8, 128


def lengths(n_seq: int = 16, lo: int = 128, hi: int = 4096, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n_seq)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markdown", action="store_true", help="print the results as a Markdown table")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes ~10-30 s)")
    p.add_argument("--unmasked", action="store_true", help="no causal mask inside the prompts")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved timing rounds, the order rotated (the median; default 2)")
    p.add_argument("--sweep", action="store_true",
                   help="also time forward variants (work-list order, K/V loads, block configs), each "
                        "checked against float64 first")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: expected a positive integer, got {args.rounds}")

    import torch
    import triton

    if not torch.cuda.is_available():
        print("bench/varlen.py: needs a CUDA GPU (sm90_resources.py --kernel varlen compiles the kernels "
              "without one)", file=sys.stderr)
        return 2
    from attnscope.measure.bench import environment
    from attnscope.model.flops import attention_flops

    t_start = time.time()
    causal = not args.unmasked
    lens = lengths()
    total = sum(lens)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    print(f"{len(lens)} prompts, {total:,} tokens, lengths {min(lens)}..{max(lens)}, Hq {HQ}, Hkv {HKV}, "
          f"d {D}, bf16, {'causal' if causal else 'unmasked'}", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    q, do = (torch.randn(total, HQ, D, device=dev, dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(total, HKV, D, device=dev, dtype=dtype, generator=g) for _ in range(2))
    impls = _impls(torch, q, k, v, lens, causal, args.no_flex)
    rng = random.Random(1)
    sample = sorted({lens.index(min(lens)), lens.index(max(lens)), *rng.sample(range(len(lens)), 2)})
    ref = _reference(torch, q, k, v, do, lens, sample, causal)
    bound_o = 2 * ref["torch_err"][0] + 1e-3
    bound_g = [3 * e + 1e-3 for e in ref["torch_err"][1:]]
    useful = sum(attention_flops(1, HQ, n, n, D, causal) for n in lens)

    def rep_ms(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median"))

    from attnscope.kernels import _common, bwd, varlen_bwd

    mods = _common.check_mods(torch, causal, None, 0.0, None, HQ, dev)
    chosen = varlen_bwd.pick_impl("auto", q, causal, mods, D ** -0.5)
    print(f"attnscope backward kernels (impl='auto'): {chosen}", flush=True)
    rows, failed = [], False
    atomic_default, pick_impl = bwd.ATOMIC_DQ_BY_DEFAULT, varlen_bwd.pick_impl

    def under(name, call):
        """``call`` with ``name``'s backward switches set for its duration (restored after)."""
        atomic = atomic_default or name == "attnscope-atomic-dq"
        portable = name in ("attnscope-atomic-dq", "attnscope-portable-bwd")  # atomics: portable only

        def run():
            bwd.ATOMIC_DQ_BY_DEFAULT = atomic
            varlen_bwd.pick_impl = (lambda *a, **kw: "portable") if portable else pick_impl
            try:
                return call()
            finally:
                bwd.ATOMIC_DQ_BY_DEFAULT, varlen_bwd.pick_impl = atomic_default, pick_impl
        return run

    timers = {}  # (impl, "fwd" | "fwdbwd") -> the timed call, for the implementations that passed
    for name, fn in impls.items():
        row = {"impl": name}
        rows.append(row)
        try:
            errs = under(name, lambda fn=fn: _errors(torch, fn, q, k, v, do, lens, sample, ref))()
            row["err"] = errs
            ok = errs[0] <= bound_o and all(e <= b for e, b in zip(errs[1:], bound_g, strict=True))
            if name.startswith("attnscope") and not ok:
                print(f"  FAIL {name}: errors {errs} > bounds {bound_o:.3g} / {bound_g}; not timed",
                      flush=True)
                failed = True
                continue
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]

            def fwd(fn=fn):
                with torch.no_grad():
                    return fn(q, k, v)
            timers[name, "fwd"] = under(name, fwd)
            timers[name, "fwdbwd"] = under(name, lambda fn=fn, x=leaves: torch.autograd.grad(fn(*x), x, do))
            timers[name, "fwd"](), timers[name, "fwdbwd"]()  # a peer that cannot run fails here
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            print(f"  {name} n/a: {row['error']}", flush=True)
            timers.pop((name, "fwd"), None)
            timers.pop((name, "fwdbwd"), None)
    # interleaved rounds, the order rotated round to round (a GPU at its power cap slows a call timed
    # after a hot series), the median over rounds
    keys, per = list(timers), {key: [] for key in timers}
    for r in range(args.rounds if keys else 0):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            per[key].append(rep_ms(timers[key]))
    for row in rows:
        name = row["impl"]
        if (name, "fwd") in per:
            row["fwd_ms"] = statistics.median(per[name, "fwd"])
            row["fwdbwd_ms"] = statistics.median(per[name, "fwdbwd"])
            row["fwd_tflops"] = useful / row["fwd_ms"] / 1e9
            row["fwdbwd_tflops"] = 3.5 * useful / row["fwdbwd_ms"] / 1e9
    torch.cuda.empty_cache()
    bwd.ATOMIC_DQ_BY_DEFAULT, varlen_bwd.pick_impl = atomic_default, pick_impl
    _print(rows, args.markdown, bound_o, bound_g)
    if args.sweep:
        failed |= _sweep(torch, q, k, v, lens, causal, sample, ref, bound_o, rep_ms, useful)
    print("PASS: all attnscope results matched the float64 reference" if not failed else
          "FAIL: an attnscope result missed the float64 bound (see FAIL above)", flush=True)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": environment(torch), "lengths": lens, "causal": causal, "hq": HQ, "hkv": HKV,
                       "d": D, "bounds": [bound_o, *bound_g], "rows": rows}, f, indent=2)
    return 1 if failed else 0


def _impls(torch, q, k, v, lens, causal, no_flex):
    """name -> fn(q, k, v) -> o [total, Hq, d] (differentiable)."""
    import attnscope

    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=q.device)
    m = max(lens)
    impls = {
        "attnscope": lambda q, k, v: attnscope.flash_attention_varlen(q, k, v, cu, cu, m, m, causal=causal),
        "attnscope-atomic-dq": lambda q, k, v: attnscope.flash_attention_varlen(
            q, k, v, cu, cu, m, m, causal=causal),  # run with bwd.ATOMIC_DQ_BY_DEFAULT = True, portable
        "attnscope-portable-bwd": lambda q, k, v: attnscope.flash_attention_varlen(
            q, k, v, cu, cu, m, m, causal=causal),  # run with the portable backward kernels
    }
    if not no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(len(lens), device=q.device),
                                      torch.tensor(lens, device=q.device))

        def doc_mask(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return (same & (q_idx >= kv_idx)) if causal else same

        total = sum(lens)
        block_mask = create_block_mask(doc_mask, None, None, total, total, device=q.device, _compile=True)
        flex = torch.compile(flex_attention, dynamic=False)

        def flex_call(q, k, v):
            o = flex(*(t.transpose(0, 1)[None] for t in (q, k, v)), block_mask=block_mask, enable_gqa=True)
            return o[0].transpose(0, 1)

        impls["flex"] = flex_call

    from torch.nn.attention import SDPBackend, sdpa_kernel

    starts = [0, *itertools.accumulate(lens)]
    group = q.shape[1] // k.shape[1]

    def cudnn_loop(q, k, v):
        ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        outs = []
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for a, n in zip(starts, lens, strict=False):
                qs, ks, vs = (t[a:a + n].transpose(0, 1)[None] for t in (q, ke, ve))
                outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)[0])
        return torch.cat([o.transpose(0, 1) for o in outs])

    impls["sdpa-cudnn-loop"] = cudnn_loop
    return impls


def _seq(t, a, n, heads):
    return t[a:a + n, heads].transpose(0, 1)


def _reference(torch, q, k, v, do, lens, sample, causal):
    """float64 autograd on the sampled prompts (query heads 0, 1 and their kv head), and PyTorch's own
    bf16 error (dense SDPA per prompt) on the same: the bounds."""
    starts = [0, *itertools.accumulate(lens)]
    group = q.shape[1] // k.shape[1]
    out, torch_err = {}, [0.0] * 4
    for s in sample:
        a, n = starts[s], lens[s]
        per = {}
        for name, dt in (("f64", torch.float64), ("bf16", q.dtype)):
            qs = _seq(q, a, n, [0, 1]).to(dt).requires_grad_()
            ks, vs = (_seq(t, a, n, [0]).to(dt).requires_grad_() for t in (k, v))
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks.expand(2, -1, -1),
                                                                 vs.expand(2, -1, -1), is_causal=causal)
            grads = torch.autograd.grad(o, (qs, ks, vs), _seq(do, a, n, [0, 1]).to(dt))
            per[name] = [o.detach(), *grads]
        out[s] = per["f64"]
        torch_err = [max(e, (x.double() - r).abs().max().item())
                     for e, x, r in zip(torch_err, per["bf16"], per["f64"], strict=True)]
    assert group == q.shape[1] // k.shape[1]
    return {"grads": out, "torch_err": torch_err}


def _errors(torch, fn, q, k, v, do, lens, sample, ref):
    """Max abs errors (o, dq, dk, dv) of ``fn`` on the sampled prompts against float64. dK, dV of kv head 0
    get the gradient of every query head of its group, so the bf16 do of the other heads is zeroed."""
    starts = [0, *itertools.accumulate(lens)]
    group = q.shape[1] // k.shape[1]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    do_masked = do.clone()
    do_masked[:, 2:group] = 0  # only heads 0 and 1 of kv head 0's group carry a gradient
    o = fn(*leaves)
    grads = torch.autograd.grad(o, leaves, do_masked)
    errs = [0.0] * 4
    for s in sample:
        a, n = starts[s], lens[s]
        got = [_seq(o.detach(), a, n, [0, 1]), _seq(grads[0], a, n, [0, 1]), _seq(grads[1], a, n, [0]),
               _seq(grads[2], a, n, [0])]
        errs = [max(e, (x.double() - r).abs().max().item()) for e, x, r in zip(errs, got, ref["grads"][s],
                                                                               strict=True)]
    return errs


def _weight_sorted(torch, cu, n_items, block_m, causal):
    """The work list ordered globally by each tile's K/V rows, descending (no sequence grouping): the
    order `varlen_plan._work_items` replaced, kept here to time against it."""
    n = (cu[1:] - cu[:-1]).long()
    tiles = (n + block_m - 1) // block_m
    ends = torch.cumsum(tiles, 0)
    w = torch.arange(n_items, device=cu.device)
    seq = torch.searchsorted(ends, w, right=True).clamp_(max=n.shape[0] - 1)
    tile = w - (ends[seq] - tiles[seq])
    valid = w < ends[-1]
    weight = torch.minimum((tile + 1) * block_m, n[seq]) if causal else n[seq]
    order = torch.argsort(torch.where(valid, weight + 1, 0), descending=True, stable=True)
    seq, tile = torch.where(valid, seq, -1)[order], torch.where(valid, tile, 0)[order]
    return seq.to(torch.int32), tile.to(torch.int32)


def _sweep(torch, q, k, v, lens, causal, sample, ref, bound_o, rep_ms, useful) -> bool:
    """Forward variants of the varlen kernel on the same batch: the default (plan's sequence-major list,
    TMA K/V, `varlen.pick_config`), pointer K/V loads, the globally weight-sorted list, other block configs.
    Each variant's output is checked against float64 on the sampled prompts before it is timed."""
    from attnscope.kernels import varlen

    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=q.device)
    m, total, starts = max(lens), sum(lens), [0, *itertools.accumulate(lens)]
    base = varlen.pick_config(q.shape[2], causal, max(lens))
    sorted_items = _weight_sorted(torch, cu, -(-total // base[0]) + len(lens), base[0], causal)
    variants = {"default": {}, "pointer K/V": {"tma": False}, "weight-sorted list": {"items": sorted_items}}
    for cfg in ((128, 128, 8, 2), (128, 64, 8, 2), (128, 64, 4, 3), (64, 64, 4, 2)):
        if cfg != base:
            variants[f"config {cfg}"] = {"config": cfg}
    from attnscope.kernels import varlen_plan

    dims = (total, q.shape[1], q.shape[2], total, k.shape[1])
    lists = [(-(-total // base[0]) + len(lens), base[0], causal, False)]
    flag = torch.zeros(1, dtype=torch.int32, device=q.device)

    def torch_forms():
        cq = varlen_plan._sanitize(cu, total, m, flag, 1, 4)
        ck = varlen_plan._sanitize(cu, total, m, flag, 2, 8)
        return varlen_plan._work_items(cq, ck, *lists[0])

    print(f"work list + cu_seqlens sanitising per forward: varlen_plan.plan (one program) "
          f"{rep_ms(lambda: varlen_plan.plan(cu, cu, dims, m, m, lists)) * 1e3:.0f} us, the torch forms "
          f"(~86 small ops) {rep_ms(torch_forms) * 1e3:.0f} us", flush=True)
    print("| forward variant | ms | TFLOP/s | max err o |\n| --- | --- | --- | --- |", flush=True)
    failed = False
    for name, kw in variants.items():
        def fn(kw=kw):
            return varlen._launch(q, k, v, cu, cu, m, m, causal, None, False, False, **kw)[0]
        try:
            o = fn()
            err = max((_seq(o, starts[s], lens[s], [0, 1]).double() - ref["grads"][s][0]).abs().max().item()
                      for s in sample)
            if err > bound_o:
                print(f"| {name} | FAIL: error {err:.3g} > {bound_o:.3g}, not timed | | |", flush=True)
                failed = True
                continue
            ms = rep_ms(fn)
            print(f"| {name} | {ms:.3f} | {useful / ms / 1e9:.0f} | {err:.2g} |", flush=True)
        except Exception as e:  # noqa: BLE001 - e.g. a config past the shared memory
            print(f"| {name} | n/a: {type(e).__name__}: {str(e)[:120]} | | |", flush=True)
    return failed


def _print(rows, markdown, bound_o, bound_g):
    base = next((r for r in rows if r["impl"] == "flex" and "fwd_ms" in r), None)
    loop = next((r for r in rows if r["impl"] == "sdpa-cudnn-loop" and "fwd_ms" in r), None)
    head = ["impl", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "fwd+bwd TFLOP/s", "fwd vs Flex",
            "fwd vs CUDNN loop", "fwd+bwd vs Flex", "max err o / dq / dk / dv"]
    lines = []
    for r in rows:
        if "fwd_ms" not in r:
            lines.append([r["impl"], r.get("error", "failed the check")] + [""] * (len(head) - 2))
            continue
        ratio = lambda ref, key, r=r: f"{ref[key] / r[key]:.2f}" if ref else "-"  # noqa: E731
        lines.append([r["impl"], f"{r['fwd_ms']:.3f}", f"{r['fwd_tflops']:.0f}", f"{r['fwdbwd_ms']:.3f}",
                      f"{r['fwdbwd_tflops']:.0f}", ratio(base, "fwd_ms"), ratio(loop, "fwd_ms"),
                      ratio(base, "fwdbwd_ms"), " / ".join(f"{e:.2g}" for e in r["err"])])
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
        for line in [head, *lines]:
            print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    print(f"bounds: o {bound_o:.3g}, dq / dk / dv {' / '.join(f'{b:.3g}' for b in bound_g)}")


if __name__ == "__main__":
    sys.exit(main())
