"""Logical HBM traffic of the serving layouts: a packed batch of prompts and a step against a KV cache.

`packed`: a packed variable-length prefill (kernels/varlen.py), the line-by-line sum of its sequences'
dense ledgers (model/traffic.py) plus the varlen kernel's work-list reads and the rows its ragged TMA
tiles read past a sequence's end. `paged`: one split-KV decode / chunked-prefill step (Flash-Decoding,
kernels/decode/) against a paged or dense KV cache, whole call: block-table reads, the valid K/V rows
once per kv head, the split partials, and the allocated-but-unread tail of each last page.
`decode_step`: `paged`'s bytes per decode step of a whole generation (all layers and sequences, mean over
the steps) and their time at the DRAM bandwidth, at the queries' dtype or an FP8 cache (the report's line).
Score mods: both take ``window``, ``softcap`` and ``sinks`` (`model.traffic.Config`). A window shrinks each
sequence's K/V reads to the KV tiles it visits (model/tiles.py; decode: the blocks of `window_kv_bounds0`
for the sequence's last ``nq`` rows); softcap moves no byte; sinks add one FP32 read per program.
Cost: a loop over the sequences, never over tokens.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace

from attnscope.errors import InputError, choice, expect, is_int, positive_int
from attnscope.model import roofline
from attnscope.model.flops import visible_pairs
from attnscope.model.tiles import Grid, bounded_window, floor_sum, window_kv_bounds0
from attnscope.model.traffic import (
    BUILDERS,
    CAUSAL,
    DTYPE_BYTES,
    ROW_NAMES,
    SPEC_ROWS,
    STAT_BYTES,
    Config,
    Kernel,
    Row,
    Transfer,
    read,
    row_names,
    write,
)

#: K/V cache element types of the decode ledger (`paged`): the queries' dtype, or e4m3 with fp32 scales.
KV_DTYPES = ("fp16", "bf16", "fp8")


def _lengths(name: str, values) -> tuple[int, ...]:
    """Validate a list of non-negative integer lengths (bools refused)."""
    try:
        vals = tuple(values)
    except TypeError:
        raise InputError(f"{name}: expected a list of non-negative integers, got {values!r}") from None
    expect(len(vals) > 0, name, "at least one length", list(vals))
    expect(all(is_int(v) and v >= 0 for v in vals), name, "a list of non-negative integers", list(vals))
    return vals


def _head(what: str) -> str:
    """A ledger line's text up to its first comma outside brackets ("Q [Nq, d], each ..." -> "Q [Nq, d]")."""
    depth = 0
    for i, ch in enumerate(what):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            return what[:i]
    return what


def _sum_rows(rows: list[tuple[Row, int]], n: int) -> Row:
    """Line-by-line sum of rows with the same structure, each (row, count) standing for ``count`` sequences
    of a packed batch of ``n`` (a shape repeated in the batch is built once)."""
    first = rows[0][0]
    kernels = []
    for ki, k in enumerate(first.kernels):
        transfers = tuple(
            Transfer(t.tensor, t.direction, sum(r.kernels[ki].transfers[ti].nbytes * c for r, c in rows),
                     f"{_head(t.what)}, summed over {n} sequences")
            for ti, t in enumerate(k.transfers))
        kernels.append(Kernel(k.name, sum(r.kernels[ki].flops * c for r, c in rows), k.unit, transfers))
    return Row(first.name, first.label + ", packed", first.condition, first.baseline, tuple(kernels),
               first.assumptions)


def _add_bytes(row: Row, extra: dict[tuple[str, str], int]) -> Row:
    """Add bytes to the first transfer of each (tensor, direction) in ``extra``."""
    extra = dict(extra)
    kernels = []
    for k in row.kernels:
        ts = []
        for t in k.transfers:
            add = extra.pop((t.tensor, t.direction), 0)
            ts.append(Transfer(t.tensor, t.direction, t.nbytes + add, t.what) if add else t)
        kernels.append(Kernel(k.name, k.flops, k.unit, tuple(ts)))
    assert not extra, f"no transfer for {extra}"  # internal: every row reads Q and writes O
    return Row(row.name, row.label, row.condition, row.baseline, tuple(kernels), row.assumptions)


#: Per work item of the varlen kernel, each query head's program reads its (sequence, query tile) pair
#: and the four cu_seqlens values bounding its sequence: 6 int32.
VARLEN_ITEM_BYTES = 6 * 4


@dataclass(frozen=True)
class Packed:
    """Traffic of one packed variable-length prefill call. Bytes per query head, summed over sequences
    (``*_all`` in JSON: times the query heads)."""

    lengths_q: tuple[int, ...]
    lengths_k: tuple[int, ...]
    config: Config  # d, dtype, tiles, heads, lse; nq / nk are the longest lengths
    rows: dict[str, Row]
    work_items: int  # (sequence, query tile) pairs: sum of ceil(Nq_s / B_r)

    def __getitem__(self, name: str) -> Row:
        return self.rows[choice("row", name, self.rows)]

    def to_json(self) -> dict:
        c, h = self.config, self.config.heads
        rows = [r.to_json(self.rows[r.baseline].total / r.total if r.baseline in self.rows else None, h)
                for r in self.rows.values()]
        return {"params": {"layout": "packed", "lengths_q": list(self.lengths_q),
                           "lengths_k": list(self.lengths_k), "sequences": len(self.lengths_q),
                           "total_q": sum(self.lengths_q), "total_k": sum(self.lengths_k),
                           "work_items": self.work_items, "d": c.d, "dtype": c.dtype,
                           "bytes_per_element": c.b, "block_q": c.block_q, "block_kv": c.block_kv,
                           "heads": c.heads, "kv_heads": c.kv_heads, "lse": c.lse, **_mods_json(c),
                           "per": "one query head, summed over the sequences; *_all fields are the "
                                  "whole call"},
                "rows": rows}


def packed(lengths_q, lengths_k=None, d: int = 128, dtype: str = "fp16", block_q: int = 128,
           block_kv: int = 64, *, heads: int = 1, kv_heads: int | None = None, lse: bool = False,
           rows=SPEC_ROWS, tma: bool = True, window=None, softcap: float = 0.0,
           sinks: bool = False) -> Packed:
    """Logical HBM bytes of a packed variable-length prefill (`flash_attention_varlen`), per query head.

    Each sequence with queries and keys contributes its dense ledger (``traffic`` with Nq_s, Nk_s, causal
    bottom-right per sequence), summed line by line; a sequence with queries but no keys reads Q and
    writes O (zeros; and the LSE), one with no queries moves nothing. The flash rows add the work list
    (`VARLEN_ITEM_BYTES` per item) and, with ``tma``, the rows ragged K/V tiles read past a sequence's
    end (`_ragged_overread_rows`).

    Parameters
    ----------
    lengths_q: query lengths of the B sequences (>= 0), in packing order. lengths_k: key lengths
        (default: lengths_q).
    d, dtype, block_q, block_kv, heads, kv_heads, lse, rows: as `traffic`.
    tma: K/V by TMA (True, the kernel's default for 16-byte aligned K/V) or by predicated loads (False:
        no rows past a sequence are read).
    window, softcap, sinks: the score mods, per sequence (bottom-right, as causal), as `traffic`.
    """
    lq = _lengths("lengths_q", lengths_q)
    lk = lq if lengths_k is None else _lengths("lengths_k", lengths_k)
    expect(len(lk) == len(lq), "lengths_k", f"{len(lq)} lengths (one per sequence, as lengths_q)", list(lk))
    full = [(a, b) for a, b in zip(lq, lk, strict=True) if a > 0 and b > 0]
    expect(len(full) > 0, "lengths_q", "at least one sequence with Nq >= 1 and Nk >= 1",
           f"lengths_q {list(lq)}, lengths_k {list(lk)}")
    names = row_names(rows, ROW_NAMES)
    cfg = Config(nq=max(lq), nk=max(lk), d=d, dtype=dtype, block_q=block_q, block_kv=block_kv, heads=heads,
                 kv_heads=kv_heads, lse=lse, window=window, softcap=softcap, sinks=sinks)
    no_keys = sum(a for a, b in zip(lq, lk, strict=True) if b == 0)  # query rows with no key at all
    items = sum(-(-a // block_q) for a in lq)
    shapes = collections.Counter(full)  # (Nq, Nk) -> sequences of that shape, in first-seen order
    out = {}
    for name in names:
        per_shape = [(BUILDERS[name](replace(cfg, nq=a, nk=b)), c) for (a, b), c in shapes.items()]
        row = _sum_rows(per_shape, len(lq))
        if no_keys:
            extra = {("Q", "read"): no_keys * d * cfg.b, ("O", "write"): no_keys * d * cfg.b}
            if name.startswith("flash") and lse:
                extra[("LSE", "write")] = no_keys * STAT_BYTES
            if name.startswith("flash") and sinks:  # their programs read the sink (LSE = sink, O = 0)
                extra[("sinks", "read")] = sum(-(-a // block_q) for a, b in zip(lq, lk, strict=True)
                                               if b == 0) * STAT_BYTES
            row = _add_bytes(row, extra)
        if name.startswith("flash"):
            k = row.kernels[0]
            extra = [read("meta", items * VARLEN_ITEM_BYTES,
                          f"work list + cu_seqlens: {items} (sequence, query tile) items x 6 int32")]
            if tma:
                over = _ragged_overread_rows(lq, lk, block_q, block_kv, name == "flash-causal", cfg.window)
                extra += [read("K", over * d * cfg.b, "K rows past the sequence ends read by ragged TMA "
                                                      f"tiles and discarded ({over} rows)"),
                          read("V", over * d * cfg.b, "V, the same rows")]
            row = Row(row.name, row.label, row.condition, row.baseline,
                      (Kernel(k.name, k.flops, k.unit, k.transfers + tuple(extra)),),
                      row.assumptions + ("building the work list on the device (O(B) int32, once per call, "
                                         "shared by all heads) and the grid's idle items are not counted",))
        out[name] = row
    return Packed(lq, lk, cfg, out, items)


def _ragged_overread_rows(lq, lk, block_q: int, block_kv: int, causal: bool, window=None) -> int:
    """K rows (= V rows) that TMA tiles read past their sequence's end, per query head, summed over the
    sequences (closed form per sequence). Sequence s's last KV tile is ragged when Nk % B_c != 0; every
    query tile that loads it (`Grid.loaded_pairs`' second count: all T_r unmasked, a suffix causal or
    windowed) reads ``min(k0 + T_c B_c, total_k) - (k0 + Nk)`` extra rows (zeros past the tensor's end are
    not read)."""
    total_k = sum(lk)
    k0 = 0
    rows = 0
    for nq, nk in zip(lq, lk, strict=True):
        if nq and nk and nk % block_kv:
            t_c = -(-nk // block_kv)
            n_tiles = Grid(nq, nk, block_q, block_kv, causal=causal, window=window).loaded_pairs()[1]
            rows += n_tiles * (min(k0 + t_c * block_kv, total_k) - (k0 + nk))
        k0 += nk
    return rows


#: `paged`'s default KV block: a window's reads start at the block holding its first key.
WINDOW_BLOCK = 128


@dataclass(frozen=True)
class Paged:
    """Traffic of one decode / chunked-prefill step against a KV cache, the whole call (all heads).

    ``row`` is the ledger (its total is what moves); ``tail`` are bytes of K/V allocated to the
    sequences but never read (the unused end of each last page, or of a dense cache's rows)."""

    cache_lens: tuple[int, ...]
    nq: int
    page_size: int | None
    capacity: int | None
    num_splits: int
    config: Config
    row: Row
    tail: int
    pages: int  # pages holding keys (paged) or 0
    kv_dtype: str  # the K/V cache's element type (dtype, or fp8 with fp32 scales)

    def to_json(self) -> dict:
        c, r = self.config, self.row
        return {"params": {"layout": "paged" if self.page_size else "dense-cache",
                           "cache_lens": list(self.cache_lens), "nq": self.nq, "page_size": self.page_size,
                           "capacity": self.capacity, "num_splits": self.num_splits, "pages": self.pages,
                           "d": c.d, "dtype": c.dtype, "bytes_per_element": c.b, "kv_dtype": self.kv_dtype,
                           "block_kv": c.block_kv, "heads": c.heads, "kv_heads": c.kv_heads, "lse": c.lse,
                           **_mods_json(c),
                           "per": "the whole call"},
                "rows": [{"name": r.name, "label": r.label, "reads": r.reads, "writes": r.writes,
                          "total": r.total, "flops": r.flops, "allocated_not_read": self.tail,
                          "assumptions": list(r.assumptions), "items": [k.to_json() for k in r.kernels]}]}


def paged(cache_lens, page_size: int | None = None, *, nq: int = 1, d: int = 128, dtype: str = "bf16",
          heads: int = 32, kv_heads: int | None = None, num_splits: int = 1, block_kv: int = WINDOW_BLOCK,
          capacity: int | None = None, lse: bool = False, kv_dtype: str | None = None, window=None,
          softcap: float = 0.0, sinks: bool = False) -> Paged:
    """Logical HBM bytes of one split-KV decode / chunked-prefill step (`flash_decode`), whole call.

    The kernel (Flash-Decoding, kernels/decode/) runs one program per (sequence, kv head, split); each
    streams its split's keys once for all ``heads / kv_heads`` query heads of its group and all ``nq``
    query rows (the last ``nq`` positions of the sequence, which ``cache_lens`` counts). Lines:

    - Q: read by every split's program: ``B * Hq * nq * d * S`` elements;
    - cache_seqlens: one int32 per program;
    - block table (paged only): per kv head, one int32 per (KV block of ``block_kv`` keys, page) pair the
      keys touch: ``ceil(len / min(page_size, block_kv))`` per sequence (both powers of two, so they nest);
    - K and V: only the valid rows, once per kv head: ``Hkv * sum(len) * d`` each (masked loads), at
      ``kv_dtype``'s width (default ``dtype``; ``fp8``: one byte per element, e4m3);
    - k_scale, v_scale (``kv_dtype="fp8"`` only): one fp32 each per program (per-head scales: the
      program's kv head);
    - S = 1: O (and LSE) written once; S > 1: fp32 partials O_s [nq, d] and lse_s per (sequence, query
      head, split) written by phase 1 and read by the merge, which writes O (and LSE).

    ``tail`` (not in the total): K/V bytes allocated but not read -- the end of each sequence's last page
    (``ceil(len / P) * P - len`` rows), or for a dense cache (``page_size`` None) ``capacity - len`` rows.
    ``flops``: 4 * Hq * d * (visible pairs), bottom-right causal among the nq queries.

    Score mods (``window``, ``softcap``, ``sinks``, as `traffic`): with a window each sequence reads only
    the KV blocks its ``nq`` queries visit (`_window_blocks`), and the block table only their entries;
    rows before the window are allocated but skipped (said in an assumption, not in the total). Sinks: one
    FP32 ``sinks[h]`` per (sequence, query head) read by the kernel that writes O; softcap: no bytes.
    """
    lens = _lengths("cache_lens", cache_lens)
    for name, v in (("nq", nq), ("num_splits", num_splits), ("block_kv", block_kv)):
        positive_int(name, v)
    if page_size is not None:
        positive_int("page_size", page_size)
        expect(page_size & (page_size - 1) == 0, "page_size", "a power of two", page_size)
        expect(block_kv & (block_kv - 1) == 0, "block_kv", "a power of two (pages and blocks nest)", block_kv)
        expect(capacity is None, "capacity", "None with a paged cache (pages size it)", capacity)
    else:
        capacity = max(lens) if capacity is None else positive_int("capacity", capacity)
        expect(capacity >= max(lens), "capacity", f">= the longest cache length ({max(lens)})", capacity)
    expect(all(n >= nq for n in lens), "cache_lens", f"lengths >= nq ({nq}): the queries are the last nq "
           "positions of each sequence and are counted in it", list(lens))
    cfg = Config(nq=nq, nk=max(max(lens), 1), d=d, dtype=dtype, block_kv=block_kv, heads=heads,
                 kv_heads=kv_heads, lse=lse, window=window, softcap=softcap, sinks=sinks)
    kv_dtype = dtype if kv_dtype is None else choice("kv_dtype", kv_dtype, KV_DTYPES)
    expect(kv_dtype in (dtype, "fp8"), "kv_dtype", f"{dtype} (as dtype) or fp8", kv_dtype)
    kv_b = DTYPE_BYTES[kv_dtype]
    B, hq, hkv, b, S = len(lens), cfg.heads, cfg.kv_heads, cfg.b, num_splits
    keys = sum(lens)
    spans = _window_blocks(lens, nq, block_kv, cfg.window)  # per sequence: keys [lo, hi) read
    rows_q = B * hq * nq
    q_bytes = rows_q * d * b
    transfers = [
        read("Q", q_bytes * S, f"Q [B, Hq, {nq}, d], read by each of the {S} split program(s) of its group"),
        read("cache_seqlens", B * hkv * S * 4, "one int32 per (sequence, kv head, split) program"),
    ]
    pages = 0
    if page_size is not None:
        pages = sum(-(-n // page_size) for n in lens)
        unit = min(page_size, block_kv)
        entries = sum(-(-hi // unit) - lo // unit for lo, hi in spans)
        transfers.append(read("block_table", hkv * entries * 4,
                            f"int32 page ids: {entries} (block, page) pairs per kv head, x {hkv} kv heads"))
        tail_rows = pages * page_size - keys
    else:
        tail_rows = B * capacity - keys
    read_rows = sum(hi - lo for lo, hi in spans)
    kv = hkv * read_rows * d * kv_b
    where = "" if cfg.window is None else f" in the window's blocks ({keys - read_rows:,} rows skipped)"
    transfers += [read("K", kv, f"valid K rows ({kv_dtype}){where}, once per kv head (the GQA group shares "
                                "them)"),
                  read("V", kv, "valid V rows, the same")]
    if kv_dtype == "fp8":
        transfers.append(read("k_scale, v_scale", B * hkv * S * 2 * STAT_BYTES,
                              "one fp32 K and one V scale per (sequence, kv head, split) program"))
    part = rows_q * S * (d + 1) * STAT_BYTES  # O_s [d] and lse_s, fp32, per (row, split)
    out = [write("O", q_bytes, f"O [B, Hq, {nq}, d]")]
    if lse:
        out.append(write("LSE", rows_q * STAT_BYTES, "logsumexp, one FP32 per query row"))
    if sinks:
        out.append(read("sinks", B * hq * STAT_BYTES, "sinks[h], one FP32 per (sequence, query head), merged "
                                                      "once with O; softcap and sinks move no other byte"))
    pairs = sum(visible_pairs(nq, n, True) if cfg.window is None else
                Grid(nq, n, causal=True, window=cfg.window).visible_pairs() for n in lens)  # n >= nq >= 1
    flops = 4 * hq * d * pairs
    if S == 1:
        kernels = (Kernel("split-KV attention", flops, "tensor", tuple(transfers + out)),)
    else:
        kernels = (Kernel("phase 1: split-KV attention", flops, "tensor",
                          (*transfers, write("partials", part, f"O_s and lse_s (fp32) of {S} splits"))),
                   Kernel("phase 2: logsumexp merge", 0, "elementwise",
                          tuple([read("partials", part, "O_s and lse_s read back")] + out)))
    assumptions = ("K/V loads are masked to the valid rows: the unused end of the last page is allocated "
                   "but never read (reported as allocated_not_read, outside the total)",
                   "every split program reads its group's Q rows; empty splits still write their partials",
                   "the nq queries of a sequence share one program per (kv head, split): K/V read once")
    label = f"{'paged' if page_size else 'dense'} KV cache, nq = {nq}, {S} split(s)"
    row = Row("paged" if page_size else "dense-cache", label, CAUSAL, "paged" if page_size else "dense-cache",
              kernels, assumptions)
    if cfg.window is not None:
        row = Row(row.name, row.label + f", window {cfg.window}", row.condition, row.baseline, row.kernels,
                  row.assumptions + (f"window {cfg.window}: each sequence reads only the KV blocks of "
                                     f"{block_kv} keys its {nq} queries visit; {keys - read_rows:,} "
                                     "allocated rows per kv head are skipped, never read",))
    return Paged(lens, nq, page_size, capacity if page_size is None else None, S, cfg, row,
                 2 * hkv * tail_rows * d * kv_b, pages, kv_dtype)


def _mods_json(c: Config) -> dict:
    """The score mods' fields of a serving ledger's JSON params (as `Config.to_json`)."""
    return {k: v for k, v in c.to_json().items() if k in ("window", "softcap", "sinks")}


def _window_blocks(lens, nq: int, block_kv: int, window) -> list[tuple[int, int]]:
    """Per sequence of ``len`` keys, the keys ``[lo, hi)`` a decode step of its last ``nq`` queries reads:
    the KV blocks `window_kv_bounds0` loads (causal, bottom-right), all ``[0, len)`` without a window."""
    if window is None:
        return [(0, n) for n in lens]
    out = []
    for n in lens:
        lo, _, _, hi = window_kv_bounds0(0, nq, nq, n, block_kv, True, window)
        out.append((lo, hi))
    return out



@dataclass(frozen=True)
class DecodeStep:
    """Logical HBM bytes of attention in one decode step of a generation, all layers and sequences, and
    the time of those bytes at the device's DRAM bandwidth (the ceiling no kernel of them passes)."""

    kv_dtype: str
    nbytes: float  # mean over the decode steps (a half byte at most from an integer)
    ceiling_s: float  # nbytes / the device's HBM bandwidth (model/roofline.py)

    def to_json(self) -> dict:
        return {"kv_dtype": self.kv_dtype, "bytes": self.nbytes, "ceiling_s": self.ceiling_s}


def decode_step(batch: int, prompt: int, output: int, *, layers: int, heads: int, kv_heads: int | None = None,
                d: int = 128, dtype: str = "bf16", kv_dtype: str | None = None,
                device: str = "h200", window=None, window_layers: int = 0) -> DecodeStep:
    """Mean attention bytes per decode step of ``batch`` sequences generating ``output`` tokens after a
    ``prompt``-token prefill, one split-KV call (`paged`, dense cache, one split) per layer.

    The prefill yields the first token; the ``output - 1`` decode steps attend with cache lengths
    ``prompt + 1 .. prompt + output - 1`` (counting the step's query). `paged`'s total is affine in the
    length (K/V grow, Q, O and the scales do not), so the mean over the steps is the mean of the first and
    the last step's: closed form, ``batch`` and ``layers`` multiply one sequence's ledger.
    ``output == 1`` has no decode step (`InputError`).

    ``window`` (``(left, right)``, decode is causal: the left side bounds) on ``window_layers`` of the
    layers: those read only the KV blocks their query's window visits, ``L - lo(L)`` keys with ``lo`` the
    start of the 128-key block holding key ``L - 1 - left`` (`_window_blocks`), no longer affine in L: the
    mean over the steps is its exact sum (`tiles.floor_sum`), still closed form.
    """
    for name, v in (("batch", batch), ("prompt", prompt), ("layers", layers)):
        positive_int(name, v)
    expect(is_int(output) and output >= 2, "output",
           "at least 2 tokens (the first comes from the prefill; decode steps make the rest)", output)
    expect(is_int(window_layers) and 0 <= window_layers <= layers, "window_layers",
           f"an integer from 0 to layers ({layers})", window_layers)
    expect(window_layers == 0 or window is not None, "window", "a window for window_layers > 0", window)
    kw = dict(nq=1, d=d, dtype=dtype, heads=heads, kv_heads=kv_heads, kv_dtype=kv_dtype)
    first, last = (paged([prompt + t], **kw) for t in (1, output - 1))
    nbytes = batch * (layers - window_layers) * (first.row.total + last.row.total) / 2
    if window_layers:
        left, _ = bounded_window(True, window)
        a, b = prompt + 1, prompt + output - 1  # the steps' cache lengths
        w = paged([a], window=(left, 0), **kw)
        per_key = 2 * w.config.kv_heads * d * DTYPE_BYTES[w.kv_dtype]  # K and V of one key, every kv head
        fixed = w.row.total - per_key * _window_keys_read(a, left)
        keys = (b * (b + 1) - (a - 1) * a) // 2 - _block_starts(a, b, left)  # sum of L - lo(L), L = a .. b
        nbytes += batch * window_layers * (fixed + per_key * keys / (b - a + 1))
    return DecodeStep(first.kv_dtype, nbytes, nbytes / roofline.device(device).hbm)


def _window_keys_read(n: int, left: int) -> int:
    """Keys one decode query (the last of ``n``) reads under a window bounded ``left`` keys back, from the
    start of its 128-key block (`_window_blocks`)."""
    return n - max(0, n - 1 - left) // WINDOW_BLOCK * WINDOW_BLOCK


def _block_starts(a: int, b: int, left: int) -> int:
    """sum over n = a .. b of ``max(0, n - 1 - left) // WINDOW_BLOCK * WINDOW_BLOCK`` (`_window_keys_read`'s
    block start), closed form (`tiles.floor_sum`)."""
    lo = max(a, left + 1)  # from here n - 1 - left >= 0
    if lo > b:
        return 0
    return WINDOW_BLOCK * floor_sum(b - lo + 1, WINDOW_BLOCK, 1, lo - 1 - left)
