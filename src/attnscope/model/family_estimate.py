"""DRAM-byte estimates of a decode step and a packed varlen prefill: compulsory bytes plus the terms the
hardware adds (split-KV partials written and read back, extra row tiles, metadata, FA-2's LSE, K/V re-reads
that miss the L2, register-spill frames written back) less the output still dirty in the L2 when the call
ends (the forward estimate's rule, model/l2.py), whole call: the counter ncu's
``dram__bytes_read.sum + dram__bytes_write.sum`` reads.

Decode (`decode_estimate`): attnscope `flash_decode` (grid (B x Hkv x row tiles, S): one program per
(sequence, kv head, row tile, split) reads its keys once for the GQA group; kernels/decode/plan.py), SDPA
FLASH (PyTorch's FA-2 `mha_fwd`: at one query row with GQA it folds the group into the query rows, so each
CTA reads its kv head's K/V once, and `set_params_splitkv` picks the splits; `flash_splits`), SDPA CUDNN
(closed source: its terms are all probe constants). Varlen (`varlen_estimate`): attnscope
`flash_attention_varlen` (1-D grid over (sequence, query tile) items x query heads, heads fastest) and Flex
attention with a document mask (grid (query blocks, batch, heads), 128 x 128 sparse blocks,
torch/_inductor/kernel/flex; no LSE without grad).

Every constant comes from `model.family_params.FamilyParams` (None: not measured; the estimate refuses with
`NotMeasured`). Cost: a loop (and a sort) over the sequences (and FA-2's at most 128 split counts), never over
tokens.
Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnscope.errors import choice, expect, is_int, positive_int
from attnscope.model import roofline
from attnscope.model.family_params import (
    H200_FAMILY_PARAMS,
    RESIDENT_BELOW,
    FamilyParams,
    NotMeasured,
    need,
)
from attnscope.model.l2 import (  # the forward estimate's rules for dirty output lines and dead spill frames
    DIRTY_O,
    VALIDATED_HEAD_DIMS,
    _retained,
    dead_frame_evicted,
)
from attnscope.model.l2 import estimate as _forward_estimate
from attnscope.model.l2_params import H200_L2_PARAMS, KERNELS, Kernel, miss
from attnscope.model.tiles import Grid, bounded_window, hides_keys, window_kv_bounds0, window_span
from attnscope.model.traffic import DTYPE_BYTES, STAT_BYTES

DECODE_IMPLS = ("flash", "cudnn", "attnscope")
VARLEN_IMPLS = ("attnscope", "flex")
SECTOR = 32  # bytes: the DRAM/L2 access granule a small read is rounded up to
#: attnscope decode: rows (GQA group x nq) per program at most (kernels/decode/heuristics.py BLOCK_M_MAX),
#: and the fused merge's limit on one program's partials (FUSE_MAX_BYTES).
DECODE_BLOCK_M_MAX = 128
DECODE_FUSE_MAX_BYTES = 64 * 1024
#: PyTorch's FA-2 split-KV: query rows per m-block, the most splits (flash_api.cpp set_params_splitkv).
FLASH_SPLIT_BLOCK_M = 64
FLASH_MAX_SPLITS = 128
#: attnscope varlen's work item: (sequence, query tile) + the 4 cu_seqlens bounds, int32 (model/serving.py).
VARLEN_ITEM_BYTES = 6 * 4
VARLEN_BLOCK_Q, VARLEN_BLOCK_KV = 128, 64  # the ledger's tiles (model/serving.py `packed`)
#: attnscope varlen's threads per program: 4 warps in every row of kernels/fwd.py CONFIG_TABLE.
VARLEN_THREADS = 128
#: (d, causal) -> the `FamilyParams` field of the bytes a thread's spill frame writes back, per build the
#: varlen forward compiles (kernels/varlen.py: TMA K/V except d 128 unmasked; ptxas stack frames in
#: bench/results/sm90-varlen-compile-2026-12-02.txt); None: ptxas reports no stack frame (d 64 causal).
VARLEN_FRAMES = {(128, False): "varlen_frame_d128", (128, True): "varlen_frame_d128_causal",
                 (64, False): "varlen_frame_d64", (64, True): None}
#: Flex attention's sparse block (torch.nn.attention.flex_attention _DEFAULT_SPARSE_BLOCK_SIZE).
FLEX_BLOCK = 128
#: Flex's forward kernel on sm_90 (torch/_inductor/template_heuristics/triton.py h100_default_flex_config,
#: fp16/bf16: d 128 (BLOCK_M 128, BLOCK_N 64, 3 stages, 8 warps), d 64 (128, 128, 3 stages, 4 warps)), grid
#: (query blocks, batch, heads): query blocks fastest, then the documents (one packed batch), then the
#: heads ("bh"); K/V walked forwards, no LSE without grad. CTAs per SM from shared memory (not measured):
#: Q 32 KiB + 3 stages x K, V 16 KiB each at d 128 (128 KiB: one fits 228 KiB), 16 + 3 x 32 KiB at d 64.
FLEX_KERNELS = {128: Kernel(128, 64, 1, "bh", False, False), 64: Kernel(128, 128, 2, "bh", False, False)}


#: The one term allowed below zero: O still dirty in the L2 when the call ends (`model.l2.DIRTY_O`).
CREDIT = "dirty_o"


@dataclass(frozen=True)
class FamilyEstimate:
    """One call's estimated DRAM bytes: ``compulsory`` plus each named ``terms`` entry (bytes; >= 0 except
    the `CREDIT`, the named reason an estimate may fall below the compulsory bytes)."""

    family: str
    impl: str
    compulsory: int
    terms: tuple  # ((name, bytes, what), ...)
    facts: dict  # the kernel geometry the estimate used (splits, row tiles, footprints)

    @property
    def total(self) -> float:
        return self.compulsory + sum(b for _, b, _ in self.terms)

    @property
    def credits(self) -> list[tuple[str, float]]:
        """(reason, bytes) the estimate counts below the compulsory bytes."""
        return [(w, -b) for n, b, w in self.terms if n == CREDIT and b < 0]

    def to_json(self) -> dict:
        return {"family": self.family, "impl": self.impl, "total": self.total, "compulsory": self.compulsory,
                "terms": [{"name": n, "bytes": b, "what": w} for n, b, w in self.terms], "facts": self.facts}


def attnscope_window(what: str, impl: str, causal: bool, window) -> tuple[int, int] | None:
    """The effective window of a family's estimate (`tiles.bounded_window`; None for none), which models it
    for attnscope's kernels only: NotImplementedError naming ``what`` for another ``impl``."""
    if window is None:
        return None
    win = bounded_window(causal, window)
    if impl != "attnscope":
        raise NotImplementedError(f"{what}: a window is not modelled; supported: attnscope")
    return win


def unwindowed_terms(plain) -> dict | None:
    """Term name -> bytes of a windowed call's estimate without its window (``plain``: a callable giving it),
    which caps the windowed call's re-read terms: the window's kernel walks a subset of the same walk's tile
    pairs in the same order, so it re-reads no more, while the band walk's distances, counted alone, can
    exceed the whole walk's near full width. None where the plain call is not modelled or not measured."""
    try:
        return {n: b for n, b, _ in plain().terms}
    except (NotImplementedError, NotMeasured):
        return None


def capped(value: float, caps: dict | None, name: str, facts: dict) -> float:
    """``value`` at most ``caps[name]`` (`unwindowed_terms`: 0 where that estimate has no such term; no cap
    where caps is None), the capped names listed in ``facts["window_capped"]``."""
    cap = None if caps is None else caps.get(name, 0.0)
    if cap is not None and value > cap:
        facts.setdefault("window_capped", []).append(name)
        return cap
    return value


def _dirty_o(o: int, kv_read: float, q: int, l2: int, w: float | None = None) -> tuple:
    """The `CREDIT` term: bytes of the output ``o`` still dirty in the write-back L2 when the call ends, which
    ncu does not count. The forward estimate's rule (model/l2.py, `_retained`, measured there against the
    H200's counters): O written uniformly over the call's stream of insertions (the K/V bytes read from DRAM
    at weight 1, Q and O at ``w``: by default `L2Params.qo_weight`; Flex's `FamilyParams.flex_o_weight`),
    random replacement at the `L2Params.shared` capacity."""
    p = H200_L2_PARAMS
    w = p.qo_weight() if w is None else w
    room = kv_read + (q + o) * w
    kept = _retained(0.0, o * w, room, p.shared * l2, total_span=room) / w
    return (CREDIT, -kept, DIRTY_O)


def _sectors(nbytes: int) -> int:
    return -(-nbytes // SECTOR) * SECTOR


def _l2_bytes(l2_bytes, device: str) -> int:
    return roofline.device(device).l2 if l2_bytes is None else positive_int("l2_bytes", l2_bytes)


def _sms(sms, device: str) -> int:
    return roofline.device(device).sms if sms is None else positive_int("sms", sms)


def _heads(heads: int, kv_heads: int | None) -> tuple[int, int]:
    positive_int("heads", heads)
    hkv = heads if kv_heads is None else positive_int("kv_heads", kv_heads)
    expect(heads % hkv == 0, "kv_heads", f"a divisor of heads ({heads})", hkv)
    return heads, hkv


def _lens(name: str, values) -> list[int]:
    vals = list(values) if isinstance(values, list | tuple) else None
    expect(bool(vals) and all(is_int(v) and v > 0 for v in vals), name,
           "a non-empty list of positive integers", values)
    return vals


# --- decode -------------------------------------------------------------------------------------------
def decode_compulsory(cache_lens, *, nq: int = 1, d: int = 128, dtype: str = "fp16", heads: int = 32,
                      kv_heads: int | None = None, kv_dtype: str | None = None, window=None) -> int:
    """Q read and O written once, the valid K/V rows read once per kv head at the cache's width (with a
    sliding ``window``, the keys its queries see: `decode_window_keys`), and the e4m3 cache's per-head fp32
    scales (2 x Hkv): the least a decode call moves, whole call."""
    lens = _lens("cache_lens", cache_lens)
    h, hkv = _heads(heads, kv_heads)
    b = DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16"))]
    kv_b = DTYPE_BYTES[choice("kv_dtype", kv_dtype or dtype, (dtype, "fp8"))]
    comp = 2 * len(lens) * h * positive_int("nq", nq) * positive_int("d", d) * b + \
        2 * hkv * decode_window_keys(lens, nq, window) * d * kv_b
    return comp + (2 * hkv * STAT_BYTES if kv_b == 1 else 0)


def decode_window_keys(lens, nq: int, window) -> int:
    """Keys the last ``nq`` queries of the sequences see, summed: all of them without a ``window``; with one
    (decode is causal: `tiles.bounded_window` with causal, a bounded left side, else one line naming
    ``window``) ``min(len, nq + left)`` each."""
    if window is None:
        return sum(lens)
    left, _ = bounded_window(True, window)
    return sum(min(n, nq + left) for n in lens)


def flash_splits(batch: int, heads: int, kv_heads: int, seqlen_k: int, d: int, sms: int) -> tuple[int, int]:
    """(splits, query rows per CTA row) PyTorch's FA-2 runs one decode row per (sequence, head) with: GQA
    folds the group into the query rows (``seqlenq_ngroups_swapped``: heads -> kv heads, rows -> group),
    then `num_splits_heuristic` over batch x heads x m-blocks, 2 x SMs, key blocks of 256 (d <= 64) or 128
    (flash_api.cpp, `set_params_splitkv`; d <= 128)."""
    rows, h = (heads // kv_heads, kv_heads) if heads > kv_heads else (1, heads)
    block_n = 256 if d <= 64 else 128
    n_blocks = -(-seqlen_k // block_n)
    m_blocks = -(-rows // FLASH_SPLIT_BLOCK_M)
    work, slots = batch * h * m_blocks, 2 * sms
    if work >= 0.8 * slots:
        return 1, rows
    top = min(FLASH_MAX_SPLITS, slots, n_blocks)

    def eligible(s):
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    eff = {s: (work * s / slots) / -(-(work * s) // slots) for s in range(1, top + 1) if eligible(s)}
    best = max(eff.values())
    return next(s for s in sorted(eff) if eff[s] >= 0.85 * best), rows


def _attnscope_decode_geometry(group: int, nq: int, splits: int, d: int) -> dict:
    """Row tiles and merge of `flash_decode` (kernels/decode/heuristics.py `_tiling`, `_fuse_by_default`):
    ``group x nq`` rows in tiles of at most 128; the merge runs in the last program (fused) while its
    partials (next_pow2(rows) x S x d fp32) fit 64 KiB, else in its own kernel, which writes the LSE."""
    rows = group * nq
    block_m = min(1 << (rows - 1).bit_length(), DECODE_BLOCK_M_MAX)
    m_tiles = -(-rows // block_m)
    fused = splits == 1 or (1 << (min(block_m, rows) - 1).bit_length()) * splits * d * 4 <= \
        DECODE_FUSE_MAX_BYTES
    return {"rows": rows, "block_m": max(block_m, 16), "row_tiles": m_tiles, "merge": "fused" if fused else
            "separate"}


def decode_estimate(impl: str, cache_lens, *, nq: int = 1, d: int = 128, dtype: str = "fp16", heads: int = 32,
                    kv_heads: int | None = None, page_size: int | None = None, kv_dtype: str | None = None,
                    splits: int | None = None, sms: int | None = None, l2_bytes: int | None = None,
                    device: str = "h200", params: FamilyParams = H200_FAMILY_PARAMS,
                    window=None) -> FamilyEstimate:
    """Estimated DRAM bytes of one decode call, whole call.

    Parameters
    ----------
    impl: "attnscope" (`flash_decode`: dense or paged cache, fp16/bf16 or e4m3, ``splits`` given, nq >= 1),
        "flash" or "cudnn" (SDPA on a dense cache [B, Hkv, L, d] of equal lengths, nq = 1).
    cache_lens: the B sequences' key counts (including the step's nq queries).
    nq, d, dtype, heads, kv_heads, page_size, kv_dtype: the call's shape (as `model.serving.paged`).
    splits: attnscope's KV splits (required for it); SDPA FLASH's come from PyTorch's heuristic.
    sms, l2_bytes, device: the GPU's SM count and L2 (default: the device table's).
    params: the constants (`FamilyParams`); a term whose constant is None raises `NotMeasured`.
    window: attnscope's sliding window ``(left, right)`` (causal: the left side bounds; None: none): the
        compulsory K/V are the keys the queries see, and the kernel reads them from the start of its
        key block (64 keys with a row tile over 32 rows, else 128) that holds the first (the ``window_edge``
        term); every other term as without.

    Returns
    -------
    FamilyEstimate: compulsory (`decode_compulsory`) and the terms, each >= 0.
    """
    choice("impl", impl, DECODE_IMPLS)
    lens = _lens("cache_lens", cache_lens)
    h, hkv = _heads(heads, kv_heads)
    group, B = h // hkv, len(lens)
    comp = decode_compulsory(lens, nq=nq, d=d, dtype=dtype, heads=h, kv_heads=hkv, kv_dtype=kv_dtype,
                             window=window)
    kv_b = DTYPE_BYTES[kv_dtype or dtype]
    kv = kv_valid = 2 * hkv * decode_window_keys(lens, nq, window) * d * kv_b
    qo = B * h * nq * d * DTYPE_BYTES[dtype]  # Q (= O) bytes
    l2 = _l2_bytes(l2_bytes, device)
    what = f"decode {impl}"
    terms, facts = [], {"group": group}
    if impl != "attnscope":
        if nq != 1 or page_size is not None or (kv_dtype or dtype) != dtype or splits is not None or \
                window is not None:
            raise NotImplementedError(f"{what}: nq, page_size, kv_dtype, splits and window are attnscope's; "
                                      "supported for SDPA: one query row on a dense cache of the queries' "
                                      "dtype")
        expect(len(set(lens)) == 1, "cache_lens", "one length (SDPA takes a dense cache)", lens)
    if impl == "flash":
        s, rows = flash_splits(B, h, hkv, lens[0], d, _sms(sms, device))
        if rows > FLASH_SPLIT_BLOCK_M:
            raise NotImplementedError(f"{what}: a GQA group of {rows} query heads runs {-(-rows // 64)} "
                                      "m-blocks per kv head; modelled: groups of at most 64")
        facts |= {"splits": s, "rows_per_cta": rows}
        terms.append(("lse", B * h * STAT_BYTES, "FA-2 writes the fp32 logsumexp of every row"))
        if s > 1:
            acc = 2 * s * B * h * (-(-d // 32) * 32 + 1) * STAT_BYTES  # out_accum + lse_accum, written + read
            share = need(params, "flash_partials_dram", f"{what} with {s} splits")
            terms.append(("partials", share * acc, f"fp32 accumulators of {s} splits, {acc:,} B written and "
                                                   f"read back, x {share} reaching DRAM"))
        terms.append(_dirty_o(qo, kv, qo, l2))
        return FamilyEstimate("decode", impl, comp, tuple(terms), facts)
    if impl == "cudnn":
        kv_share = need(params, "cudnn_kv_dram", what)
        terms.append(("kv_excess", (kv_share - 1.0) * kv, f"K/V at {kv_share} x the valid bytes"))
        if group > 1:
            g = need(params, "cudnn_gqa_kv_dram", f"{what} with GQA")
            terms.append(("gqa_kv", g * (group - 1) * kv, f"K/V re-read for {group - 1} more query heads per "
                                                         f"kv head, x {g}"))
        other = need(params, "cudnn_other_per_row", what)
        terms.append(("other", other * B * h, f"{other} B per (sequence, query head) beyond Q, K/V, O"))
        terms.append(_dirty_o(qo, kv, qo, l2))
        return FamilyEstimate("decode", impl, comp, tuple(terms), facts)
    expect(splits is not None, "splits", "a split count for attnscope (the grid's second dimension)", splits)
    positive_int("splits", splits)
    geo = _attnscope_decode_geometry(group, nq, splits, d)
    facts |= geo | {"splits": splits}
    terms.append(("cache_seqlens", _sectors(B * 4), "one int32 per sequence, read once (the other programs' "
                                                   "reads hit the L2)"))
    block_n = 64 if geo["block_m"] > 32 else 128  # heuristics.py `_block_config`
    # keys [lo, hi) each sequence's row tile loads (all of them without a window)
    spans = [(0, n) if window is None else window_kv_bounds0(0, nq, nq, n, block_n, True, window)[::3]
             for n in lens]
    if window is not None:
        edge = sum(hi - lo for lo, hi in spans) - decode_window_keys(lens, nq, window)
        terms.append(("window_edge", 2 * hkv * edge * d * kv_b, f"{edge:,} keys before each window's first "
                                                                 f"key in its {block_n}-key block, loaded"))
        kv += 2 * hkv * edge * d * kv_b
    if page_size is not None:
        positive_int("page_size", page_size)
        table = sum(_sectors((-(-hi // page_size) - lo // page_size) * 4) for lo, hi in spans)
        terms.append(("block_table", table, "each sequence's page ids once (the window's), in 32 B sectors"))
    elif nq > 1:  # the plan pages a dense cache for a chunk: its own table, one id per BLOCK_N keys
        table = sum(_sectors((-(-hi // block_n) - lo // block_n) * 4) for lo, hi in spans)
        terms.append(("block_table", table, f"the plan's table over the dense cache ({block_n} keys per id)"))
    if geo["row_tiles"] > 1:
        share = need(params, "row_tile_kv_miss", f"{what} with {geo['row_tiles']} row tiles")
        terms.append(("row_tiles", share * (geo["row_tiles"] - 1) * kv,
                      f"K/V re-read by {geo['row_tiles'] - 1} more row tile(s), x {share} missing the L2"))
    if splits > 1:
        part = 2 * B * h * nq * splits * (d + 1) * STAT_BYTES  # O_s and lse_s, written and read back
        slope = need(params, "attnscope_partials_dram", f"{what} with {splits} splits")
        onset = need(params, "attnscope_partials_onset", f"{what} with {splits} splits")
        streamed = (comp + (kv - kv_valid)) / l2  # the call's stream past the partials, in L2 sizes
        share = min(1.0, slope * max(0.0, streamed - onset))
        terms.append(("partials", share * part, f"fp32 partials of {splits} splits, {part:,} B written and "
                                                f"read back, x {share:.3g} reaching DRAM (the call streams "
                                                f"{streamed:.3g} L2 sizes)"))
        if geo["merge"] == "separate":
            terms.append(("lse", B * h * nq * STAT_BYTES, "the separate merge kernel writes the fp32 LSE"))
    terms.append(_dirty_o(qo, kv, qo, l2))
    return FamilyEstimate("decode", impl, comp, tuple(terms), facts)


# --- varlen -------------------------------------------------------------------------------------------
def varlen_compulsory(lens, *, d: int = 128, dtype: str = "fp16", heads: int = 32,
                      kv_heads: int | None = None) -> int:
    """Q, K, V read once and O written once over the packed tokens, whole call."""
    lens = _lens("lens", lens)
    h, hkv = _heads(heads, kv_heads)
    return sum(lens) * positive_int("d", d) * DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16"))] * \
        (2 * h + 2 * hkv)


def flex_blocks(lens, causal: bool, block: int = FLEX_BLOCK) -> tuple[int, int]:
    """(query blocks, (query block, KV block) pairs) Flex's document-mask block mask holds over the packed
    ``lens`` (blocks of ``block`` tokens; a pair is loaded when any of its (q, k) is in one document and,
    causal, k <= q). Query block i spans documents first(i)..last(i) and loads KV blocks from the block of
    first(i)'s start to that of last(i)'s end (causal: to block i). Closed form per document: the query
    blocks inside one document load the same span (unmasked) or an arithmetic run (causal)."""
    lens = _lens("lens", lens)
    total = sum(lens)
    n_q = -(-total // block)
    starts, at = [], 0
    for n in lens:
        starts.append(at)
        at += n
    ends = [s + n for s, n in zip(starts, lens, strict=True)]
    pairs, counted = 0, 0  # counted: query blocks summed so far (each once)
    for s, e in zip(starts, ends, strict=True):
        # the query blocks whose first row is in this document: from the block holding s (if s starts it,
        # or if it is the document's own) -- count each block by the document holding its first row
        b0, b1 = -(-s // block), (e - 1) // block  # blocks starting inside [s, e)
        if b0 > b1:
            continue
        for i in (b0, b1) if b1 > b0 else (b0,):  # the edge blocks, directly
            pairs += _flex_span(i, starts, ends, block, total, causal)
        inner = b1 - b0 - 1  # blocks b0+1 .. b1-1 lie inside this document (start and end in it)
        if inner > 0:
            lo = s // block
            if causal:  # block i loads lo..i: i - lo + 1, summed over i = b0+1 .. b1-1
                pairs += sum_range(b0 + 1 - lo + 1, b1 - 1 - lo + 1)
            else:
                pairs += inner * ((e - 1) // block - lo + 1)
        counted += b1 - b0 + 1
    assert counted == n_q, (counted, n_q)  # every query block starts in exactly one document
    return n_q, pairs


def sum_range(a: int, b: int) -> int:
    """a + (a + 1) + ... + b (0 when b < a)."""
    return 0 if b < a else (a + b) * (b - a + 1) // 2


def _flex_span(i: int, starts, ends, block: int, total: int, causal: bool) -> int:
    """KV blocks query block i loads: from the block of its first document's start to that of its last
    document's end (causal: at most block i)."""
    import bisect

    q0, q1 = i * block, min(total, (i + 1) * block) - 1
    first = bisect.bisect_right(starts, q0) - 1
    last = bisect.bisect_right(starts, q1) - 1
    lo, hi = starts[first] // block, (ends[last] - 1) // block
    return (min(hi, i) if causal else hi) - lo + 1


def _varlen_waves(p0: int, n: int, heads: int, c: int, causal: bool) -> tuple[float, float, int, int]:
    """(a, b, later, end): the waves of one sequence of ``n`` rows whose programs start at position ``p0`` of
    attnscope's varlen grid. The grid is work items (sequence, query tile) x heads, heads fastest, so ``c``
    programs at a time hold ``c / heads`` query tiles of *every* head, and each wave of them streams the K/V
    of all the sequence's kv heads; a later wave reads it again. The list is sequence-major and the waves
    do not restart at a sequence: the sequence's P = tiles x heads programs meet waves floor(p0 / c) ..
    ceil((p0 + P) / c) - 1, the first of them shared with the sequences before, the last with those after
    (a partial wave still spans every head). The first wave reads the whole set; the ``later`` ones after it,
    k = 1 .. later, read a share a - b k of it: all of it unmasked (a 1, b 0); causal, heaviest tile first,
    up to the diagonal of the wave's first program p = k c - p0 % c of the sequence, 1 - p / P. ``end``:
    the program that ends the last wave."""
    programs = -(-n // VARLEN_BLOCK_Q) * heads
    w0, w1 = p0 // c, (p0 + programs - 1) // c
    if not causal:
        return 1.0, 0.0, w1 - w0, (w1 + 1) * c
    return 1.0 + (p0 % c) / programs, c / programs, w1 - w0, (w1 + 1) * c


def _missed_share(a: float, b: float, k0: int, k1: int, lo: float, hi: float) -> float:
    """Sum over k = k0 .. k1 of f x clip((f - lo) / (hi - lo), 0, 1), f = a - b k, b >= 0, lo < hi: the
    passes of waves that read share f of a set and miss the L2 by `miss` at a live set linear in f (no
    miss at f <= lo, all at f >= hi). Closed form: sums of k and k^2 over the ranges where the clip is
    1 and where it is linear, so its cost does not grow with the waves."""
    def poly(j0, j1, c1, c2):  # sum of c1 f + c2 f^2 over k = j0 .. j1
        if j1 < j0:
            return 0.0
        m = j1 - j0 + 1
        s1 = (j0 + j1) * m / 2
        s2 = (j1 * (j1 + 1) * (2 * j1 + 1) - (j0 - 1) * j0 * (2 * j0 - 1)) / 6
        return c1 * (m * a - b * s1) + c2 * (m * a * a - 2 * a * b * s1 + b * b * s2)
    if k1 < k0:
        return 0.0
    if b <= 0.0:
        return (k1 - k0 + 1) * a * min(1.0, max(0.0, (a - lo) / (hi - lo)))
    full = min(k1, math.floor((a - hi) / b))  # f >= hi up to here
    some = min(k1, math.ceil((a - lo) / b) - 1)  # f > lo up to here
    return poly(k0, full, 1.0, 0.0) + poly(max(k0, full + 1), some, -lo / (hi - lo), 1.0 / (hi - lo))


def _list_order(lens, heads: int) -> list[tuple[int, int, int]]:
    """(sequence, first program, programs) in attnscope's varlen grid order: the list is sequence-major,
    the sequences by length descending, ties by index (kernels/varlen_plan.py `_work_items`, one cu_seqlens
    for queries and keys), each sequence's query tiles x ``heads`` programs."""
    at, out = 0, []
    for i in sorted(range(len(lens)), key=lambda i: (-lens[i], i)):
        progs = -(-lens[i] // VARLEN_BLOCK_Q) * heads
        out.append((i, at, progs))
        at += progs
    return out


def _varlen_spill(programs: int, c: int, d: int, causal: bool, inserted: float, l2: int,
                  params: FamilyParams, what: str) -> tuple:
    """The "spill" term: register-spill frames of attnscope's varlen kernel written back to DRAM. Each of the
    ``programs`` (`VARLEN_THREADS` threads) dirties its local-memory frame in the L2 (`VARLEN_FRAMES`: the
    bytes a thread's frame writes back, per build); the frames of the last ``c`` programs are live when the
    call ends, the others dead, and a dead frame reaches DRAM when evicted before a later program takes
    its slot (the forward estimate's rule, `model.l2.dead_frame_evicted`, over the call's ``inserted``
    bytes at the `L2Params.capacity`). Linear in the constant (not counted in the dirty-O room)."""
    field = VARLEN_FRAMES[d, causal]
    if field is None:
        return ("spill", 0.0, f"no spill frame (ptxas: 0 bytes stack frame at d {d}, causal)")
    dead = max(0, programs - c) / programs * dead_frame_evicted(inserted, programs, c,
                                                                H200_L2_PARAMS.capacity * l2)
    if dead == 0.0:
        return ("spill", 0.0, "no finished program's frame evicted before the call ends")
    frame = need(params, field, f"{what} at d {d}{' causal' if causal else ''}")
    return ("spill", programs * VARLEN_THREADS * frame * dead,
            f"{programs} programs x {VARLEN_THREADS} threads x {frame} B of spill frame, x {dead:.2f} dead "
            "and evicted before a later program re-dirties it")


def varlen_estimate(impl: str, lens, *, causal: bool = False, d: int = 128, dtype: str = "fp16",
                    heads: int = 32, kv_heads: int | None = None, sms: int | None = None,
                    l2_bytes: int | None = None, device: str = "h200",
                    params: FamilyParams = H200_FAMILY_PARAMS, window=None) -> FamilyEstimate:
    """Estimated DRAM bytes of one packed varlen prefill (q, k, v [total, H, d], one cu_seqlens for both),
    whole call. Both re-read terms are the forward estimate's L2 rules; attnscope's probe constants are its
    spill frames (`VARLEN_FRAMES`) and the room its resident programs' Q/O take (`varlen_qo_weight`).

    attnscope (d 64 or 128): compulsory + the work list (24 B per (sequence, query tile) item, read once)
    + each sequence's K/V re-reads by its later waves of programs (`_varlen_waves`: the grid runs heads
    fastest, so a wave holds every head's programs and streams the K/V of all the sequence's kv heads;
    each later wave re-reads it; the waves run on across sequence boundaries, `_list_order`, and the last wave
    of a sequence also streams the sequences after it that start there), at most the
    ledger's re-reads, each wave's share of the K/V x its miss share at its live set (the share of the K/V
    it streams + the resident programs' Q/O at `FamilyParams.varlen_qo_weight`; `l2_params.miss` at
    `L2Params.shared`: lines read from both partitions; `_missed_share`)
    + the spill frames of finished programs written back (`_varlen_spill`).
    ``sms``: concurrent programs are SMs x the portable forward's CTAs per SM (`l2_params.KERNELS`, the
    same tile config).
    flex: compulsory + the block mask (per query block two int32 counts and an int32 index per loaded KV
    block, read once: H and B broadcast) + its K/V re-reads: none while one head's pass (its Q, O and its
    kv head's K, V) stays under `RESIDENT_BELOW` x the L2, else the forward estimate's (`_flex_rereads`); its
    dirty-O credit with Q/O at `FamilyParams.flex_o_weight` of room.
    ``params``: the constants (`FamilyParams`, the spill frames); a term whose constant is None raises
    `NotMeasured`.
    ``window``: attnscope's sliding window per sequence (``(left, right)``, causal bounds the right): each
    query tile loads the KV tiles of its band, so a later wave re-reads only the band it shares with the wave
    before (``left + right`` keys and one KV tile, per kv head), behind the wave's own band (its C / H query
    tiles' rows and the window's width) and the resident Q/O; the windowed build is the masked one, whose
    spill frame is taken as the causal build's (ptxas: 176 B against 200 B at d 128, none at d 64); the
    re-reads at most the call's without the window (`unwindowed_terms`). Flex with a window is not modelled.
    """
    choice("impl", impl, VARLEN_IMPLS)
    lens = _lens("lens", lens)
    h, hkv = _heads(heads, kv_heads)
    b = DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16"))]
    positive_int("d", d)
    l2 = _l2_bytes(l2_bytes, device)
    comp = varlen_compulsory(lens, d=d, dtype=dtype, heads=h, kv_heads=hkv)
    kv, qo = 2 * hkv * sum(lens) * d * b, h * sum(lens) * d * b  # compulsory K/V; Q (= O) bytes
    what = f"varlen {impl}"
    terms, facts = [], {}
    win = attnscope_window(what, impl, causal, window)
    if impl == "attnscope":
        if d not in VALIDATED_HEAD_DIMS:  # the kernel runs d 256 too; its probes measured these only
            raise NotImplementedError(f"{what}: head dim {d} is not modelled; supported: "
                                      f"{', '.join(map(str, VALIDATED_HEAD_DIMS))} (the probes' head dims)")
        items = sum(-(-n // VARLEN_BLOCK_Q) for n in lens)
        terms.append(("work_list", _sectors(items * VARLEN_ITEM_BYTES),
                      f"{items} work items x 6 int32, once"))
        c = _sms(sms, device) * KERNELS["attnscope"][-d if causal else d].ctas_per_sm
        qo_tile = 2 * VARLEN_BLOCK_Q * d * b  # a resident program's Q and O tiles
        order, extra = _list_order(lens, h), {}
        starts, ends = [0] * len(lens), [0] * len(lens)
        for i, p0, progs in order:
            starts[i], ends[i] = p0, p0 + progs
        total_k, k0, rereads, worst = sum(lens), 0, 0.0, 0.0
        # each sequence's window, None where it hides none of its keys (its programs run as without one)
        wins = [win if win is not None and hides_keys(n, n, causal, win) else None for n in lens]
        for i, n in enumerate(lens):  # the ledger's re-reads: at most what the waves can re-read
            g = Grid(n, n, VARLEN_BLOCK_Q, VARLEN_BLOCK_KV, causal=causal, window=wins[i])
            pairs, last = g.loaded_pairs()
            t_c = -(-n // VARLEN_BLOCK_KV)
            rows = pairs * VARLEN_BLOCK_KV - (t_c * VARLEN_BLOCK_KV - n) * last  # K rows loaded, in-sequence
            over = last * (min(k0 + t_c * VARLEN_BLOCK_KV, total_k) - (k0 + n)) if n % VARLEN_BLOCK_KV else 0
            extra[i] = 2 * hkv * (rows + over - n) * d * b  # K and V re-reads beyond one pass, per kv head
            k0 += n
        for at, (i, p0, progs) in enumerate(order):
            n = lens[i]
            kv_i = 2 * hkv * n * d * b  # the sequence's K/V, every kv head
            w_i = wins[i]
            a, step, later, wave_end = _varlen_waves(p0, n, h, c, causal and w_i is None)
            # rows of one kv head a wave streams: all of them, or with a window its tiles' bands
            streamed = n if w_i is None else min(n, c / h * VARLEN_BLOCK_Q + window_span(w_i, n))
            # a wave between two of the sequence's own streams it alone; its last wave also streams the K/V
            # of the sequences after it that start there (each in full once all its heads have a program)
            beside = sum(2 * hkv * (lens[j] if w_i is None else min(lens[j], streamed)) * d * b
                         * min(1.0, (min(ends[j], wave_end) - q0) / h)
                         for j, q0, _ in order[at + 1:] if q0 < wave_end)
            if later:  # live bytes beside the K/V: the resident programs' Q and O (`varlen_qo_weight`)
                w = need(params, "varlen_qo_weight", f"{what} with a sequence over more than one wave of "
                                                     f"{c} programs")
                if w_i is not None:  # a later wave re-reads the band it shares with the wave before
                    kv_i = 2 * hkv * min(n, window_span(w_i, n) + VARLEN_BLOCK_KV) * d * b
                # a later wave's live set: the share f of the K/V it streams and the resident Q/O; the last
                # wave's also the sequences after it
                kvs, qo_live = 2 * hkv * streamed * d * b, min(c, progs) * qo_tile * w
                cap, ramp = H200_L2_PARAMS.shared * l2, H200_L2_PARAMS.shared_ramp
                f_first, f_last = a - step, a - step * later
                live_first, live_last = f_first * kvs + qo_live, f_last * kvs + qo_live + beside
                worst = max(worst, live_first / l2, live_last / l2)
                m_first, m_last = miss(live_first / cap, ramp), miss(live_last / cap, ramp)
                lo = (cap - qo_live) / kvs  # the share f at which a wave's live set fills the capacity
                want = (_missed_share(a, step, 1, later - 1, lo, lo + (ramp - 1.0) * cap / kvs)
                        + f_last * m_last) * kv_i
                rereads += min(extra[i] * max(m_first, m_last), want)
        facts |= {"largest_live_set_l2": worst, "concurrent_programs": c}  # of the re-read sequences
        if any(w is not None for w in wins):
            rereads = capped(rereads, unwindowed_terms(lambda: varlen_estimate(
                impl, lens, causal=causal, d=d, dtype=dtype, heads=h, kv_heads=hkv, sms=sms,
                l2_bytes=l2_bytes, device=device, params=params)), "kv_rereads", facts)
        terms.append(("kv_rereads", rereads, "K/V of every kv head re-read by each later wave of programs "
                                             "(heads fastest: a wave spans all heads), missing the L2"))
        terms.append(_varlen_spill(items * h, c, d, causal or win is not None, comp + rereads, l2, params,
                                   what))
        terms.append(_dirty_o(qo, kv + rereads, qo, l2))
        return FamilyEstimate("varlen", impl, comp, tuple(terms), facts)
    n_q, pairs = flex_blocks(lens, causal)
    facts |= {"q_blocks": n_q, "block_pairs": pairs}
    terms.append(("block_mask", _sectors(n_q * 2 * 4 + pairs * 4), f"{n_q} query blocks' counts and {pairs} "
                                                                  "KV block indices, once"))
    ratio = 4 * sum(lens) * d * b / l2  # one head's Q, O and its kv head's K, V: one head's pass
    facts["head_footprint_l2"] = ratio
    rereads = 0.0
    if ratio > RESIDENT_BELOW:
        rereads = _flex_rereads(lens, causal, d, dtype, h, hkv, _sms(sms, device), l2, what)
    terms.append(("kv_rereads", rereads, "K/V blocks re-read by later query blocks and by a group's other "
                                         "heads, missing the L2 (the forward estimate's wave rule)"))
    w_o = need(params, "flex_o_weight", f"{what}'s dirty-O credit")
    terms.append(_dirty_o(qo, kv + rereads, qo, l2, w_o))
    return FamilyEstimate("varlen", impl, comp, tuple(terms), facts)


def _flex_rereads(lens, causal: bool, d: int, dtype: str, h: int, hkv: int, sms: int, l2: int,
                  what: str) -> float:
    """Flex's K/V reads beyond one pass, past residency: its grid (query blocks, 1, H), query blocks fastest
    over the packed documents, is the dense forward's grid of a batch of the documents in "bh" order (the
    other documents between a group's heads), so the forward estimate (`model.l2.estimate`) with Flex's
    tiles (`FLEX_KERNELS`) counts them: exactly so for documents of one length; for several lengths, each
    document's share of a batch of documents of its length as long as the packed batch (round(total / n),
    at least one): a group's next head re-reads the document's K/V one head's pass over *all* the packed
    tokens later, so the gap is the packed batch's, whatever its documents' lengths. Refused (not
    modelled): causal GQA over several documents (the forward's rule for that order is FA-2's own measured
    curve, `l2_params.hot_miss`)."""
    if causal and h > hkv and len(lens) > 1:
        raise NotImplementedError(f"{what}: causal GQA over several documents past the L2 (one head's pass "
                                  f"over {RESIDENT_BELOW:.2f} x L2) is not modelled (the forward's rule for "
                                  "that order is FA-2's measured curve); supported: MHA, one document, or a "
                                  "batch under that footprint")
    total, b = sum(lens), DTYPE_BYTES[dtype]
    extra = {}
    for n in set(lens):  # the forward estimate of a batch of documents of length n as long as the packed one
        # ("efficient": a fused kernel with no FA-2-only term; the geometry is Flex's own, `kernel`)
        docs = max(1, round(total / n))
        (k,) = _forward_estimate("efficient", n, d, h, docs, dtype, causal, kv_heads=hkv, l2_bytes=l2,
                                 sms=sms, kernel=FLEX_KERNELS[d]).kernels
        extra[n] = max(0.0, k.read - docs * n * d * b * (h + 2 * hkv)) / docs
    return sum(extra[n] for n in lens)


def error_text(exc: Exception) -> str:
    """The one line a sweep prints where an estimate refuses (`NotMeasured`, a shape not modelled)."""
    kind = "not measured" if isinstance(exc, NotMeasured) else "not modelled"
    return f"{kind}: {exc}"

