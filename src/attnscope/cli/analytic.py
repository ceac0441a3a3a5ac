"""The analytic subcommands: `traffic`, `footprint`, `tiles`, `amdahl` (model/; CPU, no torch).

Each parses its flags, calls one model function and prints a table, or JSON with `--json`. With no
arguments each reproduces the spec's worked example (N = 4,096, d = 128, FP16, B_r = 128, B_c = 64).
"""

from __future__ import annotations

import argparse

from attnscope.cli import serving
from attnscope.cli._out import GiB, KiB, MiB, console, int_list, ledger, print_json, table
from attnscope.errors import InputError, expect
from attnscope.model import roofline as rl

SPEC = "(spec default: %(default)s)"


def _size(b: int | float) -> str:
    """Binary size with its unit: GiB from 1 GiB, MiB from 1 MiB, else KiB (2 decimals)."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB")):
        if b >= unit:
            return f"{b / unit:,.2f} {name}"
    return f"{b / KiB:,.2f} KiB"


def _shape_flags(p: argparse.ArgumentParser, d: bool = True, dtype: bool = True) -> None:
    p.add_argument("--n", type=int, default=4096, help=f"sequence length of Q and K/V {SPEC}")
    p.add_argument("--nq", type=int, default=None, help="query length, overrides --n")
    p.add_argument("--nk", type=int, default=None, help="key/value length, overrides --n")
    if d:
        p.add_argument("--d", type=int, default=128, help=f"head dimension {SPEC}")
    if dtype:
        p.add_argument("--dtype", default="fp16", help=f"element type: fp16, bf16, fp32, fp8 {SPEC}")
    p.add_argument("--block-q", type=int, default=128, help=f"query tile B_r, rows {SPEC}")
    p.add_argument("--block-kv", type=int, default=64, help=f"key/value tile B_c, rows {SPEC}")


def _mods_flags(p: argparse.ArgumentParser, mods: bool = True) -> None:
    """--window (and with ``mods`` --softcap, --sinks): the score mods."""
    p.add_argument("--window", default=None, metavar="L,R",
                   help="sliding window, flash-attn's window_size: row r sees keys r+off-L .. r+off+R "
                        "(off = Nk - Nq, bottom-right), -1 = unbounded on that side; causal forces R = 0 "
                        "(write negative values as --window=-1,8)")
    if mods:
        p.add_argument("--softcap", type=float, default=0.0,
                       help="logit softcap: scores become softcap * tanh(s / softcap); 0 = off (default)")
        p.add_argument("--sinks", action="store_true",
                       help="a per-head sink logit (fp32 [Hq]) in every softmax denominator")


def window_arg(text: str | None) -> tuple[int, int] | None:
    """``--window L,R`` as a pair of integers >= -1, or None; one line if not."""
    if text is None:
        return None
    w = int_list("--window", text, least=-1, most=2)
    expect(len(w) == 2, "--window", "L,R: two integers >= -1 (-1 = unbounded)", text)
    return (w[0], w[1])


def mods_args(args) -> dict:
    """The score mods' keyword arguments of the model calls, from the parsed flags."""
    return {"window": window_arg(args.window), "softcap": args.softcap, "sinks": args.sinks}


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def configure(sub) -> None:
    """Add `traffic`, `footprint`, `tiles` and `amdahl` to `sub` (argparse subparsers)."""
    from attnscope.model.traffic import ROW_NAMES, SPEC_ROWS

    p = sub.add_parser("traffic",
                       help="logical HBM bytes: naive vs FlashAttention-2, itemised (spec §1.1, §4)",
                       description="Logical HBM traffic per (batch, query head), exact bytes, reads/writes "
                                   "split; ratios only within one masking condition.")
    _shape_flags(p)
    p.add_argument("--batch", type=int, default=1,
                   help="batch size; totals are printed beside per-head bytes")
    p.add_argument("--heads", type=int, default=1,
                   help="query heads; totals are printed beside per-head bytes")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="K/V heads for GQA/MQA (divides --heads; default --heads); bytes stay per query "
                        "head as the kernel issues them")
    p.add_argument("--lse", action="store_true", help="the flash kernels also write the FP32 logsumexp "
                                                      "(4 B per query row)")
    p.add_argument("--rows", default=",".join(SPEC_ROWS),
                   help=f"comma-separated configurations, or 'all': {', '.join(ROW_NAMES)} "
                        "(default: the spec's four §4 rows)")
    p.add_argument("--pass", dest="pass_", default="forward", choices=("forward", "backward"),
                   help="forward (default) or backward: the naive backward (P and the mask kept) vs the "
                        "FA-2 backward (atomic or separate-pass dQ); --rows defaults to all backward rows")
    p.add_argument("--ratio", nargs=2, metavar=("BASELINE", "CONFIG"), default=None,
                   help="also print BASELINE total / CONFIG total (same masking condition only)")
    p.add_argument("--items", action="store_true", help="print the itemised ledger of every kernel")
    p.add_argument("--device", default=None,
                   help="add roofline lines for a device: a100, h100, h200 (ridge, FLOP/byte, time floor)")
    serving.add_flags(p)
    _mods_flags(p)
    _json_flag(p)
    p.set_defaults(func=cmd_traffic)

    p = sub.add_parser("footprint", help="memory scopes: per head, layer peak, training, CTA state, SRAM fit",
                       description="The memory scopes of spec §1.2 and §3.3 and the tile buffers' SRAM fit, "
                                   "each with the assumption it rests on.")
    _shape_flags(p)
    p.add_argument("--heads", type=int, default=32, help=f"query heads of one layer {SPEC}")
    p.add_argument("--layers", type=int, default=32, help=f"transformer layers {SPEC}")
    p.add_argument("--batch", type=int, default=1, help=f"sequences {SPEC}")
    p.add_argument("--device", default=None, help="check SRAM fit on one device: a100, h100, h200 "
                                                  "(default: all)")
    _json_flag(p)
    p.set_defaults(func=cmd_footprint)

    p = sub.add_parser("tiles", help="causal or sliding-window schedule of a query tile: loaded, skipped, "
                                     "masked KV tiles",
                       description="Which KV tiles one query tile loads, skips and masks (spec §2.1; "
                                   "1-based tiles and rows, as in the spec).")
    _shape_flags(p, d=False, dtype=False)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal masking, bottom-right aligned when Nq != Nk (default: causal)")
    _mods_flags(p, mods=False)
    p.add_argument("--query-tile", type=int, default=None,
                   help="query tile i, 1-based (default: 5, the spec's, or the last when there are fewer)")
    _json_flag(p)
    p.set_defaults(func=cmd_tiles)

    p = sub.add_parser("amdahl", help="end-to-end speedup from a time share and a kernel speedup (spec §5)",
                       description="speedup = 1 / ((1 - f) + f / S). f must be a measured *time* share, "
                                   "not a FLOP share (spec §5.1).")
    p.add_argument("--f", type=float, action="append", default=None,
                   help="time share of the part sped up, in [0, 1]; may repeat (the first is the headline, "
                        "all of them form the sensitivity table; default 0.15 with the spec's 15/40/65 %% "
                        "table)")
    p.add_argument("--s", type=float, default=3.5, help=f"kernel speedup of that part, > 0 {SPEC}")
    p.add_argument("--part-ms", type=float, default=None,
                   help="carry to an outer boundary: the part's time in ms (with --inner-ms, --outer-ms)")
    p.add_argument("--inner-ms", type=float, default=None, help="inner boundary in ms, e.g. GPU prefill")
    p.add_argument("--outer-ms", type=float, default=None,
                   help="outer boundary in ms, e.g. client TTFT; its other segments are held fixed")
    _json_flag(p)
    p.set_defaults(func=cmd_amdahl)


# --- traffic ----------------------------------------------------------------------------------------
def cmd_traffic(args) -> int:
    from attnscope.model.backward import BACKWARD_ROWS, backward_traffic
    from attnscope.model.traffic import ROW_NAMES, SPEC_ROWS, mods_note, traffic

    names = [x.strip() for x in args.rows.split(",") if x.strip()]
    mods = mods_args(args)
    if args.lengths is not None or args.cache_lens is not None:
        return serving.run(args, ROW_NAMES if names == ["all"] else names, mods)
    serving.check_unused(args)
    shape = dict(nq=args.nq, nk=args.nk, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, **mods)
    if args.pass_ == "backward":  # all, or the forward default: every backward row
        names = BACKWARD_ROWS if names in (["all"], list(SPEC_ROWS), list(ROW_NAMES)) else names
        t = backward_traffic(args.n, args.d, args.dtype, args.block_q, args.block_kv, **shape, rows=names)
    else:
        t = traffic(args.n, args.d, args.dtype, args.block_q, args.block_kv, **shape, lse=args.lse,
                    rows=ROW_NAMES if names == ["all"] else names)
    ratio = None
    if args.ratio:
        expect(all(x in t.rows for x in args.ratio), "ratio", "two of the configurations counted ("
               + ", ".join(t.rows) + ")", " ".join(args.ratio))
        ratio = (args.ratio[0], args.ratio[1], t.ratio(*args.ratio))
    dev = rl.device(args.device) if args.device else None
    bh = t.config.batch_heads
    points = {r.name: rl.roofline(r, dev, t.config.dtype) for r in t.rows.values()} if dev else {}

    if args.json:
        out = t.to_json()
        if ratio:
            out["ratio"] = {"baseline": ratio[0], "config": ratio[1], "ratio": ratio[2]}
        if dev:
            out["device"] = dev.to_json() | {"ridge": rl.ridge(dev, t.config.dtype)}
            for row in out["rows"]:
                pts = points[row["name"]]
                row["roofline"] = [p.to_json() for p in pts]
                row["floor_s"] = rl.time_floor(pts)
                if bh != 1:
                    row["floor_s_all"] = rl.time_floor(rl.roofline(t[row["name"]], dev, t.config.dtype, bh))
        print_json(out)
        return 0

    c = t.config
    con = console()
    shape = (f"Nq = {c.nq:,}, Nk = {c.nk:,}, d = {c.d}, {c.dtype} ({c.b} B), B_r = {c.block_q}, "
             f"B_c = {c.block_kv}" + (", with LSE write" if c.lse else ""))
    cols = ["Configuration", "Reads MiB", "Writes MiB", "Total MiB", "Reads B", "Writes B", "Total B",
            "Reduction vs matched baseline"]
    if bh != 1:
        cols.append(f"Total x {bh} (B x H) MiB")
    body = []
    for r in t.rows.values():
        x = t.matched_ratio(r.name)
        if r.baseline == r.name:
            red = f"1.00x ({r.condition} baseline)"
        elif x is None:
            red = f"(add {r.baseline} for the ratio)"
        else:
            red = f"{x:.2f}x vs {r.baseline}"
        body.append([r.label, f"{r.reads / MiB:,.2f}", f"{r.writes / MiB:,.2f}", f"{r.total / MiB:,.2f}",
                     f"{r.reads:,}", f"{r.writes:,}", f"{r.total:,}", red,
                     *([f"{r.total * bh / MiB:,.2f}"] if bh != 1 else [])])
    gqa = f"; GQA {c.heads}/{c.kv_heads}: K/V counted per query head, as the kernel issues them" \
        if c.kv_heads != c.heads else ""
    con.print(table(f"Logical HBM traffic, one (batch, query head): {shape}", cols, body,
                    caption="Logical bytes: cold cache, no L2 reuse, no sector padding "
                            "(spec §4, see docs/model.md). Ratios "
                            "only within one masking condition; unmasked and causal are separate "
                            f"experiments{gqa}."))
    passes = [f"{c.condition(causal)} {t.kv_passes(causal):g}"
              for name, causal in (("flash", False), ("flash-causal", True)) if name in t.rows]
    if passes:
        tr = -(-c.nq // c.block_q)
        con.print(f"FA-2 passes over K/V ({tr:,} query tile{'' if tr == 1 else 's'}): " + ", ".join(passes))
    if ratio:
        con.print(f"ratio {ratio[0]} / {ratio[1]}: {ratio[2]:.2f}x (total bytes, same masking condition)")
    for line in mods_note(c):
        con.print(line)
    if "naive-causal-eager" in t.rows:
        con.print("naive-causal-eager assumes:")
        for a in t["naive-causal-eager"].assumptions:
            con.print(f"  - {a}")
    if args.items:
        for r in t.rows.values():
            items = ledger(r) + [["Total" if k == "reads" else "", "", k, f"{v:,}", f"{v / MiB:,.2f}", ""]
                                 for k, v in (("reads", r.reads), ("writes", r.writes), ("total", r.total))]
            con.print(table(f"{r.label}: ledger", ["Kernel", "Tensor", "Dir", "Bytes", "MiB", "What"], items,
                            caption="; ".join(r.assumptions)))
    if dev:
        _print_roofline(con, t, dev, points)
    return 0


def _print_roofline(con, t, dev, points) -> None:
    c = t.config
    pk = rl.peak(dev, c.dtype)
    con.print()
    con.print(f"Roofline on {dev.label}: {pk / rl.TERA:,.0f} TFLOP/s dense {c.dtype} / "
              f"{dev.hbm / rl.TERA:g} TB/s HBM = ridge {rl.ridge(dev, c.dtype):.0f} FLOP/byte; "
              f"elementwise work at the {dev.fp32 / rl.TERA:g} TFLOP/s FP32 CUDA-core peak. "
              f"L2 {dev.l2 / MiB:g} MiB, {dev.sms} SMs.")
    body = []
    for r in t.rows.values():
        for p in points[r.name]:
            body.append([r.name, p.name, f"{p.flops:,}", f"{p.nbytes:,}", f"{p.intensity:,.1f}", p.bound,
                         f"{p.floor_s * 1e6:,.2f}"])
        body.append([r.name, "time floor (kernels in sequence)", "", "", "", "",
                     f"{rl.time_floor(points[r.name]) * 1e6:,.2f}"])
    con.print(table("Per (batch, query head): intensity and time floor = "
                    "max(FLOPs / peak, bytes / bandwidth)",
                    ["Configuration", "Kernel", "FLOPs", "HBM bytes", "FLOP/byte", "Bound", "Floor µs"], body,
                    caption="Peaks are dense and not sustained; a floor is a bound no kernel beats, not a "
                            "prediction. " + "; ".join(f"{k}: {v}" for k, v in dev.sources.items()
                                                        if k in ("flops", "hbm"))))


# --- footprint --------------------------------------------------------------------------------------
def cmd_footprint(args) -> int:
    from attnscope.model.footprint import footprint

    f = footprint(args.n, args.d, args.dtype, args.block_q, args.block_kv, nq=args.nq, nk=args.nk,
                  heads=args.heads, layers=args.layers, batch=args.batch,
                  devices=None if args.device is None else [args.device])
    if args.json:
        print_json(f.to_json())
        return 0
    p = f.params
    con = console()
    shape = (f"Nq = {p['nq']:,}, Nk = {p['nk']:,}, d = {p['d']}, {p['dtype']}, B_r = {p['block_q']}, "
             f"B_c = {p['block_kv']}, {p['heads']} heads, {p['layers']} layers, batch {p['batch']}")
    for title, first, scopes in ((f"Memory scopes: {shape}", "Scope", f.scopes),
                                 ("Tile buffers of one CTA (SRAM)", "Buffer", f.tiles)):
        con.print(table(title, [first, "Counts", "Bytes", "Size", "Assumption"],
                        [[s.name, s.counts, f"{s.nbytes:,}", _size(s.nbytes), s.assumption] for s in scopes]))
    con.print(table("Shared-memory fit", ["Device", "Buffers", "Size", "Per-block max", "Carve-out", "Fits"],
                    [[x.device, x.what, _size(x.nbytes), _size(x.limit), _size(x.carveout),
                      "yes" if x.fits else "NO"] for x in f.fits],
                    caption="Per-block max is the opt-in limit of one thread block; the carve-out is per SM "
                            "(CUDA Programming Guide). Extra pipeline stages add a K and a V tile each."))
    return 0


# --- tiles ------------------------------------------------------------------------------------------
def _ranges(lo: int, hi: int) -> str:
    """Tiles lo..hi (1-based, inclusive) as text; 'none' when empty."""
    return "none" if hi < lo else (str(lo) if lo == hi else f"{lo}..{hi}")


#: Largest grid for which `tiles --json` lists every tile number (beyond: first/last/count only).
JSON_LIST_LIMIT = 4096
#: Masked tiles shown in the row-class table (first and last halves; the rest elided with a note).
TABLE_ROWS = 24


def cmd_tiles(args) -> int:
    from attnscope.model.tiles import Grid

    nq = args.n if args.nq is None else args.nq
    nk = args.n if args.nk is None else args.nk
    g = Grid(nq, nk, args.block_q, args.block_kv, causal=args.causal, window=window_arg(args.window))
    i = min(5, g.n_q_tiles) if args.query_tile is None else args.query_tile
    r0, r1 = g.rows(i)  # validates the query tile
    t = g.kv_tiles(i)
    tc = g.n_kv_tiles
    passes = g.kv_rows_total() / nk
    right0 = max(t.full_last, t.full_first - 1) + 1  # the first right-masked tile
    runs = {"loaded": [(t.first, t.last)], "skipped": [(1, t.first - 1), (max(t.last, t.first - 1) + 1, tc)],
            "full": [(t.full_first, t.full_last)], "masked": [(t.first, t.full_first - 1), (right0, t.last)],
            "left_masked": [(t.first, t.full_first - 1)], "right_masked": [(right0, t.last)]}
    runs = {k: [(a, b) for a, b in v if b >= a] for k, v in runs.items()}
    n_masked = sum(b - a + 1 for a, b in runs["masked"])
    half = TABLE_ROWS // 2  # first and last masked tiles shown, the rest elided
    head = [j for a, b in runs["masked"] for j in range(a, min(b, a + TABLE_ROWS) + 1)]
    tail = [j for a, b in runs["masked"] for j in range(max(a, b - TABLE_ROWS), b + 1)]
    shown = head if n_masked <= TABLE_ROWS else head[:half] + tail[-half:]
    if args.json:
        out = {"query_tile": i, "rows": [r0, r1]}
        listed = tc <= JSON_LIST_LIMIT
        for k, v in runs.items():
            out[k] = [j for a, b in v for j in range(a, b + 1)] if listed else None
            out[k + "_span"] = {"first": v[0][0], "last": v[-1][1],
                                "count": sum(b - a + 1 for a, b in v)} if v else None
            if k in ("skipped", "masked"):  # two runs under a window: before and after the loaded band
                out[k + "_runs"] = [list(r) for r in v]
        out["row_classes"] = {str(j): {k: (list(v) if v else None) for k, v in g.row_classes(i, j).items()}
                              for j in shown}
        out.update(params={"nq": nq, "nk": nk, "block_q": g.block_q, "block_kv": g.block_kv,
                           "causal": g.causal, "window": None if g.window is None else list(g.window)},
                   n_q_tiles=g.n_q_tiles, n_kv_tiles=tc, kv_rows_loaded=g.kv_rows_loaded(i),
                   cols={str(j): list(g.cols(j)) for a, b in runs["loaded"] for j in range(a, b + 1)}
                   if listed else None,
                   kv_passes=passes, tile_pairs=g.loaded_pairs()[0])
        if not listed or len(shown) < n_masked:
            out["elided"] = (f"tile lists are given only up to {JSON_LIST_LIMIT:,} KV tiles and row classes "
                             f"for {TABLE_ROWS} masked tiles (first and last); the *_span fields are exact")
        print_json(out)
        return 0
    con = console()
    left, right = g.bounds
    how = ("causal (bottom-right aligned)" if g.causal else "unmasked") if g.window is None else \
        f"{'causal, ' if g.causal else ''}window {g.window} (effective ({left}, {right}), bottom-right)"
    con.print(f"Grid: Nq = {nq:,}, Nk = {nk:,}, B_r = {g.block_q:,}, B_c = {g.block_kv:,}, "
              f"{how}: {g.n_q_tiles:,} query tile{'' if g.n_q_tiles == 1 else 's'} x {tc:,} KV "
              f"tile{'' if tc == 1 else 's'} (1-based)")
    con.print(f"Query tile {i:,}: rows {r0:,}..{r1:,} ({r1 - r0 + 1:,} rows)")
    n_loaded = max(0, t.last - t.first + 1)
    con.print(f"  loads   KV tiles {_ranges(t.first, t.last)} ({n_loaded:,} of {tc:,}; "
              f"{g.kv_rows_loaded(i):,} K rows and as many V rows)")
    why = ": every column in the future, never loaded" if g.masking else "; unmasked loads every tile"
    if left >= 0:
        why = ": every column outside the window, never loaded"
    skipped = " and ".join(_ranges(a, b) for a, b in runs["skipped"]) or "none"
    con.print(f"  skips   KV tiles {skipped} ({tc - n_loaded:,}{why})")
    con.print(f"  full    KV tiles {_ranges(t.full_first, t.full_last)} (loaded, no mask arithmetic)")
    if left < 0:
        con.print(f"  masked  KV tiles {_ranges(right0, t.last)} (loaded, straddle the diagonal: mask "
                  "before m and l)")
    else:
        con.print(f"  masked  KV tiles {_ranges(t.first, t.full_first - 1)} (left-masked: straddle the "
                  f"window's left edge) and {_ranges(right0, t.last)} (right-masked: straddle its right "
                  "edge), mask before m and l")
    classes = ["Rows fully masked", "Rows triangular", "Rows fully permitted"]
    if left >= 0:
        classes += ["Rows left edge", "Rows fully masked (left)"]
    body = [[str(j), "{}..{}".format(*g.cols(j)), *("{}..{}".format(*v) if v else "-"
                                                    for v in g.row_classes(i, j).values())] for j in shown]
    if body:
        note = None if len(shown) == n_masked else \
            f"{n_masked - len(shown):,} masked tiles in the middle not shown (--json gives the spans)"
        con.print(table("Masked tiles: which rows see them how", ["KV tile", "Columns", *classes], body,
                        caption=note))
    pairs = g.loaded_pairs()[0]
    con.print(f"Whole grid: {passes:g} pass{'' if passes == 1 else 'es'} over K/V"
              + (f"; {pairs:,} of {g.n_q_tiles * tc:,} tile pairs visited" if g.window is not None else ""))
    return 0


# --- amdahl -----------------------------------------------------------------------------------------
#: Most `--f` values `amdahl` takes (rows of its sensitivity table).
MAX_F_VALUES = 100


def cmd_amdahl(args) -> int:
    from attnscope.model import amdahl

    fs = args.f or [0.15]
    if len(fs) > MAX_F_VALUES:  # one table row each: a table of thousands of rows is no sensitivity table
        raise InputError(f"--f: expected at most {MAX_F_VALUES} values, got {len(fs):,}")
    head = amdahl.project(fs[0], args.s)
    table_fs = fs if len(fs) > 1 else amdahl.DEFAULT_SENSITIVITY
    sens = amdahl.sensitivity(args.s, table_fs)
    carry_args = (args.part_ms, args.inner_ms, args.outer_ms)
    bound = None
    if any(x is not None for x in carry_args):
        if any(x is None for x in carry_args):
            given = [f for f, x in zip(("--part-ms", "--inner-ms", "--outer-ms"), carry_args, strict=True)
                     if x is not None]
            raise InputError("--part-ms: expected --part-ms, --inner-ms and --outer-ms together, got only "
                             + ", ".join(given))
        bound = amdahl.carry(*carry_args, args.s, names={"part_ms": "--part-ms", "inner_ms": "--inner-ms",
                                                         "outer_ms": "--outer-ms", "s": "--s"})
    if args.json:
        out = head.to_json() | {"sensitivity": [x.to_json() for x in sens]}
        if bound:
            out["carry"] = bound.to_json()
        print_json(out)
        return 0
    con = console()
    con.print(f"f = {head.f:g} (time share), S = {head.s:g}: speedup = 1 / ((1 - f) + f / S) = "
              f"{head.speedup:.3f}x, latency reduction {head.reduction * 100:.2f} %")
    con.print(table(f"Sensitivity, same S = {args.s:g}", ["f (time share)", "Speedup", "Latency reduction"],
                    [[f"{x.f * 100:g} %", f"{x.speedup:.3f}x", f"{x.reduction * 100:.2f} %"] for x in sens],
                    caption="f must be a measured time share inside a stated boundary; a FLOP share is not a "
                            "time share (spec §5.1)."))
    if bound:
        con.print(f"Inner boundary: {bound.inner_ms:g} ms -> {bound.inner_projected_ms:.2f} ms "
                  f"({bound.inner_speedup:.4f}x, {bound.inner_reduction * 100:.2f} % reduction; "
                  f"f = {bound.f_inner:.4f})")
        con.print(f"Outer boundary: {bound.outer_ms:g} ms -> {bound.outer_projected_ms:.2f} ms "
                  f"({bound.outer_speedup:.4f}x, {bound.outer_reduction * 100:.2f} % reduction), holding the "
                  f"other {bound.outer_ms - bound.inner_ms:g} ms fixed (an assumption, not a measurement)")
    return 0
