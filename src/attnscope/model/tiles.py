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
straddling the diagonal) and ``skipped`` (never loaded); ``loaded = full + masked`` and ``full`` always
precede ``masked``. Unmasked attention loads every tile and masks none (the ragged last tile needs only
a bounds check, which is not a causal mask).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnscope.errors import InputError, positive_int, short

#: Largest T_c for which `Grid.schedule` builds explicit lists of tile numbers.
MAX_LISTED = 1 << 20


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum_{t=0}^{n-1} floor((a t + b) / m) for n >= 0, m > 0, a >= 0, b >= 0, in O(log m) steps (the
    Euclid-like reduction of the lattice-point count under a line)."""
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
    """Ceiling division for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


@dataclass(frozen=True)
class Grid:
    """A tiling of an ``Nq x Nk`` score matrix into ``block_q x block_kv`` tiles."""

    nq: int
    nk: int
    block_q: int = 128
    block_kv: int = 64
    causal: bool = False

    def __post_init__(self) -> None:
        for name in ("nq", "nk", "block_q", "block_kv"):
            positive_int(name, getattr(self, name))

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
        if not (isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= self.n_q_tiles):
            raise InputError(f"query_tile: expected an integer in 1..{self.n_q_tiles}, got {short(i)}")
        return (self.block_q * (i - 1) + 1, min(self.block_q * i, self.nq))

    def cols(self, j: int) -> tuple[int, int]:
        """Columns (1-based, inclusive) of KV tile ``j``."""
        if not (isinstance(j, int) and 1 <= j <= self.n_kv_tiles):
            raise InputError(f"kv_tile: expected an integer in 1..{self.n_kv_tiles}, got {short(j)}")
        return (self.block_kv * (j - 1) + 1, min(self.block_kv * j, self.nk))

    def kv_bounds(self, i: int) -> tuple[int, int]:
        """``(n_full, n_loaded)`` for query tile ``i`` (1-based): KV tiles ``1..n_full`` are loaded without
        mask arithmetic, ``n_full+1..n_loaded`` loaded and masked, ``n_loaded+1..T_c`` skipped.

        Tile j is loaded iff its first column is permitted for the tile's last row, so ``n_loaded =
        clamp(ceil((r_last + off) / B_c), 0, T_c)``; it needs no mask iff its last column is permitted for
        the first row, so ``n_full = clamp(floor((r_first + off) / B_c), 0, T_c)`` (all when
        ``r_first + off >= Nk``).
        """
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
        (`kv_bounds(i)` gives the same as two integers at any size)."""
        n_full, n_loaded = self.kv_bounds(i)
        if self.n_kv_tiles > MAX_LISTED or n_loaded - n_full > MAX_LISTED // 64:
            raise InputError(f"block_kv: expected at most {MAX_LISTED:,} KV tiles (and {MAX_LISTED // 64:,} "
                             f"masked) for explicit tile lists, got {self.n_kv_tiles:,}; use kv_bounds(i)")
        masked = list(range(n_full + 1, n_loaded + 1))
        return TileSchedule(
            query_tile=i,
            rows=self.rows(i),
            loaded=list(range(1, n_loaded + 1)),
            skipped=list(range(n_loaded + 1, self.n_kv_tiles + 1)),
            full=list(range(1, n_full + 1)),
            masked=masked,
            row_classes={j: self.row_classes(i, j) for j in masked},
        )

    def row_classes(self, i: int, j: int) -> dict[str, tuple[int, int] | None]:
        """For KV tile ``j`` seen from query tile ``i``: which rows see it fully masked, triangular
        (partly permitted), or fully permitted. Each value is an inclusive 1-based row range or None.

        Row r sees tile j (columns c0..c1) fully masked iff ``c0 > r + off``, fully permitted iff
        ``c1 <= r + off``, triangular otherwise; the three ranges are contiguous and in that order.
        """
        r0, r1 = self.rows(i)
        c0, c1 = self.cols(j)
        off = self.offset if self.causal else None

        def clamp(lo: int, hi: int) -> tuple[int, int] | None:
            lo, hi = max(lo, r0), min(hi, r1)
            return (lo, hi) if lo <= hi else None

        if off is None:
            return {"masked": None, "triangular": None, "permitted": (r0, r1)}
        # masked: r + off < c0  <=>  r <= c0 - off - 1;  permitted: r >= c1 - off
        return {
            "masked": clamp(r0, c0 - off - 1),
            "triangular": clamp(c0 - off, c1 - off - 1),
            "permitted": clamp(c1 - off, r1),
        }

    def kv_rows_loaded(self, i: int) -> int:
        """Number of K rows (= V rows) query tile ``i`` reads: the sum of the loaded tiles' widths."""
        _, n_loaded = self.kv_bounds(i)
        return min(n_loaded * self.block_kv, self.nk)

    def loaded_pairs(self) -> tuple[int, int]:
        """``(pairs, full)``: the (query tile, KV tile) pairs the grid loads (the sum of `kv_bounds`'s
        ``n_loaded``) and how many query tiles load every KV tile, in closed form: causal, the tiles before
        the last split into runs loading none, ``ceil((B_r i + off) / B_c)`` (a `floor_sum`), and all T_c.
        """
        tr, tc, bq, bc, off = self.n_q_tiles, self.n_kv_tiles, self.block_q, self.block_kv, self.offset
        if not self.causal:
            return tr * tc, tr
        last = self.kv_bounds(tr)[1]
        pairs, full = last, int(last == tc)
        m = tr - 1  # tiles 1..m have r_last = B_r * i (none when T_r = 1: both ranges below are empty)
        i0 = max(1, -off // bq + 1)  # first i with B_r i + off > 0
        i1 = max(i0, (bc * (tc - 1) - off) // bq + 1)  # first i loading every KV tile
        lo, hi = i0, min(i1 - 1, m)
        if hi >= lo:  # ceil(x / B_c) = floor((x + B_c - 1) / B_c), i = lo + t
            pairs += floor_sum(hi - lo + 1, bc, bq, bq * lo + off + bc - 1)
        if m >= i1:
            pairs += (m - i1 + 1) * tc
            full += m - i1 + 1
        return pairs, full

    def kv_rows_total(self) -> int:
        """K rows (= V rows) streamed by the whole grid: the sum of `kv_rows_loaded(i)` over the query
        tiles. Every loaded tile is B_c rows but the ragged last one, which the ``full`` tiles load."""
        pairs, full = self.loaded_pairs()
        return self.block_kv * pairs - (self.block_kv * self.n_kv_tiles - self.nk) * full

    def permitted(self, r: int, c: int) -> bool:
        """Is key column ``c`` visible to query row ``r`` (both 1-based)?"""
        return (not self.causal) or c <= r + self.offset


@dataclass(frozen=True)
class TileSchedule:
    """What one query tile does. All indices 1-based; ``rows`` inclusive."""

    query_tile: int
    rows: tuple[int, int]
    loaded: list[int]
    skipped: list[int]
    full: list[int]
    masked: list[int]
    row_classes: dict[int, dict[str, tuple[int, int] | None]]

    def to_json(self) -> dict:
        classes = {str(j): {k: list(v) if v else None for k, v in rc.items()}
                   for j, rc in self.row_classes.items()}
        return asdict(self) | {"rows": list(self.rows), "row_classes": classes}


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
    Anything but a pair of integers >= -1 raises `InputError` naming ``window``."""
    if window is None:
        left, right = -1, -1
    else:
        ok = isinstance(window, (tuple, list)) and len(window) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= -1 for x in window)
        if not ok:
            raise InputError("window: expected None or a pair (left, right) of integers >= -1 "
                             f"(-1 = unbounded), got {short(window)}")
        left, right = int(window[0]), int(window[1])
    if causal:
        right = 0
    return left, right


def window_kv_bounds0(row0: int, rows: int, nq: int, nk: int, block_kv: int, causal: bool,
                      window=None) -> tuple[int, int, int, int]:
    """KV columns (0-based, element units, tile-aligned) of the query rows ``row0 .. row0 + rows - 1`` under
    ``causal`` and ``window`` (`normalize_window`): ``(lo, full_lo, full_hi, hi)`` with
    ``lo <= full_lo <= full_hi <= hi``: keys ``[lo, hi)`` are loaded, of which ``[full_lo, full_hi)`` are
    visible to every row (no mask), ``[lo, full_lo)`` and ``[full_hi, hi)`` are masked; the rest are skipped
    (never loaded). ``lo == hi`` when no row sees any key; ``full_lo == full_hi == hi`` when no tile is
    wholly visible. A kernel recomputes this in-kernel (tests hold the two against each other); kernels
    also mask the ragged last tile (a bounds check, not a mask of the attention)."""
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


def persistent_item(k: int, num_m: int) -> tuple[int, int | None]:
    """(heavy, light) 0-based query tiles of item ``k`` of one head in the persistent causal schedule
    (kernels/fwd_hopper.py ``_work``; light None: the tile runs alone). Even ``num_m``: items
    ``k < num_m / 2`` pair ``(num_m - 1 - k, k)``; odd: items ``k < (num_m - 1) / 2`` pair
    ``(num_m - 2 - k, k)`` and item ``(num_m - 1) / 2`` is tile ``num_m - 1`` alone. With Nq = Nk every item
    of a call then loads the same number of KV tiles (num_m + 1 even, num_m odd, square tiles)."""
    half = (num_m + 1) // 2
    if not 0 <= k < half:
        raise ValueError(f"k: expected 0 <= k < {half}, got {k}")
    odd = num_m % 2
    if odd and k == half - 1:
        return num_m - 1, None
    return num_m - 1 - odd - k, k


def persistent_items(num_m: int) -> list[tuple[int, int | None]]:
    """Every item of one head, in order (`persistent_item`); cost grows with ``num_m``: for tests and the
    development simulator, never on an analytic path."""
    return [persistent_item(k, num_m) for k in range((num_m + 1) // 2)]
