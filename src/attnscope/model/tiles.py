"""Tile arithmetic of FlashAttention-2: the one place it lives.

The traffic model, the float64 reference and the Triton launchers all take their tile counts and causal
bounds from here (spec §2, §2.1; FA-2 §3.1.1).

Conventions
-----------
- Everything a user sees is 1-based, as in the spec: query tile ``i`` covers rows
  ``B_r (i-1) + 1 .. min(B_r i, Nq)`` and KV tile ``j`` covers columns ``B_c (j-1) + 1 .. min(B_c j, Nk)``.
  Ragged last tiles are exact (they are shorter, never padded).
- Causal alignment is bottom-right: key ``c`` is permitted for query ``r`` iff ``c <= r + (Nk - Nq)``.
  When ``Nq == Nk`` that is the ordinary ``c <= r`` (top-left and bottom-right coincide), which is what
  SDPA's ``is_causal`` does; when ``Nq != Nk`` it is flash-attn >= 2.1's convention (the last query
  sees every key). With ``Nq > Nk`` the first ``Nq - Nk`` rows have no permitted key at all.
- Two operations, never conflated (spec §2.1): the **skip bound** drops KV tiles whose every column is
  in the future of every row of the query tile (exact, changes only the cost); the **mask** sets the
  future entries of the tiles that straddle the diagonal to -inf (changes the result).

For a query tile the KV tiles partition into ``full`` (loaded, no mask arithmetic), ``masked`` (loaded,
straddling the diagonal) and ``skipped`` (never loaded); ``loaded = full + masked`` and, causal,
``full`` precede ``masked``. Unmasked attention loads every tile and masks none (the ragged last tile
needs only a bounds check, which is not a causal mask).

A sliding window (``window=(left, right)``, flash-attn's ``window_size``, `normalize_window`) bounds the
keys of row ``r`` to ``[r + off - left, r + off + right]``. A query tile then loads a band of KV tiles:
``left-masked`` (straddling the window's left edge), ``full``, ``right-masked`` (the diagonal), in that
order, and skips the tiles on both sides (`Grid.kv_tiles`). The grid visits O(N W / (B_r B_c)) tile
pairs instead of causal's O(N^2 / (2 B_r B_c)); the totals stay closed forms (`Grid.loaded_pairs`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from attnscope.errors import MAX_DIM, InputError, expect, is_int, positive_int, short

#: Largest T_c for which `Grid.schedule` builds explicit lists of tile numbers.
MAX_LISTED = 1 << 20


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum_{t=0}^{n-1} floor((a t + b) / m) for n >= 0, m > 0, a >= 0, b >= 0, in O(log m) steps (the
    Euclid-like reduction of the lattice-point count under a line). Anything else (a float, a bool, a
    negative, m = 0) raises `InputError` naming the argument."""
    for name, value, least in (("n", n, 0), ("m", m, 1), ("a", a, 0), ("b", b, 0)):
        expect(is_int(value) and value >= least, name, f"an integer >= {least}", value)
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


def cdiv(a: int, b: int) -> int:
    """Ceiling division for any integer ``a`` and positive ``b`` (else `InputError` naming ``b``)."""
    expect(is_int(a), "a", "an integer", a)
    if not (is_int(b) and b > 0):
        raise InputError(f"b: expected a positive integer divisor, got {short(b)}")
    return -(-a // b)


@dataclass(frozen=True)
class Grid:
    """A tiling of an ``Nq x Nk`` score matrix into ``block_q x block_kv`` tiles, under ``causal`` and a
    sliding ``window`` (``(left, right)`` or None, `normalize_window`; causal forces ``right = 0``)."""

    nq: int
    nk: int
    block_q: int = 128
    block_kv: int = 64
    causal: bool = False
    window: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("nq", "nk", "block_q", "block_kv"):
            positive_int(name, getattr(self, name))
        if self.window is not None:
            object.__setattr__(self, "window", normalize_window(False, self.window))

    @property
    def bounds(self) -> tuple[int, int]:
        """The effective ``(left, right)`` window (-1 = unbounded), causal folded in as ``right = 0``."""
        return normalize_window(self.causal, self.window)

    @property
    def masking(self) -> bool:
        """Does any row see fewer than all keys (a bounded side: causal or a window)?"""
        return self.bounds != (-1, -1)

    @property
    def n_q_tiles(self) -> int:
        """T_r = ceil(Nq / B_r): query tiles, one program (CTA) each per (batch, head)."""
        return cdiv(self.nq, self.block_q)

    @property
    def n_kv_tiles(self) -> int:
        """T_c = ceil(Nk / B_c)."""
        return cdiv(self.nk, self.block_kv)

    @property
    def offset(self) -> int:
        """Nk - Nq: the bottom-right shift of the diagonal."""
        return self.nk - self.nq

    # --- 1-based geometry ------------------------------------------------------------------------
    def rows(self, i: int) -> tuple[int, int]:
        """Rows (1-based, inclusive) of query tile ``i``."""
        if not (is_int(i) and 1 <= i <= self.n_q_tiles):
            raise InputError(f"query_tile: expected an integer in 1..{self.n_q_tiles}, got {short(i)}")
        return (self.block_q * (i - 1) + 1, min(self.block_q * i, self.nq))

    def cols(self, j: int) -> tuple[int, int]:
        """Columns (1-based, inclusive) of KV tile ``j``."""
        if not (isinstance(j, int) and 1 <= j <= self.n_kv_tiles):
            raise InputError(f"kv_tile: expected an integer in 1..{self.n_kv_tiles}, got {short(j)}")
        return (self.block_kv * (j - 1) + 1, min(self.block_kv * j, self.nk))

    def kv_tiles(self, i: int) -> KvTiles:
        """The KV tiles query tile ``i`` (1-based) loads, as 1-based inclusive tile numbers: the closed form
        `window_kv_bounds0` (the one the kernels recompute) in tile units. Every tile outside
        ``first..last`` is skipped; ``first..full_first-1`` are left-masked, ``full_first..full_last`` need
        no mask, ``full_last+1..last`` are right-masked. No tile wholly visible: ``full_first = last + 1``
        and ``full_last = last`` (all loaded tiles left-masked, as `window_kv_bounds0`); nothing visible:
        ``(1, 1, 0, 0)``."""
        r0, r1 = self.rows(i)
        bc = self.block_kv
        lo, full_lo, full_hi, hi = window_kv_bounds0(r0 - 1, r1 - r0 + 1, self.nq, self.nk, bc, self.causal,
                                                     self.window)
        if lo == hi:
            return KvTiles(1, 1, 0, 0)
        return KvTiles(lo // bc + 1, cdiv(full_lo, bc) + 1, cdiv(full_hi, bc), cdiv(hi, bc))

    def kv_bounds(self, i: int) -> tuple[int, int]:
        """``(n_full, n_loaded)`` for query tile ``i`` (1-based): KV tiles ``1..n_full`` are loaded without
        mask arithmetic, ``n_full+1..n_loaded`` loaded and masked, ``n_loaded+1..T_c`` skipped.

        Causal: tile j is loaded iff its first column is permitted for the tile's last row, so
        ``n_loaded = clamp(ceil((r_last + off) / B_c), 0, T_c)``; it needs no mask iff its last column is
        permitted for the first row, so ``n_full = clamp(floor((r_first + off) / B_c), 0, T_c)`` (all when
        ``r_first + off >= Nk``). A window with a bounded left side skips leading tiles, which this pair
        cannot say: use `kv_tiles` (NotImplementedError here).
        """
        if self.window is not None:  # the general form; the causal one below is its special case
            if self.bounds[0] >= 0:
                raise NotImplementedError("kv_bounds: supported without a left window bound (tiles "
                                          f"1..n_loaded); window {self.window} skips leading tiles: use "
                                          "kv_tiles(i)")
            t = self.kv_tiles(i)
            return (max(0, t.full_last - t.full_first + 1), t.last)
        r0, r1 = self.rows(i)
        if not self.causal:
            return (self.n_kv_tiles, self.n_kv_tiles)
        off = self.offset
        n_loaded = min(max(cdiv(r1 + off, self.block_kv), 0), self.n_kv_tiles) if r1 + off > 0 else 0
        n_full = self.n_kv_tiles if r0 + off >= self.nk else min(max((r0 + off) // self.block_kv, 0),
                                                                 self.n_kv_tiles)
        return (n_full, n_loaded)

    def schedule(self, i: int) -> TileSchedule:
        """The schedule of query tile ``i`` (1-based) as explicit lists, up to `MAX_LISTED` KV tiles
        (`kv_tiles(i)` gives the same as four integers at any size)."""
        t = self.kv_tiles(i)
        n_masked = max(0, t.full_first - t.first) + max(0, t.last - t.full_last)
        if self.n_kv_tiles > MAX_LISTED or n_masked > MAX_LISTED // 64:
            raise InputError(f"block_kv: expected at most {MAX_LISTED:,} KV tiles (and {MAX_LISTED // 64:,} "
                             f"masked) for explicit tile lists, got {self.n_kv_tiles:,}; use kv_tiles(i)")
        left = list(range(t.first, t.full_first))
        right = list(range(max(t.full_last, t.full_first - 1) + 1, t.last + 1))
        return TileSchedule(
            query_tile=i,
            rows=self.rows(i),
            loaded=list(range(t.first, t.last + 1)),
            skipped=list(range(1, t.first)) + list(range(max(t.last, t.first - 1) + 1, self.n_kv_tiles + 1)),
            full=list(range(t.full_first, t.full_last + 1)),
            masked=left + right,
            row_classes={j: self.row_classes(i, j) for j in left + right},
            left_masked=left,
            right_masked=right,
        )

    def row_classes(self, i: int, j: int) -> dict[str, tuple[int, int] | None]:
        """For KV tile ``j`` seen from query tile ``i``: which rows see it how, each an inclusive 1-based
        row range or None, contiguous and in this order as r grows (row r sees columns
        ``[r + off - left, r + off + right]``, tile j columns ``c0..c1``):

        - ``masked``: ``r + off + right < c0``, the tile is wholly in the future;
        - ``triangular``: ``c0 <= r + off + right < c1``, the window's right edge (the diagonal) cuts it;
        - ``permitted``: ``r + off + right >= c1`` and ``r + off - left <= c0``, wholly visible;

        and with a bounded left side two more keys: ``left_edge`` (``c0 < r + off - left <= c1``, the left
        edge cuts it, the right does not) and ``left_masked`` (``r + off - left > c1``, wholly too old).
        """
        r0, r1 = self.rows(i)
        c0, c1 = self.cols(j)
        left, right = self.bounds
        off = self.offset

        def clamp(lo: int, hi: int) -> tuple[int, int] | None:
            lo, hi = max(lo, r0), min(hi, r1)
            return (lo, hi) if lo <= hi else None

        if right < 0:  # r + off + right = +inf: the right edge never cuts
            classes = {"masked": None, "triangular": None, "permitted": (r0, r1)}
        else:  # masked: r <= c0 - off - right - 1; triangular: up to r <= c1 - off - right - 1
            classes = {"masked": clamp(r0, c0 - off - right - 1),
                       "triangular": clamp(c0 - off - right, c1 - off - right - 1),
                       "permitted": clamp(c1 - off - right, r1)}
        if left < 0:
            return classes
        # the left edge r + off - left passes c0 at r = c0 - off + left and c1 at r = c1 - off + left
        right_ok = r0 if right < 0 else c1 - off - right  # first row the right edge clears the tile
        if classes["permitted"] is not None:
            classes["permitted"] = clamp(classes["permitted"][0], c0 - off + left)
        return classes | {"left_edge": clamp(max(right_ok, c0 - off + left + 1), c1 - off + left),
                          "left_masked": clamp(max(right_ok, c1 - off + left + 1), r1)}

    def kv_rows_loaded(self, i: int) -> int:
        """Number of K rows (= V rows) query tile ``i`` reads: the sum of the loaded tiles' widths."""
        t = self.kv_tiles(i)
        return max(0, min(t.last * self.block_kv, self.nk) - (t.first - 1) * self.block_kv)

    def loaded_pairs(self) -> tuple[int, int]:
        """``(pairs, last)``: the (query tile, KV tile) pairs the grid loads (the sum over query tiles of
        `kv_tiles`' ``last - first + 1``) and how many query tiles load the last KV tile (unmasked or
        causal: those loading every tile), in closed form (module docstring).

        Query tile t (0-based) below the last has rows ``B_r t .. B_r t + B_r - 1``; its first loaded key
        ``F(t) = clamp(B_r t + off - left, 0, Nk - 1)`` and last ``L(t) = clamp(B_r t + B_r - 1 + off + right,
        0, Nk - 1)`` are affine in t, clamped, and it loads ``floor(L / B_c) - floor(F / B_c) + 1`` tiles
        when it sees a key (t in one interval): each sum is clamped runs plus one `floor_sum`. The ragged
        last query tile is counted directly.
        """
        tr, tc, bq, bc, nk = self.n_q_tiles, self.n_kv_tiles, self.block_q, self.block_kv, self.nk
        left, right = self.bounds
        off = self.offset
        t = self.kv_tiles(tr)
        pairs, last = max(0, t.last - t.first + 1), int(t.last == tc)
        t0 = 0 if right < 0 else max(0, cdiv(-(bq - 1 + off + right), bq))  # L(t) >= 0 from here
        t1 = tr - 2 if left < 0 else min(tr - 2, (nk - 1 - off + left) // bq)  # F(t) <= Nk - 1 up to here
        if t1 < t0:
            return pairs, last
        n = t1 - t0 + 1
        hi_sum = n * ((nk - 1) // bc) if right < 0 else \
            _sum_floor_clamped(t0, t1, bq, bq - 1 + off + right, nk - 1, bc)
        lo_sum = 0 if left < 0 else _sum_floor_clamped(t0, t1, bq, off - left, nk - 1, bc)
        pairs += hi_sum - lo_sum + n
        first_last = t0 if right < 0 else max(t0, cdiv(bc * (tc - 1) - (bq - 1 + off + right), bq))
        last += max(0, t1 - first_last + 1)
        return pairs, last

    def kv_rows_total(self) -> int:
        """K rows (= V rows) streamed by the whole grid: the sum of `kv_rows_loaded(i)` over the query
        tiles. Every loaded tile is B_c rows but the ragged last one (`loaded_pairs`' second count)."""
        pairs, last = self.loaded_pairs()
        return self.block_kv * pairs - (self.block_kv * self.n_kv_tiles - self.nk) * last

    def visible_pairs(self) -> int:
        """(query row, key) pairs visible under the causal flag and window: the sum over rows r (0-based)
        of ``min(Nk - 1, r + off + right) - max(0, r + off - left) + 1`` over the rows that see a key (an
        interval of r), each side a clamped affine function of r: closed form."""
        left, right = self.bounds
        nq, nk, off = self.nq, self.nk, self.offset
        r0 = 0 if right < 0 else max(0, -(off + right))  # r + off + right >= 0 from here
        r1 = nq - 1 if left < 0 else min(nq - 1, nk - 1 - off + left)  # r + off - left <= Nk - 1 up to here
        if r1 < r0:
            return 0
        n = r1 - r0 + 1
        last = n * (nk - 1) if right < 0 else _sum_floor_clamped(r0, r1, 1, off + right, nk - 1, 1)
        first = 0 if left < 0 else _sum_floor_clamped(r0, r1, 1, off - left, nk - 1, 1)
        return last - first + n

    def permitted(self, r: int, c: int) -> bool:
        """Is key column ``c`` visible to query row ``r`` (both 1-based)?"""
        left, right = self.bounds
        return (left < 0 or c >= r + self.offset - left) and (right < 0 or c <= r + self.offset + right)


def _sum_floor_clamped(t0: int, t1: int, a: int, c: int, hi: int, m: int) -> int:
    """sum_{t=t0}^{t1} floor(clamp(a t + c, 0, hi) / m) for a > 0, hi >= 0, m > 0, in O(log m): the runs
    clamped at 0 and at ``hi`` are constants, the rest one `floor_sum`."""
    if t1 < t0:
        return 0
    p = min(t1, (0 - c) // a)  # t <= p: a t + c <= 0
    q = max(t0, cdiv(hi - c, a))  # t >= q: a t + c >= hi (cdiv is a ceiling for any sign)
    total = max(0, t1 - q + 1) * (hi // m)
    s, e = max(t0, p + 1), min(t1, q - 1)
    if e >= s:
        total += floor_sum(e - s + 1, m, a, a * s + c)
    return total


class KvTiles(NamedTuple):
    """`Grid.kv_tiles`: 1-based inclusive KV tile numbers of one query tile."""

    first: int
    full_first: int
    full_last: int
    last: int


@dataclass(frozen=True)
class TileSchedule:
    """What one query tile does. All indices 1-based; ``rows`` inclusive. ``loaded`` = ``left_masked`` +
    ``full`` + ``right_masked`` in order; ``masked`` = ``left_masked`` + ``right_masked``."""

    query_tile: int
    rows: tuple[int, int]
    loaded: list[int]
    skipped: list[int]
    full: list[int]
    masked: list[int]
    row_classes: dict[int, dict[str, tuple[int, int] | None]]
    left_masked: list[int]
    right_masked: list[int]

    def to_json(self) -> dict:
        classes = {str(j): {k: list(v) if v else None for k, v in rc.items()}
                   for j, rc in self.row_classes.items()}
        return asdict(self) | {"rows": list(self.rows), "row_classes": classes}


def head_block(d: int) -> int:
    """The head-dim width of the kernels' tiles for head dim ``d``: the next power of two (``d`` itself for
    64, 128, 256), at least 16 (a tensor-core dot's smallest reduction). A head dim between runs in those
    tiles, its columns past ``d`` zeros (TMA reads zeros past the tensor and clips the stores; pointer
    accesses are masked)."""
    return max(16, 1 << (d - 1).bit_length())


def causal_kv_bounds0(start_m: int, nq: int, nk: int, block_q: int, block_kv: int) -> tuple[int, int]:
    """0-based twin of `Grid.kv_bounds` in element units, as a kernel computes it in-kernel (tests hold the
    two against each other): for the query tile at row ``start_m * block_q``, columns ``[0, lo)`` need no
    mask, ``[lo, hi)`` are loaded and masked, ``[hi, Nk)`` are skipped."""
    g = Grid(nq, nk, block_q, block_kv, causal=True)
    n_full, n_loaded = g.kv_bounds(start_m + 1)
    return (min(n_full * block_kv, nk), min(n_loaded * block_kv, nk))


def normalize_window(causal: bool, window) -> tuple[int, int]:
    """The effective ``(left, right)`` window of a call (flash-attn's ``window_size``; -1 = unbounded on
    that side): key ``c`` (0-based) is visible to query row ``r`` iff ``c >= r + off - left`` (left >= 0)
    and ``c <= r + off + right`` (right >= 0), with ``off = Nk - Nq`` (bottom-right, as causal).
    ``window=None`` is ``(-1, -1)``; ``causal=True`` forces ``right = 0``, so causal alone is ``(-1, 0)``.
    Anything but a pair of integers from -1 to `MAX_DIM` (a side past every sequence) raises `InputError`
    naming ``window``."""
    if window is None:
        left, right = -1, -1
    else:
        ok = isinstance(window, (tuple, list)) and len(window) == 2 and all(
            is_int(x) and -1 <= x <= MAX_DIM for x in window)
        if not ok:
            raise InputError("window: expected None or a pair (left, right) of integers from -1 to 10^24 "
                             f"(-1 = unbounded), got {short(window)}")
        left, right = int(window[0]), int(window[1])
    if causal:
        right = 0
    return left, right


def bounded_window(causal: bool, window) -> tuple[int, int]:
    """The effective ``(left, right)`` of a windowed call (`normalize_window`), refused in one line naming
    ``window`` when it hides no key the mask alone would show (no window, or causal with an unbounded left
    side)."""
    left, right = normalize_window(causal, window)
    expect((left, right) != normalize_window(causal, None), "window",
           "a window bounding the left side (causal bounds the right one)" if causal else
           "a window bounding at least one side", window)
    return left, right


def hides_keys(nq: int, nk: int, causal: bool, window) -> bool:
    """Whether ``window`` (`normalize_window`) hides some (query, key) pair of an ``nq`` x ``nk`` call that
    the causal flag alone shows: fewer visible pairs (`Grid.visible_pairs`, closed form). A window that hides
    none (a side at least the call's length) leaves the call as it is without one."""
    return Grid(nq, nk, causal=causal, window=window).visible_pairs() < \
        Grid(nq, nk, causal=causal).visible_pairs()


def window_span(window: tuple[int, int], n: int) -> int:
    """Keys an effective window ``(left, right)`` spans beside a row's own, within ``n`` keys a side (-1,
    unbounded: ``n``): ``left + right`` clipped."""
    return sum(n if side < 0 else min(side, n) for side in window)


def window_kv_bounds0(row0: int, rows: int, nq: int, nk: int, block_kv: int, causal: bool,
                      window=None) -> tuple[int, int, int, int]:
    """KV columns (0-based, element units, tile-aligned) of the query rows ``row0 .. row0 + rows - 1`` under
    ``causal`` and ``window`` (`normalize_window`): ``(lo, full_lo, full_hi, hi)`` with
    ``lo <= full_lo <= full_hi <= hi``: keys ``[lo, hi)`` are loaded, of which ``[full_lo, full_hi)`` are
    visible to every row (no mask), ``[lo, full_lo)`` and ``[full_hi, hi)`` are masked; the rest are skipped
    (never loaded). ``lo == hi`` when no row sees any key; ``full_lo == full_hi == hi`` when no tile is
    wholly visible. A kernel recomputes this in-kernel (tests hold the two against each other); kernels
    also mask the ragged last tile (a bounds check, not a mask of the attention)."""
    expect(is_int(row0) and row0 >= 0, "row0", "a non-negative integer", row0)
    for name, v in (("rows", rows), ("nq", nq), ("nk", nk), ("block_kv", block_kv)):
        positive_int(name, v)
    left, right = normalize_window(causal, window)
    off = nk - nq
    r0, r1 = row0, row0 + rows - 1
    first = 0 if left < 0 else max(0, r0 + off - left)  # the first key any row sees
    last = nk - 1 if right < 0 else min(nk - 1, r1 + off + right)  # the last key any row sees
    if first > last:
        return (0, 0, 0, 0)
    lo = (first // block_kv) * block_kv
    hi = min(cdiv(last + 1, block_kv) * block_kv, nk)
    f0 = 0 if left < 0 else r1 + off - left  # keys every row sees: [f0, f1]
    f1 = nk - 1 if right < 0 else min(nk - 1, r0 + off + right)
    full_lo = max(cdiv(max(f0, 0), block_kv) * block_kv, lo)
    full_hi = min(nk if f1 == nk - 1 else ((f1 + 1) // block_kv) * block_kv, hi)
    if full_lo >= full_hi:
        return (lo, hi, hi, hi)
    return (lo, full_lo, full_hi, hi)


def persistent_item(k: int, num_m: int, ramp: int | None = None) -> tuple[int, int | None]:
    """(heavy, light) 0-based query tiles of item ``k`` of one head in the persistent paired schedule
    (kernels/fwd_hopper.py ``_work``; light None: the tile runs alone). The first ``ramp`` tiles of a head
    (`persistent_ramp`; default ``num_m``: causal, every tile) cost 1 to ``ramp`` units and go in pairs, the
    others cost about ``ramp + 1`` each and run alone first, the last tile first: items ``k < num_m - ramp``
    are tile ``num_m - 1 - k``; then, with ``j = k - (num_m - ramp)``, an even ``ramp`` pairs ``(ramp - 1 -
    j, j)``; an odd one pairs ``(ramp - 2 - j, j)`` and runs tile ``ramp - 1`` alone as item ``j = (ramp - 1)
    / 2``. With Nq = Nk every item of a call then loads about the same number of KV tiles (square tiles).
    ``ramp`` 0: no pairs, item ``k`` is tile ``k`` (the kernel's plain round-robin)."""
    ramp = num_m if ramp is None else ramp
    expect(is_int(num_m) and num_m >= 0, "num_m", "an integer >= 0", num_m)
    expect(is_int(ramp) and 0 <= ramp <= num_m, "ramp", f"an integer from 0 to num_m = {num_m}", ramp)
    expect(is_int(k), "k", "an integer", k)
    uniform, half = num_m - ramp, (ramp + 1) // 2
    if not 0 <= k < uniform + half:
        raise ValueError(f"k: expected 0 <= k < {uniform + half}, got {k}")
    if ramp == 0:  # nothing paired: the tiles in turn, one round each
        return k, None
    if k < uniform:
        return num_m - 1 - k, None
    j, odd = k - uniform, ramp % 2
    if odd and j == half - 1:
        return ramp - 1, None
    return ramp - 1 - odd - j, j


def persistent_ramp(num_m: int, rows: int, nq: int, nk: int, causal: bool, window=None) -> int:
    """How many of a head's first query tiles (``rows`` rows each) the persistent kernel pairs
    (`persistent_item`; kernels/fwd_hopper.py computes the same in-kernel): every tile causal; with a window
    whose right side is the diagonal (``(left, 0)``: a causal window) and fewer than ``rows`` keys before
    the first query's, the tiles whose rows' windows reach before key 0 -- they load 1, 2, ... KV tiles,
    the others about ``left / rows + 1`` each, so unpaired in a static round-robin the programs drift apart;
    0 otherwise (every tile alone, in turn)."""
    if window is None:
        return num_m if causal else 0
    left, right = normalize_window(causal, window)
    if right != 0:
        return 0
    if left < 0:  # causal
        return num_m
    if nk - nq >= rows:  # keys before the first query's: no tile loads 1, 2, ... KV tiles
        return 0
    return min(max(-(-(left - (nk - nq)) // rows), 0), num_m)


def persistent_items(num_m: int, ramp: int | None = None) -> list[tuple[int, int | None]]:
    """Every item of one head, in order (`persistent_item`); cost grows with ``num_m``: for tests and the
    development simulator, never on an analytic path: ``num_m`` up to `MAX_LISTED`, else `InputError`."""
    expect(is_int(num_m) and 0 <= num_m <= MAX_LISTED, "num_m",
           f"an integer from 0 to {MAX_LISTED:,} (explicit item lists)", num_m)
    ramp = num_m if ramp is None else ramp
    return [persistent_item(k, num_m, ramp) for k in range(num_m - ramp + (ramp + 1) // 2)]




#: `launch_tail`'s factor: the interleaved tail's work, spread over the SMs, lasts TAIL_WAVES / 2 times the
#: heaviest tile (list-schedule simulations; the H200 launch-order probe, BENCHMARKS.md "Backward").
TAIL_WAVES = 4


def launch_tail(causal: bool, blocks: int, heads: int, sms: int) -> int:
    """How many heads end the one-CTA-per-tile kernels' launch order interleaved (`launch_tile`; the Gluon
    kernels and the portable forward).
    Causal, a head's ``blocks`` tiles cost 1 to ``blocks`` units and start heaviest first; in the grid's
    order the last head's heaviest tile starts when little work is left and runs alone at the end. The last
    ``ceil(TAIL_WAVES sms / blocks)`` heads (all when fewer) go rank by rank instead, longest processing
    time first among them: their work (blocks^2 / 2 units a head) then lasts TAIL_WAVES / 2 heaviest tiles
    on ``sms`` SMs, time for the heavy ones to finish beside the light ones. The heads before keep the
    grid's order (a head's CTAs side by side share its K/V, or its Q and dO, in the L2). Unmasked (equal
    tiles): 1, the grid's own order."""
    for name, value in (("blocks", blocks), ("heads", heads), ("sms", sms)):
        positive_int(name, value)
    return min(heads, -(-TAIL_WAVES * sms // blocks)) if causal else 1


def launch_tile(pid: int, blocks: int, heads: int, tail: int) -> tuple[int, int]:
    """(rank, head) of the CTA launched ``pid``-th (0-based; the hardware starts a 2-D grid's CTAs x
    fastest) in a grid of ``blocks`` x ``heads``: the first ``heads - tail`` heads in the grid's order (a
    head's ranks in turn), then the last ``tail`` heads rank by rank (`launch_tail`); ``tail`` 1 is the
    grid's own order, ``tail`` = ``heads`` all heads rank by rank. The kernels (kernels/_tl.py `cta_tile`)
    map rank 0 to their heaviest tile: a query tile counted from the end, a K/V tile from the start."""
    for name, value in (("blocks", blocks), ("heads", heads), ("tail", tail)):
        positive_int(name, value)
    expect(tail <= heads, "tail", f"an integer from 1 to heads = {heads}", tail)
    last = blocks * heads - 1
    expect(is_int(pid) and 0 <= pid <= last, "pid", f"an integer from 0 to {last}", pid)
    lead = (heads - tail) * blocks
    if pid < lead:
        return pid % blocks, pid // blocks
    return (pid - lead) // tail, heads - tail + (pid - lead) % tail
