"""Decode benchmark (issue 14): attnscope split-KV decode against SDPA FLASH and CUDNN, eager and in
CUDA-graph replay, paged caches against the contiguous one, FlexAttention decoding (contiguous and paged),
all on the same inputs in one run.

    PYTHONPATH=src python bench/decode.py [--quick] [--json out.json] [--no-flex] [--flex-all]

bf16, d = 128, one query token, (B, Hq, Hkv) in {(1,32,32), (1,32,8), (16,32,8), (64,32,8), (64,32,32)} x
L in {4k, 32k, 128k}, every sequence full (``cache_seqlens = L``). Points whose K + V exceed the memory
budget are reported as skipped; paged copies are made only up to `PAGED_MAX` bytes of cache.

Two passes. Pass 1 checks every point before anything is timed: sequence 0 of ``plan.run`` against
float64 attention on the GPU (bound: 2 x SDPA's own error + 1e-3), the one-liner ``flash_decode`` gives
the same bits as ``plan.run``, the paged plans (pages of 16 and 64, random page order) agree with the
contiguous one, and Flex's outputs agree with attnscope's; it prints "all results match, starting
benchmarks" or exits 1. Pass 2 rebuilds the same inputs (same seeds) and times with
``triton.testing.do_bench`` (median):

- ``attnscope flash_decode``: the one-liner, defaults (checks the lengths: a host sync per call), and with
  ``check_seqlens=False``; both take their plan from flash_decode's plan cache;
- ``attnscope plan.run`` eagerly and ``attnscope graph`` (replay of a captured ``plan.run``);
- ``sdpa FLASH`` / ``sdpa CUDNN``, eagerly and in graph replay (``enable_gqa=True``);
- ``attnscope paged {16,64}``: ``plan.run`` and graph replay on the paged copy;
- Flex (``torch.compile(flex_attention)``, decoding kernel for one query): contiguous, and paged through
  torch's experimental ``PagedAttention`` helper (``torch.nn.attention.experimental._paged_attention``,
  physical cache [1, Hkv, pages x page, d], block size = page size) when it exists; otherwise the run
  records "not available". Flex compiles once per shape, so by default it runs at one point
  (`FLEX_POINT`); ``--flex-all`` runs it at every point with paged copies (minutes of compiles).

TB/s = the analytic bytes (`attnscope.kernels.decode.logical_bytes`; paged adds the block-table reads)
over the measured time. The summary lists the issue's musts: eager plan.run >= SDPA FLASH, graph >= CUDNN
graph, paged >= 0.95 x contiguous. Run time on one H200 with a cold cache, estimated (not yet measured;
compiles dominate, each run prints its own): ~2.5 min full, ~1 min --quick, ~1.5 min --no-flex.
"""

# ruff: noqa: B023 - every timed closure is called (do_bench) inside the iteration that defines it
import argparse
import json
import math
import sys
import time

import torch
import triton

import attnscope
from attnscope.kernels.decode import logical_bytes

GRID = [(1, 32, 32), (1, 32, 8), (16, 32, 8), (64, 32, 8), (64, 32, 32)]
LENS = [4096, 32768, 131072]
#: the 14 grid points the decode experiments time (B 64, Hkv 32 at 128k would need 137 GB of K and V)
POINTS = [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS if B * Hkv * L <= 64 * 32 * 32768]
#: where the portable plan runs 128 programs on the H200's 132 SMs (B 1, Hkv 32 with 4 splits; B 16, Hkv 8)
PARITY = [(1, 32, 32, 131072), (16, 32, 8, 32768), (16, 32, 8, 131072), (1, 32, 32, 32768)]
QUICK = [(1, 32, 32, 4096), (1, 32, 8, 32768), (16, 32, 8, 32768), (64, 32, 8, 4096)]
PAGES = (16, 64)
D = 128
BUDGET = 100 * 2**30  # bytes of K + V per point
PAGED_MAX = 16 * 2**30  # paged copies only up to this K + V size (memory and time)
FLEX_POINT = (16, 32, 8, 32768)  # where Flex runs by default: one compile per variant


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
    """Sequence 0 against float64 attention; returns (err, bound = 2 x SDPA's own error + 1e-3)."""
    G = q.shape[1] // k.shape[1]
    kk = k[:1].double().repeat_interleave(G, 1)
    vv = v[:1].double().repeat_interleave(G, 1)
    s = (q[:1].double() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    ref = torch.softmax(s, -1) @ vv
    low = torch.nn.functional.scaled_dot_product_attention(q[:1], k[:1], v[:1], enable_gqa=True)
    return (o[:1].double() - ref).abs().max().item(), 2 * (low.double() - ref).abs().max().item() + 1e-3


class Flex:
    """FlexAttention decoding, contiguous and paged; every failure is recorded, never fatal."""

    def __init__(self):
        self.fn = self.paged_cls = None
        self.why = self.why_paged = None
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            self.fn = torch.compile(flex_attention, dynamic=False)
            self.create_block_mask = create_block_mask
        except Exception as e:  # noqa: BLE001 - recorded
            self.why = f"FlexAttention not available: {type(e).__name__}: {e}"
            return
        try:  # experimental in torch (2.5 .. 2.13): a private module path, so guarded
            from torch.nn.attention.experimental._paged_attention import PagedAttention
            self.paged_cls = PagedAttention
        except Exception as e:  # noqa: BLE001 - recorded
            self.why_paged = f"torch's paged attention helper not available: {type(e).__name__}: {e}"

    def contiguous(self, q, k, v):
        return lambda: self.fn(q, k, v, enable_gqa=True)

    def paged(self, q, kp, vp, table):
        """Flex on the same pages: physical cache [1, Hkv, n x page, d], block mask of page-size blocks
        mapped to the physical pages by torch's PagedAttention; returns the call."""
        B, Hq, _, d = q.shape
        n, page, Hkv, _ = kp.shape
        per_seq = table.shape[1]
        pa = self.paged_cls(n, page, B, device=q.device)
        pa.page_table[:, :per_seq] = table.long()
        logical = torch.arange(per_seq, device=q.device).expand(B, -1)
        pa.physical_to_logical.scatter_(1, table.long(), logical)
        pa.capacity[:] = per_seq * page
        pa.empty_pages = []
        k_phys = kp.permute(2, 0, 1, 3).reshape(1, Hkv, n * page, d)  # a copy in Flex's layout
        v_phys = vp.permute(2, 0, 1, 3).reshape(1, Hkv, n * page, d)

        def everything(b, h, q_idx, kv_idx):
            return kv_idx >= 0

        bm = self.create_block_mask(everything, B, None, 1, per_seq * page, device="cuda",
                                    BLOCK_SIZE=(128, page))
        bm = pa.convert_logical_block_mask(bm)
        return lambda: self.fn(q, k_phys, v_phys, block_mask=bm, enable_gqa=True)


def point_setup(B, Hq, Hkv, L):
    q, k, v, lens = inputs(B, Hq, Hkv, L)
    plan = attnscope.decode_plan(q, k, v, lens, check_seqlens=False)
    return q, k, v, lens, plan


def check_point(B, Hq, Hkv, L, flex, want_flex):
    """Pass 1 at one point (compiling every kernel it needs): returns the row of checks (``ok``)."""
    name = f"B={B} Hq={Hq} Hkv={Hkv} L={L}"
    q, k, v, lens, plan = point_setup(B, Hq, Hkv, L)
    o = plan.run(q, k, v, lens)
    err, bound = reference_error(o, q, k, v)
    same_bits = torch.equal(o, attnscope.flash_decode(q, k, v, lens))
    row = {"point": name, "B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "num_splits": plan.num_splits,
           "fused": plan.fuse, "max_err": err, "bound": bound, "one_liner_same_bits": same_bits,
           "paged_max_diff": {}, "flex_max_diff": {}}
    ok = err <= bound and same_bits
    kv_bytes = 2 * B * Hkv * L * D * 2
    if kv_bytes <= PAGED_MAX:
        for page in PAGES:
            kp, vp, table = paged_copy(k, v, page, seed=page)
            pplan = attnscope.decode_plan(q, kp, vp, lens, table, check_seqlens=False)
            op = pplan.run(q, kp, vp, lens, table)
            diff = (op.float() - o.float()).abs().max().item()
            row["paged_max_diff"][page] = diff
            ok = ok and diff <= 1e-2
            if want_flex and flex.paged_cls is not None:  # compiles Flex for this page size
                try:
                    of = flex.paged(q, kp, vp, table)()
                    row["flex_max_diff"][f"paged {page}"] = (of.float() - o.float()).abs().max().item()
                except Exception as e:  # noqa: BLE001 - a peer that fails is recorded
                    row["flex_max_diff"][f"paged {page}"] = f"n/a: {type(e).__name__}: {str(e)[:120]}"
            del kp, vp, table, pplan
    if want_flex and flex.fn is not None:
        try:
            of = flex.contiguous(q, k, v)()
            row["flex_max_diff"]["contiguous"] = (of.float() - o.float()).abs().max().item()
        except Exception as e:  # noqa: BLE001
            row["flex_max_diff"]["contiguous"] = f"n/a: {type(e).__name__}: {str(e)[:120]}"
    for key, diff in row["flex_max_diff"].items():
        if isinstance(diff, float) and diff > 2e-2:
            print(f"  {name}: flex {key} differs from attnscope by {diff:.2e} (Flex is a peer: reported)",
                  flush=True)
    row["ok"] = ok
    print(f"{name}: splits={plan.num_splits} fused={plan.fuse} err={err:.2e}<={bound:.2e} "
          f"one-liner same bits {same_bits} paged diffs {row['paged_max_diff']} "
          f"{'ok' if ok else 'MISMATCH'}", flush=True)
    return row


def time_point(row, rep, flex, want_flex):
    """Pass 2 at one point: the timings, TB/s and ratios into ``row``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    B, Hq, Hkv, L = row["B"], row["Hq"], row["Hkv"], row["L"]
    q, k, v, lens, plan = point_setup(B, Hq, Hkv, L)
    nbytes = logical_bytes(B, Hq, Hkv, B * L, D, 2, plan.num_splits)["total"]
    t, moved = {}, {}
    t["attnscope flash_decode"] = ms(lambda: attnscope.flash_decode(q, k, v, lens), rep)
    t["attnscope flash_decode check_seqlens=False"] = ms(
        lambda: attnscope.flash_decode(q, k, v, lens, check_seqlens=False), rep)
    t["attnscope plan.run"] = ms(lambda: plan.run(q, k, v, lens), rep)
    t["attnscope graph"] = ms(graph_of(lambda: plan.run(q, k, v, lens)).replay, rep)
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
    if want_flex and flex.fn is not None and isinstance(row["flex_max_diff"].get("contiguous"), float):
        t["flex contiguous"] = ms(flex.contiguous(q, k, v), rep)
    for page in row["paged_max_diff"]:
        kp, vp, table = paged_copy(k, v, page, seed=page)
        pplan = attnscope.decode_plan(q, kp, vp, lens, table, check_seqlens=False)

        def prun():
            return pplan.run(q, kp, vp, lens, table)
        t[f"attnscope paged {page} plan.run"] = ms(prun, rep)
        t[f"attnscope paged {page} graph"] = ms(graph_of(prun).replay, rep)
        moved[f"attnscope paged {page} plan.run"] = moved[f"attnscope paged {page} graph"] = \
            nbytes + 4 * B * (L // page)  # + the block-table entries
        if want_flex and isinstance(row["flex_max_diff"].get(f"paged {page}"), float):
            t[f"flex paged {page}"] = ms(flex.paged(q, kp, vp, table), rep)
    row["bytes"] = nbytes
    row["ms"] = t
    row["TB/s"] = {key: moved.get(key, nbytes) / (val * 1e-3) / 1e12 for key, val in t.items()}
    ratios = {}
    if "sdpa FLASH" in t:
        ratios["plan.run / FLASH (eager, must >= 1)"] = t["sdpa FLASH"] / t["attnscope plan.run"]
        ratios["flash_decode / FLASH (eager)"] = t["sdpa FLASH"] / t["attnscope flash_decode"]
        ratios["flash_decode unchecked / FLASH (eager)"] = \
            t["sdpa FLASH"] / t["attnscope flash_decode check_seqlens=False"]
    if "sdpa CUDNN graph" in t:
        ratios["graph / CUDNN graph (must >= 1)"] = t["sdpa CUDNN graph"] / t["attnscope graph"]
    if "sdpa CUDNN" in t:
        ratios["plan.run / CUDNN (eager, goal >= 1)"] = t["sdpa CUDNN"] / t["attnscope plan.run"]
    for page in row["paged_max_diff"]:
        ratios[f"paged {page} / contiguous (plan.run, must >= 0.95)"] = \
            t["attnscope plan.run"] / t[f"attnscope paged {page} plan.run"]
        ratios[f"paged {page} / contiguous (graph)"] = \
            t["attnscope graph"] / t[f"attnscope paged {page} graph"]
    row["ratios"] = ratios
    print(f"{row['point']} splits={plan.num_splits} fused={plan.fuse}", flush=True)
    for key, val in t.items():
        print(f"  {key:44s} {val * 1e3:9.1f} us  {row['TB/s'][key]:5.2f} TB/s", flush=True)
    for key, val in ratios.items():
        print(f"  {key:44s} {val:6.3f}x", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{len(QUICK)} points, short timing")
    p.add_argument("--json", metavar="PATH", help="write every check, time, TB/s and ratio as JSON")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles take ~20 s each)")
    p.add_argument("--flex-all", action="store_true",
                   help="Flex at every point with paged copies, not only at B=16 Hkv=8 L=32k (slow compiles)")
    args = p.parse_args()
    t0 = time.time()
    points = QUICK if args.quick else [(B, Hq, Hkv, L) for B, Hq, Hkv in GRID for L in LENS]
    rep = 20 if args.quick else 50
    flex = None
    records = {"flex": None, "flex_paged": None}
    if not args.no_flex:
        flex = Flex()
        records["flex"], records["flex_paged"] = flex.why or "available", flex.why_paged or "available"
        print(f"FlexAttention: {records['flex']}; paged (torch experimental PagedAttention): "
              f"{records['flex_paged']}", flush=True)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}",
          flush=True)

    rows, failures = [], 0
    for B, Hq, Hkv, L in points:  # pass 1: correctness at full size, every point, before any timing
        kv_bytes = 2 * B * Hkv * L * D * 2
        name = f"B={B} Hq={Hq} Hkv={Hkv} L={L}"
        if kv_bytes > BUDGET:
            print(f"{name}: skipped (K+V {kv_bytes / 2**30:.0f} GiB over the {BUDGET / 2**30:.0f} GiB "
                  f"budget)", flush=True)
            rows.append({"point": name, "skipped": "memory"})
            continue
        want_flex = flex is not None and (args.flex_all or (B, Hq, Hkv, L) == FLEX_POINT)
        row = check_point(B, Hq, Hkv, L, flex, want_flex)
        row["flex"] = want_flex
        failures += not row["ok"]
        rows.append(row)
        torch.cuda.empty_cache()
    if failures:
        print(f"{failures} points FAILED the correctness check: not timing", flush=True)
    else:
        print(f"all results match, starting benchmarks ({time.time() - t0:.0f} s of checks and compiles)",
              flush=True)
        for row in rows:  # pass 2
            if "skipped" not in row:
                time_point(row, rep, flex, row["flex"])
                torch.cuda.empty_cache()
        must = [(r["point"], key, val) for r in rows if "ratios" in r for key, val in r["ratios"].items()
                if "must" in key]
        missed = [(pt, key, val) for pt, key, val in must
                  if val < (0.95 if "0.95" in key else 1.0)]
        print(f"musts: {len(must) - len(missed)} of {len(must)} met", flush=True)
        for pt, key, val in missed:
            print(f"  missed: {pt}: {key} = {val:.3f}x", flush=True)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "triton": triton.__version__,
                       "device": torch.cuda.get_device_name(), "records": records, "rows": rows,
                       "seconds": time.time() - t0}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
