"""Split-KV decode: the size-dependent choices of a plan (split count, row tile, block config, merge) and
the logical byte ledger of one call."""

from __future__ import annotations

import functools
import math

from attnscope.errors import expect, is_int
from attnscope.kernels._common import LOG2E, import_torch_triton, interpreting, num_sms
from attnscope.model.tiles import window_kv_bounds0

torch, triton = import_torch_triton()

MAX_NUM_SPLITS = 1024  # a launch-grid bound (grid axis 1 < 65536) with room; 128 is already plenty
MIN_KEYS_PER_SPLIT = 256  # shorter splits spend more on their partial write + prologue than they save
SPLIT_CAP = 128  # the heuristic's cap: 128 splits already fill 132 SMs from a single (batch, kv head)
WAVES = 1  # programs the heuristic aims for, in multiples of the SM count (measured: one wave wins)
# Many (batch, kv head) items, long keys: split when the last wave would leave most SMs idle (`_tail_splits`)
TAIL_MIN_KEYS = 16384  # shorter programs lose more to the extra programs' fill than the tail costs
TAIL_FILL = 0.6  # a last wave with at least this share of the SMs busy keeps the bandwidth
TAIL_MAX_SPLITS = 4
#: ``scale * log2 e`` above which the kernel keeps its running max in raw scores (``MAX_UNSCALED``, as the
#: dense forward does past 1) and runs one split: base-2 scores ``s * qk_scale`` of unit-size inputs would
#: pass fp32 from about 1e37 on (inf - inf = NaN), and split partials carry base-2 LSEs that may be +inf
RAW_SCORES_ABOVE = 1e4


def default_num_splits(batch: int, kv_heads: int, seqlen: int, sms: int = 132, *, waves: int = WAVES,
                       min_keys: int = MIN_KEYS_PER_SPLIT, cap: int = SPLIT_CAP) -> int:
    """How many KV splits phase 1 uses when ``num_splits`` is not given.

    Without splitting, decode launches ``batch * kv_heads`` programs. Split until about ``waves * sms``
    programs run (one program per SM already streams at the bandwidth ceiling; each extra split costs a
    partial write and a longer merge), never below ``min_keys`` keys per split, never above ``cap``
    (measured with probes now at 5eeec86, `git show 5eeec86:bench/decode_splits.py`):

        num_splits = clamp(floor(waves * sms / (batch * kv_heads)), 1, min(cap, seqlen // min_keys))

    With ``waves * sms`` items or more that formula gives 1 split, unless the keys are long (at least
    `TAIL_MIN_KEYS`) and the last wave of programs would keep fewer than `TAIL_FILL` of the SMs busy: then
    the fewest splits (2 .. `TAIL_MAX_SPLITS`) that fill it that far, else the fullest (`_tail_splits`).
    Measured (5eeec86's bench/decode_coresident.py --tail): B = 34, Hkv = 32, L = 32k runs 1,088 programs,
    32 SMs busy in the last wave, at 0.953 x CUDNN; 3 splits fill it and reach 1.004 x. (Plans for Nq > 1,
    128-row chunk tiles, keep 1 split there: the rule is measured for decode tiles only.)

    Parameters
    ----------
    batch, kv_heads : int
        B and Hkv; ``batch * kv_heads`` programs per split.
    seqlen : int
        The longest sequence (max of ``cache_seqlens``, or L_max when the lengths are not read).
    sms : int
        Streaming multiprocessors (132 on an H100/H200).

    Examples
    --------
    >>> default_num_splits(1, 8, 4096)     # 8 programs: 16 splits fill 128 SMs, 256 keys each
    16
    >>> default_num_splits(64, 8, 131072)  # 512 programs already fill 132 SMs; the 4th wave 116 of them
    1
    >>> default_num_splits(34, 32, 32768)  # 1,088 programs: 32 SMs busy in the 9th wave; 3 splits: 96
    3
    """
    for name, value in (("batch", batch), ("kv_heads", kv_heads), ("sms", sms), ("waves", waves),
                        ("min_keys", min_keys), ("cap", cap)):
        expect(is_int(value) and value > 0, name, "a positive integer", value)
    expect(is_int(seqlen) and seqlen >= 0, "seqlen", "a non-negative integer", seqlen)
    return _splits(batch, kv_heads, seqlen, sms, waves, min_keys, cap)


def _splits(batch, kv_heads, seqlen, sms, waves=WAVES, min_keys=MIN_KEYS_PER_SPLIT, cap=SPLIT_CAP,
            tail=True) -> int:
    """`default_num_splits`'s formula on checked values (the plan's call path; ``tail=False``: without the
    tail rule, for chunk tiles: the rule is measured for decode tiles only). ``waves`` above `WAVES` (e4m3:
    `FP8_DENSE_WAVES`): the splits toward that many programs per SM, each split at least `WAVE_MIN_KEYS`
    keys, and never fewer than one wave's."""
    items = batch * kv_heads
    if waves > WAVES:
        one = _splits(batch, kv_heads, seqlen, sms, WAVES, min_keys, cap, tail)
        if items >= waves * sms:
            return one
        return max(one, min((waves * sms) // items, seqlen // max(min_keys, WAVE_MIN_KEYS), cap))
    if items >= waves * sms:
        return _tail_splits(items, seqlen, sms) if tail else 1
    return max(1, min((waves * sms) // items, seqlen // min_keys, cap))


def _tail_splits(items: int, seqlen: int, sms: int) -> int:
    """Splits of a layout with a wave or more of items: 1, unless the keys are long and the last wave of
    ``items * s`` programs (one per SM) would keep fewer than `TAIL_FILL` of the SMs busy."""
    def fill(s):  # share of the SMs busy in the last wave of items * s programs
        rest = items * s % sms
        return 1.0 if rest == 0 else rest / sms
    if seqlen < TAIL_MIN_KEYS or fill(1) >= TAIL_FILL:
        return 1
    fits = [s for s in range(2, TAIL_MAX_SPLITS + 1) if fill(s) >= TAIL_FILL]
    return fits[0] if fits else max(range(1, TAIL_MAX_SPLITS + 1), key=fill)


def _window_span(nq: int, left: int) -> int | None:
    """The most keys the ``nq`` queries of one sequence see under a window of ``left`` keys (decode is
    causal), None without a window (``left < 0``: every key): ``[lo, hi)`` of `model.tiles.window_kv_bounds0`
    at key granularity for the last ``nq`` rows of a cache longer than the window, ``left + nq``. A sequence
    of n keys sees ``min(n, span)`` of them, the length the split count is sized by (the kernel splits a row
    tile's window, from the block holding its first key; splits sized by L would mostly load nothing)."""
    if left < 0:
        return None
    n = left + nq + 1  # longer than the window: its first key is inside the cache
    lo, _, _, hi = window_kv_bounds0(0, nq, nq, n, 1, True, (left, 0))
    return hi - lo



def logical_bytes(batch: int, q_heads: int, kv_heads: int, total_keys: int, head_dim: int, elt: int,
                  num_splits: int, return_lse: bool = False) -> dict[str, int]:
    """Logical HBM bytes of one Nq = 1 `flash_decode` call on a dense cache, itemised.

    ``total_keys`` is ``sum_b cache_seqlens[b]``; ``elt`` the element size of q/K/V (2 for fp16/bf16).
    Partials exist only when ``num_splits > 1``. (A paged cache adds 4 bytes per page used.)
    """
    kv = 2 * kv_heads * total_keys * head_dim * elt  # K and V, each byte once per step (GQA shared)
    q = batch * q_heads * head_dim * elt  # the one query row per head
    partial = batch * q_heads * num_splits * (head_dim + 1) * 4 if num_splits > 1 else 0  # O_s, lse_s fp32
    out = batch * q_heads * head_dim * elt + (batch * q_heads * 4 if return_lse else 0)
    return {"kv_read": kv, "q_read": q, "partial_write": partial, "partial_read": partial, "out_write": out,
            "total": kv + q + 2 * partial + out}


#: Whether a paged launch checks each split's block-table entries once before its KV loop and then loads
#: K/V rows unmasked (the kernel's ``PAGE_PRECHECK``; e4m3 tiles with keys as the MMA rows always do): a
#: split holding an entry outside [0, num_pages) attends to no key and reports ``ERR_BLOCK_TABLE``, where
#: the per-key check drops only that entry's keys. Off: on the H200 it was not faster everywhere than the
#: per-key check (``bench/decode.py --paged-precheck``, BENCHMARKS.md's decode section).
PAGE_PRECHECK = False


def _keys_for_dim(block_n: int, head_dim: int) -> int:
    """A tile's keys at head dim ``head_dim``: the d <= 128 tables' ``block_n``, scaled down past d = 128 so a
    tile holds the bytes it holds at d = 128 (d = 256: half the keys; shared memory and registers as there).
    Compiled for sm_90 on a CPU (bench/sm90_resources.py --kernel decode); on the H200 (`bench/decode.py
    --d 256 --quick`, BENCHMARKS.md) 19 of the 22 d = 128 musts held."""
    return max(16, block_n * 128 // head_dim) if head_dim > 128 else block_n


def _block_config(block_m: int = 16, page_size: int = 0, fp8: bool = False, programs: int = 0,
                  sms: int = 132, head_dim: int = 128) -> dict:
    """The phase-1 block config (BLOCK_N, STAGES, warps) for a row tile of ``block_m`` rows and pages of
    ``page_size`` keys (0: dense), e4m3 K/V or not: one measured config per tile kind
    (`bench/tune.py decode`), no autotuner; e4m3 decode tiles: `FP8_CONFIGS` [`_fp8_config_name`
    (``programs``, ``sms``)] (`_fp8_config`), ``programs`` the launch's B x Hkv x row tiles x splits;
    past d = 128 fewer keys per tile (`_keys_for_dim`).
    Interpreter: small blocks, still multi-block splits and (pages of 16) pages per block.
    """
    if interpreting():
        cfg = {"BLOCK_N": 32 if page_size == 16 else 16, "STAGES": 1, "num_warps": 4, "num_stages": 1}
        if fp8:
            cfg["F16QK"] = True
    elif fp8 and block_m <= 32:
        return _fp8_config(_fp8_config_name(programs, sms, page_size != 0), page_size, head_dim)
    else:
        cfg = {"BLOCK_N": 64, "num_warps": 8} if block_m > 32 else {"BLOCK_N": 128, "num_warps": 4}
        cfg["BLOCK_N"] = _keys_for_dim(cfg["BLOCK_N"], head_dim)
        # Triton's pipeliner gives K/V loads addressed through a block table of several pages per block
        # only part of the stages: 3 would buffer one K and one V tile, 5 the dense kernel's two of each.
        # A block inside one page (whose load mask depends on the page index checked on the device) gets
        # them all: 3, the dense kernel's two of each (5 would pass the 227 KiB of shared memory at
        # BLOCK_N = 128)
        stages = 5 if page_size and cfg["BLOCK_N"] > page_size else 3
        cfg = {**cfg, "STAGES": stages, "num_stages": stages}
    if page_size and PAGE_PRECHECK:
        cfg["PAGE_PRECHECK"] = True
    return cfg


#: e4m3 decode-tile (rows <= 32) block configs: BLOCK_N, warps, dense stages (paged: `_fp8_config`), and
#: ``F16QK``: Q K^T in fp16 (the kernel's ``FP8_F16QK``: bf16 q rows scaled by powers of two into fp16, K and
#: V converted one instruction per two e4m3, MMA operands 16-bit; a tile of one query runs keys as the MMA
#: rows, S^T = K Q^T and O^T = V^T P^T on 8 or 16 query rows). Warp instructions per KiB of K/V in the KV
#: loop, counted in the sm_90 SASS of a CPU compile (Triton's bundled ptxas, no GPU), Hq/Hkv 32/8, dense /
#: pages of 64 (``python bench/sm90_resources.py --sass-per-kib``; the bf16 cache: 30.6 / 43.7): bf16qk-w8
#: 148.5 / 188.0 (e4m3 -> bf16 converts, 8-bit MMA operand layout), f16qk-w8 66.8 / 83.5, f16qk-w4
#: 56.2 / 64.4, f16qk-w4-s3 56.2 / 62.5, f16qk-n256-w8 57.1 / 62.5, f16qk-n256-w4 49.8 / 49.6 (244-255
#: registers), f16qk-w2-s3 50.4 / 56.6, f16qk-w2-s2 49.8 / 49.4 (253-255 registers). ``bench/decode.py
#: --fp8-sweep`` times each beside attnscope bf16 and SDPA CUDNN, with `FP8_DEFAULT` / `FP8_MANY` /
#: `FP8_SPLIT_BYTES`'s choice.
FP8_CONFIGS = {
    "bf16qk-w8": {"BLOCK_N": 128, "num_warps": 8, "STAGES": 5, "F16QK": False},  # converts to q's dtype
    "f16qk-w8": {"BLOCK_N": 128, "num_warps": 8, "STAGES": 5, "F16QK": True},  # two warps per scheduler
    "f16qk-w4": {"BLOCK_N": 128, "num_warps": 4, "STAGES": 5, "F16QK": True},  # one warp per scheduler
    "f16qk-w4-s3": {"BLOCK_N": 128, "num_warps": 4, "STAGES": 3, "F16QK": True},  # 98 KiB: 2 per SM
    "f16qk-n256-w8": {"BLOCK_N": 256, "num_warps": 8, "STAGES": 3, "F16QK": True},  # bf16's bytes per tile
    # 64 keys per warp and block: the fewest instructions per byte; 130 KiB, 64 KiB of K/V in flight
    "f16qk-n256-w4": {"BLOCK_N": 256, "num_warps": 4, "STAGES": 2, "F16QK": True},
    # 64 keys per warp as f16qk-n256-w4, at half its tile: 98 KiB, 2 programs per SM; 66 KiB, 3 per SM
    "f16qk-w2-s3": {"BLOCK_N": 128, "num_warps": 2, "STAGES": 3, "F16QK": True},
    "f16qk-w2-s2": {"BLOCK_N": 128, "num_warps": 2, "STAGES": 2, "F16QK": True},
}
#: The shipped e4m3 decode-tile config (H200 sweep, `bench/decode.py --fp8-sweep`, B 1/8/32, Hq/Hkv 32/8,
#: L 4k-128k, dense and paged): 4 warps, fewer instructions per byte than 8, had the best graph-replay geomean
#: against attnscope bf16 (0.98 x; 8 warps 0.89 x) and won or tied at every dense point with one program
#: per SM or fewer.
FP8_DEFAULT = "f16qk-w4"
#: ... and on a dense cache with more programs than SMs (None: `FP8_DEFAULT` there too): 4-warp programs
#: in 98 KiB of shared memory, two per SM (B x Hkv = 256 programs all run at once on 132 SMs): 1.14-1.19 x
#: attnscope bf16 at B = 32, against 1.03-1.07 x for `FP8_DEFAULT`; on paged caches it lost (0.96 x, a
#: paged loop with a range check per key).
FP8_MANY = "f16qk-w4-s3"
#: Whether e4m3 splits are sized on bytes rather than keys (`_split_min_keys`: at least the bf16
#: minimum's bytes, twice its keys, per split); measured no faster
FP8_SPLIT_BYTES = False


def _fp8_config(name: str, page_size: int = 0, head_dim: int = 128) -> dict:
    """`FP8_CONFIGS` [name] as a phase-1 block config for pages of ``page_size`` keys (0: dense) at head dim
    ``head_dim`` (`_keys_for_dim`): dense tiles take the config's stages; paged ones `_block_config`'s rule
    (5 for blocks of several pages, which the pipeliner buffers only in part; 3 inside one page)."""
    cfg = dict(FP8_CONFIGS[name])
    cfg["BLOCK_N"] = _keys_for_dim(cfg["BLOCK_N"], head_dim)
    if page_size:
        cfg["STAGES"] = min(cfg["STAGES"], 5 if cfg["BLOCK_N"] > page_size else 3)
    cfg["num_stages"] = cfg["STAGES"]
    return cfg


def _fp8_config_name(programs: int, sms: int, paged: bool = False) -> str:
    """The `FP8_CONFIGS` key of an e4m3 decode launch of ``programs`` programs on ``sms`` SMs: on a dense
    cache `FP8_MANY` past one program per SM (where set), else `FP8_DEFAULT`."""
    return FP8_MANY if FP8_MANY is not None and programs > sms and not paged else FP8_DEFAULT


#: Programs per SM the split heuristic aims for on an e4m3 dense cache with one query per sequence (`WAVES`
#: elsewhere): two, so a launch under two waves of (sequence, kv head) items splits until two programs per
#: SM run, in `FP8_MANY`'s config (two fit per SM): one 4-warp program per SM cannot hide the e4m3 loop's
#: latencies. H200, Hq 32, graph replay, against one wave (bench/results/h200-2026-12-03c-fp8-waves.txt):
#: B 16 Hkv 8, L 32k / 128k 1.205 / 1.201 x (1.83 x SDPA CUDNN bf16's tokens/s), B 8 1.11-1.14 x, B 1 Hkv 32
#: L 32k 1.108 x, B 1 Hkv 8 L 128k 1.030 x; B 1 Hkv 8 L 32k (splits of ~1k keys) 0.951 x: hence
#: `WAVE_MIN_KEYS`.
FP8_DENSE_WAVES = 2
#: Fewest keys per split when the heuristic seeks more than one wave (`_splits`).
WAVE_MIN_KEYS = 2048


def _split_waves(fp8: bool, paged: bool, nq: int) -> int:
    """The heuristic's ``waves`` for a decode layout: `FP8_DENSE_WAVES` for e4m3 on a dense cache with one
    query per sequence, else `WAVES`."""
    return FP8_DENSE_WAVES if fp8 and not paged and nq == 1 else WAVES


def _split_min_keys(fp8: bool, split_bytes: bool | None = None) -> int:
    """Fewest keys per split: `MIN_KEYS_PER_SPLIT`, doubled for e4m3 K/V when splits are sized on bytes
    (``split_bytes``, default `FP8_SPLIT_BYTES`): one byte per element reads the same bytes in twice the
    keys."""
    split_bytes = FP8_SPLIT_BYTES if split_bytes is None else split_bytes
    return MIN_KEYS_PER_SPLIT * (2 if fp8 and split_bytes else 1)


#: The fused merge (see `_fuse_by_default`) holds at most this many bytes of partials per last program.
FUSE_MAX_BYTES = 64 * 1024
#: Elements of one merge chunk [MERGE_M, MERGE_S, d] (fp32; 32 registers per thread at 4 warps).
MERGE_ELEMS = 4096
#: Row-tile cap (heads x queries per program); 16 under the interpreter, so CPU tests run several tiles.
BLOCK_M_MAX = 128
PAGE_SIZES = (16, 32, 64, 128, 256)


def _fuse_by_default(rows: int, num_splits: int, head_dim: int) -> bool:
    """Merge in the last program (one launch) while its ``rows x S x d`` fp32 partials stay within
    `FUSE_MAX_BYTES` (beyond, the separate kernel's B x Hq x Nq programs win; 5eeec86's
    bench/decode_variants.py)."""
    return triton.next_power_of_2(rows) * num_splits * head_dim * 4 <= FUSE_MAX_BYTES


@functools.lru_cache(maxsize=16)
def _sms(device) -> int:
    return num_sms(torch, device)


def _raw_scores(scale, d, softcap=0.0) -> bool:
    """Whether a plan with this ``scale`` (None: 1/sqrt(d)) keeps raw scores (`RAW_SCORES_ABOVE`); never
    with a softcap, which bounds the scores (``|s'| <= softcap``)."""
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    return not softcap and sm_scale * LOG2E > RAW_SCORES_ABOVE


def _tiling(device, B, Hq, Nq, Hkv, L_max, max_seqlen, num_splits, use_dot, raw=False,
            min_keys=MIN_KEYS_PER_SPLIT, waves=WAVES):
    """(rows per tile BLOCK_M, row tiles, split count) of a layout: the plan's only choices that
    depend on sizes (``max_seqlen``: the longest length, for the split heuristic; None: L_max); ``raw``
    (`_raw_scores`): one split; ``min_keys``: fewest keys per split (`_split_min_keys`); ``waves``: programs
    per SM aimed for (`_split_waves`)."""
    rows = (Hq // Hkv) * Nq
    cap = 16 if interpreting() else BLOCK_M_MAX
    block_m = min(triton.next_power_of_2(rows), cap)
    if use_dot is None or use_dot:
        block_m = max(16, block_m)  # tl.dot needs M >= 16
    m_tiles = -(-rows // block_m)
    if num_splits is None and raw:
        num_splits = 1
    if num_splits is None:
        longest = L_max if max_seqlen is None else max_seqlen
        num_splits = _splits(B * m_tiles, Hkv, longest, _sms(device), waves, min_keys, tail=Nq == 1)
    return block_m, m_tiles, num_splits
