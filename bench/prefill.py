"""Prefill forward benchmark: attnscope's portable kernel, each Gluon Hopper variant and ``impl="auto"``
against SDPA CUDNN and SDPA FLASH, same inputs, same run.

    PYTHONPATH=src python bench/prefill.py --grid 16k --markdown [--json F] [--rounds 2]
    PYTHONPATH=src python bench/prefill.py --shapes bench/grids/dispatch_heldout.csv --markdown
    PYTHONPATH=src python bench/prefill.py --mods [--json F]   # window / softcap / sinks, Hopper kernel
    PYTHONPATH=src python bench/prefill.py --host             # host us per call: flash_attention vs SDPA
    python bench/prefill.py --draw 33 > bench/grids/dispatch_heldout.csv   # CPU: draw held-out shapes
    python bench/prefill.py --draw 35 --windows > bench/grids/window_heldout.csv  # windowed held-out shapes
    python bench/prefill.py --draw 39 --family backward > bench/grids/heldout_backward.csv  # a bytes grid

``--grid 16k``: H = 32, B*N = 16,384, N in {1k, 2k, 4k, 8k, 16k} x d {64, 128} x causal/not x bf16/fp16.
``--shapes CSV``: rows ``batch,q_heads,kv_heads,n,d,causal,dtype`` (e.g. the dispatch check's held-out
shapes, drawn by ``--draw`` before any run), and an optional ``window`` column, ``L:R`` (flash-attn's
``window_size``; empty: none; ``--draw SEED --windows`` draws such shapes): a windowed point runs
attnscope's kernels only (SDPA has no window), is checked against float64 under the window with PyTorch's
own windowed error as the bound (`checks.torch_attention`), and counts the FLOPs of its visible pairs.
Every attnscope implementation runs through the public call, ``flash_attention(q, k, v, causal=c,
impl=...)`` (a Hopper variant forced by its name), so auto and each
variant pay the same host path and auto / variant isolates the dispatch choice; the run opens with the host
time per call of `flash_attention` and of SDPA (``host_times``; ``--host`` alone). Step 1 checks every
implementation at every point at its full shape against float64 (heads 0-1 of batch 0, the last 2,048
rows; bound `checks.kernel_tolerance` of SDPA FLASH's error on the same inputs); one that fails or raises
is reported and not timed. Step 2 times the rest (triton.testing.do_bench, median) in ``--rounds``
interleaved rounds, the order rotated round to round; a point's TFLOP/s (`model.flops.attention_flops`) is
the median over rounds. The closing lines say, per point, auto / best kept variant and auto / portable, and
the minimum of each (the dispatch check: auto >= 0.98 x the best variant and >= 1.0 x portable), then the
rule's picks apart from timing noise (the kernel auto ran, under its own name, against the fastest kernel).
``--mods``: every kept variant with window, softcap and sinks against float64 (`MOD_CASES`), then causal
windows against full causal (`MOD_TIMINGS`), the window also on the portable kernel and on each kept variant
built for that head dim (is auto's pick the fastest with a window?). Takes about 2-4 minutes per 40 points
on an H200 (the Gluon compiles, about 3 s each, included).
"""

import argparse
import csv
import functools
import json
import math
import os
import random
import statistics
import sys

GRIDS = {"16k": [(16384 // n, 32, 32, n, d, c, dt) for dt in ("bfloat16", "float16") for d in (128, 64)
                 for c in (False, True) for n in (1024, 2048, 4096, 8192, 16384)]}
FIELDS = ("batch", "q_heads", "kv_heads", "n", "d", "causal", "dtype")
WINDOW_FIELDS = (*FIELDS, "window")


def draw(seed: int, count: int = 24, max_tflop: float = 16.0) -> list[tuple]:
    """``count`` shapes off the B*N = 16k, H = 32 grid: B 1-16, Hq 8-96 with a GQA group of 1-8, N log-uniform
    in 1k-32k, each (d, mask, dtype) combination equally often; shapes over ``max_tflop`` TFLOP are drawn
    again (keeps one timed call under ~30 ms)."""
    def point(rng, d, c, dt):
        b, hq, hkv = _batch_heads(rng)
        n = _log_uniform(rng, 1024, 32768)
        flops = 4 * b * hq * n * n * d / (2 if c else 1)
        off_grid = not (b * n == 16384 and hq == 32)
        return (b, hq, hkv, n, d, c, dt) if off_grid and flops <= max_tflop * 1e12 else None
    return _draw_points(seed, count, (False, True), point)


def draw_windows(seed: int, count: int = 24, max_tflop: float = 16.0) -> list[tuple]:
    """``count`` windowed shapes (``--draw SEED --windows``): B 1-16, Hq 8-96 with a GQA group of 1-8, N and
    the window's side W log-uniform in 1k-32k and 64-8k (W < N), each (d, window kind, dtype) equally often:
    causal ``(W, 0)`` or unmasked ``(W, W)``; shapes over ``max_tflop`` TFLOP of visible pairs drawn again."""
    def point(rng, d, c, dt):
        b, hq, hkv = _batch_heads(rng)
        n = _log_uniform(rng, 1024, 32768)
        w = _log_uniform(rng, 64, 8192)
        window = (w, 0 if c else w)
        if w >= n or 4 * b * hq * visible_pairs(n, c, window) * d > max_tflop * 1e12:
            return None
        return (b, hq, hkv, n, d, c, dt, window)
    return _draw_points(seed, count, (True, False), point)


def _draw_points(seed: int, count: int, masks: tuple, point) -> list[tuple]:
    """``count`` points of ``point(rng, d, causal, dtype)`` (None: drawn again), cycling through every
    (d 64 / 128, mask of ``masks``, bf16 / fp16) combination; one seeded generator for all."""
    rng = random.Random(seed)
    combos = [(d, c, dt) for d in (64, 128) for c in masks for dt in ("bfloat16", "float16")]
    out = []
    while len(out) < count:
        p = point(rng, *combos[len(out) % len(combos)])
        if p is not None:
            out.append(p)
    return out


def _batch_heads(rng) -> tuple[int, int, int]:
    """A held-out shape's (batch 1-16, query heads 8-96, kv heads) with a GQA group of 1, 2, 4, 6 or 8."""
    b = rng.randint(1, 16)
    group = rng.choice((1, 2, 4, 6, 8))
    hkv = rng.choice([x for x in range(1, 97) if 8 <= x * group <= 96])
    return b, hkv * group, hkv


def visible_pairs(n: int, causal: bool, window) -> int:
    """Query-key pairs an n x n call sees under ``causal`` and ``window`` (`model.tiles.Grid.visible_pairs`,
    closed form)."""
    from attnscope.model.tiles import Grid

    return Grid(n, n, causal=bool(causal), window=window).visible_pairs()


#: `attnscope bytes --sweep` grids of issue 39 (``--draw SEED --family F``): the columns, then one drawing
#: rule per family. Every point fits an H200 with room (tensors under ~9 GB); an ncu pass takes seconds.
SWEEP_COLUMNS = ("pass", "impl", "batch", "heads", "kv_heads", "n", "d", "causal", "dtype", "deterministic",
                 "cache_lens", "page_size", "kv_dtype", "splits", "nq", "lens", "window")
SWEEP_FAMILIES = ("backward", "decode", "varlen", "varlen2", "fwd_openclass", "window", "decode_window",
                  "varlen_window", "backward_window", "window_wide")


def _log_uniform(rng, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def draw_sweep(family: str, seed: int, count: int = 48) -> list[dict]:
    """``count`` grid rows for one family, round-robin over its implementations (and modes), each (d, dtype)
    pair equally often, GQA groups 1-8 where the implementation takes them:

    - backward: naive (MHA, N 512-4k), SDPA flash, cudnn, attnscope atomic dQ and deterministic (N 1k-16k),
      B 1-4, Hq 8-32, causal or not;
    - decode: SDPA flash, cudnn (B 1-32, one length 1k-64k), attnscope dense, paged (page 16-256) and fp8
      (dense or paged), lengths drawn per sequence in [L/4, L], splits 1-16;
    - varlen: attnscope and Flex (document mask), 2-16 sequences of 64-8k, causal or not;
    - varlen2 (the varlen family's second grid, rows of pass varlen): two attnscope rows per Flex row, Flex
      with 2-8 sequences (each Flex point compiles its own kernel and evaluates its mask over total^2
      pairs: fewer and smaller ones keep the sweep short), otherwise as varlen;
    - fwd_openclass: the forward's open class, SDPA FLASH causal, Hkv 1-4 (Hq >= 4 Hkv), N 20k-40k, B 2-4;
    - window: a sliding-window forward, two attnscope rows per Flex row (each Flex point compiles), B 1-4,
      N 1k-32k, half causal (W, 0), else (W, W) or one side unbounded, W 32-N log-uniform;
    - decode_window (rows of pass decode): attnscope's decode as the decode rule draws it (dense, paged,
      fp8), with a window of W 32-L log-uniform keys (W:0), a quarter of the rows a chunk of 16 queries;
    - varlen_window (rows of pass varlen): attnscope's packed call as the varlen rule draws it, with a window
      of W 32 to the longest sequence, log-uniform: (W, 0) when causal, else (W, W);
    - backward_window (rows of pass backward): attnscope's backward, atomic dQ and deterministic, as the
      backward rule draws them, with a window of W 32-N log-uniform: (W, 0) when causal, else (W, W);
    - window_wide (rows of pass window): attnscope's causal windows wider than a quarter of the keys, where
      hopper_persist pairs only the first tiles (`paired_band_rereads`): (W, 0) with W uniform in [N / 4, N),
      N 16k-48k log-uniform, B 1-2, half the rows MHA.
    """
    rng = random.Random(seed)
    modes = {"backward": [("naive", {}), ("flash", {}), ("cudnn", {}), ("attnscope", {"deterministic": 0}),
                          ("attnscope", {"deterministic": 1})],
             "decode": [("flash", {}), ("cudnn", {}), ("attnscope", {}), ("attnscope", {"page_size": 1}),
                        ("attnscope", {"kv_dtype": "fp8"})],
             "varlen": [("attnscope", {}), ("flex", {})],
             "varlen2": [("attnscope", {}), ("attnscope", {}), ("flex", {})],
             "fwd_openclass": [("flash", {})],
             "window": [("attnscope", {}), ("attnscope", {}), ("flex", {})],
             "window_wide": [("attnscope", {})],
             "decode_window": [("attnscope", {}), ("attnscope", {"page_size": 1}),
                               ("attnscope", {"kv_dtype": "fp8"})],
             "varlen_window": [("attnscope", {})],
             "backward_window": [("attnscope", {"deterministic": 0}),
                                 ("attnscope", {"deterministic": 1})]}[family]
    combos = [(d, dt) for d in (64, 128) for dt in ("fp16", "bf16")]
    rows = []
    while len(rows) < count:
        impl, extra = modes[len(rows) % len(modes)]
        d, dt = combos[(len(rows) // len(modes)) % len(combos)]
        kind = {"fwd_openclass": "forward", "varlen2": "varlen", "decode_window": "decode",
                "varlen_window": "varlen", "backward_window": "backward",
                "window_wide": "window"}.get(family, family)
        row = {"pass": kind, "impl": impl, "d": d, "dtype": dt,
               **extra}
        group = 1 if impl == "naive" or family == "window_wide" and len(rows) % 2 == 0 else \
            rng.choice((1, 2, 4, 8))
        hq = rng.choice([x for x in (8, 12, 16, 24, 32) if x % group == 0])
        row["heads"], row["kv_heads"] = hq, hq // group
        if kind == "backward":
            n_lo, n_hi = (512, 4096) if impl == "naive" else (1024, 16384)
            row |= {"batch": rng.randint(1, 4), "n": _log_uniform(rng, n_lo, n_hi),
                    "causal": int(rng.random() < 0.5)}
            if family == "backward_window":
                w = _log_uniform(rng, 32, row["n"] - 1)
                row["window"] = f"{w}:0" if row["causal"] else f"{w}:{w}"
        elif family == "window_wide":
            n = _log_uniform(rng, 16384, 49152)
            row |= {"batch": rng.randint(1, 2), "n": n, "causal": 1,
                    "window": f"{rng.randint(n // 4, n - 1)}:0"}
        elif family == "window":
            n = _log_uniform(rng, 1024, 32768)
            w, kind = _log_uniform(rng, 32, n - 1), rng.random()
            win = (w, 0) if kind < 0.5 else (w, w) if kind < 0.8 else (w, -1) if kind < 0.9 else (-1, w)
            row |= {"batch": rng.randint(1, 4), "n": n, "causal": int(kind < 0.5),
                    "window": f"{win[0]}:{win[1]}"}
        elif family == "fwd_openclass":
            hkv = rng.choice((1, 2, 4))
            row |= {"batch": rng.randint(2, 4), "kv_heads": hkv,
                    "heads": hkv * rng.choice([g for g in (4, 8, 16) if hkv * g <= 32]),
                    "n": _log_uniform(rng, 20_001, 40_000), "causal": 1}
        elif kind == "varlen":
            most = 8 if family == "varlen2" and impl == "flex" else 16
            lens = [_log_uniform(rng, 64, 8192) for _ in range(rng.randint(2, most))]
            row |= {"lens": ";".join(map(str, lens)), "causal": int(rng.random() < 0.5)}
            if family == "varlen_window":
                w = _log_uniform(rng, 32, max(lens))
                row["window"] = f"{w}:0" if row["causal"] else f"{w}:{w}"
        else:
            b, top = rng.randint(1, 32), _log_uniform(rng, 1024, 65536)
            if b * row["kv_heads"] * top * d * 4 > 4 * 10**9:  # K and V of the cache at most 4 GB
                continue
            if impl == "attnscope":
                lens = [rng.randint(max(1, top // 4), top) for _ in range(b)]
                row |= {"cache_lens": ";".join(map(str, lens)), "splits": rng.choice((1, 2, 4, 8, 16))}
                if extra.get("page_size") or (extra.get("kv_dtype") and rng.random() < 0.5):
                    row["page_size"] = rng.choice((16, 32, 64, 128, 256))
                if family == "decode_window":
                    row["window"] = f"{_log_uniform(rng, 32, top)}:0"
                    if rng.random() < 0.25 and min(lens) >= 16:
                        row["nq"] = 16
            else:
                row |= {"batch": b, "cache_lens": top}
        rows.append(row)
    return rows


def read_shapes(path: str) -> list[tuple]:
    """The points of a ``--shapes`` CSV: ``(batch, q_heads, kv_heads, n, d, causal, dtype, window)``, window
    ``(L, R)`` from an ``L:R`` cell or None (no column, or an empty cell)."""
    with open(path, newline="") as f:
        return [(int(r["batch"]), int(r["q_heads"]), int(r["kv_heads"]), int(r["n"]), int(r["d"]),
                 r["causal"].strip().lower() in ("1", "true"), r["dtype"].strip(), _window(r.get("window")))
                for r in csv.DictReader(f)]


def _window(cell):
    if cell is None or not cell.strip():
        return None
    left, right = cell.split(":")
    return int(left), int(right)


def _impls(torch):
    """name -> ``f(q, k, v, causal)``. attnscope's are one public call, ``flash_attention(q, k, v,
    causal=c, impl=name)`` (a `fwd_hopper.VARIANTS` name forces that variant): the same wrapper, checks and
    outputs for each, so auto / a variant measures the dispatch choice alone."""
    import attnscope
    from attnscope.measure.backends import sdpa
    from attnscope.model import dispatch

    def public(impl):
        return lambda q, k, v, c, window=None: attnscope.flash_attention(q, k, v, causal=c, impl=impl,
                                                                        window=window)

    impls = {name: public(name) for name in ("portable", *dispatch.VARIANTS, "auto")}
    impls["cudnn"] = sdpa("cudnn")
    impls["flash"] = sdpa("flash")
    return impls


#: ``host_times``: a shape at which the GPU idles (a few microseconds of work per call), calls per timing.
HOST_SHAPE = (1, 8, 128, 128)  # B, H, N, d (bf16)
HOST_CALLS = 1000


def host_times(torch, log=print) -> dict:
    """Host microseconds per call: the wall time of ``HOST_CALLS`` back-to-back calls at ``HOST_SHAPE``
    (synchronised before and after; the median of interleaved rounds, `host_us_per_call`), for
    `flash_attention` and SDPA's default call, each without and with inputs that require grad (forward
    only)."""

    import torch.nn.functional as F

    import attnscope

    b, h, n, d = HOST_SHAPE
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    calls = {"flash_attention": lambda: attnscope.flash_attention(q, k, v),
             "flash_attention grad": lambda: attnscope.flash_attention(qg, kg, vg),
             "SDPA": lambda: F.scaled_dot_product_attention(q, k, v),
             "SDPA grad": lambda: F.scaled_dot_product_attention(qg, kg, vg)}
    from attnscope.measure.bench import host_us_per_call

    out = host_us_per_call(torch, calls, HOST_CALLS)
    out["flash_attention / SDPA"] = out["flash_attention"] / out["SDPA"]
    out["flash_attention grad / SDPA grad"] = out["flash_attention grad"] / out["SDPA grad"]
    log(f"host us per call (B={b} H={h} N={n} d={d} bf16, {HOST_CALLS:,} back-to-back calls, wall time of "
        "the issuing loop): " + ", ".join(f"{x} {y:.{3 if '/' in x else 1}f}" for x, y in out.items()))
    return out


def run_points(torch, points, rounds: int, log=print, save=lambda rows: None) -> list[dict]:
    """Check then time every implementation at every point (module docstring); one row per point."""
    from attnscope.checks import kernel_tolerance
    from attnscope.kernels import fwd_hopper
    from attnscope.measure.bench import _median_ms, _ref_error
    from attnscope.model import dispatch
    from attnscope.model.flops import attention_flops

    impls = _impls(torch)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    from attnscope import checks
    from attnscope.kernels._common import check_mods

    for point in points:
        b, hq, hkv, n, d, c, dt, win = (*point, None)[:8]
        torch.manual_seed(b * 7919 + hq * 31 + n + d)
        dtype = getattr(torch, dt)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype) for _ in range(2))
        # SDPA's fused kernels take no GQA (enable_gqa finds no FLASH kernel): the peers get K/V expanded to
        # Hq heads, built once outside the timed calls
        kx, vx = (t.repeat_interleave(hq // hkv, dim=1) if hq != hkv and win is None else t for t in (k, v))
        args = {name: (q, kx, vx, c) if name in ("cudnn", "flash") else (q, k, v, c, win) for name in impls}
        mods = check_mods(torch, c, win, 0.0, None, hq, q.device)  # the window the rule sees (fwd._pick_impl)
        eff = (mods.left, mods.right) if mods.windowed else None
        row = {"batch": b, "q_heads": hq, "kv_heads": hkv, "n": n, "d": d, "causal": c, "dtype": dt,
               "window": None if win is None else list(win),
               "auto_runs": dispatch.hopper_variant(d, c, b, hq, hkv, n, n, sms, eff) or "portable",
               "flops": (attention_flops(b, hq, n, n, d, c, "forward") if win is None
                         else 4 * b * hq * d * visible_pairs(n, c, win)), "err": {}, "fail": {}, "tflops": {}}
        names = [x for x in impls if (x not in dispatch.VARIANTS or fwd_hopper.supports(x, d, c))
                 and not (win is not None and x in ("cudnn", "flash"))]  # SDPA has no window
        if win is None:
            bound = kernel_tolerance(_ref_error(torch, impls["flash"](*args["flash"]), q, k, v, c))
        else:  # PyTorch's own error under the window, on the rows _ref_error checks
            heads = [h // (hq // hkv) for h in range(2)]  # the kv head of query heads 0 and 1
            qs, ks, vs = q[:1, :2, -2048:], k[:1, heads], v[:1, heads]
            t_out = checks.torch_attention(qs, ks, vs, c, win)[0]
            bound = kernel_tolerance(_ref_error(torch, t_out, qs, ks, vs, c, window=win))
        timed = []
        for name in names:
            try:
                err = _ref_error(torch, impls[name](*args[name]), q, k, v, c, window=win)
            except Exception as e:  # noqa: BLE001 - reported; that implementation is not timed here
                row["fail"][name] = f"{type(e).__name__}: {str(e)[:160]}"
                continue
            row["err"][name] = err
            if name in ("cudnn", "flash") or err <= bound:
                timed.append(name)
            else:
                row["fail"][name] = f"err {err:.3g} > bound {bound:.3g}"
        per_round = {name: [] for name in timed}
        for r in range(rounds):
            first = r % len(timed)
            for name in timed[first:] + timed[:first]:
                call = functools.partial(impls[name], *args[name])
                per_round[name].append(row["flops"] / _median_ms(call) / 1e9)
        row["tflops"] = {name: statistics.median(xs) for name, xs in per_round.items()}
        row["rounds"] = per_round
        t = row["tflops"]
        log(f"{_label(row)} auto->{row['auto_runs']} | " + " ".join(f"{x}={y:.1f}" for x, y in t.items())
            + "".join(f" FAIL {x}: {y}" for x, y in row["fail"].items()))
        rows.append(row)
        save(rows)
        del q, k, v, kx, vx, args
        torch.cuda.empty_cache()
    return rows


#: Score-mod cases of ``--mods``: (name, causal, window, softcap, sinks?, Nq, Nk); Nq > Nk with a narrow
#: window leaves rows with no visible key (output 0, LSE -inf, or the sink with sinks).
MOD_CASES = [("window (W,0)", True, (300, 0), 0.0, False, 1000, 1000),
             ("window (W,W)", False, (200, 200), 0.0, False, 1000, 1100),
             ("window (0,0) empty rows", False, (0, 0), 0.0, False, 1100, 1000),
             ("window (0,0) empty rows + sinks", False, (0, 0), 0.0, True, 1100, 1000),
             ("softcap 30 causal", True, None, 30.0, False, 1000, 1000),
             ("softcap 5 large logits", False, None, 5.0, False, 1000, 1000),
             ("sinks", False, None, 0.0, True, 1000, 1100),
             ("window (-1,W) + softcap + sinks", False, (-1, 150), 20.0, True, 1000, 1000)]
#: ``--mods`` timings: (N, W) causal windows at B*N = 32k, H = 32, against full causal at the same shape; the
#: widths span `model.dispatch.WINDOW_PORTABLE_KEYS` (d = 64: portable up to 4k keys, Gluon past it).
MOD_TIMINGS = [(8192, 256), (8192, 1024), (32768, 4096), (32768, 8192)]


def _tiles_loaded(n: int, window) -> int:
    """KV tiles a causal call at Nq = Nk = n loads over its 128-row query tiles (`model.tiles`)."""
    from attnscope.model.tiles import cdiv, window_kv_bounds0

    return sum(cdiv(hi - lo, 128) for lo, _, _, hi in (window_kv_bounds0(r0, 128, n, n, 128, True, window)
                                                       for r0 in range(0, n, 128)))


def run_mods(torch, log=print, save=lambda out: None) -> dict:
    """Window / softcap / sinks on every kept Hopper variant against float64 (O and LSE, outputs poisoned),
    then causal-window timings against full causal (``MOD_TIMINGS``) and softcap / sinks against plain."""
    import numpy as np

    from attnscope import reference
    from attnscope.checks import kernel_tolerance, torch_attention
    from attnscope.kernels import _common, fwd, fwd_hopper
    from attnscope.measure.bench import _median_ms
    from attnscope.model import dispatch
    out = {"checks": [], "timings": []}
    i = 0
    for variant in dispatch.VARIANTS:
        for d in sorted(fwd_hopper.VARIANTS[variant].configs):
            i += 1
            dtype = (torch.bfloat16, torch.float16)[i % 2]  # one dtype per build: fewer compiles
            for name, causal, window, softcap, use_sinks, nq, nk in MOD_CASES:
                torch.manual_seed(i * 100 + len(out["checks"]))
                q = torch.randn(2, 8, nq, d, device="cuda", dtype=dtype) * (3.0 if "large" in name else 1.0)
                k, v = (torch.randn(2, 2, nk, d, device="cuda", dtype=dtype) for _ in range(2))
                sinks = (torch.randn(8, device="cuda") * 3).float() if use_sinks else None
                o = torch.full_like(q, float("nan"))
                lse = torch.full(q.shape[:3], float("nan"), device="cuda", dtype=torch.float32)
                mods = _common.check_mods(torch, causal, window, softcap, sinks, 8, q.device)
                row = {"variant": variant, "d": d, "case": name, "dtype": str(dtype).split(".")[-1]}
                try:
                    fwd_hopper.launch(q, k, v, o, lse, fwd.LOG2E / math.sqrt(d), causal, True, variant, mods)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - reported
                    row["fail"] = f"{type(e).__name__}: {str(e)[:300]}"
                    out["checks"].append(row)
                    log(f"mods {variant} d={d} {name}: FAIL {row['fail']}")
                    continue
                args = [t.double().cpu().numpy() for t in (q, k, v)]
                sk = None if sinks is None else sinks.double().cpu().numpy()
                ro, rlse = reference.naive_attention(*args, causal=causal, return_lse=True, window=window,
                                                     softcap=softcap, sinks=sk)
                on, ln = o.double().cpu().numpy(), lse.double().cpu().numpy()
                t_out = torch_attention(q, k, v, causal, window, softcap, sinks)[0].float()
                t_err = np.abs(t_out.double().cpu().numpy() - ro).max()
                err = np.abs(on - ro).max() if not np.isnan(on).any() else float("nan")
                fin = np.isfinite(rlse)
                lse_err = np.abs(ln - rlse)[fin].max(initial=0.0)
                lse_ok = bool((ln[~fin] == -np.inf).all()) and not np.isnan(ln).any()
                ok = bool(err <= kernel_tolerance(t_err) and lse_err < 1e-3 and lse_ok)
                row.update(err=float(err), torch_err=float(t_err), lse_err=float(lse_err), ok=ok,
                           empty_rows=int((~fin).sum()))
                out["checks"].append(row)
                save(out)
                log(f"mods {variant} d={d} {row['dtype']} {name}: err {err:.3g} "
                    f"(bound {kernel_tolerance(t_err):.3g}) lse err {lse_err:.3g} "
                    f"empty rows {row['empty_rows']} -> {'ok' if ok else 'FAIL'}")
    log(f"mods checks: {sum(r.get('ok', False) for r in out['checks'])} of {len(out['checks'])} pass")

    def pairs(n, w):  # visible (query, key) pairs of a causal window (w None: full causal)
        return sum(min(r + 1, (w if w is not None else n) + 1) for r in range(n))

    for d in (128, 64):
        for n, w in MOD_TIMINGS:
            b = max(1, 32768 // n)
            q, k, v = (torch.randn(b, 32, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            sinks = torch.randn(32, device="cuda").float()
            calls = {"causal": dict(causal=True), f"window ({w},0)": dict(causal=True, window=(w, 0)),
                     "causal softcap 50": dict(causal=True, softcap=50.0),
                     "causal sinks": dict(causal=True, sinks=sinks)}
            # the window on each kernel auto could pick (the dispatch rule's choice at this point, checked)
            calls.update({f"window ({w},0) {impl}": dict(causal=True, window=(w, 0), impl=impl)
                          for impl in ("portable", *dispatch.VARIANTS)
                          if impl == "portable" or d in fwd_hopper.VARIANTS[impl].configs})
            try:
                ms = {name: _median_ms(functools.partial(fwd.flash_attention, q, k, v, **kw))
                      for name, kw in calls.items()}
            except Exception as e:  # noqa: BLE001 - reported
                log(f"mods timing d={d} N={n} W={w}: FAIL {type(e).__name__}: {str(e)[:300]}")
                continue
            frac = _tiles_loaded(n, (w, 0)) / _tiles_loaded(n, None)
            row = {"d": d, "n": n, "w": w, "batch": b, "ms": ms, "tile_fraction": frac,
                   "tflops_visited": {x: 4 * d * b * 32 * pairs(n, w if "window" in x else None) / t / 1e9
                                      for x, t in ms.items()},
                   "window_vs_scaled_causal": ms[f"window ({w},0)"] / (ms["causal"] * frac)}
            out["timings"].append(row)
            save(out)
            log(f"mods timing d={d} N={n} W={w} B={b}: " + " ".join(f"{x} {t:.3f} ms" for x, t in ms.items())
                + f" | window / (causal x tile fraction {frac:.3f}) = {row['window_vs_scaled_causal']:.3f}"
                + " | TFLOP/s (visited) "
                + " ".join(f"{x} {y:.0f}" for x, y in row["tflops_visited"].items()))
            del q, k, v
            torch.cuda.empty_cache()
    return out


def verdict(rows) -> list[str]:
    """auto / best kept variant and auto / portable per point, and their minima; then the rule's picks apart
    from timing noise: the kernel auto ran (``auto_runs``) timed under its own name against the fastest of the
    portable kernel and the kept variants (a wrong pick costs that ratio; auto against its own kernel's column
    is noise between two timings of one kernel)."""
    from attnscope.model import dispatch

    lines, vs_best, vs_port, picks = [], [], [], []
    for r in rows:
        t = r["tflops"]
        kept = [t[x] for x in dispatch.VARIANTS if x in t]
        if "auto" not in t or "portable" not in t:
            lines.append(f"{_label(r)}: auto or portable not timed ({r['fail']})")
            continue
        best = max(kept or [t["auto"]])
        vs_best.append(t["auto"] / best)
        vs_port.append(t["auto"] / t["portable"])
        if r.get("auto_runs") in t:
            fastest = max(("portable", *dispatch.VARIANTS), key=lambda x: t.get(x, 0.0))
            picks.append((t[r["auto_runs"]] / t[fastest], _label(r), r["auto_runs"], fastest))
    if vs_best:
        ok = min(vs_best) >= 0.98 and min(vs_port) >= 1.0
        lines.append(f"dispatch {'PASS' if ok else 'FAIL'}: min auto / best kept variant {min(vs_best):.3f} "
                     f"(need >= 0.98), min auto / portable {min(vs_port):.3f} (need >= 1.0), "
                     f"{len(vs_best)} points")
    if picks:
        right = sum(ran == fastest for _, _, ran, fastest in picks)
        cost, label, ran, fastest = min(picks)
        lines.append(f"dispatch picks: auto ran the fastest kernel at {right} of {len(picks)} points"
                     + ("" if right == len(picks) else
                        f"; worst pick {label}: {ran} at {cost:.3f} x {fastest}"))
    return lines


def _label(r) -> str:
    win = r.get("window")
    return (f"{'bf16' if r['dtype'] == 'bfloat16' else 'fp16'} B={r['batch']} Hq={r['q_heads']} "
            f"Hkv={r['kv_heads']} N={r['n']} d={r['d']} {'causal' if r['causal'] else 'full'}"
            + (f" window=({win[0]},{win[1]})" if win else ""))


def markdown(rows) -> str:
    """One table: the point, what auto ran, TFLOP/s of each implementation, auto's ratios."""
    from attnscope.model import dispatch

    cols = ["portable", *dispatch.VARIANTS, "auto", "cudnn", "flash"]
    out = ["| shape | auto runs | " + " | ".join(cols) + " | auto / best | auto / portable | auto / CUDNN |",
           "| --- " * (len(cols) + 5) + "|"]
    for r in rows:
        t = r["tflops"]
        kept = [t[x] for x in dispatch.VARIANTS if x in t]
        auto = t.get("auto")
        ratios = [f"{auto / x:.3f}" if auto and x else "-" for x in (max(kept or [0.0]), t.get("portable"),
                                                                     t.get("cudnn"))]
        out.append(f"| {_label(r)} | {r['auto_runs']} | "
                   + " | ".join([f"{t[x]:.1f}" if x in t else "-" for x in cols] + ratios) + " |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", choices=sorted(GRIDS), help="a named grid of points (16k: H = 32, B*N = 16,384)")
    p.add_argument("--shapes", metavar="CSV",
                   help="points from a CSV (batch,q_heads,kv_heads,n,d,causal,dtype)")
    p.add_argument("--draw", metavar="SEED", type=int, help="print 24 held-out shapes as CSV and exit (CPU)")
    p.add_argument("--windows", action="store_true", help="with --draw: windowed shapes (a window column)")
    p.add_argument("--family", choices=SWEEP_FAMILIES,
                   help="with --draw: print 48 rows of an `attnscope bytes --sweep` grid of this family "
                        "instead (issue 39's held-out grids; CPU)")
    p.add_argument("--mods", action="store_true", help="window / softcap / sinks: checks and timings")
    p.add_argument("--host", action="store_true", help="host us per call of flash_attention and SDPA only "
                   "(also printed first by --grid and --shapes)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds per point (median)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table of the results")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE (after every point)")
    a = p.parse_args()
    if a.family is not None and a.draw is None:
        p.error("--family needs --draw SEED")
    if a.family is not None:
        rows = draw_sweep(a.family, a.draw)
        w = csv.DictWriter(sys.stdout, [c for c in SWEEP_COLUMNS if any(c in r for r in rows)],
                           lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return 0
    if a.windows and (a.draw is None or a.family is not None):
        p.error("--windows needs --draw SEED (and no --family)")
    if a.draw is not None and a.windows:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(WINDOW_FIELDS)
        w.writerows((b, hq, hkv, n, d, int(c), dt, f"{win[0]}:{win[1]}")
                    for b, hq, hkv, n, d, c, dt, win in draw_windows(a.draw))
        return 0
    if a.draw is not None:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(FIELDS)
        w.writerows((b, hq, hkv, n, d, int(c), dt) for b, hq, hkv, n, d, c, dt in draw(a.draw))
        return 0
    if not (a.grid or a.shapes or a.mods or a.host):
        p.error("give --grid, --shapes, --mods, --host or --draw")

    import torch

    from attnscope.measure.bench import environment

    if not torch.cuda.is_available():
        print("bench/prefill.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = {"env": environment(torch)}
    print("# " + json.dumps(out["env"]), flush=True)

    def save(key):
        def f(rows):
            out[key] = rows
            if a.json:
                os.makedirs(os.path.dirname(os.path.abspath(a.json)) or ".", exist_ok=True)
                with open(a.json, "w") as fh:
                    json.dump(out, fh, indent=1)
        return f

    if a.host or a.grid or a.shapes:
        out["host_us"] = host_times(torch)
        save("host_us")(out["host_us"])
    for key, points in (("shapes", read_shapes(a.shapes) if a.shapes else None),
                        ("grid", GRIDS[a.grid] if a.grid else None)):
        if points is None:
            continue
        rows = run_points(torch, points, a.rounds, save=save(key))
        out[key + "_verdict"] = verdict(rows)
        for line in out[key + "_verdict"]:
            print(line, flush=True)
        if a.markdown:
            print(markdown(rows), flush=True)
        save(key)(rows)
    if a.mods:
        save("mods")(run_mods(torch, save=save("mods")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
