"""`attnscope traffic --lengths / --cache-lens`: the serving layouts' ledgers (model/serving.py)."""

from __future__ import annotations

from attnscope.cli._out import MiB, console, int_list, ledger, print_json, table
from attnscope.errors import expect


def add_flags(p) -> None:
    """Add the serving-layout flags to the `traffic` parser ``p``."""
    g = p.add_argument_group("serving layouts (whole-batch ledgers instead of one (batch, head))")
    g.add_argument("--lengths", default=None, metavar="N1,N2,...",
                   help="packed variable-length prefill: query lengths of the sequences (0 allowed); "
                        "bytes per query head summed over the sequences; uses --d, --dtype, --block-q, "
                        "--block-kv, --heads, --kv-heads, --lse, --rows")
    g.add_argument("--kv-lengths", default=None, metavar="N1,N2,...",
                   help="packed: key lengths per sequence (default: --lengths)")
    g.add_argument("--no-tma", action="store_true",
                   help="packed: the kernel's pointer-load path (ragged K/V tiles read no rows past their "
                        "sequence; default: TMA, which reads whole tiles and discards the extra rows)")
    add_cache_flags(g)


def add_cache_flags(g) -> None:
    """Add the KV-cache flags (--cache-lens, --page-size, --capacity, --splits, --kv-dtype) to ``g``, a
    parser or argument group of `traffic` or `bytes`."""
    g.add_argument("--cache-lens", default=None, metavar="L1,L2,...",
                   help="decode / chunked prefill against a KV cache: keys per sequence (counting the "
                        "--nq new queries); the whole call's bytes; with --page-size a paged cache")
    g.add_argument("--page-size", type=int, default=None,
                   help="paged KV cache: rows per page, a power of two (block-table reads, the unused "
                        "tail of each last page); without it a dense cache of --capacity rows")
    g.add_argument("--capacity", type=int, default=None,
                   help="dense cache rows per sequence (default: the longest --cache-lens)")
    g.add_argument("--splits", type=int, default=1, help="split-KV programs per sequence (default 1)")
    g.add_argument("--kv-dtype", default=None, choices=("fp16", "bf16", "fp8"),
                   help="--cache-lens: the K/V cache's element type (default: --dtype); fp8 is e4m3, one "
                        "byte per element plus one fp32 K and V scale per program")


def check_unused(args) -> None:
    """Without --lengths / --cache-lens, the flags that only qualify them are refused."""
    for flag in ("kv_lengths", "page_size", "capacity", "kv_dtype"):
        expect(getattr(args, flag) is None, "--" + flag.replace("_", "-"),
               "to come with --lengths or --cache-lens", getattr(args, flag))
    expect(not args.no_tma, "--no-tma", "to come with --lengths", args.no_tma)


def run(args, names, mods: dict | None = None) -> int:
    """`traffic --lengths ...` (packed prefill) or `traffic --cache-lens ...` (paged / dense-cache decode);
    ``mods``: the score mods' keyword arguments (window, softcap, sinks) of the model calls."""
    mods = mods or {}
    from attnscope.model.serving import packed, paged

    expect(args.lengths is None or args.cache_lens is None, "--cache-lens", "not together with --lengths",
           args.cache_lens)
    expect(args.device is None and args.ratio is None, "--device",
           "no --device / --ratio with --lengths or --cache-lens", args.device or args.ratio)
    con = console()
    if args.lengths is not None:
        for flag in ("page_size", "capacity", "kv_dtype"):
            expect(getattr(args, flag) is None, "--" + flag.replace("_", "-"), "only with --cache-lens",
                   getattr(args, flag))
        lk = int_list("--kv-lengths", args.kv_lengths) if args.kv_lengths is not None else None
        p = packed(int_list("--lengths", args.lengths), lk, args.d, args.dtype, args.block_q, args.block_kv,
                   heads=args.heads, kv_heads=args.kv_heads, lse=args.lse, rows=names, tma=not args.no_tma,
                   **mods)
        if args.json:
            print_json(p.to_json())
            return 0
        c = p.config
        body = []
        for r in p.rows.values():
            base = p.rows.get(r.baseline)
            red = f"{base.total / r.total:.2f}x vs {r.baseline}" if base is not None and base is not r else ""
            body.append([r.label, f"{r.reads:,}", f"{r.writes:,}", f"{r.total:,}", f"{r.total / MiB:,.2f}",
                         f"{r.total * c.heads / MiB:,.2f}", red])
        con.print(table(f"Packed prefill, {len(p.lengths_q)} sequences ({sum(p.lengths_q):,} query / "
                        f"{sum(p.lengths_k):,} key rows), d = {c.d}, {c.dtype}, B_r = {c.block_q}, "
                        f"B_c = {c.block_kv}, {p.work_items} work items: bytes per query head",
                        ["Configuration", "Reads B", "Writes B", "Total B", "Total MiB",
                         f"Total x {c.heads} heads MiB", "Reduction"], body,
                        caption="Each sequence's dense ledger, summed line by line (logical bytes, bottom-"
                                "right causal per sequence)."))
        rows = p.rows.values()
    else:
        expect(args.kv_lengths is None, "--kv-lengths", "only with --lengths", args.kv_lengths)
        expect(not args.no_tma, "--no-tma", "only with --lengths", args.no_tma)
        nq = 1 if args.nq is None else args.nq  # 0 reaches the model's check, not a silent 1
        g = paged(int_list("--cache-lens", args.cache_lens), args.page_size, nq=nq, d=args.d,
                  dtype=args.dtype, heads=args.heads, kv_heads=args.kv_heads, num_splits=args.splits,
                  block_kv=args.block_kv, capacity=args.capacity, lse=args.lse, kv_dtype=args.kv_dtype,
                  **mods)
        if args.json:
            print_json(g.to_json())
            return 0
        print_paged(con, g)
        rows = [g.row]
    if args.items and args.lengths is not None:
        for r in rows:
            items = ledger(r, mib=False)
            con.print(table(f"{r.label}: ledger", ["Kernel", "Tensor", "Dir", "Bytes", "What"], items))
    return 0


def print_paged(con, g) -> None:
    """Print a decode / chunked-prefill ledger (`model.serving.Paged`) as one table with its total."""
    r = g.row
    body = ledger(r)
    body.append(["Total", "", "", f"{r.total:,}", f"{r.total / MiB:,.2f}", "reads + writes"])
    body.append(["allocated, not read", "K, V", "", f"{g.tail:,}", f"{g.tail / MiB:,.2f}",
                 "end of each last page" if g.page_size else "cache rows past each length"])
    con.print(table(f"{r.label}: {len(g.cache_lens)} sequences, {sum(g.cache_lens):,} keys, "
                    f"d = {g.config.d}, {g.config.dtype}, K/V {g.kv_dtype}, Hq = {g.config.heads}, "
                    f"Hkv = {g.config.kv_heads}: the whole call",
                    ["Kernel", "Tensor", "Dir", "Bytes", "MiB", "What"], body,
                    caption="; ".join(r.assumptions)))
