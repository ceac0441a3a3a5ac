"""Prefill benchmark (issue 15): attnscope portable and hopper vs SDPA CUDNN, SDPA FLASH and compiled
FlexAttention, same inputs, same run; then the first-call latency of every kernel variant.

    PYTHONPATH=src python bench/prefill.py [--quick] [--json F] [--no-flex] [--no-hopper] [--no-first-call]
        [--hopper-variants hopper,hopper_nopp,...] [--no-auto] [--d 128] [--n 8192] [--fp16 128:4096,...]
        [--rounds 3]
    PYTHONPATH=src python bench/prefill.py --first-call-only [--json F]   # every table variant's first call
        [--first-call-variants A,B]   # only these variants' table rows

Grid: bf16, H = 32, B*N = 16,384, N in {1k, 2k, 4k, 8k, 16k} (--quick: 1k, 4k), d in {64, 128}, causal
and not; then the fp16 points of ``--fp16`` (d:N pairs, causal and not; default d = 128 at 4k and 16k,
d = 64 at 16k) that `fwd.HOPPER_VALIDATED` needs before it may name a Hopper variant for fp16.
Step 1 checks every implementation at every grid point at the full shape against float64
(measure/bench.py's `_ref_error`: heads 0-1, the last 2,048 rows; bound 2 x SDPA FLASH's error + 1e-3);
one that fails (or raises) is reported and not timed. Step 2 times the rest (triton.testing.do_bench,
median) in ``--rounds`` interleaved rounds per point (each round times every implementation once, the order
rotated round to round); a point's TFLOP/s is the median over rounds and its ratio to CUDNN the median of
the per-round ratios (peers timed in the same round), so clock or run drift between rounds cannot decide
a comparison. TFLOP/s from `model.flops.attention_flops`. Hopper variants (kernels/fwd_hopper.py VARIANTS):
"hopper" is the public impl="hopper" (ping-pong, default variant); the others are the VARIANTS entries
(ablations and alternatives, each timed at the head dims it is built for); "auto" is impl="auto" (the
variant `fwd.HOPPER_VALIDATED` names, else portable: it must never be slower than portable). The closing
"summary" lines give, per variant and dtype, the issue's targets: min ratio to CUDNN at N >= 4k and at
N = 1k, and to the portable kernel. The JSON is rewritten after every timed point (a timeout keeps them).

First call: a child process per cache state runs portable and hopper (d x causal x {bf16, fp16}, N = 1k) once
each, and with --first-call-only also impl="auto" at the first N of every `fwd.HOPPER_VALIDATED` row (each
table variant's first call as a user meets it), and times that first call (host wall clock to completion;
compile included), CUDA already initialised.
"cold": TRITON_CACHE_DIR is a fresh empty directory; "warm": a second process with the same directory.
No call runs an autotuning sweep (configs come from tables).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

_FIRST_CALL = r"""
import json, sys, time, torch
import attnscope
torch.zeros(1, device="cuda"); torch.cuda.synchronize()  # CUDA context outside the timed calls
rows = []
for impl, d, dt, causal, n in json.loads(sys.argv[1]):
    dtype = getattr(torch, dt)
    q, k, v = (torch.randn(max(1, 16384 // n), 8, n, d, device="cuda", dtype=dtype) for _ in range(3))
    torch.cuda.synchronize()
    row = dict(impl=impl, d=d, dtype=dt, causal=causal, n=n)
    try:
        t0 = time.perf_counter()
        attnscope.flash_attention(q, k, v, causal=causal, impl=impl)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        attnscope.flash_attention(q, k, v, causal=causal, impl=impl)
        torch.cuda.synchronize()
        row.update(first_s=t1 - t0, second_s=time.perf_counter() - t1)
    except Exception as e:  # a failing variant is reported, not fatal
        row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
    rows.append(row)
print(json.dumps(rows))
"""


def first_call_cases(impls=("portable", "hopper"), table: bool = False, variants=None) -> list:
    """The first calls to time: ``(impl, d, dtype, causal, n)``. Each impl at d 128/64 x bf16/fp16 x mask,
    N = 1k; with ``table``, also impl="auto" at the first N of every `fwd.HOPPER_VALIDATED` row (its
    variant's first call as a user meets it; B = 16k / N, 8 heads), or only of the rows whose variant is in
    ``variants``."""
    cases = [(i, d, dt, c, 1024) for i in impls for d in (128, 64) for dt in ("bfloat16", "float16")
             for c in (False, True)]
    if table:
        from attnscope.kernels import fwd

        cases += [("auto", d, dt, c, lo) for d, dt, c, lo, _hi, v in fwd.HOPPER_VALIDATED
                  if variants is None or v in variants]
    return cases


def first_call_latency(impls=("portable", "hopper"), log=print, table: bool = False,
                       variants=None) -> list[dict]:
    """First-call seconds per case of `first_call_cases`, cold and warm Triton cache (two child processes, one
    cache dir). Rows of impl="auto" name the variant the table ran (``variant``)."""
    from attnscope.kernels import fwd

    cases = first_call_cases(impls, table, variants)
    out = []
    with tempfile.TemporaryDirectory(prefix="attnscope-triton-cache-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        for state in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", _FIRST_CALL, json.dumps(cases)], env=env,
                               capture_output=True, text=True, timeout=240)
            if r.returncode != 0:
                raise RuntimeError(f"first-call child ({state}) failed:\n{r.stderr[-3000:]}")
            for row in json.loads(r.stdout.strip().splitlines()[-1]):
                row["cache"] = state
                if row["impl"] == "auto":
                    row["variant"] = fwd._hopper_validated(row["d"], row["dtype"], row["causal"], row["n"])
                out.append(row)
                what = (f"{row['first_s']:.2f} s (second call {row['second_s'] * 1e3:.1f} ms)"
                        if "error" not in row else f"FAILED {row['error']}")
                via = f" ({row['variant']})" if row.get("variant") else ""
                log(f"first call, {state} cache: {row['impl']}{via} d={row['d']} {row['dtype']} "
                    f"causal={int(row['causal'])} N={row['n']}: {what}")
    return out


def _hopper_variant(torch, name):
    """A `fwd_hopper.VARIANTS` entry as a callable: the public path's allocation, the variant's launch."""
    import math

    from attnscope.kernels import fwd, fwd_hopper

    def call(q, k, v, c):
        d = q.shape[-1]
        o = torch.empty_like(q)
        lse = torch.empty(1, device=q.device, dtype=torch.float32)
        fwd_hopper.launch(q, k, v, o, lse, fwd.LOG2E / math.sqrt(d), c, False, name)
        return o

    return call


def _supports(name, d, causal) -> bool:
    """Whether implementation ``name`` is built for head dim ``d`` and this mask (a Hopper variant may not
    be)."""
    if not name.startswith("hopper"):
        return True
    from attnscope.kernels import fwd_hopper

    return fwd_hopper.supports(name, d, causal)


def _impls(torch, flex: bool, hopper=("hopper",), auto: bool = True):
    import attnscope
    from attnscope.measure.backends import sdpa

    impls = {"portable": lambda q, k, v, c: attnscope.flash_attention(q, k, v, causal=c, impl="portable")}
    for name in hopper:  # "hopper" is the public impl="hopper"; the others are fwd_hopper.VARIANTS entries
        impls[name] = (_hopper_variant(torch, name) if name != "hopper" else
                       lambda q, k, v, c: attnscope.flash_attention(q, k, v, causal=c, impl="hopper"))
    if auto:
        impls["auto"] = lambda q, k, v, c: attnscope.flash_attention(q, k, v, causal=c, impl="auto")
    impls["cudnn"] = sdpa("cudnn")
    impls["flash"] = sdpa("flash")
    if flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention)
        masks = {}

        def causal_mod(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        def flex_call(q, k, v, c):
            mask = None
            if c:
                key = (q.shape[2], k.shape[2])
                if key not in masks:  # built once per shape, outside the timed calls
                    masks[key] = create_block_mask(causal_mod, None, None, key[0], key[1], device="cuda")
                mask = masks[key]
            return compiled(q, k, v, block_mask=mask)

        impls["flex"] = flex_call
    return impls


def _to_cudnn(row, name) -> float:
    """``name``'s ratio to SDPA CUDNN at one point: the median of the per-round ratios (else of medians)."""
    return row.get("cudnn_ratio", {}).get(name, row["tflops"][name] / row["tflops"]["cudnn"])


def _summary(rows) -> list[str]:
    """Per Hopper variant (and auto), the issue's targets: min ratio to CUDNN at N >= 4k and at 1k, and to
    portable."""
    lines = []
    names = sorted({k for r in rows for k in r["tflops"] if k.startswith("hopper") or k == "auto"})
    for name in names:
        for dt, d, c in sorted({(r["dtype"], r["d"], r["causal"]) for r in rows}):
            sel = [r for r in rows if r["dtype"] == dt and r["d"] == d and r["causal"] == c
                   and name in r["tflops"] and "cudnn" in r["tflops"] and "portable" in r["tflops"]]
            if not sel:
                continue
            cu_long = [_to_cudnn(r, name) for r in sel if r["n"] >= 4096]
            cu_1k = [_to_cudnn(r, name) for r in sel if r["n"] <= 1024]
            port = [r["tflops"][name] / r["tflops"]["portable"] for r in sel]
            fmt = lambda xs: f"{min(xs):.3f}" if xs else "-"  # noqa: E731
            lines.append(f"summary {name} {dt} d={d} causal={int(c)}: min /cudnn N>=4k {fmt(cu_long)}, "
                         f"N=1k {fmt(cu_1k)}; min /portable {fmt(port)}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N in {1k, 4k} only")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE")
    p.add_argument("--no-flex", action="store_true", help="skip compiled FlexAttention (its compiles)")
    p.add_argument("--no-first-call", action="store_true", help="skip the first-call latency children")
    p.add_argument("--first-call-only", action="store_true",
                   help="only the first-call children, with impl='auto' at every HOPPER_VALIDATED row")
    p.add_argument("--first-call-variants", default=None,
                   help="with --first-call-only: only the table rows of these variants (comma-separated), "
                        "and not the portable/hopper first calls")
    p.add_argument("--no-hopper", action="store_true", help="leave out every Gluon Hopper variant")
    p.add_argument("--hopper-variants", default=None,
                   help="comma-separated fwd_hopper.VARIANTS names to time (default: all)")
    p.add_argument("--no-auto", action="store_true", help="do not time impl='auto'")
    p.add_argument("--fp16", default="128:4096,128:16384,64:16384",
                   help="fp16 points as d:N pairs, causal and not ('' for none)")
    p.add_argument("--d", type=int, action="append", help="head dim(s) (default 128 and 64)")
    p.add_argument("--n", type=int, action="append", help="sequence length(s) (default 1k-16k)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds per point (median)")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=32)
    a = p.parse_args()

    import statistics

    import torch

    from attnscope.measure.bench import _median_ms, _ref_error, environment
    from attnscope.model.flops import attention_flops

    if not torch.cuda.is_available():
        print("bench/prefill.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    env = environment(torch)
    print("# " + json.dumps(env), flush=True)
    if a.first_call_only:
        only = a.first_call_variants.split(",") if a.first_call_variants else None
        out = {"env": env, "first_call": first_call_latency(impls=() if only else ("portable", "hopper"),
                                                             table=True, variants=only)}
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=1)
        return 0
    from attnscope.kernels import fwd_hopper

    names = fwd_hopper.VARIANTS if a.hopper_variants is None else a.hopper_variants.split(",")
    hopper = () if a.no_hopper else tuple(x for x in names if x)
    impls = _impls(torch, flex=not a.no_flex, hopper=hopper, auto=not a.no_auto)
    ns = a.n or ([1024, 4096] if a.quick else [1024, 2048, 4096, 8192, 16384])
    points = [("bfloat16", d, c, n) for d in (a.d or (128, 64)) for c in (False, True) for n in ns]
    for pair in (x for x in a.fp16.split(",") if x):
        d, n = (int(x) for x in pair.split(":"))
        points += [("float16", d, c, n) for c in (False, True)]

    def inputs(dt, d, n):
        torch.manual_seed(n + d)
        b = max(1, a.tokens // n)
        return [torch.randn(b, a.heads, n, d, device="cuda", dtype=getattr(torch, dt)) for _ in range(3)]

    # Step 1: correctness of every implementation at every point, full shape, before any timing.
    ok, errs, failures = {}, {}, []
    for dt, d, c, n in points:
        q, k, v = inputs(dt, d, n)
        ref = _ref_error(torch, impls["flash"](q, k, v, c), q, k, v, c)
        for name, fn in impls.items():
            if not _supports(name, d, c):
                continue
            try:
                err = _ref_error(torch, fn(q, k, v, c), q, k, v, c)
            except Exception as e:  # noqa: BLE001 - reported, and that implementation is not timed here
                err, why = None, f"{type(e).__name__}: {str(e)[:160]}"
            else:
                why = None if err <= 2 * ref + 1e-3 else f"err {err:.3g} > 2 x {ref:.3g} + 1e-3"
            errs[(dt, d, c, n, name)] = err
            ok[(dt, d, c, n, name)] = why is None
            if why:
                failures.append(f"{name} {dt} d={d} causal={int(c)} N={n}: {why}")
        del q, k, v
        torch.cuda.empty_cache()
    for f in failures:
        print("  FAIL (not timed) " + f, flush=True)
    print("all results match, starting benchmarks" if not failures else
          f"{len(failures)} check(s) failed (listed above); timing the rest", flush=True)

    # Step 2: time what passed.
    rows = []
    out = {"env": env, "prefill": rows, "failures": failures}

    def save():
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)

    for dt, d, c, n in points:
        q, k, v = inputs(dt, d, n)
        flops = attention_flops(q.shape[0], a.heads, n, n, d, c, "forward")
        row = {"dtype": dt, "d": d, "causal": c, "n": n, "batch": q.shape[0], "heads": a.heads,
               "flops": flops, "tflops": {}, "err": {}}
        for name in impls:
            if (dt, d, c, n, name) in ok:  # else a variant not built for this head dim or mask
                row["err"][name] = errs[(dt, d, c, n, name)]
        timed = [name for name in impls if ok.get((dt, d, c, n, name))]
        per_round = {name: [] for name in timed}
        for r in range(a.rounds):
            first = r % max(len(timed), 1)
            for name in timed[first:] + timed[:first]:  # rotated: no implementation always first
                fn = impls[name]
                ms = _median_ms(lambda fn=fn, q=q, k=k, v=v, c=c: fn(q, k, v, c))
                per_round[name].append(flops / ms / 1e9)
        row["tflops"] = {name: statistics.median(xs) for name, xs in per_round.items()}
        t = row["tflops"]
        cu = t.get("cudnn")
        ours = [k for k in t if k not in ("cudnn", "flash", "flex")]
        ratios = ""
        if cu:  # per-round ratios to the CUDNN time of the same round; their median
            rr = {k: [x / y for x, y in zip(per_round[k], per_round["cudnn"], strict=True)] for k in ours}
            row["rounds"] = per_round
            row["cudnn_ratio"] = {k: statistics.median(xs) for k, xs in rr.items()}
            ratios = " ".join(f"{k}={row['cudnn_ratio'][k]:.3f}" +
                              (f"[{min(rr[k]):.3f}-{max(rr[k]):.3f}]" if a.rounds > 1 else "") for k in ours)
        print(f"{'bf16' if dt == 'bfloat16' else 'fp16'} d={d:3d} causal={int(c)} N={n:5d} | " +
              " ".join(f"{k}={t[k]:.1f}" for k in t) + (f" | /cudnn {ratios}" if ratios else ""), flush=True)
        rows.append(row)
        save()  # every timed point survives a later timeout
        del q, k, v
        torch.cuda.empty_cache()
    out["summary"] = _summary(rows)
    for line in out["summary"]:
        print(line, flush=True)
    save()
    if not a.no_first_call:
        out["first_call"] = first_call_latency(impls=[i for i in ("portable", "hopper") if i in impls])
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
