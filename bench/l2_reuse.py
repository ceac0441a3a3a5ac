"""What the GPU's L2 keeps: re-reads at controlled reuse distances and CTA orders, DRAM bytes by ncu.

    PYTHONPATH=src python bench/l2_reuse.py [--quick] [--json out.json]
    PYTHONPATH=src python bench/l2_reuse.py --stream [--json out.json]   # E alone, 37 launches
    PYTHONPATH=src python bench/l2_reuse.py --stream-wide [--json out.json]   # E with T > P, 12 launches
    PYTHONPATH=src python bench/l2_reuse.py --hot [--json out.json]   # H alone, 9 launches
    PYTHONPATH=src python bench/l2_reuse.py --fit out.json   # no GPU: E's fit of a --stream(-wide) JSON

One Triton kernel (`_reread`) is run in four experiments, each kernel launch profiled by ncu through
measure/ncu.py's own path (`ncu.run_child`: dram__bytes_read.sum / dram__bytes_write.sum,
--cache-control none, --clock-control none, the L2 evicted with clean lines before each launch, one
marker kernel per launch):

A. distance: a buffer of W bytes read R = 3 times in the same kernel, chunk c of pass p read by work
   item p * M + c (so each chunk is re-read after exactly W bytes of other reads). Miss fraction of a
   re-read m(W) = (DRAM read - W) / ((R - 1) W). This is the replacement curve model/l2.py's `miss`
   assumes: 0 up to an effective capacity, then a ramp. Fitted here: ``capacity`` (bytes, the largest W
   with m <= 0.05, interpolated) and ``ramp`` (W / capacity where m reaches 0.95).
B. order: ``sets`` K/V-like sets of ``kv`` bytes each, every set read whole by ``T`` work items (query
   tiles), work items taken in head-major order (query tile fastest: what FlashAttention's grids do) or
   tile-major order (set fastest), by P = SMs x k persistent programs (P is the concurrency: a wave).
   DRAM read / (sets x kv) is the K/V read amplification; model/l2.py's `wave_rereads` prints its
   prediction beside each.
C. causal-like: as B, head-major, but work item i of a set reads only the first (i + 1) / T of it,
   forwards (tile 0 first, attnscope's kernel) or backwards (diagonal first, FlashAttention-2's loop).
   The programs take items statically (p, p + P, ...): two readers of a set are one diagonal step
   apart, so P such steps come between their visits of a tile (model/l2.py `wave_rereads`,
   ``schedule="static"``, prints its prediction beside each).
D. write-back: a kernel that writes W bytes (fill), then one that reads them back (producer ->
   consumer, naive attention's S): DRAM writes of the first (what does not stay dirty in L2) and reads
   of the second (what the L2 kept).
E. streaming (``--stream``: only this, at nine K/V sizes; the full run takes one per P): as B with 16 sets
   of 128 readers (N = 16k, d = 128), P = SMs or 2 x SMs, each reader also reading a private Q tile and
   writing a private O tile (2 x 32 KiB), twice that, the Q or the O alone, or nothing: do streamed-once
   bytes push K/V out of the L2? model/l2.py counts a wave's Q and O in the reuse distance of the set a
   wave boundary cuts, at `L2Params.qo_weight` K/V bytes each; printed: that prediction (the K/V lines'
   shared capacity), the one without streams, and the weight of a streamed byte that fits the measurement.

F. sharing (``--share``, only this): the same reuse distances W, three ways of re-reading, 3 passes each:
   "mixed" = A (a chunk read by a different program each pass), "private" (chunk h always read by program
   h: one SM, so one L2 partition's side), "shared" (every program reads the whole buffer each pass, in
   step: every line read from both partitions at once, as a K/V set is by the CTAs of one head). Where a
   read from the far L2 partition leaves a copy in the near one, a shared line holds two copies and a
   private one 1 to 2: the capacity falls from private to mixed to shared (model/l2.py `COPIES`).

H. hot sets (``--hot``, only this): FA-2's causal MQA grid at B > 1 ((m, b, h) launch order: the batch between
   a head's pairs), B sets read over and over by alternating (head, batch) pairs of causal backward readers
   (`hot_experiments`): what the L2 keeps of a few hot sets; printed beside the estimate's re-reads for FA-2's
   call of that geometry (`hot_estimate`; held-out grids 14 and 22 missed B = 2 by +80 %).

The run ends with ``L2_PARAMS {json}`` (capacity in bytes, ramp, dirty_bytes, the GPU) and the line to
paste into model/l2.py (``H200_L2_PARAMS = L2Params(capacity=<fraction of the L2>, ramp=...)``); E
says whether the resident CTAs' Q/O belong in a wave's working set. Needs a CUDA GPU, Triton and ncu.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

MiB = 2**20
TILE = 4096  # fp32 elements per load: 16 KiB, one K/V tile of 64 rows x d = 128 in fp16


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _reread(src, out, stream, n_items, T, SETS, TILES, P, SET_MOD, ORDER: tl.constexpr,
                CAUSAL: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr, QT: tl.constexpr,
                OT: tl.constexpr):
        """Persistent program pid takes work items pid, pid + P, ...; item w reads set h's tiles (set h's
        memory is set h % SET_MOD's: H's hot sets), and streams QT private tiles in (a Q tile) and OT private
        tiles out (an O tile) once each."""
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], tl.float32)
        offs = tl.arange(0, BLOCK)
        for w in range(pid, n_items, P):
            for q in range(QT):
                acc += tl.load(stream + (w * (QT + OT) + q) * BLOCK + offs)
            if ORDER == 0:  # head-major: the T items of one set are consecutive
                h = w // T
                i = w % T
            else:  # tile-major: consecutive items are different sets
                h = w % SETS
                i = w // SETS
            n_t = TILES
            if CAUSAL:
                n_t = ((i + 1) * TILES + T - 1) // T
            for j in range(0, n_t):
                t = j
                if BACKWARD:
                    t = n_t - 1 - j
                acc += tl.load(src + ((h % SET_MOD).to(tl.int64) * TILES + t) * BLOCK + offs)
            for o in range(OT):
                tl.store(stream + (w * (QT + OT) + QT + o) * BLOCK + offs, acc)
        tl.store(out + pid, tl.sum(acc, 0))

    return _reread


def experiments(sms: int, quick: bool) -> list[dict]:
    """The launches, in order. Each: name, what to pass to the kernel, and the bytes it must read."""
    ex = []
    dists = [8, 16, 24, 28, 32, 36, 40, 48, 64, 96] if quick else \
        [8, 16, 20, 24, 28, 30, 32, 34, 36, 40, 44, 48, 56, 64, 80, 96, 128]
    for w in dists:  # A: a chunk of 4 tiles (64 KiB) per item, R = 3 passes, tile-major = cyclic
        sets = w * MiB // (4 * TILE * 4)
        ex.append({"exp": "distance", "W": w * MiB, "sets": sets, "T": 3, "tiles": 4, "order": 1,
                   "P": 2 * sms, "causal": False, "backward": False, "qt": 0, "ot": 0})
    kvs = [4, 8, 16] if quick else [2, 4, 8, 12, 16, 24]
    for kv in kvs:  # B: 32 sets, T = 16 readers per set
        for k in (1, 2):
            for order in (0, 1):
                if order == 1 and kv != kvs[1]:
                    continue  # tile-major is all misses once sets x kv >> L2: one size shows it
                ex.append({"exp": "order", "kv": kv * MiB, "sets": 32, "T": 16,
                           "tiles": kv * MiB // (TILE * 4), "order": order, "P": k * sms, "causal": False,
                           "backward": False, "qt": 0, "ot": 0})
    for kv in ([4, 16] if quick else [2, 4, 8, 16]):  # C: causal-like, forwards and backwards
        for backward in (False, True):
            ex.append({"exp": "causal", "kv": kv * MiB, "sets": 32, "T": 16, "tiles": kv * MiB // (TILE * 4),
                       "order": 0, "P": 2 * sms, "causal": True, "backward": backward, "qt": 0, "ot": 0})
    ex += stream_experiments(sms, few=True)  # all of E: --stream
    for w in ([16, 32, 64] if quick else [8, 16, 24, 32, 40, 48, 64, 128]):  # D: fill then read back
        ex.append({"exp": "writeback", "W": w * MiB})
    return ex


def stream_experiments(sms: int, few: bool) -> list[dict]:
    """E: attention-like, 16 sets of 128 readers (N = 16k at d = 128), P = SMs or 2 x SMs programs; each
    reader streams (qt, ot) private 16 KiB tiles: none, a Q and an O tile of 32 KiB each (2, 2), twice that
    (4, 4), and at one size per P the Q or the O alone. The sizes put the re-read of the set a wave boundary
    cuts below the shared capacity without streams and across it with them. Three sizes again with 80 sets
    (5 x the waves, as FA-2 at B = 5 against B = 1): does the share of a set re-read fall with the wave
    count? (``--stream``: only these; ``few``: one size per P, as in the full run.)"""
    sizes = {1: [12], 2: [6]} if few else {1: [8, 10, 12, 14, 16], 2: [4, 6, 8, 10]}
    alone = {1: 12, 2: 6}  # the sizes that also run the Q or the O alone
    many = set() if few else {(1, 12), (1, 14), (2, 8)}  # (k, kv) run with 80 sets too
    ex = []
    for k, kvs in sizes.items():
        for kv in kvs:
            runs = [(16, qt, ot) for qt, ot in ((0, 0), (2, 2), (4, 4)) + (((2, 0), (0, 2)) if kv == alone[k]
                                                                          else ())]
            runs += [(80, 0, 0), (80, 2, 2)] if (k, kv) in many else []
            for sets, qt, ot in runs:
                ex.append({"exp": "stream", "kv": kv * MiB, "sets": sets, "T": 128,
                           "tiles": kv * MiB // (TILE * 4), "order": 0, "P": k * sms, "causal": False,
                           "backward": False, "qt": qt, "ot": ot})
    return ex


def wide_experiments(sms: int) -> list[dict]:
    """E with more readers per set than programs (``--stream-wide``): 8 sets of T = 4 x SMs readers at
    P = 2 x SMs (EFFICIENT's 64-row tiles at N ~ 32k: T ~ 500 against 264 CTA slots), streams of 0, 1 + 1 and
    2 + 2 tiles, and T = 2 x SMs at P = SMs (a 132-CTA grid's 128-row tiles), streams of 0, 2 + 2 and 4 + 4
    tiles; K/V sets of 10 and 14 MiB (0.38 and 0.54 of the shared capacity at N = 20-28k, d = 128). Each set
    is re-read by the readers of the next wave, after the rest of it and the wave's streams: the pattern of
    `lockstep_rereads` where T > C."""
    ex = []
    for k, t, runs in ((2, 4, ((0, 0), (1, 1), (2, 2))), (1, 2, ((0, 0), (2, 2), (4, 4)))):
        for kv in (10, 14):
            for qt, ot in runs:
                ex.append({"exp": "stream", "kv": kv * MiB, "sets": 8, "T": t * sms,
                           "tiles": kv * MiB // (TILE * 4), "order": 0, "P": k * sms, "causal": False,
                           "backward": False, "qt": qt, "ot": ot})
    return ex


#: H's geometry: query heads per batch, readers per (head, batch) pair (128-row tiles of N = 28,672)
HOT_HEADS, HOT_T = 8, 224


def hot_experiments(sms: int) -> list[dict]:
    """H (``--hot``): FA-2's causal MQA grid at B > 1, (m, b, h) launch order, so the batch comes between a
    head's pairs: HOT_HEADS x B (head, batch) pairs of HOT_T causal backward readers each, pair q reading set
    q % B of B K/V sets of kv bytes, P = 2 x SMs programs (two CTAs per SM), each reader streaming a 32 KiB
    Q tile in and an O tile out. B = 1 .. 5 at kv = 14 MiB (grids 14 and 22's +80 % MQA misses are B = 2 at
    N = 26-29k), B = 1 .. 4 at 7 MiB. What does the L2 keep of B hot sets read over and over?"""
    ex = []
    for kv, bs in ((14, (1, 2, 3, 4, 5)), (7, (1, 2, 3, 4))):
        for b in bs:
            ex.append({"exp": "hot", "kv": kv * MiB, "sets": HOT_HEADS * b, "mod": b, "T": HOT_T,
                       "tiles": kv * MiB // (TILE * 4), "order": 0, "P": 2 * sms, "causal": True,
                       "backward": True, "qt": 2, "ot": 2})
    return ex


def hot_estimate(s: dict, l2: int, sms: int, model) -> float:
    """The estimate's K/V reads beyond one pass of the B sets, per set, for FA-2's call of H's geometry
    (MQA, B = ``s["mod"]``, N = HOT_T 128-row tiles, d = 128 fp16: the kv bytes of a 14 MiB set; frames
    left out, as the kernel has none)."""
    b, n = s["mod"], HOT_T * 128
    d = s["kv"] // (2 * n * 2)
    ker = model.Kernel(128, 64, 2, "bh", True, True)
    e = model.estimate("flash", n, d, HOT_HEADS, b, "fp16", True, kv_heads=1, l2_bytes=l2, sms=sms,
                       kernel=ker)
    q, kv = b * HOT_HEADS * n * d * 2, 2 * n * d * 2
    return (e.read - q - b * kv) / (b * kv)


def share_experiments(sms: int) -> list[dict]:
    """F: the same W for the three ways of re-reading, W = k x P x one 16 KiB tile (P = 2 x SMs programs)."""
    ex, p = [], 2 * sms
    for k in (5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20):
        w = k * p * TILE * 4
        base = {"W": w, "P": p, "causal": False, "backward": False, "qt": 0, "ot": 0, "passes": 3}
        ex.append({**base, "exp": "mixed", "sets": w // (4 * TILE * 4), "T": 3, "tiles": 4, "order": 1})
        ex.append({**base, "exp": "private", "sets": p, "T": 3, "tiles": k, "order": 1})
        ex.append({**base, "exp": "shared", "sets": 1, "T": 3 * p, "tiles": k * p, "order": 0})
    return ex


# --- the child (runs under ncu) ----------------------------------------------------------------------
def child(specs: list[dict]) -> int:
    import torch

    kern = _kernel()
    cudart = torch.cuda.cudart()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    big = max(s.get("W", 0) or s.get("mod", s["sets"]) * s["tiles"] * TILE * 4 for s in specs)
    src = torch.ones(big // 4 + TILE, dtype=torch.float32, device="cuda")
    out = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
    n_stream = max((s.get("sets", 0) * s.get("T", 0) * (s.get("qt", 0) + s.get("ot", 0)) for s in specs),
                   default=0)
    stream = torch.ones(max(1, n_stream) * TILE, dtype=torch.float32, device="cuda")
    status = []
    for s in specs:
        try:
            if s["exp"] == "writeback":
                n = s["W"] // 4
                view = src[:n]

                def run(view=view):
                    view.fill_(2.0)
                    view.sum()
            else:
                n_items = s["sets"] * s["T"]

                def run(s=s, n_items=n_items):
                    kern[(s["P"],)](src, out, stream, n_items, s["T"], s["sets"], s["tiles"], s["P"],
                                    s.get("mod", s["sets"]), ORDER=s["order"], CAUSAL=s["causal"],
                                    BACKWARD=s["backward"],
                                    BLOCK=TILE, QT=s["qt"], OT=s["ot"], num_warps=4)
            run()  # compile / warm
            torch.cuda.synchronize()
            scratch.sum()  # clean lines: a cold L2
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            try:
                torch.cuda._sleep(1000)
                run()
                torch.cuda.synchronize()
            finally:
                cudart.cudaProfilerStop()
            status.append({**s, "ok": True, "marked": True})
        except Exception as e:  # keep the other experiments
            status.append({**s, "ok": False, "marked": False, "error": f"{type(e).__name__}: {e}"[:200]})
    print("ATTNSCOPE_STATUS " + json.dumps(status))
    return 0


# --- the parent ----------------------------------------------------------------------------------------
def fit_distance(rows: list[dict]) -> dict:
    """capacity: W where the miss fraction crosses 0.05; ramp: (W where it crosses 0.95) / capacity."""
    pts = sorted((r["W"], r["miss"]) for r in rows)

    def crossing(level):
        for (w0, m0), (w1, m1) in zip(pts, pts[1:], strict=False):
            if m0 <= level < m1:
                return w0 + (level - m0) / (m1 - m0) * (w1 - w0)
        return None

    cap, full = crossing(0.05), crossing(0.95)
    return {"capacity": int(cap) if cap else None, "ramp": (full / cap) if (cap and full) else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="write every point and the fitted parameters to PATH")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds for the ncu run (default 400)")
    p.add_argument("--share", action="store_true", help="only F: mixed vs private vs shared re-reads")
    p.add_argument("--stream", action="store_true", help="only E: K/V re-reads with and without streamed "
                   "Q/O tiles (about 35 launches)")
    p.add_argument("--stream-wide", action="store_true", help="only E with more readers per set than "
                   "programs (12 launches), then the fit of its K/V capacity, ramp and streamed-byte weight")
    p.add_argument("--hot", action="store_true", help="only H: B hot K/V sets read over and over by "
                   "alternating (head, batch) pairs, as FA-2's causal MQA grid at B > 1 (9 launches)")
    p.add_argument("--fit", metavar="JSON", help="no GPU: the E fit (`fit_stream`) of a --stream or "
                   "--stream-wide run's JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(json.loads(a.child))
    if a.fit:
        from attnscope.model import l2 as model

        data = json.loads(Path(a.fit).read_text(encoding="utf-8"))
        sets = 8 if any(r.get("T", 0) > r.get("P", 0) for r in data["rows"] if r["exp"] == "stream") else 16
        print("E fit: " + json.dumps(fit_stream(data["rows"], data["env"]["l2_bytes"], model, sets)))
        return 0

    from attnscope.measure import ncu
    from attnscope.measure.backends import gpu_problem
    from attnscope.model import l2 as model

    if why := gpu_problem():
        print(f"l2_reuse: error: {why}", file=sys.stderr)
        return 2
    import torch

    props = torch.cuda.get_device_properties(0)
    sms, l2 = props.multi_processor_count, props.L2_cache_size
    specs = share_experiments(sms) if a.share else stream_experiments(sms, few=a.quick) if a.stream else \
        wide_experiments(sms) if a.stream_wide else hot_experiments(sms) if a.hot else \
        experiments(sms, a.quick)
    print(f"{torch.cuda.get_device_name(0)}: {sms} SMs, L2 {l2 / MiB:.1f} MiB; {len(specs)} launches "
          "under ncu", flush=True)
    try:
        me = os.path.abspath(__file__)
        text, output = ncu.run_child([sys.executable, me, "--child", json.dumps(specs)], timeout_s=a.timeout)
    except ncu.NcuError as e:
        print(f"l2_reuse: error: {e}", file=sys.stderr)
        return 2
    status = ncu.child_status(output)
    calls = ncu.split_at_markers(ncu.parse_csv(text))
    rows = []
    for s, ks in ncu.pair(status, calls):
        read, write = sum(k.read for k in ks), sum(k.write for k in ks)
        r = {**s, "read": read, "write": write, "kernels": [k.to_json() for k in ks]}
        if s["exp"] in SHARE:
            r["miss"] = (read - s["W"]) / ((s["passes"] - 1) * s["W"])
        elif s["exp"] == "distance":
            w = s["sets"] * s["tiles"] * TILE * 4
            r["W"] = w
            r["miss"] = (read - w) / ((s["T"] - 1) * w)
        elif s["exp"] == "writeback":
            fill, back = (ks + [None, None])[:2]
            r["fill_write"] = fill.write if fill else None
            r["readback_read"] = back.read if back else None
            r["dirty_kept"] = s["W"] - fill.write if fill else None
            r["hit"] = 1 - back.read / s["W"] if back else None
        else:
            kv = s["tiles"] * TILE * 4
            q_bytes = s["sets"] * s["T"] * s["qt"] * TILE * 4  # the streamed Q tiles: read once each
            r["amplification"] = (read - q_bytes) / (s.get("mod", s["sets"]) * kv)  # per distinct set
            other = (s["qt"] + s["ot"]) * TILE * 4
            share = 1.0
            if s["causal"]:  # item i reads ceil((i + 1) TILES / T) of the TILES tiles
                share = sum(-(-(i + 1) * s["tiles"] // s["T"]) for i in range(s["T"])) / (s["T"] * s["tiles"])
            if s["exp"] == "stream":  # as the estimate counts a CTA's Q/O: K/V lines' (shared) capacity,
                r.update(stream_fit(s, kv, other, l2, r["amplification"], model))  # Q/O at `qo_weight`
            elif s["exp"] == "hot":
                r["model"] = 1.0 + hot_estimate(s, l2, sms, model)
            else:
                for key, ob in (("model", other), ("model_no_stream", 0)):
                    r[key] = model.wave_rereads(
                        sets=s["sets"], per_set=s["T"], concurrent=s["P"], kv_bytes=kv, other_bytes=ob,
                        causal=s["causal"], backward=s["backward"], l2_bytes=l2,
                        order="head" if s["order"] == 0 else "tile", share=share, schedule="static")
        rows.append(r)
    for s in status:
        if not s.get("ok"):
            print(f"failed: {s['exp']}: {s.get('error')}")

    if a.share:
        return share_report(rows, status, l2, sms, torch, a.json)
    if a.stream_wide:
        print("E fit (T > P): " + json.dumps(fit_stream(rows, l2, model, sets=8)), flush=True)
    if not (a.stream or a.stream_wide or a.hot):
        print("\nA. miss fraction of a re-read vs reuse distance W (cyclic, 3 passes)")
    for r in (r for r in rows if r["exp"] == "distance"):
        print(f"  W {r['W'] / MiB:7.1f} MiB  ({r['W'] / l2:5.2f} x L2)  DRAM read "
              f"{r['read'] / MiB:9.1f} MiB  miss {r['miss']:+.3f}")
    print("\nB/C/E. K/V read amplification (DRAM K/V read / sets x kv): measured vs model/l2.py (E: with the "
          "readers' streamed Q/O counted in the wave's working set, as the model does, and without)")
    for r in (r for r in rows if r["exp"] == "hot"):
        print(f"  hot    kv {r['kv'] / MiB:5.1f} MiB x {r['mod']} sets read by {r['sets']} alternating pairs "
              f"of {r['T']} causal backward readers, P {r['P']}: K/V reads / (sets x kv) measured "
              f"{r['amplification']:.3f}, FA-2's estimate for that call {r['model']:.3f}")
    for r in (r for r in rows if r["exp"] in ("order", "causal", "stream")):
        how = ("head-major" if r["order"] == 0 else "tile-major") + \
            (f", causal {'backward' if r['backward'] else 'forward'}" if r["causal"] else "") + \
            (f", streams {r['qt']}+{r['ot']} tiles" if r["qt"] or r["ot"] else "")
        extra = ""
        if r["exp"] == "stream":
            w = "n/a" if r["weight"] is None else ("<= " if r["weight_bound"] else "") + f"{r['weight']:.2f}"
            extra = f" (without streams {r['model_no_stream']:.3f}; a streamed byte's weight that fits: {w})"
        print(f"  {r['exp']:6s} kv {r['kv'] / MiB:5.1f} MiB x {r['sets']} sets, {r['T']} readers, "
              f"P {r['P']:4d} ({how}): measured {r['amplification']:.3f}  model {r['model']:.3f}{extra}")
    if not (a.stream or a.stream_wide or a.hot):
        print("\nD. write-back: fill W, then read it back")
    for r in (r for r in rows if r["exp"] == "writeback"):
        hit = r["hit"] if r["hit"] is not None else float("nan")
        print(f"  W {r['W'] / MiB:6.1f} MiB: fill wrote {(r['fill_write'] or 0) / MiB:7.1f} MiB (kept dirty "
              f"{(r['dirty_kept'] or 0) / MiB:6.1f}); read-back hit {hit:.3f}")
    fit = fit_distance([r for r in rows if r["exp"] == "distance"])
    kept = [r["dirty_kept"] for r in rows if r["exp"] == "writeback" and r.get("dirty_kept") is not None
            and r["W"] >= 2 * l2]
    params = {"capacity": fit["capacity"], "ramp": fit["ramp"],
              "dirty_bytes": int(sum(kept) / len(kept)) if kept else None,
              "gpu": torch.cuda.get_device_name(0), "l2_bytes": l2, "sms": sms}
    if a.json:
        from attnscope.inputs import write_atomic

        write_atomic(a.json, json.dumps({"env": {"gpu": params["gpu"], "l2_bytes": l2, "sms": sms,
                                                 "torch": torch.__version__},
                                         "rows": rows, "params": params}, indent=1), "--json")
    print("\nL2_PARAMS " + json.dumps(params))
    if params["capacity"] and params["ramp"]:
        import datetime

        day = datetime.date.today().isoformat()
        print(f"model/l2.py: H200_L2_PARAMS = L2Params(capacity={params['capacity'] / l2:.3f}, "
              f"ramp={params['ramp']:.2f}, source=\"bench/l2_reuse.py, {params['gpu']}, {day}\")")
    return 0 if all(s.get("ok") for s in status) else 1


SHARE = ("mixed", "private", "shared")


def stream_fit(s: dict, kv: int, other: int, l2: int, measured: float, model) -> dict:
    """E's predictions: `wave_rereads` with the K/V lines' shared capacity and ramp (`L2Params.for_shared`),
    the streamed bytes (``other`` per reader) weighted as the estimate weighs a CTA's Q/O (`qo_weight`, key
    "model") or left out ("model_no_stream"), and "weight": the weight of a streamed byte, in K/V bytes of
    L2 room, at which the prediction equals ``measured`` (bisection; None where no weight in [0, 4] does:
    the measurement is below the prediction without streams, or over its ceiling); "weight_bound": the
    measurement is within 0.01 of the prediction without streams, so the weight is only an upper bound."""
    params = model.H200_L2_PARAMS

    def amp(w):
        return model.wave_rereads(sets=s["sets"], per_set=s["T"], concurrent=s["P"], kv_bytes=kv,
                                  other_bytes=w * other, l2_bytes=l2, params=params.for_shared())
    out = {"model": amp(params.qo_weight()), "model_no_stream": amp(0.0), "weight": None}
    out["weight_bound"] = measured - out["model_no_stream"] < 0.01
    lo, hi = 0.0, 4.0
    if other and amp(lo) <= measured <= amp(hi) and amp(hi) > amp(lo):
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if amp(mid) < measured else (lo, mid)
        out["weight"] = (lo + hi) / 2
    return out


def fit_stream(rows: list[dict], l2: int, model, sets: int = 16) -> dict:
    """The K/V capacity (fraction of the L2), ramp and streamed-byte weight that fit the stream rows of
    ``sets`` sets best (least squares of the amplification over a grid: capacity 0.40-0.80 by 0.01, ramp
    1.10-2.00 by 0.05, weight 0-1.5 by 0.05), with `wave_rereads` as `stream_fit` calls it; and the RMS error
    there."""
    pts = [r for r in rows
           if r["exp"] == "stream" and r["sets"] == sets and r.get("amplification") is not None]
    best = None
    for ci in range(40, 81):
        for ri in range(22, 41):
            params = model.L2Params(shared=ci / 100, shared_ramp=ri / 20).for_shared()
            for wi in range(31):
                err = sum((model.wave_rereads(
                    sets=r["sets"], per_set=r["T"], concurrent=r["P"], kv_bytes=r["tiles"] * TILE * 4,
                    other_bytes=wi / 20 * (r["qt"] + r["ot"]) * TILE * 4, l2_bytes=l2, params=params)
                    - r["amplification"]) ** 2 for r in pts)
                if best is None or err < best[0]:
                    best = (err, ci / 100, ri / 20, wi / 20)
    err, cap, ramp, w = best
    return {"capacity": cap, "ramp": ramp, "weight": w, "rms": math.sqrt(err / max(1, len(pts))),
            "points": len(pts)}


def share_report(rows, status, l2, sms, torch, path) -> int:
    """F's table (miss fraction of a re-read by W, per way) and each way's fitted capacity and ramp."""
    print("\nF. miss fraction of a re-read vs reuse distance W: mixed (A) / private (one SM) / shared (all)")
    by_w = {}
    for r in rows:
        by_w.setdefault(r["W"], {})[r["exp"]] = r["miss"]
    for w, m in sorted(by_w.items()):
        print(f"  W {w / MiB:7.2f} MiB ({w / l2:5.3f} x L2): " +
              "  ".join(f"{k} {m[k]:+.3f}" if k in m else f"{k} n/a" for k in SHARE))
    fits = {k: fit_distance([{"W": r["W"], "miss": r["miss"]} for r in rows if r["exp"] == k]) for k in SHARE}
    for k, f in fits.items():
        cap = f"{f['capacity'] / MiB:.1f} MiB = {f['capacity'] / l2:.3f} x L2" if f["capacity"] else "n/a"
        print(f"  {k:8s} capacity {cap}, ramp {f['ramp'] or float('nan'):.2f}")
    if path:
        from attnscope.inputs import write_atomic

        env = {"gpu": torch.cuda.get_device_name(0), "l2_bytes": l2, "sms": sms, "torch": torch.__version__}
        write_atomic(path, json.dumps({"env": env, "rows": rows, "fits": fits}, indent=1), "--json")
    print("L2_SHARE " + json.dumps({k: {"capacity": f["capacity"] / l2 if f["capacity"] else None,
                                         "ramp": f["ramp"]} for k, f in fits.items()}))
    return 0 if all(s.get("ok") for s in status) else 1


if __name__ == "__main__":
    sys.exit(main())
