"""Decode benchmark: attnscope's split-KV decode as users call it, against SDPA FLASH and CUDNN, in one run.

    PYTHONPATH=src python bench/decode.py [--quick] [--markdown] [--json out.json] [--rep 50] [--host]
    PYTHONPATH=src python bench/decode.py --window [--json out.json] [--rep 20]

bf16, d = 128 (``--d``: another head dim), one query token per sequence, every sequence full
(``cache_seqlens = L``). The grid: (B, Hq, Hkv) in {(1,32,32), (1,32,8), (16,32,8), (64,32,8), (64,32,32)} x
L in {4k, 32k, 128k} (points whose K + V pass `BUDGET` are skipped), plus B = 1, Hq/Hkv = 64/8, L = 2k.
``--quick``: `QUICK`.

Pass 1, before anything is timed, at full size: sequence 0 of the one-liner against float64 attention
(bound: `checks.kernel_tolerance` of SDPA's own error); ``plan.run`` gives the one-liner's bits; the paged
copy (pages of `PAGE`, random order) the dense result within 1e-2; the FP8 cache (`attnscope.quantize_kv`,
per-head scales; dense and paged) against float64 on the dequantised cache; `decode.check_errors()` finds
nothing. It prints "all results match, starting benchmarks" or exits 1. Pass 2 times with
``triton.testing.do_bench`` (median, µs):

- ``one-liner``: ``flash_decode(q, k, v, cache_seqlens=lens)``, the default call (no host sync);
- ``plan.run`` and ``graph`` (replay of a captured ``plan.run``);
- ``paged``: the one-liner on the paged copy; ``fp8`` / ``fp8 paged``: the one-liner on the e4m3 cache;
- ``FLASH``, ``CUDNN`` (``sdpa_kernel``, ``enable_gqa=True``) eager and ``FLASH graph``, ``CUDNN graph``;
- ``--paged-precheck``: also ``paged plan.run`` and ``paged precheck``, the paged copy's ``plan.run`` with
  the per-key block-table check and with each split's entries checked once (``PAGE_PRECHECK``), same
  config and splits (`precheck_plans`); the latter checked against float64 and the one-liner in pass 1.

TB/s = the logical bytes (`model.serving.paged`, the ledger of ``attnscope traffic --cache-lens``) over
the time. Host time per call: 1,000 back-to-back calls at B = 1, Hq = 32, Hkv = 8, L = 512 (the GPU idles),
wall time of the issuing loop, the median of 5 rounds that interleave the calls (`host_us_per_call`),
for the one-liner, ``plan.run``, SDPA and flash-attn's ``flash_attn_with_kvcache`` (without new keys;
appending one with tensor lengths, an int length, and on the paged copy: `kvcache_calls`; with their
device time beside the one-liner's), and for the one-liner and SDPA FLASH on a cache one key longer each
call (transformers' DynamicCache: a new shape and strides each step, `growing_views`), timed call by call:
the median, and the slowest call apart (on a cold Triton cache the one-off compile for a new integer class
of the length). ``--host``: only that section, after `check_growing` and `check_kvcache` (PASS/FAIL). The
summary checks issue 37's musts. About 3 min full, 40 s ``--quick`` on one H200 (estimated).

``--window`` (`window_sweep`, issue 35: a window reads only its bytes): the one-liner with
``window=(W, 0)``, W in {4k, 8k}, and without one, at B in {1, 16, 64}, Hq/Hkv 32/8, L in {32k, 128k}; each
checked first (PASS/FAIL, float64 over the keys the query sees), then eager and graph replay of
``plan.run``: µs, TB/s over the ledger's bytes (the K/V blocks the kernel loads), the fraction of the read
ceiling (`measure.bench.read_ceiling`, same run) and the time and bytes against the call without a window;
beside each windowed call a plain read of its bytes timed alike (a sum: the fixed costs of a read that size).
"""

# ruff: noqa: B023 - every timed closure is called (do_bench) inside the iteration that defines it
import argparse
import itertools
import json
import math
import sys
import time

import torch
import triton

import attnscope
from attnscope.checks import kernel_tolerance
from attnscope.kernels import decode
from attnscope.kernels._common import HEAD_DIMS
from attnscope.measure.backends import capture_graph
from attnscope.model.serving import paged as ledger

GRID = [(1, 32, 32), (1, 32, 8), (16, 32, 8), (64, 32, 8), (64, 32, 32)]
LENS = [4096, 32768, 131072]
EXTRA = [(1, 64, 8, 2048)]
#: the 14 grid points the decode experiments time (B 64, Hkv 32 at 128k would need 137 GB of K and V)
POINTS = [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS if B * Hkv * L <= 64 * 32 * 32768]
#: where the portable plan runs 128 programs on the H200's 132 SMs (B 1, Hkv 32 with 4 splits; B 16, Hkv 8)
PARITY = [(1, 32, 32, 131072), (16, 32, 8, 32768), (16, 32, 8, 131072), (1, 32, 32, 32768)]
QUICK = [(1, 32, 32, 4096), (1, 32, 8, 32768), (16, 32, 8, 32768), (64, 32, 8, 4096), (1, 64, 8, 2048)]
PAGE = 64
D = 128
BUDGET = 100 * 2**30  # bytes of K + V per point
PAGED_MAX = 24 * 2**30  # paged and FP8 copies only up to this bf16 K + V size (memory)
PAGED_PRECHECK = False  # --paged-precheck: also time the paged plan with PAGE_PRECHECK on
HOST_SHAPE = (1, 32, 8, 512)
HOST_CALLS = 1000


def ms(fn, rep):
    return triton.testing.do_bench(fn, warmup=max(5, rep // 4), rep=rep)


def each_point(points, measure, json_path=None, shape=lambda point: point):
    """For each point: its inputs (`inputs` of ``shape(point)``, i.e. B, Hq, Hkv, L), its JSON row from
    ``measure(point, q, k, v, lens)``, inputs freed before the next point; then the rows (`write_rows`)."""
    rows = []
    for point in points:
        tensors = inputs(*shape(point))
        rows.append(measure(point, *tensors))
        del tensors
        torch.cuda.empty_cache()
    if json_path:
        write_rows(json_path, rows)
    return rows


def write_rows(path, rows, **extra):
    """The rows of a bench/decode*.py run as JSON at ``path``, with the device, torch and Triton versions."""
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "triton": triton.__version__, **extra, "rows": rows}, f, indent=1)


def inputs(B, Hq, Hkv, L):
    torch.manual_seed(B * 1000 + Hkv + L)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16).normal_()
    v = torch.empty(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16).normal_()
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    return q, k, v, lens


def paged_copy(k, v, page, seed):
    """[B, Hkv, L, d] -> pages [B * L / page, page, Hkv, d] in a random order, and the block table."""
    B, Hkv, L, d = k.shape
    n = B * L // page
    g = torch.Generator(device=k.device).manual_seed(seed)
    perm = torch.randperm(n, device=k.device, generator=g)
    table = perm.view(B, L // page).to(torch.int32)
    kp = torch.empty(n, page, Hkv, d, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    kp[perm] = k.transpose(1, 2).reshape(n, page, Hkv, d)
    vp[perm] = v.transpose(1, 2).reshape(n, page, Hkv, d)
    return kp, vp, table


def reference_error(o, q, k, v):
    """Sequence 0 against float64 attention on k, v (any dtype, upcast); returns (err, bound): the bound
    is `checks.kernel_tolerance` of SDPA's own error at q's dtype on k, v cast to it."""
    G = q.shape[1] // k.shape[1]
    kk = k[:1].double().repeat_interleave(G, 1)
    vv = v[:1].double().repeat_interleave(G, 1)
    s = (q[:1].double() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    ref = torch.softmax(s, -1) @ vv
    low = torch.nn.functional.scaled_dot_product_attention(q[:1], k[:1].to(q.dtype), v[:1].to(q.dtype),
                                                           enable_gqa=True)
    err = (o[:1].double() - ref).abs().max().item()
    return err, kernel_tolerance((low.double() - ref).abs().max().item())


def dequantised(x8, scale):
    return x8.float() * scale[None, :, None, None]


class Point:
    """One grid point's tensors: the dense cache, and (when small enough) its paged and FP8 copies."""

    def __init__(self, B, Hq, Hkv, L):
        self.B, self.Hq, self.Hkv, self.L = B, Hq, Hkv, L
        self.q, self.k, self.v, self.lens = inputs(B, Hq, Hkv, L)
        self.plan = attnscope.decode_plan(self.q, self.k, self.v, self.lens)
        self.copies = 2 * B * Hkv * L * D * 2 <= PAGED_MAX
        if self.copies:
            self.kp, self.vp, self.table = paged_copy(self.k, self.v, PAGE, seed=PAGE)
            self.k8, self.ks = attnscope.quantize_kv(self.k)
            self.v8, self.vs = attnscope.quantize_kv(self.v)
            # the pages hold the same rows, so the same per-head amax and scales
            self.k8p, self.v8p = (attnscope.quantize_kv(t, head_axis=-2)[0] for t in (self.kp, self.vp))
            if PAGED_PRECHECK:
                self.paged_plans = precheck_plans(self.q, self.kp, self.vp, self.lens, self.table)

    def calls(self):
        """name -> the call timed eagerly (the one-liner and its variants, plan.run)."""
        q, lens, fd = self.q, self.lens, attnscope.flash_decode
        c = {"one-liner": lambda: fd(q, self.k, self.v, cache_seqlens=lens),
             "plan.run": lambda: self.plan.run(q, self.k, self.v, lens)}
        if self.copies:
            c["paged"] = lambda: fd(q, self.kp, self.vp, lens, self.table)
            c["fp8"] = lambda: fd(q, self.k8, self.v8, lens, k_scale=self.ks, v_scale=self.vs)
            c["fp8 paged"] = lambda: fd(q, self.k8p, self.v8p, lens, self.table, k_scale=self.ks,
                                        v_scale=self.vs)
            if PAGED_PRECHECK:
                for name, plan in self.paged_plans.items():
                    c[name] = lambda plan=plan: plan.run(q, self.kp, self.vp, lens, self.table)
        return c

    def bytes_of(self, name):
        """Logical bytes of a call (`model.serving.paged`)."""
        kw = dict(nq=1, d=D, dtype="bf16", heads=self.Hq, kv_heads=self.Hkv, num_splits=self.plan.num_splits)
        fp8 = name.startswith("fp8")
        page = PAGE if "paged" in name else None
        return ledger([self.L] * self.B, page, kv_dtype="fp8" if fp8 else None, **kw).row.total


def precheck_plans(q, kp, vp, lens, table):
    """``--paged-precheck``: the default paged plan ("paged plan.run") and the same plan with the block
    table checked once per split (`heuristics.PAGE_PRECHECK`, "paged precheck"): same block config, splits
    and merge, so the two differ only in the loop."""
    base = attnscope.decode_plan(q, kp, vp, lens, table)
    cfg = {name: base._consts[key] for name, key in (("BLOCK_N", "BLOCK_N"), ("STAGES", "STAGES"),
                                                     ("num_warps", "num_warps"), ("num_stages", "num_stages"),
                                                     ("OFF32", "OFF32"))}
    on = decode.plan._tuned_plan(q, kp, vp, lens, table, num_splits=base.num_splits,
                                 fuse_combine=base.fuse, config={**cfg, "PAGE_PRECHECK": True})
    assert on._consts.get("PAGE_PRECHECK") and not base._consts.get("PAGE_PRECHECK"), "precheck plan"
    return {"paged plan.run": base, "paged precheck": on}


def sdpa_calls(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def make(backend):
        def call():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=True)
        return call
    return {"FLASH": make(SDPBackend.FLASH_ATTENTION), "CUDNN": make(SDPBackend.CUDNN_ATTENTION)}


def check(pt):
    """Pass 1 at one point: a row of checks with ``ok``."""
    c = pt.calls()
    o = c["one-liner"]()
    err, bound = reference_error(o, pt.q, pt.k, pt.v)
    row = {"point": [pt.B, pt.Hq, pt.Hkv, pt.L], "num_splits": pt.plan.num_splits, "err": err, "bound": bound,
           "run_same_bits": torch.equal(o, c["plan.run"]())}
    ok = err <= bound and row["run_same_bits"]
    if pt.copies:
        row["paged_diff"] = (c["paged"]().float() - o.float()).abs().max().item()
        k0, v0 = dequantised(pt.k8[:1], pt.ks), dequantised(pt.v8[:1], pt.vs)  # sequence 0, fp32
        e8, b8 = reference_error(c["fp8"](), pt.q, k0, v0)
        row["fp8_paged_diff"] = (c["fp8 paged"]().float() - c["fp8"]().float()).abs().max().item()
        row["fp8_err"], row["fp8_bound"] = e8, b8
        ok = ok and row["paged_diff"] <= 1e-2 and e8 <= b8 and row["fp8_paged_diff"] <= 1e-2
        if PAGED_PRECHECK:  # sequence 0 against float64, and the whole batch against the dense one-liner
            op = c["paged precheck"]()
            row["precheck_err"], row["precheck_bound"] = reference_error(op, pt.q, pt.k, pt.v)
            row["precheck_diff"] = (op.float() - o.float()).abs().max().item()
            ok = ok and row["precheck_err"] <= row["precheck_bound"] and row["precheck_diff"] <= 1e-2
    decode.check_errors()  # raises if a length or page index was out of range: none is
    row["ok"] = ok
    print(f"{row['point']}: {'ok' if ok else 'MISMATCH'} {json.dumps(row)}", flush=True)
    return row


def time_point(pt, row, rep):
    """Pass 2 at one point: µs, TB/s and ratios into ``row``."""
    t = {name: ms(fn, rep) * 1e3 for name, fn in pt.calls().items()}
    t["graph"] = ms(capture_graph(lambda: pt.plan.run(pt.q, pt.k, pt.v, pt.lens)).replay, rep) * 1e3
    for name, fn in sdpa_calls(pt.q, pt.k, pt.v).items():
        try:
            fn()
            t[name] = ms(fn, rep) * 1e3
            t[name + " graph"] = ms(capture_graph(fn).replay, rep) * 1e3
        except RuntimeError as e:  # a backend that refuses the shape is reported
            print(f"  {name}: n/a ({str(e).splitlines()[0][:80]})", flush=True)
    row["us"] = t
    row["TB/s"] = {n: pt.bytes_of(n) / (us * 1e-6) / 1e12 for n, us in t.items()
                   if not n.startswith(("FLASH", "CUDNN"))}
    r = {}
    if "FLASH" in t:
        r["one-liner / FLASH (must >= 1)"] = t["FLASH"] / t["one-liner"]
    if "CUDNN" in t:
        r["one-liner / CUDNN (goal >= 1)"] = t["CUDNN"] / t["one-liner"]
    if "CUDNN graph" in t:
        r["graph / CUDNN graph (must >= 0.98)"] = t["CUDNN graph"] / t["graph"]
    if "paged" in t:
        r["paged / dense (must >= 0.97)"] = t["one-liner"] / t["paged"]
        r["fp8 / bf16 (must >= 1)"] = t["one-liner"] / t["fp8"]
        if "CUDNN" in t and pt.L >= 32768:
            r["fp8 tokens/s / CUDNN bf16 (must >= 1.8)"] = t["CUDNN"] / t["fp8"]
    if "paged precheck" in t:  # plan.run beside plan.run: the same host path
        r["paged precheck / paged plan.run"] = t["paged plan.run"] / t["paged precheck"]
        r["paged precheck / dense plan.run (goal >= 0.97)"] = t["plan.run"] / t["paged precheck"]
    row["ratios"] = r
    for name, us in t.items():
        tbs = row["TB/s"].get(name)
        print(f"  {name:12s} {us:9.1f} us" + (f"  {tbs:5.2f} TB/s" if tbs else ""), flush=True)
    for name, x in r.items():
        print(f"  {name:42s} {x:6.3f}x", flush=True)


def growing_views(pt, n):
    """K, V of ``pt``'s batch and heads as transformers' DynamicCache hands them over on ``n`` decode steps:
    lengths L .. L + n - 1, each contiguous [B, Hkv, L, d] (``torch.cat``'s result: a new shape and new
    strides each step), here views of one buffer, so no copy is timed."""
    B, Hkv, L, d = pt.k.shape
    buf = torch.randn(2, B * Hkv * (L + n) * d, device=pt.k.device, dtype=pt.k.dtype)
    return [tuple(buf[i].as_strided((B, Hkv, m, d), (Hkv * m * d, m * d, d, 1)) for i in (0, 1))
            for m in range(L, L + n)]


def growing_calls(pt, views):
    """The one-liner as transformers' eager decode step calls it (``flash_decode(q, k, v, scale=...)``, no
    lengths) on `growing_views`, one step per call (then from the first again), and SDPA FLASH on them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    step = itertools.cycle(range(len(views)))
    scale = pt.q.shape[-1] ** -0.5

    def grown():
        return attnscope.flash_decode(pt.q, *views[next(step)], scale=scale)

    def grown_flash():
        k, v = views[next(step)]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(pt.q, k, v, scale=scale, enable_gqa=True)
    return {"one-liner, growing cache": grown, "FLASH, growing cache": grown_flash}


def check_growing(pt, n=48):
    """PASS/FAIL: on a cache growing by one key per call (`growing_views`: lengths across multiples of 16,
    which Triton compiles apart) the one-liner gives a fresh plan's bits at every length and float64's
    values within the bound at the last, and builds one plan per split count at most. Returns the failures."""
    decode.clear_plan_cache()
    views = growing_views(pt, n)
    grown = growing_calls(pt, views)["one-liner, growing cache"]
    scale = pt.q.shape[-1] ** -0.5
    bad, splits = 0, set()
    for k, v in views:
        o = grown()
        fresh = decode.DecodePlan(pt.q, k, v, scale=scale)
        splits.add(fresh.num_splits)
        ref = fresh.run(pt.q, k, v)
        if not torch.equal(o, ref):
            bad += 1
            print(f"FAIL growing cache, L = {k.shape[2]}: differs from a fresh plan by "
                  f"{(o.float() - ref.float()).abs().max().item():.3g}", flush=True)
    err, bound = reference_error(o, pt.q, k, v)
    info = decode.plan_cache_info()
    ok = err <= bound and info.misses <= len(splits) and bad == 0
    print(f"{'PASS' if ok else 'FAIL'} growing cache, L = {views[0][0].shape[2]} .. {k.shape[2]}: equal to a "
          f"fresh plan at {n - bad} of {n} lengths; max error {err:.3g} (bound {bound:.3g}); plans built "
          f"{info.misses} (split counts {sorted(splits)}), reused {info.hits} times", flush=True)
    decode.check_errors()
    return 0 if ok else 1


def kvcache_calls(pt):
    """flash-attn's ``flash_attn_with_kvcache`` on ``pt``'s cache as [B, L, Hkv, d] views (the paged copy
    as is): without new keys (lengths L, as a tensor and as an int), and appending one new key per sequence
    at L - 1 (the lengths after it are L: the one-liner's attention), with tensor lengths, an int length,
    and on the paged copy. The new key and value are the cache's own row L - 1, so repeated calls leave the
    cache as it was."""
    from attnscope.flash_attn_interface import flash_attn_with_kvcache as fa

    q = pt.q.transpose(1, 2)  # [B, 1, Hq, d]
    kc, vc = pt.k.transpose(1, 2), pt.v.transpose(1, 2)  # [B, L, Hkv, d]
    k_new, v_new = kc[:, -1:].clone(), vc[:, -1:].clone()
    before = pt.lens - 1
    return {"with_kvcache, no append": lambda: fa(q, kc, vc, cache_seqlens=pt.lens),
            "with_kvcache, no append, int lens": lambda: fa(q, kc, vc, cache_seqlens=pt.L),
            "with_kvcache + append, tensor lens": lambda: fa(q, kc, vc, k_new, v_new, cache_seqlens=before),
            "with_kvcache + append, int lens": lambda: fa(q, kc, vc, k_new, v_new, cache_seqlens=pt.L - 1),
            "with_kvcache paged + append": lambda: fa(q, pt.kp, pt.vp, k_new, v_new, cache_seqlens=before,
                                                      block_table=pt.table)}


def check_kvcache(pt):
    """PASS/FAIL: on copies of ``pt``'s dense and paged caches, ``flash_attn_with_kvcache`` with a random
    new key per sequence at L - 1 (tensor and int lengths) writes exactly that row, and its output has the
    bits of the one-liner on the updated cache. Returns the failures."""
    from attnscope.flash_attn_interface import flash_attn_with_kvcache as fa

    B, Hkv, L, d = pt.k.shape
    g = torch.Generator(device="cuda").manual_seed(38)
    k_new, v_new = (torch.randn(B, 1, Hkv, d, device="cuda", dtype=pt.k.dtype, generator=g) for _ in range(2))
    q = pt.q.transpose(1, 2)
    bad = 0
    for name, lens in (("dense, tensor lens", pt.lens - 1), ("dense, int lens", L - 1),
                       ("paged", pt.lens - 1)):
        paged = name == "paged"
        kc, vc = (pt.kp.clone(), pt.vp.clone()) if paged else (pt.k.clone(), pt.v.clone())
        want_k, want_v = kc.clone(), vc.clone()
        if paged:  # key L - 1 of sequence b: slot (L - 1) % PAGE of page table[b, (L - 1) // PAGE]
            pages = pt.table[:, (L - 1) // PAGE].long()
            want_k[pages, (L - 1) % PAGE], want_v[pages, (L - 1) % PAGE] = k_new[:, 0], v_new[:, 0]
            o = fa(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=pt.table)
            ref = attnscope.flash_decode(pt.q, kc, vc, pt.lens, pt.table)
        else:
            want_k[:, :, L - 1], want_v[:, :, L - 1] = k_new[:, 0], v_new[:, 0]
            o = fa(q, kc.transpose(1, 2), vc.transpose(1, 2), k_new, v_new, cache_seqlens=lens)
            ref = attnscope.flash_decode(pt.q, kc, vc, cache_seqlens=pt.lens)
        ok = torch.equal(kc, want_k) and torch.equal(vc, want_v) and torch.equal(o.transpose(1, 2), ref)
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} with_kvcache + append, {name}: the new row written, nothing else; "
              f"output {'equals' if ok else 'vs'} the one-liner on the updated cache", flush=True)
    decode.check_errors()
    return bad


def host_times():
    """µs of host time per call: 1,000 back-to-back calls at a shape where the GPU idles. The growing cache
    (a new length every call) is timed call by call: its median, and apart from it the slowest call, which
    on a cold Triton cache is the one-off compile of a binary for a new integer class of the length. The
    one-liner on the e4m3 cache ("fp8") and the ``flash_attn_with_kvcache`` calls (`kvcache_calls`) also get
    their device time (do_bench) beside the one-liner's."""
    pt = Point(*HOST_SHAPE)
    kv = kvcache_calls(pt)
    calls = {**{n: f for n, f in pt.calls().items() if n in ("one-liner", "plan.run", "fp8")}, **kv,
             **sdpa_calls(pt.q, pt.k, pt.v)}
    from attnscope.measure.bench import host_us_per_call

    out = host_us_per_call(torch, calls, HOST_CALLS)
    out["one-liner / CUDNN (must <= 1.25)"] = out["one-liner"] / out["CUDNN"]
    out["fp8 / one-liner"] = out["fp8"] / out["one-liner"]
    for name in kv:
        out[f"{name} / one-liner"] = out[name] / out["one-liner"]
    for name, fn in {"one-liner": calls["one-liner"], "fp8": calls["fp8"], **kv}.items():
        out[f"{name}, device us"] = ms(fn, 20) * 1e3
    for name, fn in growing_calls(pt, growing_views(pt, HOST_CALLS)).items():
        torch.cuda.synchronize()
        ts = []
        for _ in range(HOST_CALLS):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        ts = sorted(1e6 * t for t in ts)
        out[f"{name}, median"] = ts[len(ts) // 2]
        out[f"{name}, slowest call"] = ts[-1]
    out["growing / fixed one-liner"] = out["one-liner, growing cache, median"] / out["one-liner"]
    print("host time per call: " + ", ".join(f"{n} {v:.1f}" for n, v in out.items()), flush=True)
    return out


def markdown(rows, host):
    cols = ["one-liner", "plan.run", "graph", "paged", "fp8", "fp8 paged", "FLASH", "CUDNN", "FLASH graph",
            "CUDNN graph"]
    if any("paged precheck" in r.get("us", {}) for r in rows):
        cols += ["paged plan.run", "paged precheck"]
    print("\n| B, Hq, Hkv, L | " + " | ".join(cols) + " |")
    print("|" + " --- |" * (len(cols) + 1))
    for r in rows:
        if "us" in r:
            cells = [f"{r['us'][c]:.1f}" if c in r["us"] else "n/a" for c in cols]
            print(f"| {', '.join(map(str, r['point']))} | " + " | ".join(cells) + " |")
    print("\nµs per call (do_bench median). Ratios (> 1: attnscope faster):\n")
    names = sorted({n for r in rows for n in r.get("ratios", {})})
    print("| B, Hq, Hkv, L | " + " | ".join(names) + " |")
    print("|" + " --- |" * (len(names) + 1))
    for r in rows:
        if "ratios" in r:
            cells = [f"{r['ratios'][n]:.3f}" if n in r["ratios"] else "" for n in names]
            print(f"| {', '.join(map(str, r['point']))} | " + " | ".join(cells) + " |")
    if host:
        print(f"\nHost time per call (µs, {HOST_CALLS} back-to-back calls, B, Hq, Hkv, L = {HOST_SHAPE}):\n")
        print("| " + " | ".join(host) + " |\n|" + " --- |" * len(host))
        print("| " + " | ".join(f"{v:.2f}" for v in host.values()) + " |")


def main():
    global PAGED_PRECHECK, D
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{len(QUICK)} points, short timing")
    p.add_argument("--markdown", action="store_true", help="print the tables BENCHMARKS.md needs")
    p.add_argument("--json", metavar="PATH", help="write every check, time, TB/s and ratio as JSON")
    p.add_argument("--rep", type=int, default=None, help="do_bench time per measurement, ms (default 50)")
    p.add_argument("--paged-precheck", action="store_true",
                   help="also time the paged copy's plan.run with the default block table check and with "
                        "PAGE_PRECHECK on (heuristics.PAGE_PRECHECK; checked against float64 first)")
    p.add_argument("--fp8-sweep", action="store_true",
                   help="only the FP8 decode-tile candidates (heuristics.FP8_CONFIGS): B 1/8/32, Hq/Hkv "
                        "32/8, L 4k/32k/128k, dense and paged; PASS/FAIL vs float64, then graph and eager "
                        "beside attnscope bf16 and SDPA CUDNN (default --rep 20)")
    p.add_argument("--host", action="store_true",
                   help=f"only the host-time section (B, Hq, Hkv, L = {HOST_SHAPE}), after the growing-cache "
                        "check (PASS/FAIL: a cache one key longer each call, as transformers' DynamicCache)")
    p.add_argument("--d", type=int, default=D, choices=HEAD_DIMS, metavar="D",
                   help=f"head dim of every point (default {D}; a multiple of 8 up to 256; the grid's points "
                        "over BUDGET bytes skipped)")
    p.add_argument("--window", action="store_true",
                   help="only the sliding-window section: the one-liner with window=(W, 0), W 4k/8k, and "
                        "without one, B 1/16/64, Hq/Hkv 32/8, L 32k/128k; PASS/FAIL vs float64, then eager "
                        "and graph replay, TB/s over the ledger's window bytes and the fraction of the read "
                        "ceiling (default --rep 20)")
    args = p.parse_args()
    PAGED_PRECHECK, D = args.paged_precheck, args.d
    if not torch.cuda.is_available():
        print("bench/decode.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    if args.host:
        pt = Point(*HOST_SHAPE)
        fails = check_growing(pt) + check_kvcache(pt)
        host = host_times()
        if args.json:
            write_rows(args.json, [], host_us=host, seconds=time.time() - t0)
        print(f"done in {time.time() - t0:.0f} s", flush=True)
        return 1 if fails else 0
    if args.window:
        fails = window_sweep(args.rep or 20, args.json)
        print(f"window sweep: {'all PASS' if not fails else f'{fails} FAIL'}; done in "
              f"{time.time() - t0:.0f} s", flush=True)
        return 1 if fails else 0
    if args.fp8_sweep:
        fails = fp8_sweep(args.rep or 20, args.json)
        print(f"FP8 sweep: {'all PASS' if not fails else f'{fails} FAIL'}; done in {time.time() - t0:.0f} s",
              flush=True)
        return 1 if fails else 0
    points = QUICK if args.quick else POINTS + EXTRA
    rep = args.rep or (20 if args.quick else 50)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}",
          flush=True)
    rows = []
    for point in points:  # pass 1: correctness at full size, every point, before any timing
        if 2 * point[0] * point[2] * point[3] * D * 2 > BUDGET:
            rows.append({"point": list(point), "skipped": "memory"})
            continue
        rows.append(check(Point(*point)))
        torch.cuda.empty_cache()
    failures = sum(not r["ok"] for r in rows if "ok" in r)
    host = None
    if failures:
        print(f"{failures} points FAILED the correctness check: not timing", flush=True)
    else:
        print(f"all results match, starting benchmarks ({time.time() - t0:.0f} s of checks)", flush=True)
        for row in rows:  # pass 2
            if "ok" in row:
                print(row["point"], flush=True)
                time_point(Point(*row["point"]), row, rep)
                torch.cuda.empty_cache()
        host = host_times()
        must = [(r["point"], n, x) for r in rows for n, x in r.get("ratios", {}).items() if "must" in n]
        floor = {"0.98": 0.98, "0.97": 0.97, "1.8": 1.8}
        missed = [(pt, n, x) for pt, n, x in must
                  if x < next((v for k, v in floor.items() if f">= {k}" in n), 1.0)]
        print(f"musts: {len(must) - len(missed)} of {len(must)} met", flush=True)
        for pt, n, x in missed:
            print(f"  missed: {pt}: {n} = {x:.3f}x", flush=True)
        if args.markdown:
            markdown(rows, host)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    if args.json:
        write_rows(args.json, rows, host_us=host, seconds=time.time() - t0)
    return 1 if failures else 0


# --- --fp8-sweep: the e4m3 decode-tile candidates (`heuristics.FP8_CONFIGS`) -------------------------------
SWEEP_B = (1, 8, 32)
SWEEP_L = (4096, 32768, 131072)
SWEEP_HEADS = (32, 8)  # Hq, Hkv


#: Configs whose shared memory fits several programs per SM (`heuristics.FP8_CONFIGS`' comments), tried
#: with the splits sized for that many waves: below one program per SM (B x Hkv < SMs) the shipped rule
#: gives each SM one 4-warp program, one warp per scheduler, which cannot hide the e4m3 loop's latencies.
FP8_WAVES = {"f16qk-w4-s3": 2, "f16qk-w2-s3": 2, "f16qk-w2-s2": 3}


def fp8_candidates():
    """name -> (`heuristics.FP8_CONFIGS` key, splits sized on bytes, waves), or None for "shipped" (the
    default plan): every config with one-wave splits, `FP8_DEFAULT` with the other split size, and the
    `FP8_WAVES` configs with splits for their waves."""
    from attnscope.kernels.decode import heuristics as hs

    out = {"shipped": None}  # the default plan (`decode_plan` without a config or a split count)
    out.update({name: (name, hs.FP8_SPLIT_BYTES, 1) for name in hs.FP8_CONFIGS})
    other = not hs.FP8_SPLIT_BYTES
    out[f"{hs.FP8_DEFAULT}+{'bytes' if other else 'tokens'}"] = (hs.FP8_DEFAULT, other, 1)
    for name, waves in FP8_WAVES.items():
        out[f"{name}+{waves}waves"] = (name, hs.FP8_SPLIT_BYTES, waves)
    return out


def fp8_sweep(rep, json_path=None):
    """For B in `SWEEP_B`, L in `SWEEP_L`, Hq/Hkv 32/8, d 128, dense and paged (pages of `PAGE`, shuffled):
    each FP8 candidate checked on sequence 0 against float64 on the dequantised cache (PASS/FAIL, the
    bound `checks.kernel_tolerance` of SDPA's error there), then timed (CUDA-graph replay and eager
    ``plan.run``) beside attnscope bf16 (its default plan on the bf16 cache) and SDPA CUDNN bf16 (dense)
    from the same run; the shipped one-liner on the e4m3 cache too. Ratios are K/V tokens per second
    (same tokens: time ratios); GB/s from the ledger (`model.serving.paged`)."""
    from attnscope.kernels.decode import heuristics as hs
    from attnscope.kernels.decode import plan as plan_mod

    Hq, Hkv = SWEEP_HEADS
    cands = fp8_candidates()
    rows, fails = [], 0
    for B in SWEEP_B:
        for L in SWEEP_L:
            q, k, v, lens = inputs(B, Hq, Hkv, L)
            k8, ks = attnscope.quantize_kv(k)
            v8, vs = attnscope.quantize_kv(v)
            k0, v0 = dequantised(k8[:1], ks), dequantised(v8[:1], vs)  # sequence 0, fp32
            kp, vp, table = paged_copy(k, v, PAGE, seed=PAGE)
            k8p, v8p = (attnscope.quantize_kv(t, head_axis=-2)[0] for t in (kp, vp))  # same scales
            cudnn = sdpa_calls(q, k, v)["CUDNN"]
            t_cudnn = {"eager": ms(cudnn, rep) * 1e3, "graph": ms(capture_graph(cudnn).replay, rep) * 1e3}
            for layout in ("dense", "paged"):
                paged = layout == "paged"
                kb, vb, k8x, v8x, tb = (kp, vp, k8p, v8p, table) if paged else (k, v, k8, v8, None)
                page = PAGE if paged else None
                base = attnscope.decode_plan(q, kb, vb, lens, tb)
                t_bf16 = {"eager": ms(lambda: base.run(q, kb, vb, lens, tb), rep) * 1e3,
                          "graph": ms(capture_graph(lambda: base.run(q, kb, vb, lens, tb)).replay, rep) * 1e3}
                one = lambda: attnscope.flash_decode(q, k8x, v8x, lens, tb, k_scale=ks, v_scale=vs)  # noqa: E731
                t_one = ms(one, rep) * 1e3
                t_one_bf16 = ms(lambda: attnscope.flash_decode(q, kb, vb, lens, tb), rep) * 1e3
                print(f"[B {B}, Hq {Hq}, Hkv {Hkv}, L {L}, {layout}] bf16 attnscope graph "
                      f"{t_bf16['graph']:.1f} us eager {t_bf16['eager']:.1f} us; CUDNN bf16 (dense) graph "
                      f"{t_cudnn['graph']:.1f} eager {t_cudnn['eager']:.1f}; one-liner fp8 {t_one:.1f} us, "
                      f"bf16 {t_one_bf16:.1f} us ({t_one_bf16 / t_one:.3f}x)", flush=True)
                row = {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "layout": layout, "bf16_us": t_bf16,
                       "cudnn_us": t_cudnn, "fp8_one_liner_us": t_one, "bf16_one_liner_us": t_one_bf16,
                       "candidates": {}}
                for name, spec in cands.items():
                    if spec is None:
                        p = attnscope.decode_plan(q, k8x, v8x, lens, tb, k_scale=ks, v_scale=vs)
                        splits = p.num_splits
                    else:
                        cfg_name, split_bytes, waves = spec
                        splits = hs._tiling(q.device, B, Hq, 1, Hkv, L, None, None, True, False,
                                            hs._split_min_keys(True, split_bytes), waves)[2]
                        p = plan_mod._tuned_plan(q, k8x, v8x, lens, tb, k_scale=ks, v_scale=vs,
                                                 num_splits=splits,
                                                 config=hs._fp8_config(cfg_name, PAGE if paged else 0))
                    run = lambda: p.run(q, k8x, v8x, lens, tb, k_scale=ks, v_scale=vs)  # noqa: E731
                    err, bound = reference_error(run(), q, k0, v0)
                    ok = err <= bound
                    decode.check_errors()
                    c = {"splits": splits, "err": err, "bound": bound, "ok": ok}
                    row["candidates"][name] = c
                    if not ok:
                        fails += 1
                        print(f"  FAIL {name:20s} err {err:.3g} > bound {bound:.3g}", flush=True)
                        continue
                    t = {"eager": ms(run, rep) * 1e3, "graph": ms(capture_graph(run).replay, rep) * 1e3}
                    gbs = ledger([L] * B, page, kv_dtype="fp8", nq=1, d=D, dtype="bf16", heads=Hq,
                                 kv_heads=Hkv, num_splits=splits).row.total / (t["graph"] * 1e-6) / 1e9
                    c.update(us=t, GBs_graph=gbs, vs_bf16={m: t_bf16[m] / t[m] for m in t},
                             vs_cudnn={m: t_cudnn[m] / t[m] for m in t})
                    print(f"  PASS {name:20s} splits {splits:3d} err {err:.2e} <= {bound:.2e} | graph "
                          f"{t['graph']:8.1f} us {gbs:6.0f} GB/s x bf16 {c['vs_bf16']['graph']:.3f} x CUDNN "
                          f"{c['vs_cudnn']['graph']:.3f} | eager {t['eager']:8.1f} us x bf16 "
                          f"{c['vs_bf16']['eager']:.3f} x CUDNN {c['vs_cudnn']['eager']:.3f}", flush=True)
                rows.append(row)
            q = k = v = k8 = v8 = kp = vp = k8p = v8p = kb = vb = k8x = v8x = base = p = None  # freed
            torch.cuda.empty_cache()
    fp8_summary(rows, cands)
    if json_path:
        write_rows(json_path, rows, sweep="fp8")
    return fails


def fp8_summary(rows, cands):
    """Per candidate, issue 37's FP8 musts over the sweep (eager >= 1.0 x attnscope bf16 at every point;
    at L >= 32k >= 1.8 x CUDNN bf16's tokens/s) and the geometric mean against bf16; the best candidate per
    point (graph replay)."""
    print("\nFP8 candidates over the sweep (x: tokens/s ratio; musts: eager >= 1.0 x attnscope bf16 "
          "everywhere, >= 1.8 x CUDNN bf16 at L >= 32k):", flush=True)
    for name in cands:
        got = [(r, r["candidates"][name]) for r in rows if "us" in r["candidates"].get(name, {})]
        if not got:
            print(f"  {name:20s} no timing (FAIL)", flush=True)
            continue
        eager = [c["vs_bf16"]["eager"] for _, c in got]
        long = [c["vs_cudnn"][m] for r, c in got if r["L"] >= 32768 for m in ("graph", "eager")]
        geo = math.exp(sum(math.log(c["vs_bf16"]["graph"]) for _, c in got) / len(got))
        must1 = sum(x >= 1.0 for x in eager)
        must2 = sum(x >= 1.8 for x in long)
        print(f"  {name:20s} eager x bf16 min {min(eager):.3f} ({must1}/{len(eager)} >= 1.0); L >= 32k x "
              f"CUDNN min {min(long, default=float('nan')):.3f} ({must2}/{len(long)} >= 1.8); graph x bf16 "
              f"geomean {geo:.3f}", flush=True)
    from attnscope.kernels.decode import heuristics as hs

    got = [(r, r["candidates"]["shipped"]) for r in rows if "us" in r["candidates"]["shipped"]]
    if got:
        eager = [c["vs_bf16"]["eager"] for _, c in got]
        long = [c["vs_cudnn"][m] for r, c in got if r["L"] >= 32768 for m in ("graph", "eager")]
        one = [r["bf16_one_liner_us"] / r["fp8_one_liner_us"] for r in rows]
        print(f"  shipped rule (FP8_DEFAULT {hs.FP8_DEFAULT}, FP8_MANY {hs.FP8_MANY} past one program per "
              f"SM, dense splits for {hs.FP8_DENSE_WAVES} programs per SM): "
              f"eager x bf16 min {min(eager):.3f} ({sum(x >= 1 for x in eager)}/{len(eager)} >= 1.0); "
              f"L >= 32k x CUDNN min {min(long, default=float('nan')):.3f} ({sum(x >= 1.8 for x in long)}/"
              f"{len(long)} >= 1.8); one-liner fp8 x bf16 min {min(one):.3f} ({sum(x >= 1 for x in one)}/"
              f"{len(one)} >= 1.0)", flush=True)
    print("best per point (graph replay; eager):", flush=True)
    for r in rows:
        timed = {n: c for n, c in r["candidates"].items() if "us" in c}
        if timed:
            g = min(timed, key=lambda n: timed[n]["us"]["graph"])
            e = min(timed, key=lambda n: timed[n]["us"]["eager"])
            print(f"  B {r['B']:2d} L {r['L']:6d} {r['layout']:5s}: {g} "
                  f"({timed[g]['vs_bf16']['graph']:.3f}x bf16); {e} "
                  f"({timed[e]['vs_bf16']['eager']:.3f}x bf16)", flush=True)



# --- --window: a sliding window reads only the window's bytes (issue 35) ----------------------------------
WINDOW_B = (1, 16, 64)
WINDOW_L = (32768, 131072)
WINDOW_W = (4096, 8192)
WINDOW_HEADS = (32, 8)  # Hq, Hkv
WINDOW_TARGET = 0.9  # issue 35: the window's bytes at >= 0.9 of the read ceiling at W >= 4k


def window_sweep(rep, json_path=None):
    """For B in `WINDOW_B`, L in `WINDOW_L` (points whose K + V pass `BUDGET` skipped), Hq/Hkv 32/8, d 128,
    bf16, full caches: the one-liner ``flash_decode(q, k, v, cache_seqlens=lens, window=(W, 0))`` for W in
    `WINDOW_W` and without a window, each first checked on sequence 0 against float64 attention over the keys
    its query sees (PASS/FAIL; ``plan.run`` must give the one-liner's bits), then timed eager and as a
    CUDA-graph replay of ``plan.run``. TB/s = the ledger's bytes (`model.serving.paged` with the window: the
    K/V blocks the kernel loads) / time; the fraction of the read ceiling (`measure.bench.read_ceiling`,
    measured in the same run) against `WINDOW_TARGET`. Returns the number of FAILs."""
    from attnscope.measure.bench import read_ceiling

    ceiling = read_ceiling(torch)
    print(f"read ceiling (measure.bench.read_ceiling, sum of 4 GiB bf16): {ceiling:.3f} TB/s", flush=True)
    Hq, Hkv = WINDOW_HEADS
    points = []
    for B, L in itertools.product(WINDOW_B, WINDOW_L):
        if 2 * B * Hkv * L * D * 2 > BUDGET:
            print(f"skipped B {B} L {L}: K + V pass BUDGET ({BUDGET / 2**30:.0f} GiB)", flush=True)
        else:
            points.append((B, L))
    fails = 0

    def measure(point, q, k, v, lens):
        nonlocal fails
        B, L = point
        row = {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "calls": {}}
        for W in (None, *WINDOW_W):
            window = None if W is None else (W, 0)
            o = attnscope.flash_decode(q, k, v, cache_seqlens=lens, window=window)
            seen = slice(0 if W is None else max(0, L - 1 - W), L)  # the keys the last query sees
            err, bound = reference_error(o, q, k[:, :, seen], v[:, :, seen])
            plan = attnscope.decode_plan(q, k, v, lens, window=window)
            run = lambda: plan.run(q, k, v, lens)  # noqa: E731
            same = torch.equal(o, run())
            decode.check_errors()
            name = "no window" if W is None else f"window {W}"
            ok = err <= bound and same
            c = {"window": window, "splits": plan.num_splits, "err": err, "bound": bound, "same_bits": same,
                 "ok": ok}
            row["calls"][name] = c
            print(f"{'PASS' if ok else 'FAIL'} B {B} L {L} {name}: err {err:.2e} (bound {bound:.2e}), "
                  f"plan.run {'same' if same else 'DIFFERENT'} bits, {plan.num_splits} split(s)", flush=True)
            if not ok:
                fails += 1
                continue
            nbytes = ledger([L] * B, None, nq=1, d=D, dtype="bf16", heads=Hq, kv_heads=Hkv,  # the kernel's
                            num_splits=plan.num_splits, block_kv=plan._consts["BLOCK_N"],  # blocks
                            window=window).row.total
            one = lambda: attnscope.flash_decode(q, k, v, cache_seqlens=lens, window=window)  # noqa: E731
            t = {"eager": ms(one, rep) * 1e3, "graph": ms(capture_graph(run).replay, rep) * 1e3}
            tbs = {m: nbytes / (us * 1e-6) / 1e12 for m, us in t.items()}
            c.update(bytes=nbytes, us=t, TBs=tbs, of_ceiling={m: x / ceiling for m, x in tbs.items()})
            line = f"  {name:12s} {nbytes / 2**20:9.1f} MiB"
            for m in t:
                line += f" | {m} {t[m]:8.1f} us {tbs[m]:5.2f} TB/s {tbs[m] / ceiling:5.3f} of ceiling"
            if W is not None:  # a plain read of the same bytes, timed alike: its fixed costs at this size
                c["same_size_read_tbs"] = same = read_ceiling(torch, nbytes=nbytes)
                c["of_same_size_read"] = {m: x / same for m, x in tbs.items()}
                line += f" | a read this size {same:4.2f} TB/s, graph / it {tbs['graph'] / same:5.3f}"
            full = row["calls"].get("no window", {})
            if W is not None and "us" in full:
                c["vs_no_window"] = {"bytes": nbytes / full["bytes"],
                                     **{m: t[m] / full["us"][m] for m in t}}
                line += (f" | x no window: bytes {c['vs_no_window']['bytes']:.3f}, time eager "
                         f"{c['vs_no_window']['eager']:.3f} graph {c['vs_no_window']['graph']:.3f}")
            print(line, flush=True)
        return row

    rows = each_point(points, measure, shape=lambda p: (p[0], Hq, Hkv, p[1]))
    met = [(r, n, c) for r in rows for n, c in r["calls"].items() if n != "no window" and "us" in c]
    print(f"\nwindowed points at >= {WINDOW_TARGET} of the read ceiling ({ceiling:.2f} TB/s), graph replay: "
          f"{sum(c['of_ceiling']['graph'] >= WINDOW_TARGET for _, _, c in met)} of {len(met)}; eager: "
          f"{sum(c['of_ceiling']['eager'] >= WINDOW_TARGET for _, _, c in met)} of {len(met)}", flush=True)
    for r, n, c in met:
        if c["of_ceiling"]["graph"] < WINDOW_TARGET:
            print(f"  below: B {r['B']} L {r['L']} {n}: graph {c['of_ceiling']['graph']:.3f}, eager "
                  f"{c['of_ceiling']['eager']:.3f} of the ceiling; a plain read of its "
                  f"{c['bytes'] / 2**20:.0f} MiB: {c['same_size_read_tbs'] / ceiling:.3f} of it", flush=True)
    if json_path:
        write_rows(json_path, rows, sweep="window", read_ceiling_tbs=ceiling)
    return fails

if __name__ == "__main__":
    sys.exit(main())
