"""Score-mod benchmark (issue 35): attnscope's sliding window, softcap and sinks vs FlexAttention expressing
the same attention, vs full causal, and the cost of the mods when they are off.

    PYTHONPATH=src python bench/mods.py [--quick] [--only window,softcap,sinks,off] [--markdown] [--json F]

bf16 (``--dtype``), d = 128 (``--d``), H = 32, B*N = 32k. Points (forward and backward, ms and TFLOP/s
counted on the visited query-key pairs, 4 d flops per pair forward, 2.5 x that backward):

- window: causal window (W, 0) with W = 1024 at N = 8k and W = 4096 at N = 32k; peers: Flex with the
  sliding-window causal mask (compiled, block mask), attnscope full causal (``impl="auto"``: the Hopper
  kernel on sm_90, and the portable kernel) and SDPA CUDNN full causal at
  the same shape (the ``visited/causal`` column is the model's fraction of causal work, so a window
  kernel at full-causal speed has time ratio = that fraction);
- softcap: causal, softcap 50, N = 8k; peers: Flex with the tanh score_mod, attnscope plain causal;
- sinks: causal, one sink per head, N = 8k; peers: Flex with ``return_lse`` plus the LSE correction
  ``o * sigmoid(lse - sink)``, attnscope plain causal;
- off: the portable kernel with no mod and with an all-covering window ``(N, N)`` (the WINDOW code path,
  nothing skipped) at
  N = 8k, causal and not. Run this section
  also against main's tree (``PYTHONPATH=<main>/src python bench/mods.py --only off``: that section
  uses no new keyword) to hold the mods-off kernel against today's.

The window and softcap points also time the backward alone, `kernels.bwd.flash_attention_backward` with
``impl="hopper"`` (the Gluon sm_90 kernels; sm_90 only) and ``impl="portable"`` (rows
``attnscope_bwd_hopper`` / ``attnscope_bwd_portable``, no forward), and print the backward's time against
Flex's. A window point prints its forward and Hopper backward time against attnscope's full causal time
scaled by the visited fraction, counted two ways: on the query-key pairs and, as issue 35 words it, on the
tiles the model says are visited (`TILE`, the Gluon forward's CTA tile: a partly visible tile counts whole).

Every attnscope call is first checked at the full shape against float64 (torch, on the GPU) on batch 0,
head 0: the output within 2 x PyTorch's own error at the same dtype + 1e-3 and dQ, dK, dV (and dsinks)
within 3 x (attnscope.checks.kernel_tolerance); a failed check is reported and exits 1 after the table.
Timing: triton.testing.do_bench, median, in ``--rounds`` interleaved rounds (the order rotated round to
round; the median over rounds); backward = the gradient of a retained graph (compiled Flex with sinks or a
score_mod donates its buffers: there forward+backward minus forward).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

SECTIONS = ("window", "softcap", "sinks", "off")


def _require_gpu():
    try:
        import torch
    except ImportError:
        print("bench/mods.py: needs torch and a CUDA GPU: pip install 'attnscope[kernels]'", file=sys.stderr)
        raise SystemExit(2) from None
    if not torch.cuda.is_available():
        print("bench/mods.py: needs a CUDA GPU; none is visible", file=sys.stderr)
        raise SystemExit(2)
    return torch


#: The Gluon forward's CTA tile (query rows x keys): issue 35's "fraction of tiles the model says are visited"
#: is counted on it (`model.tiles.Grid.loaded_pairs`).
TILE = (128, 128)


def visited(n: int, causal: bool, window) -> tuple[int, int]:
    """(query-key pairs the attention permits: the flop count's; tile pairs a kernel of `TILE` tiles loads),
    from the model (`attnscope.model.tiles.Grid`, closed forms)."""
    from attnscope.model.tiles import Grid

    g = Grid(n, n, *TILE, causal=causal, window=window)
    return g.visible_pairs(), g.loaded_pairs()[0]


def _torch_attn(torch, q, k, v, causal, window, softcap, sinks, dtype):
    """Math attention at ``dtype`` (float64: the reference; the input dtype: PyTorch's own error)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    n_q, n_k = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    ar = torch.arange(max(n_q, n_k), device=q.device, dtype=torch.int32)
    rel = ar[None, :n_k] - (ar[:n_q, None] + (n_k - n_q))  # key minus the row's diagonal key
    keep = torch.ones_like(rel, dtype=torch.bool)
    if left >= 0:
        keep &= rel >= -left
    if right >= 0:
        keep &= rel <= right
    s = s.masked_fill(~keep, float("-inf"))
    if dtype != torch.float64:
        s = s.float()  # the softmax in fp32, as SDPA's math path
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return p.to(dtype) @ v


def check(torch, q, k, v, do, causal, window, softcap, sinks):
    """Batch 0 at full N and H through attnscope, head 0 against float64; the failure message or None."""
    import attnscope
    from attnscope import checks

    q, k, v, do = (t[:1] for t in (q, k, v, do))  # batch 0: dsinks sums over the batch
    mods = dict(window=window, softcap=softcap)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    s_leaf = None if sinks is None else sinks.detach().requires_grad_()
    o = attnscope.flash_attention(*leaves, causal=causal, sinks=s_leaf, **mods)
    got = [o] + list(torch.autograd.grad(o, leaves + ([] if s_leaf is None else [s_leaf]), do))
    got = [g[:1, :1] for g in got[:4]] + got[4:]
    errs = {}
    for dt in (torch.float64, q.dtype):
        sl = [t[:1, :1].detach().to(dt).requires_grad_() for t in (q, k, v)]
        sk = None if sinks is None else sinks[:1].detach().to(torch.float64 if dt == torch.float64 else
                                                               torch.float32).requires_grad_()
        out = _torch_attn(torch, *sl, causal, window, softcap, sk, dt)
        gr = torch.autograd.grad(out, sl + ([] if sk is None else [sk]), do[:1, :1].to(dt))
        errs[dt] = [out.double()] + [g.double() for g in gr]
    ref, own = errs[torch.float64], errs[q.dtype]
    got[4:] = [g[:1] for g in got[4:]]  # dsinks of head 0
    bad = []
    for i, (name, a, r, t) in enumerate(zip(("o", "dq", "dk", "dv", "dsinks"), got, ref, own, strict=False)):
        err, t_err = (a.double() - r).abs().max().item(), (t - r).abs().max().item()
        tol = checks.kernel_tolerance(t_err, 2.0 if i == 0 else checks.GRAD_FACTOR)
        if not err <= tol:
            bad.append(f"{name} error {err:.3g} > {tol:.3g}")
    return "; ".join(bad) or None


def _ms(fn):
    import triton
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def _timers(torch, f, inputs, do) -> dict:
    """The timed calls of ``f(*inputs) -> o``: ``fwd`` (no grad), and ``bwd`` through a retained graph or,
    where the graph cannot be retained (compiled Flex with donated buffers), ``fwdbwd`` (forward + backward,
    the backward then reported as fwdbwd - fwd)."""
    leaves = [t.detach().requires_grad_() for t in inputs]

    def fwd():
        with torch.no_grad():
            return f(*inputs)
    out = f(*leaves)

    def bwd():
        return torch.autograd.grad(out, leaves, do, retain_graph=True)
    try:
        bwd()
        return {"fwd": fwd, "bwd": bwd}
    except RuntimeError as e:
        print(f"    backward timed as fwd+bwd - fwd ({str(e).splitlines()[0][:70]})")
        return {"fwd": fwd, "fwdbwd": lambda: torch.autograd.grad(f(*leaves), leaves, do)}


def _time_rounds(timers: dict, rounds: int) -> dict:
    """Median ms of each timed call over ``rounds`` interleaved rounds, the order rotated round to round, so
    every call meets the clocks the others do (a GPU at its power cap slows a call timed after a hot one)."""
    import statistics

    keys, per = list(timers), {key: [] for key in timers}
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            per[key].append(_ms(timers[key]))
    return {key: statistics.median(xs) for key, xs in per.items()}


def _flex(torch, n, causal, window, softcap, with_lse):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, fullgraph=True)
    left = window[0] if window is not None else -1

    def mask_mod(b, h, qi, ki):
        keep = qi >= ki if causal else qi >= 0
        return keep & (qi - ki <= left) if left >= 0 else keep

    block_mask = (create_block_mask(mask_mod, None, None, n, n, device="cuda") if causal or left >= 0
                  else None)
    score_mod = None
    if softcap:
        def score_mod(score, b, h, qi, ki):
            return softcap * torch.tanh(score / softcap)
    if with_lse:
        return lambda q, k, v: flex(q, k, v, block_mask=block_mask, score_mod=score_mod, return_lse=True)
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask, score_mod=score_mod)


def _points(sections, quick):
    pts = []
    if "window" in sections:
        pts += [("window", 8192, dict(window=(1024, 0))), ("window", 32768, dict(window=(4096, 0)))]
    if "softcap" in sections:
        pts.append(("softcap", 8192, dict(softcap=50.0)))
    if "sinks" in sections:
        pts.append(("sinks", 8192, dict(sinks=True)))
    if "off" in sections:
        pts += [("off", 8192, dict(causal=False)), ("off", 8192, dict())]
    return [p for p in pts if not quick or p[1] <= 8192]


def _impls(torch, section, n, causal, window, softcap, sinks, baseline):
    """name -> f(q, k, v) returning o (autograd-tracked) for one point."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import attnscope

    if section == "off":  # the portable kernel, which the mods live in
        impls = {"attnscope": lambda q, k, v: attnscope.flash_attention(q, k, v, causal=causal,
                                                                         impl="portable")}
        if not baseline:
            impls["attnscope_window_NN"] = lambda q, k, v: attnscope.flash_attention(
                q, k, v, causal=causal, window=(n, n), impl="portable")
        return impls
    s_req = None if sinks is None else sinks.detach().requires_grad_()
    impls = {"attnscope": lambda q, k, v: attnscope.flash_attention(
        q, k, v, causal=causal, window=window, softcap=softcap, sinks=s_req)}
    flex = _flex(torch, n, causal, window, softcap, sinks is not None)
    if sinks is not None:
        def flex_sinks(q, k, v):
            o, lse = flex(q, k, v)  # LSE correction: o * Z / (Z + e^sink) = o * sigmoid(lse - sink)
            return o * torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1).to(o.dtype)
        impls["flex"] = flex_sinks
    else:
        impls["flex"] = flex
    impls["attnscope_causal"] = lambda q, k, v: attnscope.flash_attention(q, k, v, causal=True)  # auto
    impls["attnscope_portable_causal"] = lambda q, k, v: attnscope.flash_attention(q, k, v, causal=True,
                                                                                    impl="portable")

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, is_causal=True)
    impls["sdpa_cudnn_causal"] = cudnn
    return impls


def _backward_alone(torch, q, k, v, do, causal, window, softcap) -> dict:
    """`flash_attention_backward`'s timed calls per ``impl`` ("hopper" on sm_90 only, "portable")."""
    import attnscope
    from attnscope.kernels import bwd

    o, lse = attnscope.flash_attention(q, k, v, causal=causal, window=window, softcap=softcap,
                                       return_lse=True)
    impls = ["portable"]
    if torch.cuda.get_device_capability() == (9, 0):
        impls.insert(0, "hopper")
    return {f"attnscope_bwd_{impl}": lambda impl=impl: bwd.flash_attention_backward(
        do, q, k, v, o, lse, causal, None, window=window, softcap=softcap, impl=impl) for impl in impls}


def run(torch, args, log):
    dtype = getattr(torch, args.dtype)
    rows, failures = [], []
    for section, n, kw in _points(args.only, args.quick):
        causal = kw.get("causal", True)
        window, softcap = kw.get("window"), kw.get("softcap", 0.0)
        b = max(1, args.tokens // n)
        g = torch.Generator(device="cuda").manual_seed(n + args.d)
        q, k, v, do = (torch.randn(b, args.heads, n, args.d, device="cuda", dtype=dtype, generator=g)
                       for _ in range(4))
        sinks = (torch.randn(args.heads, device="cuda", generator=g) if kw.get("sinks") else None)
        impls = _impls(torch, section, n, causal, window, softcap, sinks, args.baseline)
        label = (f"{section} N={n} B={b} " + " ".join(f"{a}={x}" for a, x in kw.items() if a != "sinks")
                 + (" sinks" if sinks is not None else ""))
        if not args.baseline:
            why = check(torch, q, k, v, do, causal, window if section != "off" else None, softcap, sinks)
            if why:
                failures.append(f"{label}: {why}")
                log(f"CHECK FAILED {label}: {why}")
        pairs, tiles = visited(n, causal, window)
        causal_pairs, causal_tiles = visited(n, True, None)
        fl = 4 * args.d * pairs * b * args.heads
        row = {"section": section, "n": n, "batch": b, "heads": args.heads, "d": args.d, "dtype": args.dtype,
               "mods": {a: x for a, x in kw.items() if a != "sinks"} | ({"sinks": True} if sinks is not None
                                                                         else {}),
               "visited_over_causal": pairs / causal_pairs, "tiles_over_causal": tiles / causal_tiles,
               "ms": {}, "tflops": {}}
        timers = {(name, kind): fn for name, f in impls.items()
                  for kind, fn in _timers(torch, f, (q, k, v), do).items()}
        alone = (_backward_alone(torch, q, k, v, do, causal, window, softcap)
                 if section in ("window", "softcap") else {})
        timers |= {(name, "bwd"): fn for name, fn in alone.items()}
        timed = _time_rounds(timers, args.rounds)
        for name in impls:
            f_ms = timed[name, "fwd"]
            b_ms = timed[name, "bwd"] if (name, "bwd") in timed else timed[name, "fwdbwd"] - f_ms
            flops = fl if not name.endswith("causal") else 4 * args.d * causal_pairs * b * args.heads
            row["ms"][name] = (f_ms, b_ms)
            row["tflops"][name] = (flops / (f_ms * 1e9), 2.5 * flops / (b_ms * 1e9))
        for name in alone:
            row["ms"][name] = (None, timed[name, "bwd"])
            row["tflops"][name] = (None, 2.5 * fl / (timed[name, "bwd"] * 1e9))
        rows.append(row)
        log(f"{label}  visited/causal {row['visited_over_causal']:.3f} (pairs), "
            f"{row['tiles_over_causal']:.3f} ({TILE[0]} x {TILE[1]} tiles)")
        for name, (f_ms, b_ms) in row["ms"].items():
            tf, tb = row["tflops"][name]
            fwd_s = f"{f_ms:8.3f} ms {tf:6.1f} TFLOP/s" if f_ms else f"{'-':>8s}{'':17s}"
            bwd_s = f"{b_ms:8.3f} ms {tb:6.1f} TFLOP/s" if b_ms else f"{'-':>8s}"
            log(f"    {name:22s} fwd {fwd_s}   bwd {bwd_s}")
        ms = row["ms"]
        if "attnscope_bwd_hopper" in ms:
            hop = ms["attnscope_bwd_hopper"][1]
            log(f"    backward: Flex / hopper {ms['flex'][1] / hop:.2f} x, portable / hopper "
                f"{ms['attnscope_bwd_portable'][1] / hop:.2f} x")
        if section == "window":
            for name, i, what in (("attnscope", 0, "forward"), ("attnscope_bwd_hopper", 1, "backward")):
                if name in ms:
                    t, c = ms[name][i], ms["attnscope_causal"][i]
                    log(f"    {what} time / (full causal x visited/causal): "
                        f"{t / (c * row['visited_over_causal']):.2f} (pairs), "
                        f"{t / (c * row['tiles_over_causal']):.2f} (tiles)")
        torch.cuda.empty_cache()
    return rows, failures


def markdown(rows) -> str:
    out = ["| point | impl | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd time / attnscope's "
           "| bwd time / attnscope's |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        base = r["ms"]["attnscope"]
        point = (f"{r['section']} N={r['n']} " + " ".join(f"{a}={x}" for a, x in r["mods"].items())
                 + f" (visited/causal {r['visited_over_causal']:.3f}, tiles {r['tiles_over_causal']:.3f})")
        for name, (f_ms, b_ms) in r["ms"].items():
            tf, tb = r["tflops"][name]
            fx = f"{f_ms / base[0]:.2f}" if f_ms else "-"
            bx = f"{b_ms / base[1]:.2f}" if b_ms and base[1] else "-"
            out.append(f"| {point} | {name} | " + (f"{f_ms:.3f} | {tf:.1f}" if f_ms else "- | -") + " | "
                       + (f"{b_ms:.3f} | {tb:.1f}" if b_ms else "- | -") + f" | {fx} | {bx} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections of {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="N <= 8k only")
    ap.add_argument("--d", type=int, default=128, choices=(64, 128), help="head dim (default 128)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32768, help="B * N (default 32k)")
    ap.add_argument("--baseline", action="store_true",
                    help="only plain calls (for --only off under an older tree without the mods)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="interleaved timing rounds per point, the order rotated (the median; default 2)")
    ap.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in args.only if s not in SECTIONS]
    if bad or (args.baseline and args.only != ["off"]):
        ap.error(f"--only: expected sections of {SECTIONS} (--baseline: off only), got {args.only}")
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive integer, got {args.rounds}")
    torch = _require_gpu()
    rows, failures = run(torch, args, print)
    if args.markdown:
        print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "failures": failures, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
