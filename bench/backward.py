"""Backward benchmark (issue 13): attnscope's FA-2 backward vs SDPA FLASH / CUDNN / EFFICIENT / Flex.

    PYTHONPATH=src python bench/backward.py [--quick] [--json out.json] [--markdown] [--impl hopper]
    PYTHONPATH=src python bench/backward.py --host [--d 128]    # host µs per call vs SDPA

bf16 (``--dtype float16``: fp16), H = 32, B*N = 16,384, N in {1k, 4k, 16k}, d in {64, 128}, causal and not;
contiguous [B, H, N, d] inputs (``--layout bshd``: views of [B, N, H, d] memory, dO too, as in a decoder).
Per shape, every implementation is first checked against float64 on one head at the full shape (dQ, dK, dV
within 3 x SDPA FLASH's own error at that dtype + 1e-3), then timed (triton.testing.do_bench, median; in
``--rounds`` interleaved rounds, the order rotated round to round, the median over rounds):
backward only (the gradient of a retained forward graph) and forward + backward. FLOPs:
attnscope.model.flops.attention_flops (backward = 2.5 x forward). `attnscope` is the user's call,
``attnscope.flash_attention(q, k, v, causal=...)`` and its ``.backward()`` with every default (autograd
picks the kernels, the mode and the build: on sm_90 at d = 64 the one-pass lean build), timed exactly as
the peers; `flash_attention_backward` called directly adds `attnscope_det` (``deterministic=True``: dQ in
its own pass) and `attnscope_atomic` (``deterministic=False``: dQ by atomics where the kernels have it).
``--impl hopper`` adds the Gluon sm_90 dK/dV and dQ kernels (`attnscope_hopper`, kernels/bwd_hopper.py,
after the same preprocess) and their one-pass build (`attnscope_hopper_onepass`, ``deterministic=False``:
dQ by fp32 atomics), both in the default build (`bwd_hopper.config`: lean at d = 64), checked and timed
the same way; ``--hopper-plain`` adds both in the plain build where the default is the lean one
(`attnscope_hopper_plain`, `attnscope_hopper_onepass_plain`); ``--d 64``: that head dim only. Flex
(torch.compile'd flex_attention) runs at d = 128, N = 1k (one compile per mask; --flex-all for every shape).
Then the peak memory of forward + backward at N = 8k, H = 32, d = 128, causal (attnscope, SDPA FLASH,
naive), beside the analytic counts (`attnscope footprint`'s training retention for the naive path).
A shape whose gradients fail the check is not timed (exit 1). About 1.5 minutes on an H200 (one round;
2 rounds, the default, not timed yet). ``--host``: only the host µs per call of the user's forward + backward,
of `flash_attention_backward` alone and of SDPA CUDNN / FLASH (`host_times`).
``--markdown`` prints BENCHMARKS.md's backward table (its columns, in its order).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from attnscope.kernels._common import HEAD_DIMS
from attnscope.model.flops import attention_flops
from attnscope.model.footprint import footprint


def _require_gpu():
    try:
        import torch
    except ImportError:
        print("bench/backward.py: needs torch and a CUDA GPU: pip install 'attnscope[kernels]'",
              file=sys.stderr)
        raise SystemExit(2) from None
    if not torch.cuda.is_available():
        print("bench/backward.py: needs a CUDA GPU; none is visible", file=sys.stderr)
        raise SystemExit(2)
    return torch


def _impls(torch, causal, d, n, flex_all):
    """name -> f(q, k, v) returning o (autograd-tracked) for the peers."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import attnscope

    def sdpa_with(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)
        return f

    impls = {"attnscope": lambda q, k, v: attnscope.flash_attention(q, k, v, causal=causal),
             "sdpa_flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
             "sdpa_cudnn": sdpa_with(SDPBackend.CUDNN_ATTENTION),
             "sdpa_efficient": sdpa_with(SDPBackend.EFFICIENT_ATTENTION)}
    if flex_all or (d == 128 and n == 1024):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, fullgraph=True)
        mask = None
        if causal:
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cuda")
        impls["flex"] = lambda q, k, v: flex(q, k, v, block_mask=mask)
    return impls


def _ref_grads(torch, q, k, v, do, causal):
    """float64 gradients of head 0 of batch 0 (autograd of the naive float64 attention)."""
    qs, ks, vs = (t[:1, :1].detach().double().requires_grad_() for t in (q, k, v))
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ vs).backward(do[:1, :1].double())
    return qs.grad, ks.grad, vs.grad


def _grad_err(g, ref):
    return max((a[:1, :1].double() - r).abs().max().item() for a, r in zip(g, ref, strict=True))


def _ms(torch, fn):
    import triton
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def _backward(bwd, args, kw):
    """``bwd.flash_attention_backward(*args, **kw)``; ``kw["plain"]``: with the kernels' plain builds
    (`bwd_hopper.CONFIGS`) where the default is the lean one (`bwd_hopper.config`), for this call only."""
    kw = dict(kw)
    if not kw.pop("plain", False):
        return bwd.flash_attention_backward(*args, **kw)
    from attnscope.kernels import bwd_hopper, bwd_plan

    d = args[1].shape[-1]
    saved = {name: table.pop(d) for name, table in bwd_hopper.LEAN_CONFIGS.items() if d in table}
    plans, bwd_plan._PLANS = bwd_plan._PLANS, _PLAIN_PLANS  # the plain build's launch plans: their own
    try:
        return bwd.flash_attention_backward(*args, **kw)
    finally:
        bwd_plan._PLANS = plans
        for name, cfg in saved.items():
            bwd_hopper.LEAN_CONFIGS[name][d] = cfg


_PLAIN_PLANS: dict = {}


def _one_shape(torch, n, d, causal, tokens, heads, flex_all, log, hopper=False, plain=False,
               dtype="bfloat16", layout="bhsd", rounds=2):
    """Check, then time, every implementation at one shape; returns (row, failures). ``hopper``: also
    attnscope's backward on the Gluon sm_90 kernels (``impl="hopper"``) as ``attnscope_hopper``; ``plain``:
    also both Hopper builds in the plain build where the default is the lean one (`bwd_hopper.config`).
    ``layout`` "bshd": q, k, v and dO are [B, H, N, d] views of [B, N, H, d] memory, as a decoder's
    projections and its output projection's gradient hand them over."""
    from attnscope import checks
    from attnscope.kernels import bwd, fwd

    b = max(1, tokens // n)
    g = torch.Generator(device="cuda").manual_seed(n + d + causal)
    shape = (b, n, heads, d) if layout == "bshd" else (b, heads, n, d)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=getattr(torch, dtype), generator=g)
                   for _ in range(4))
    if layout == "bshd":
        q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
    ref = _ref_grads(torch, q, k, v, do, causal)
    impls = _impls(torch, causal, d, n, flex_all)
    errs = {}
    for name, f in impls.items():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        errs[name] = _grad_err(torch.autograd.grad(f(*leaves), leaves, do), ref)
    o, lse = fwd.flash_attention(q, k, v, causal=causal, return_lse=True)
    # flash_attention_backward called directly (`attnscope`, the user's call, is in `impls`)
    ours = {"attnscope_det": dict(deterministic=True), "attnscope_atomic": dict(deterministic=False)}
    if hopper:  # the two Gluon kernels, and the one-pass build (deterministic=False: atomic dQ)
        ours["attnscope_hopper"] = dict(impl="hopper")
        ours["attnscope_hopper_onepass"] = dict(impl="hopper", deterministic=False)
        from attnscope.kernels import bwd_hopper

        if plain and d in bwd_hopper.LEAN_CONFIGS["dkdv"]:
            ours["attnscope_hopper_plain"] = dict(impl="hopper", plain=True)
            ours["attnscope_hopper_onepass_plain"] = dict(impl="hopper", deterministic=False, plain=True)
    for name, kw in ours.items():
        errs[name] = _grad_err(_backward(bwd, (do, q, k, v, o, lse, causal, None), kw), ref)
    torch_err = errs["sdpa_flash"]
    bound = checks.kernel_tolerance(torch_err, checks.GRAD_FACTOR)
    failures = [f"{name} N={n} d={d} causal={causal}: grad error {errs[name]:.3g} > bound {bound:.3g} "
                f"(3 x SDPA FLASH's {torch_err:.3g} + 1e-3)" for name in ("attnscope", *ours)
                if not errs[name] <= bound]
    row = {"n": n, "batch": b, "heads": heads, "d": d, "causal": causal, "dtype": dtype, "layout": layout,
           "grad_err": errs,
           "backward_ms": {}, "fwd_bwd_ms": {}}
    if failures:
        log(f"d={d:3d} causal={causal} N={n:6d}: gradient check FAIL, not timed: " + "; ".join(failures))
        return row, failures
    # backward only: attnscope's kernels called directly; the peers through a retained graph
    timers = {}  # (metric, name) -> the timed call, None where it cannot run
    for name, kw in ours.items():
        timers["backward_ms", name] = lambda kw=kw: _backward(bwd, (do, q, k, v, o, lse, causal, None), kw)
    fwd_bwd_calls = {}
    for name, f in impls.items():  # the user's calls: attnscope's default and the peers, alike
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = f(*leaves)

        def bwd_only(out=out, leaves=leaves):
            return torch.autograd.grad(out, leaves, do, retain_graph=True)
        try:  # compiled Flex donates its buffers: no retained graph, so no backward-only timing
            bwd_only()
            timers["backward_ms", name] = bwd_only
        except RuntimeError as e:
            print(f"  {name}: backward-only not timed ({str(e).splitlines()[0][:80]})")
            timers["backward_ms", name] = None
        fwd_bwd_calls[name] = lambda f=f, leaves=leaves: torch.autograd.grad(f(*leaves), leaves, do)

    def fwd_bwd(**kw):
        o2, lse2 = fwd.flash_attention(q, k, v, causal=causal, return_lse=True)
        return _backward(bwd, (do, q, k, v, o2, lse2, causal, None), kw)

    timers.update({("fwd_bwd_ms", name): fn for name, fn in fwd_bwd_calls.items()})
    timers.update({("fwd_bwd_ms", name): (lambda kw=kw: fwd_bwd(**kw)) for name, kw in ours.items()})
    # interleaved rounds, the order rotated round to round: each call meets the clocks the others do (a GPU
    # at its power cap slows whatever runs after a long hot series); the median over rounds
    keys = [key for key, fn in timers.items() if fn is not None]
    per_round = {key: [] for key in keys}
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            per_round[key].append(_ms(torch, timers[key]))
    for key in timers:
        row[key[0]][key[1]] = statistics.median(per_round[key]) if key in per_round else None
    row["rounds"] = rounds
    ms = row["backward_ms"]
    plain_ratios = "".join(f"  | {x[10:]} x CUDNN {ms['sdpa_cudnn'] / ms[x]:.2f}"
                           for x in ours if x.endswith("_plain"))
    fl_b = attention_flops(b, heads, n, n, d, causal, "backward")
    fl_fb = attention_flops(b, heads, n, n, d, causal, "forward+backward")
    row["backward_tflops"] = {k_: (fl_b / (ms * 1e9) if ms else None)
                              for k_, ms in row["backward_ms"].items()}
    row["fwd_bwd_tflops"] = {k_: fl_fb / (ms * 1e9) for k_, ms in row["fwd_bwd_ms"].items()}
    bt = row["backward_tflops"]
    log(f"d={d:3d} {'causal  ' if causal else 'unmasked'} N={n:6d} B={b:2d}  backward TFLOP/s: "
        + "  ".join(f"{k_} {x:6.1f}" if x else f"{k_} -" for k_, x in bt.items())
        + f"  | x FLASH {bt['attnscope'] / bt['sdpa_flash']:.2f}"
        + f"  x CUDNN {bt['attnscope'] / bt['sdpa_cudnn']:.2f}"
        + (f"  | hopper x FLASH {bt['attnscope_hopper'] / bt['sdpa_flash']:.2f}"
           f"  x CUDNN {bt['attnscope_hopper'] / bt['sdpa_cudnn']:.2f}"
           f"  | onepass x CUDNN {bt['attnscope_hopper_onepass'] / bt['sdpa_cudnn']:.2f}" if hopper else "")
        + plain_ratios)
    log("      fwd+bwd TFLOP/s: " + "  ".join(f"{k_} {x:6.1f}" for k_, x in row["fwd_bwd_tflops"].items())
        + f"  | grad check PASS: attnscope {errs['attnscope']:.2e}"
        + (f" hopper {errs['attnscope_hopper']:.2e} onepass {errs['attnscope_hopper_onepass']:.2e}"
           if hopper else "") + "".join(f" {x[10:]} {errs[x]:.2e}" for x in ours if x.endswith("_plain"))
        + f" (SDPA FLASH {torch_err:.2e})")
    return row, failures


def sweep(torch, ns, ds, tokens, heads, flex_all, log, hopper=False, plain=False, dtype="bfloat16",
          layout="bhsd", rounds=2):
    rows, failures = [], []
    for d in ds:
        for causal in (False, True):
            for n in ns:
                row, bad = _one_shape(torch, n, d, causal, tokens, heads, flex_all, log, hopper, plain, dtype,
                                      layout, rounds)
                rows.append(row)
                failures += bad
                torch.cuda.empty_cache()
    return rows, failures


def peak_memory(torch, n=8192, heads=32, d=128, log=print):
    """Peak bytes allocated by forward + backward (inputs, gradients and everything transient included),
    causal, batch 1, beside the analytic counts."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import attnscope

    def naive(q, k, v):
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v

    def flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v, is_causal=True)

    res = {}
    for name, f in (("attnscope", lambda q, k, v: attnscope.flash_attention(q, k, v, causal=True)),
                    ("sdpa_flash", flash), ("naive", naive)):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        q, k, v, do = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        f(*leaves).backward(do)
        torch.cuda.synchronize()
        res[name] = torch.cuda.max_memory_allocated() - base
        del q, k, v, do, leaves
    tensor = heads * n * d * 2  # one [1, H, N, d] bf16 tensor
    fa_model = 8 * tensor + 2 * heads * n * 4 + heads * n * d * 4  # q k v o dO dq dk dv, LSE + D, fp32 dQ
    scopes = footprint(n=n, d=d, dtype="bf16", heads=heads, layers=1)
    retention = scopes["training retention, all layers"].nbytes
    gib = 2 ** 30
    log(f"peak memory fwd+bwd, N={n} H={heads} d={d} causal bf16 (GiB): "
        + "  ".join(f"{k_} {x / gib:.2f}" for k_, x in res.items())
        + f"  | attnscope / FLASH {res['attnscope'] / res['sdpa_flash']:.3f}")
    log(f"  model: FA-2 tensors (q k v o dO dq dk dv + LSE, D + fp32 dQ accumulator) "
        f"{fa_model / gib:.2f} GiB; "
        f"`attnscope footprint --n {n} --heads {heads} --layers 1 --dtype bf16` training retention "
        f"(S+P kept, one layer) {retention / gib:.2f} GiB (+ 8 inputs/gradients {8 * tensor / gib:.2f} GiB)")
    return {"measured_bytes": res, "model_fa2_bytes": fa_model, "io_tensors_bytes": 8 * tensor,
            "footprint_training_retention_bytes": retention}


#: ``host_times``: B, H, N (bf16, causal) at which the GPU idles (tens of µs of work per call against hundreds
#: of µs of host time), and the calls per timing.
HOST_SHAPE = (1, 16, 512)
HOST_CALLS = 300


def _host_calls(torch, d: int) -> dict:
    """`host_times`' calls at head dim ``d``: name -> no-argument callable."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnscope
    from attnscope.kernels import bwd

    b, h, n = HOST_SHAPE
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    o, lse = attnscope.flash_attention(qd, kd, vd, causal=True, return_lse=True)

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
        return call
    return {"attnscope fwd+bwd": lambda: attnscope.flash_attention(q, k, v, causal=True).backward(do),
            "flash_attention_backward": lambda: bwd.flash_attention_backward(do, qd, kd, vd, o, lse, True,
                                                                             None),
            "SDPA CUDNN fwd+bwd": sdpa(SDPBackend.CUDNN_ATTENTION),
            "SDPA FLASH fwd+bwd": sdpa(SDPBackend.FLASH_ATTENTION)}


def host_times(torch, ds, log=print) -> dict:
    """Host µs per call at ``HOST_SHAPE``, causal, bf16, per head dim of ``ds`` (`host_us_per_call`: the wall
    time of ``HOST_CALLS`` back-to-back calls, synchronised before and after, the median of interleaved
    rounds): the user's call (`flash_attention` and ``.backward()``), `flash_attention_backward` alone (its
    defaults), and SDPA CUDNN's and FLASH's forward + backward. Gradients accumulate into ``.grad`` in every
    call alike."""
    from attnscope.measure.bench import host_us_per_call

    b, h, n = HOST_SHAPE
    out = {}
    for d in ds:
        t = host_us_per_call(torch, _host_calls(torch, d), HOST_CALLS)
        t["attnscope / CUDNN"] = t["attnscope fwd+bwd"] / t["SDPA CUDNN fwd+bwd"]
        log(f"host us per call, d = {d} (B={b} H={h} N={n} causal bf16, {HOST_CALLS} back-to-back calls, "
            "wall time of the issuing loop): "
            + ", ".join(f"{x} {y:.{3 if '/' in x else 1}f}" for x, y in t.items()))
        out[d] = t
    return out


MD_IMPLS = ("attnscope", "attnscope_atomic", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")


def markdown(rows) -> str:
    """BENCHMARKS.md's backward table: backward-only TFLOP/s per shape, the ratios to FLASH and CUDNN."""
    lines = ["| d | mask | N | attnscope | attnscope (atomic dQ) | SDPA FLASH | SDPA CUDNN | SDPA EFFICIENT "
             "| / FLASH | / CUDNN |", "|" + " --- |" * 10]
    for r in rows:
        bt = r.get("backward_tflops")
        if not bt:
            continue
        cells = [f"{bt[k]:.0f}" if bt.get(k) else "n/a" for k in MD_IMPLS]
        ratios = f" | {bt['attnscope'] / bt['sdpa_flash']:.2f} | {bt['attnscope'] / bt['sdpa_cudnn']:.2f} |"
        lines.append(f"| {r['d']} | {'causal' if r['causal'] else 'none'} | {r['n']} | " + " | ".join(cells)
                     + ratios)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: N = 1k and 4k, d = 128 only")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    p.add_argument("--markdown", action="store_true", help="print BENCHMARKS.md's backward table at the end")
    p.add_argument("--flex-all", action="store_true", help="time Flex at every shape (a compile per shape)")
    p.add_argument("--impl", choices=("portable", "hopper"), default="portable",
                   help="hopper: also check and time the Gluon sm_90 backward kernels (impl='hopper') as "
                        "attnscope_hopper, and their one-pass build as attnscope_hopper_onepass, beside the "
                        "portable ones")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--host", action="store_true",
                   help="only the host µs per call (`host_times`): the user's forward + backward, "
                        "flash_attention_backward alone and SDPA CUDNN / FLASH, where the GPU idles")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved timing rounds per shape, the order rotated (the median; default 2)")
    p.add_argument("--hopper-plain", action="store_true",
                   help="--impl hopper: also both Hopper builds in the plain build where the default is the "
                        "lean one (d = 64: bwd_hopper.CONFIGS in place of LEAN_CONFIGS) as "
                        "attnscope_hopper_plain and attnscope_hopper_onepass_plain, checked and timed beside "
                        "the default")
    p.add_argument("--hopper-lean", metavar="BM,BN,STAGES[,NWG,DQ,RED]", default=None,
                   help="another lean d = 64 dK/dV config (LEAN = 1; default: bwd_hopper.LEAN_CONFIGS), for "
                        "every call that runs the lean build (the default one included)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="the inputs' dtype for the timed sweep (the peak-memory point stays bf16)")
    p.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd",
                   help="bshd: q, k, v and dO as [B, H, N, d] views of [B, N, H, d] memory (a decoder's "
                        "layout in training) for every implementation; default contiguous [B, H, N, d]")
    p.add_argument("--d", type=int, action="append", choices=HEAD_DIMS, metavar="D",
                   help="only this head dim (repeatable; default: 64 and 128; a multiple of 8 up to 256 runs "
                        "the portable kernels in padded tiles)")
    p.add_argument("--hopper-dkdv", metavar="BM,BN,STAGES", default=None,
                   help="--impl hopper: another dK/dV config of the plain build, both head dims (default: "
                        "bwd_hopper.CONFIGS; d = 64 runs the lean build unless --hopper-plain)")
    p.add_argument("--hopper-dq", metavar="BM,BN,STAGES", default=None,
                   help="--impl hopper: another dQ config of the plain build, both head dims (default: "
                        "bwd_hopper.CONFIGS)")
    p.add_argument("--dkdv", metavar="BM,BN,WARPS,STAGES", default=None,
                   help="try another dK/dV config for both head dims (default: bwd.DKDV_CONFIGS)")
    p.add_argument("--dq", metavar="BM,BN,WARPS,STAGES", default=None,
                   help="try another dQ-pass config for both head dims (default: bwd.DQ_CONFIGS)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: expected a positive integer, got {args.rounds}")
    torch = _require_gpu()
    from attnscope.kernels import bwd

    for flag, table in ((args.dkdv, bwd.DKDV_CONFIGS), (args.dq, bwd.DQ_CONFIGS)):
        if flag:
            cfg = tuple(int(x) for x in flag.split(","))
            if len(cfg) != 4:
                p.error(f"expected BM,BN,WARPS,STAGES, got {flag!r}")
            table.update({64: cfg, 128: cfg})  # this process only: the table the launcher reads
    t0 = time.time()
    ns = (1024, 4096) if args.quick else (1024, 4096, 16384)
    ds = tuple(args.d or ((128,) if args.quick else (64, 128)))
    if args.host:
        host = host_times(torch, ds, lambda s: print(s, flush=True))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"host_us": {str(d): t for d, t in host.items()}, "date": time.strftime("%Y-%m-%d"),
                           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, fh, indent=1)
        return 0
    print(f"backward bench: {args.dtype}, H = 32, B*N = 16384, N in {ns}, d in {ds}; checking against "
          "float64 at every shape before timing it", flush=True)
    print("column attnscope: exactly the user's call, attnscope.flash_attention(q, k, v, causal=...) and its "
          ".backward() with every default (autograd picks the kernels, mode and build); attnscope_det / "
          "attnscope_atomic: flash_attention_backward(deterministic=True / False) called directly",
          flush=True)
    hopper = args.impl == "hopper"
    if hopper:
        from attnscope.kernels import bwd_hopper

        for name, flag in (("dkdv", args.hopper_dkdv), ("dq", args.hopper_dq)):
            if flag:
                cfg = tuple(int(x) for x in flag.split(","))
                if len(cfg) != 3:
                    p.error(f"expected BM,BN,STAGES, got {flag!r}")
                bwd_hopper.CONFIGS[name].update({d: bwd_hopper.BwdConfig(*cfg) for d in (64, 128)})
    if hopper and torch.cuda.get_device_capability() != (9, 0):
        print("bench/backward.py: --impl hopper needs an sm_90 GPU", file=sys.stderr)
        return 2
    if args.hopper_plain and not hopper:
        p.error("--hopper-plain needs --impl hopper")
    if args.hopper_lean:  # this process only: the lean table bwd_hopper.config reads
        from attnscope.kernels import bwd_hopper

        cfg = tuple(int(x) for x in args.hopper_lean.split(","))
        if not 3 <= len(cfg) <= 6:
            p.error(f"--hopper-lean: expected BM,BN,STAGES[,NWG,DQ,RED], got {args.hopper_lean!r}")
        bwd_hopper.LEAN_CONFIGS["dkdv"][64] = bwd_hopper.BwdConfig(*cfg)._replace(LEAN=1)
    rows, failures = sweep(torch, ns, ds, 16384, 32, args.flex_all, lambda s: print(s, flush=True), hopper,
                           args.hopper_plain, args.dtype, args.layout, args.rounds)
    mem = None if args.no_memory else peak_memory(torch, log=lambda s: print(s, flush=True))
    if failures:
        print("GRADIENT MISMATCH:\n  " + "\n  ".join(failures), file=sys.stderr)
    else:
        print("all gradients match float64 (3 x SDPA FLASH's error + 1e-3) at every shape")
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "dkdv_configs": dict(bwd.DKDV_CONFIGS), "dq_configs": dict(bwd.DQ_CONFIGS),
           **({"hopper_configs": {k: {d: tuple(c) for d, c in v.items()}
                                  for k, v in bwd_hopper.CONFIGS.items()},
               "hopper_lean_configs": {k: {d: tuple(c) for d, c in v.items()}
                                       for k, v in bwd_hopper.LEAN_CONFIGS.items()}} if hopper else {}),
           "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d"), "dtype": args.dtype,
           "layout": args.layout,
           "seconds": round(time.time() - t0, 1)}
    print(f"done in {env['seconds']} s")
    if args.markdown:
        print(markdown(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"environment": env, "rows": rows, "memory": mem, "failures": failures}, fh, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
