"""The benchmark sweep driver: attnscope's kernels against PyTorch SDPA backends, same inputs, same run.

Used by `attnscope bench` and `bench/prefill.py`. GPU only; never run by tests.

Method (METHOD.md of the device notes, and DESIGN.md "Numbers"):
- correctness first: before a kernel is timed at a shape, its output is checked at that full shape
  against a float64 reference (on a sample of heads, computed on the GPU), with the bound
  ``err(kernel) <= 2 * err(SDPA FLASH at the same dtype) + 1e-3``; a kernel that fails is not timed;
- timings are medians of CUDA-event timings after warm-up (`triton.testing.do_bench`);
- TFLOP/s = 4 * B * H * Nq * Nk * d / time, halved for causal when Nq == Nk (flash-attn's convention);
  decode TB/s = K and V bytes read / time;
- decode is timed both as CUDA-graph replays (every column; how serving engines run decode, and the
  kernels' own time) and eagerly (host launch overhead included: ~10 us for SDPA's C++ dispatch, more
  for a Python launcher, which dominates at the smallest shapes);
- every peer runs in the same process on the same tensors; SDPA backends are forced with
  `torch.nn.attention.sdpa_kernel`, so a backend that cannot take the input reports "n/a" instead of
  silently falling back.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

PREFILL_NS = (512, 1024, 2048, 4096, 8192, 16384)
DECODE_GRID = ((1, 32, 32), (1, 32, 8), (16, 32, 8), (64, 32, 8))
DECODE_LS = (4096, 32768, 131072)


def add_arguments(p) -> None:
    p.add_argument("--kind", choices=["prefill", "decode", "all"], default="all",
                   help="which sweep to run (default: all)")
    p.add_argument("--quick", action="store_true", help="a few points only (smoke test)")
    p.add_argument("--d", type=int, action="append", help="head dims for prefill (default: 64 and 128)")
    p.add_argument("--n", type=int, action="append", help="sequence lengths for prefill (default 512..16k)")
    p.add_argument("--tokens", type=int, default=16384, help="B*N held constant in prefill (default 16384)")
    p.add_argument("--heads", type=int, default=32, help="query heads in prefill (default 32)")
    p.add_argument("--no-naive", action="store_true", help="skip the naive 3-kernel baseline")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots to DIR (needs matplotlib)")
    p.add_argument("--from-json", metavar="FILE",
                   help="no GPU: print and plot a recorded run (a file --json wrote) instead of measuring")


# ----------------------------------------------------------------------------------------------------
class Progress:
    """A progress bar for the sweep, on stderr; the result lines go to stdout, between redraws.

    On a terminal the bar is redrawn in place (``\r``) after every point, with the elapsed time and an
    estimate of the time left (mean time per point so far x points left); elsewhere (a log file, CI)
    each step prints one bar line, so the record stays readable.
    """

    def __init__(self, total: int, stream=None, width: int = 28, tty: bool | None = None, clock=time.time):
        self.total, self.done, self.width = max(1, total), 0, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.clock, self.t0, self._shown = clock, clock(), 0

    def line(self, label: str = "") -> str:
        filled = round(self.width * self.done / self.total)
        elapsed = self.clock() - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed:.0f} s" + (f", ~{eta:.0f} s left" if eta is not None else "")
                + (f"  {label}" if label else ""))

    def step(self, label: str = "") -> None:
        self.done = min(self.total, self.done + 1)
        text = self.line(label)
        if self.tty:
            self.stream.write("\r" + text.ljust(self._shown))
            self._shown = len(text)
            if self.done == self.total:
                self.stream.write("\n")
                self._shown = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def log(self, text: str) -> None:
        """Print a result line to stdout without tearing the bar."""
        if self.tty and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0
        print(text, flush=True)


def _require_gpu():
    try:
        import torch
    except ImportError:
        print("attnscope bench: needs torch and a CUDA GPU: pip install 'attnscope[kernels]'",
              file=sys.stderr)
        raise SystemExit(2) from None
    if not torch.cuda.is_available():
        print("attnscope bench: needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)",
              file=sys.stderr)
        raise SystemExit(2)
    return torch


def _median_ms(fn, graph: bool = False) -> float:
    """Median ms over repetitions with CUDA events; ``graph``: replays of a captured CUDA graph, which
    leaves host launch overhead out (how serving engines run decode)."""
    import triton

    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _sdpa(torch, backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend_name]

    def call(q, k, v, causal, gqa=False):
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    return call


def _naive(torch):
    def call(q, k, v, causal):  # the spec's explicit 3-kernel baseline, S and P in the input dtype
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    return call


def _ref_error(torch, out, q, k, v, causal, heads=2, rows=2048):
    """Max abs error of ``out`` against float64 attention on heads [0, heads) of batch 0 (all keys,
    the last ``rows`` queries: the causal rows that see the most keys)."""
    g = q.shape[1] // k.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    r0 = max(0, nq - rows)
    qs = q[0, :heads, r0:].double()
    ks = k[0, [h // g for h in range(heads)]].double()
    vs = v[0, [h // g for h in range(heads)]].double()
    s = qs @ ks.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        r = torch.arange(r0, nq, device=q.device)[:, None]
        c = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(c > r + (nk - nq), float("-inf"))
    ref = torch.softmax(s, dim=-1) @ vs
    return (out[0, :heads, r0:].double() - ref).abs().max().item()


def _fmt(x, nd=1):
    return "n/a" if x is None else f"{x:.{nd}f}"


# ----------------------------------------------------------------------------------------------------
def prefill_sweep(torch, ns, ds, tokens, heads, naive=True, dtypes=None, log=print, progress=None):
    import attnscope

    dtypes = dtypes or [torch.bfloat16]
    impls = {"attnscope": lambda q, k, v, c: attnscope.flash_attention(q, k, v, causal=c),
             "flash": _sdpa(torch, "flash"), "cudnn": _sdpa(torch, "cudnn"),
             "efficient": _sdpa(torch, "efficient")}
    if naive:
        impls["naive"] = _naive(torch)
    results = []
    for dtype in dtypes:
        for d in ds:
            for causal in (False, True):
                for n in ns:
                    b = max(1, tokens // n)
                    torch.manual_seed(n + d)
                    q, k, v = (torch.randn(b, heads, n, d, device="cuda", dtype=dtype) for _ in range(3))
                    flops = 4 * b * heads * n * n * d * (0.5 if causal else 1.0)
                    row = {"dtype": str(dtype).replace("torch.", ""), "d": d, "causal": causal, "n": n,
                           "batch": b, "heads": heads, "tflops": {}, "ms": {}, "err": {}}
                    # correctness first, at the full shape
                    try:
                        ref_err = _ref_error(torch, impls["flash"](q, k, v, causal), q, k, v, causal)
                    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                        ref_err = None
                        log(f"  flash failed at this shape: {e!r}"[:200])
                    for name, fn in impls.items():
                        try:
                            out = fn(q, k, v, causal)
                            torch.cuda.synchronize()
                            err = _ref_error(torch, out, q, k, v, causal)
                            del out
                            row["err"][name] = err
                            if name == "attnscope" and ref_err is not None and not err <= 2 * ref_err + 1e-3:
                                log(f"  FAIL attnscope d={d} causal={causal} n={n}: err {err:.3g} > "
                                    f"2 x {ref_err:.3g} + 1e-3; not timed")
                                row["ms"][name] = None
                                continue
                            ms = _median_ms(lambda fn=fn, q=q, k=k, v=v, c=causal: fn(q, k, v, c))
                            row["ms"][name] = ms
                            row["tflops"][name] = flops / ms / 1e9
                        except Exception as e:  # noqa: BLE001
                            row["ms"][name] = None
                            row["err"][name] = None
                            log(f"  {name} n/a at d={d} causal={causal} n={n}: {type(e).__name__}: "
                                f"{str(e)[:120]}")
                        torch.cuda.empty_cache()
                    t = row["tflops"]
                    a = t.get("attnscope")
                    row["vs_cudnn"] = a / t["cudnn"] if a and t.get("cudnn") else None
                    row["vs_flash"] = a / t["flash"] if a and t.get("flash") else None
                    results.append(row)
                    log(f"{row['dtype']} d={d:3d} causal={int(causal)} N={n:5d} B={b:2d} | " + " ".join(
                        f"{k}={_fmt(t.get(k))}" for k in impls) +
                        f" | /cudnn={_fmt(row['vs_cudnn'], 3)} /flash={_fmt(row['vs_flash'], 3)}"
                        f" | err attnscope={_fmt(row['err'].get('attnscope'), 5)} flash={_fmt(ref_err, 5)}")
                    if progress is not None:
                        progress.step(f"prefill {row['dtype']} d={d} causal={int(causal)} N={n}")
                    torch.cuda.empty_cache()
    return results


def read_ceiling(torch, gib=4):
    """A read-only streaming ceiling: sum of a large bf16 tensor (bytes read / time), TB/s."""
    x = torch.randn(gib * 2**30 // 2, device="cuda", dtype=torch.bfloat16)
    ms = _median_ms(lambda: x.sum(dtype=torch.float32))
    tbs = x.numel() * 2 / ms / 1e9
    torch.cuda.empty_cache()
    return tbs


def decode_sweep(torch, grid=DECODE_GRID, ls=DECODE_LS, d=128, dtype=None, log=print, progress=None):
    import attnscope

    dtype = dtype or torch.bfloat16
    results = []
    flash, cudnn = _sdpa(torch, "flash"), _sdpa(torch, "cudnn")
    for (b, hq, hkv) in grid:
        for L in ls:
            torch.manual_seed(L + b)
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=dtype)
            k = torch.randn(b, hkv, L, d, device="cuda", dtype=dtype)
            v = torch.randn(b, hkv, L, d, device="cuda", dtype=dtype)
            kv_bytes = 2 * b * hkv * L * d * q.element_size()
            row = {"batch": b, "hq": hq, "hkv": hkv, "L": L, "kv_mib": kv_bytes / 2**20, "tbs": {}, "ms": {},
                   "tbs_eager": {}, "err": {}}
            impls = {
                "attnscope": lambda q=q, k=k, v=v: attnscope.flash_decode(q, k, v),
                "attnscope_1split": lambda q=q, k=k, v=v: attnscope.flash_decode(q, k, v, num_splits=1),
                "flash": lambda q=q, k=k, v=v, g=hq != hkv: flash(q, k, v, False, gqa=g),
                "cudnn": lambda q=q, k=k, v=v, g=hq != hkv: cudnn(q, k, v, False, gqa=g),
            }
            ref_err = None
            for name, fn in impls.items():
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    err = _ref_error(torch, out, q, k, v, False, heads=min(hq, 8))
                    row["err"][name] = err
                    if name == "flash":
                        ref_err = err
                    if name.startswith("attnscope") and ref_err is None:
                        # reference error of SDPA at this dtype: computed on the first kernel's turn
                        ref_err = _ref_error(torch, flash(q, k, v, False, gqa=hq != hkv), q, k, v, False,
                                             heads=min(hq, 8))
                    if name.startswith("attnscope") and not err <= 2 * ref_err + 1e-3:
                        log(f"  FAIL {name} B={b} Hkv={hkv} L={L}: err {err:.3g} > 2 x {ref_err:.3g} + 1e-3")
                        row["ms"][name] = None
                        continue
                    ms = _median_ms(fn, graph=True)
                    row["ms"][name] = ms
                    row["tbs"][name] = kv_bytes / ms / 1e9
                    row["tbs_eager"][name] = kv_bytes / _median_ms(fn) / 1e9
                except Exception as e:  # noqa: BLE001
                    row["ms"][name] = None
                    log(f"  {name} n/a at B={b} Hq={hq} Hkv={hkv} L={L}: {type(e).__name__}: {str(e)[:120]}")
            t = row["tbs"]
            a = t.get("attnscope")
            row["vs_cudnn"] = a / t["cudnn"] if a and t.get("cudnn") else None
            row["vs_flash"] = a / t["flash"] if a and t.get("flash") else None
            results.append(row)
            log(f"decode B={b:2d} Hq={hq} Hkv={hkv:2d} L={L:6d} KV={row['kv_mib']:8.1f} MiB | graph: " +
                " ".join(f"{k}={_fmt(t.get(k), 2)}" for k in impls) +
                f" TB/s | /cudnn={_fmt(row['vs_cudnn'], 3)} /flash={_fmt(row['vs_flash'], 3)} | eager: " +
                " ".join(f"{k}={_fmt(row['tbs_eager'].get(k), 2)}" for k in impls))
            if progress is not None:
                progress.step(f"decode B={b} Hkv={hkv} L={L}")
            torch.cuda.empty_cache()
    return results


def environment(torch) -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": p.name,
            "sms": p.multi_processor_count, "l2_bytes": p.L2_cache_size,
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version()}


def summarize(result: dict, log=print) -> None:
    """One line per measured point of a recorded run (the same lines the sweep prints)."""
    for row in result.get("prefill", []) + result.get("prefill_fp16", []):
        t = row["tflops"]
        log(f"{row['dtype']} d={row['d']:3d} causal={int(row['causal'])} N={row['n']:5d} "
            f"B={row['batch']:2d} | "
            + " ".join(f"{k}={_fmt(v)}" for k, v in t.items())
            + f" | /cudnn={_fmt(row.get('vs_cudnn'), 3)} /flash={_fmt(row.get('vs_flash'), 3)}")
    for row in result.get("decode", []):
        log(f"decode B={row['batch']:2d} Hq={row['hq']} Hkv={row['hkv']:2d} L={row['L']:6d} | "
            + " ".join(f"{k}={_fmt(v, 2)}" for k, v in row["tbs"].items())
            + f" TB/s | /cudnn={_fmt(row.get('vs_cudnn'), 3)} /flash={_fmt(row.get('vs_flash'), 3)}")


def _from_json(args) -> int:
    from attnscope.errors import InputError

    try:
        with open(args.from_json) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"--from-json: expected a JSON file written by `attnscope bench --json`, got "
                         f"{args.from_json!r} ({e})") from None
    if not isinstance(result, dict) or not ({"prefill", "decode"} & set(result)):
        raise InputError(f"--from-json: expected a result with 'prefill' or 'decode' rows, got "
                         f"{sorted(result) if isinstance(result, dict) else type(result).__name__}")
    print("# " + json.dumps(result.get("env", {})))
    summarize(result)
    if args.plots:
        from attnscope.measure.plots import write_plots

        for path in write_plots(result, args.plots):
            print(f"plot: {path}")
    return 0


def run(args) -> int:
    if getattr(args, "from_json", None):
        return _from_json(args)
    torch = _require_gpu()
    env = environment(torch)
    print("# " + json.dumps(env), flush=True)
    out = {"env": env}
    ds = args.d or [64, 128]
    ns = args.n or (list(PREFILL_NS) if not args.quick else [1024, 4096])
    grid = DECODE_GRID if not args.quick else DECODE_GRID[1:3]
    ls = DECODE_LS if not args.quick else (4096, 32768)
    prefill = args.kind in ("prefill", "all")
    fp16_extra = prefill and not args.quick
    decode = args.kind in ("decode", "all")
    total = (prefill * len(ds) * 2 * len(ns) + fp16_extra * 2 + decode * len(grid) * len(ls))
    progress = Progress(total)
    log = progress.log
    if prefill:
        out["prefill"] = prefill_sweep(torch, ns, ds, args.tokens, args.heads, naive=not args.no_naive,
                                       log=log, progress=progress)
        if fp16_extra:
            out["prefill_fp16"] = prefill_sweep(torch, [4096], [128], args.tokens, args.heads,
                                                naive=not args.no_naive, dtypes=[torch.float16],
                                                log=log, progress=progress)
    if decode:
        out["read_ceiling_tbs"] = read_ceiling(torch)
        log(f"read ceiling (sum of 4 GiB bf16): {out['read_ceiling_tbs']:.2f} TB/s")
        out["decode"] = decode_sweep(torch, grid, ls, log=log, progress=progress)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.plots:
        from attnscope.measure.plots import write_plots

        for path in write_plots(out, args.plots):
            print(f"plot: {path}")
    return 0
