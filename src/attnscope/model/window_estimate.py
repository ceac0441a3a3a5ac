"""DRAM-byte estimate of a sliding-window forward (``window=(left, right)``, flash-attn's ``window_size``):
compulsory bytes plus the K/V re-reads that miss the L2, the block mask (Flex), less the output still dirty
in the L2 when the call ends, whole call: the counter ncu's ``dram__bytes_read.sum + dram__bytes_write.sum``.

A window turns each query tile's K/V stream into a band of about ``left + right`` keys, shifted ``B_r`` rows
per tile. The CTAs run in lockstep waves of C = SMs x CTAs per SM consecutive query tiles (the grid's order:
a head's tiles consecutive, then the next head, `Kernel.order`). These distances decide which re-reads of a
K/V line miss (`l2_params.miss` at `L2Params.shared`: lines read from both partitions; a CTA's Q and O tiles
take `L2Params.qo_weight` of a K/V byte of room):

- inside a wave (`band_rereads`): the next tile's CTA reads a line ``B_r / B_c`` steps before (or after) its
  neighbour, while the wave reads ``C B_r`` distinct rows (its bands side by side), so a re-read sits behind
  C B_r rows of K/V and the wave's Q/O tiles;
- across a wave boundary (`band_rereads`): the first tile of the next wave re-reads the ``left + right``
  rows (one K/V tile of alignment more) the last tile of the wave before read; both walk their bands
  upwards, so those are the one's last rows and the other's first, at the in-wave distance (a windowed
  launch never interleaves heads; hopper_persist pairs only a causal window's first tiles, whose windows
  reach before key 0, `tiles.persistent_ramp`, the full tiles running in turn before them);
- hopper_persist with a causal window's first tiles paired, MHA (`paired_band_rereads`): its full tiles
  run from the last down, so the tile a round boundary cuts re-reads its band one round after the tile
  above it read it, behind the rest of one round's walks and the start of the next's (about 2 C B_r rows
  of bands, one band and the pairs' first rows, both rounds' Q and O); the ideal machine re-reads about
  2/3 of what this counts, the H200 between (docs/model.md); with GQA the group rule below stands;
- the next head of a GQA group: adjacent in the launch order ("hb", or B = 1) it re-reads a line after one
  head's pass over the set and the Q/O of the tiles launched between the line's last reader and its next
  first one (the pass less the band's width), with the batch between ("bh", Flex) after B passes; a group
  whose heads share a wave reads the set together (the wave's distance) (`group_gap_miss`).

bench/l2_sim.py --window runs the same calls through an ideal machine; where hopper_persist's static
round-robin meets unequal tiles its programs drift out of the lockstep waves assumed here (docs/model.md,
"Where it may miss"; the H200's counters did on the probe grid): a causal window's ramp now goes in pairs
of about one full tile's cost; a window with a right side, or keys before the first query's, still runs
unequal tiles in turn.

The kernels are what ``flash_attention(..., window=...)`` runs on an sm_90 GPU (`window_kernel`: the
dispatch rule's pick, `model.dispatch`) and Flex attention's forward with a sliding-window block mask
(`family_estimate.FLEX_KERNELS`, its 128 x 128 sparse blocks loaded whole). No constant of its own: the
L2's capacities, ramps and Q/O weight are the forward estimate's (model/l2_params.py, each with its probe),
Flex's dirty-O room the varlen estimate's (`FamilyParams.flex_o_weight`);
the window kernels' CTAs per SM come from ptxas (`l2_params.WINDOW_KERNELS`). Closed form: cost independent
of N. Pure Python.
"""

from __future__ import annotations

from attnscope.errors import choice, positive_int
from attnscope.model import dispatch, traffic
from attnscope.model.family_estimate import (
    FLEX_BLOCK,
    FLEX_KERNELS,
    FamilyEstimate,
    _dirty_o,
    _heads,
    _l2_bytes,
    _sectors,
    _sms,
)
from attnscope.model.family_params import H200_FAMILY_PARAMS, FamilyParams, need
from attnscope.model.l2 import VALIDATED_HEAD_DIMS
from attnscope.model.l2_params import H200_L2_PARAMS, HOPPER_KERNELS, KERNELS, WINDOW_KERNELS, Kernel, miss
from attnscope.model.tiles import Grid, bounded_window, persistent_ramp, window_span
from attnscope.model.traffic import DTYPE_BYTES

WINDOW_IMPLS = ("attnscope", "flex")


def window_kernel(impl: str, d: int, causal: bool, window, batch: int, heads: int, kv_heads: int, n: int,
                  sms: int) -> tuple[str, Kernel]:
    """(name, `Kernel`) of what ``impl`` runs for an n x n call with ``window`` on an sm_90 GPU with ``sms``
    SMs: attnscope's portable kernel in its window tiles where `dispatch.portable_window` takes the window,
    else the Gluon variant `dispatch.hopper_variant` picks (else the portable kernel's table tiles); Flex's
    forward (`FLEX_KERNELS`, loading whole 128-key sparse blocks). A head dim the L2 probes did not measure
    (`l2.VALIDATED_HEAD_DIMS`) raises NotImplementedError."""
    choice("impl", impl, WINDOW_IMPLS)
    win = bounded_window(causal, window)
    if d not in VALIDATED_HEAD_DIMS:
        raise NotImplementedError(f"window {impl}: head dim {d} is not modelled; supported: "
                                  f"{', '.join(map(str, VALIDATED_HEAD_DIMS))} (the L2 probes' head dims)")
    if impl == "flex":
        return "flex", FLEX_KERNELS[d]._replace(block_kv=FLEX_BLOCK)
    if dispatch.portable_window(d, win, n, n, causal):
        return "attnscope portable (window tiles)", WINDOW_KERNELS[d]
    variant = dispatch.hopper_variant(d, causal, batch, heads, kv_heads, n, n, sms, win)
    if variant is not None:
        return variant, HOPPER_KERNELS[variant][d]
    return "attnscope portable", KERNELS["attnscope"][-d]


def window_compulsory(n: int, *, d: int = 128, dtype: str = "fp16", batch: int = 1, heads: int = 32,
                      kv_heads: int | None = None) -> int:
    """Q, K, V read once and O written once, whole call (every key is visible to its own query row)."""
    h, hkv = _heads(heads, kv_heads)
    b = DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16"))]
    return positive_int("batch", batch) * positive_int("n", n) * positive_int("d", d) * b * (2 * h + 2 * hkv)


def _wave_rows(c: int, block: int, tiles: int, n: int, together: int, band: int = 0) -> float:
    """Rows of distinct lines a wave of ``c`` CTAs of ``block`` rows reads: their bands side by side,
    ``c block`` rows plus ``band`` (``together`` heads of one set in the wave read them once), at most the
    sets the wave spans (``n`` rows each)."""
    return min(c * block / together + band, max(1.0, c / tiles) / together * n)


def band_rereads(n: int, tiles: int, c: int, block: int, align: int, width: int, extra: float,
                 row: float, other: float, cap: float, ramp: float, together: int = 1,
                 in_turn: int = 1) -> tuple[float, dict]:
    """(rows re-read from DRAM, facts) of one set's band walk: ``tiles`` CTAs of ``block`` rows each,
    consecutive, ``c`` at a time in lockstep waves, each reading the band of the other side's rows its
    window spans (``width`` rows, aligned to ``align``-row tiles); ``extra``: the rows they read beyond
    one pass (the ledger's). Inside a wave a row is re-read by the neighbouring CTA behind the wave's bands
    side by side; at each of the set's (tiles - 1) / c wave boundaries the next wave's first CTA re-reads
    the ``width`` + ``align`` rows its band shares with the last CTA of the wave before: the walks ascend,
    so those are the last rows the one reads and the first the other does, at the in-wave distance, plus,
    when each CTA walks ``in_turn`` sets in turn (the backward's group), the ``in_turn`` - 1 other sets'
    phases of the waves between; ``row``: a row's bytes of L2 room, ``other``: a CTA's other bytes of room;
    each re-read misses with `l2_params.miss` at ``cap`` and ``ramp``."""
    room_w = _wave_rows(c, block, tiles, n, together) * row + c * other
    room_x = (in_turn - 1) * _wave_rows(c, block, tiles, n, together, width) * row + room_w
    m_w, m_x = miss(room_w / cap, ramp), miss(room_x / cap, ramp)
    crossing = min(extra, max(0.0, (tiles - 1) / c) * min(n, width + align))
    return (extra - crossing) * m_w + crossing * m_x, {"wave_room": room_w, "boundary_room": room_x,
                                                        "wave_miss": m_w, "boundary_miss": m_x,
                                                        "boundary_rows": crossing}


def paired_band_rereads(n: int, tiles: int, ramp_tiles: int, c: int, block: int, align: int, width: int,
                        extra: float, row: float, other: float, cap: float, ramp: float, band: dict,
                        sets: int) -> tuple[float, dict]:
    """(rows re-read from DRAM, facts) of one head's walk in hopper_persist's partly paired schedule (a causal
    window over fewer keys than the rows: `tiles.persistent_ramp`'s first ``ramp_tiles`` tiles go in pairs).
    A head's items are its full tiles from the last down, then the pairs; item q runs on program q % ``c``,
    all in lockstep rounds. The full tile a round boundary cuts re-reads the ``width`` + ``align`` rows the
    tile above it read one round before, and a pair the first ``ramp_tiles`` x ``block`` rows: the lines
    between are the rest of one round's walks and the start of the next's, about 2 c ``block`` rows of
    full tiles' bands (their share of the items) plus one band and the pairs' first rows, every distinct set
    of the two rounds (``adjacent`` heads of a set consecutive in the launch), and both rounds' Q and O.
    Inside a round the neighbours' re-reads are `band_rereads`' (``band``: its facts)."""
    full, pairs = tiles - ramp_tiles, (ramp_tiles + 1) // 2
    items = full + pairs
    span = 1 + 2 * c / items  # distinct sets (heads) two rounds' items read, on average
    rows_b = min(2 * c * full / items * block + width + min(n, ramp_tiles * block), min(sets, span) * n)
    room_b = rows_b * row + c * (full + 2 * pairs) / items * other
    m_b = miss(room_b / cap, ramp)
    cut = min(extra, max(0.0, (full - 1) / c) * min(n, width + align))  # the boundaries' full tiles
    cut_pairs = min(extra - cut, max(0.0, (pairs - 1) / c) * min(n, ramp_tiles * block))
    rows = (extra - cut - cut_pairs) * band["wave_miss"] + (cut + cut_pairs) * m_b
    return rows, band | {"boundary_room": room_b, "boundary_miss": m_b, "boundary_rows": cut + cut_pairs}


def group_gap_miss(n: int, tiles: int, c: int, block: int, width: int, row: float, other: float,
                   passes: int, room_w: float, cap: float, ramp: float) -> tuple[float, float]:
    """(miss share, room) of a GQA group's later head re-reading its set: after ``passes`` heads' passes
    over the set (``n`` rows of ``row`` bytes) and the ``other`` bytes of the tiles launched between the
    row's last reader and its next first one (the pass less the band's ``width``); heads that share a wave
    (``passes`` x ``tiles`` <= ``c``) read it together, at the wave's distance ``room_w``."""
    room = room_w if passes * tiles <= c else \
        max(room_w, passes * n * row + max(0.0, passes * tiles - width / block) * other)
    return miss(room / cap, ramp), room


def window_estimate(impl: str, n: int, *, window, causal: bool = False, d: int = 128, dtype: str = "fp16",
                    batch: int = 1, heads: int = 32, kv_heads: int | None = None, sms: int | None = None,
                    l2_bytes: int | None = None, device: str = "h200",
                    params: FamilyParams = H200_FAMILY_PARAMS) -> FamilyEstimate:
    """Estimated DRAM bytes of one sliding-window forward, whole call (module docstring).

    Parameters
    ----------
    impl: "attnscope" (``flash_attention(q, k, v, causal=causal, window=window)``, what it dispatches to) or
        "flex" (Flex attention with a sliding-window ``mask_mod``, compiled).
    n: Nq = Nk; window: ``(left, right)``, -1 unbounded, at least one side bounded (causal bounds the
        right); d (64 or 128: the estimate's validated head dims), dtype, batch, heads, kv_heads.
    sms, l2_bytes, device: the GPU's SM count and L2 (default: the device table's).
    params: the constants (`FamilyParams`: Flex's dirty-O room, `flex_o_weight`).

    Returns
    -------
    FamilyEstimate ("window"): compulsory (`window_compulsory`) and the terms ``kv_rereads`` (inside a head
    and by a GQA group's later heads, missing the L2), ``block_mask`` (Flex) and ``dirty_o`` (the credit).
    """
    choice("impl", impl, WINDOW_IMPLS)
    h, hkv = _heads(heads, kv_heads)
    positive_int("n", n)
    positive_int("batch", batch)
    left, right = bounded_window(causal, window)
    b = DTYPE_BYTES[choice("dtype", dtype, ("fp16", "bf16"))]
    l2, n_sms = _l2_bytes(l2_bytes, device), _sms(sms, device)
    name, ker = window_kernel(impl, d, causal, (left, right), batch, h, hkv, n, n_sms)
    comp = window_compulsory(n, d=d, dtype=dtype, batch=batch, heads=h, kv_heads=hkv)
    p = H200_L2_PARAMS
    cap, ramp, w = p.shared * l2, p.shared_ramp, p.qo_weight()
    c = n_sms * ker.ctas_per_sm
    g = Grid(n, n, ker.block_q, ker.block_kv, causal=causal, window=(left, right))
    tiles, kv_row = g.n_q_tiles, 2 * d * b  # a K/V row (K and V) of one kv head
    q_o = 2 * ker.block_q * d * b * w  # a CTA's Q and O tiles, in K/V bytes of room
    group = h // hkv
    adjacent = group if (ker.order == "hb" or batch == 1) else 1  # a group's heads adjacent in the order
    together = min(adjacent, max(1, c // tiles))  # heads of one K/V set in one wave
    # inside a head: the ledger's re-reads beyond one pass, in a wave and at its boundaries (`band_rereads`)
    width = window_span((left, right), n)
    rows, f = band_rereads(n, tiles, c, ker.block_q, ker.block_kv, width, g.kv_rows_total() - n, kv_row, q_o,
                           cap, ramp, together)
    ramp_tiles = persistent_ramp(tiles, ker.block_q, n, n, causal, (left, right)) if ker.persistent else 0
    if 0 < ramp_tiles < tiles and group == 1:  # partly paired: full tiles from the last, then the pairs
        rows, f = paired_band_rereads(n, tiles, ramp_tiles, c, ker.block_q, ker.block_kv, width,
                                      g.kv_rows_total() - n, kv_row, q_o, cap, ramp, f, batch * hkv)
    inside = batch * h * rows * kv_row
    # a group's later heads re-read the set (B passes apart with the batch between them)
    m_g, room_g = group_gap_miss(n, tiles, c, ker.block_q, width, kv_row, q_o,
                                 1 if adjacent == group else batch, f["wave_room"], cap, ramp)
    group_rr = batch * hkv * (group - 1) * n * kv_row * m_g
    facts = {"kernel": name, "block_q": ker.block_q, "block_kv": ker.block_kv, "concurrent_ctas": c,
             "window": [left, right], "tiles_per_head": tiles, "wave_room_l2": f["wave_room"] / l2,
             "boundary_room_l2": f["boundary_room"] / l2, "group_room_l2": room_g / l2}
    terms = [("kv_rereads", inside + group_rr,
              f"K/V rows re-read inside a head ({f['wave_miss']:.2f} of the in-wave re-reads, "
              f"{f['boundary_miss']:.2f} of the {f['boundary_rows']:,.0f} rows a head's wave boundaries "
              f"re-read, missing) and by {group - 1} more query head(s) of each K/V head ({m_g:.2f} "
              "missing)")]
    if impl == "flex":  # kv_num_blocks and full_kv_num_blocks per query block, an index per loaded block
        loaded, _ = g.loaded_pairs()
        terms.append(("block_mask", _sectors(tiles * 2 * 4 + loaded * 4),
                      f"{tiles} query blocks' counts and {loaded} KV block indices, once"))
    qo = batch * h * n * d * b
    kv_read = batch * hkv * n * kv_row + inside + group_rr
    w_o = need(params, "flex_o_weight", "window flex's dirty-O credit") if impl == "flex" else None
    terms.append(_dirty_o(qo, kv_read, qo, l2, w_o))
    return FamilyEstimate("window", impl, comp, tuple(terms), facts)


def window_ledger(impl: str, n: int, *, window, causal: bool = False, d: int = 128, dtype: str = "fp16",
                  batch: int = 1, heads: int = 32, kv_heads: int | None = None, sms: int | None = None,
                  device: str = "h200") -> tuple[int, str]:
    """(logical bytes, the row's name) of the call: model/traffic.py's flash row with the tiles of the kernel
    that runs (`window_kernel`), whole call."""
    h, hkv = _heads(heads, kv_heads)
    win = bounded_window(causal, window)
    name, ker = window_kernel(impl, d, causal, win, batch, h, hkv, n, _sms(sms, device))
    row = "flash-causal" if causal else "flash"
    t = traffic.traffic(n, d, dtype, ker.block_q, ker.block_kv, batch=batch, heads=h, kv_heads=hkv,
                        window=win, rows=(row,))
    return t[row].total * t.config.batch_heads, f"model/traffic.py {row}, window {win}, {name} " \
        f"{ker.block_q} x {ker.block_kv} tiles"

