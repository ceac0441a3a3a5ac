"""model/tiles.py: the spec's causal schedule (§2.1, exercise 4) and properties against a dense mask."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.errors import InputError
from attnscope.model.tiles import (
    TAIL_WAVES,
    Grid,
    causal_kv_bounds0,
    floor_sum,
    launch_tail,
    launch_tile,
    normalize_window,
    persistent_item,
    persistent_items,
    persistent_ramp,
    window_kv_bounds0,
)

SPEC = Grid(4096, 4096, 128, 64, causal=True)


# --- the spec's numbers -----------------------------------------------------------------------------
def test_spec_grid_sizes():
    # §2: "for each Q tile Q_i, i = 1..32", "j = 1 .. 64 if unmasked"
    assert SPEC.n_q_tiles == 32
    assert SPEC.n_kv_tiles == 64


def test_exercise4_query_tile_5():
    # Exercise 4: query tile 5 covers rows 513-640, loads j = 1 ... 10, tiles 1-8 unmasked, 9 and 10 masked.
    s = SPEC.schedule(5)
    assert s.rows == (513, 640)
    assert s.loaded == list(range(1, 11))
    assert s.skipped == list(range(11, 65))
    assert s.full == list(range(1, 9))
    assert s.masked == [9, 10]
    assert SPEC.cols(9) == (513, 576)
    assert SPEC.cols(10) == (577, 640)


def test_exercise4_row_classes_of_the_diagonal_tiles():
    s = SPEC.schedule(5)
    t9, t10 = s.row_classes[9], s.row_classes[10]
    # Tile 9 (columns 513-576) is fully permitted for the lower rows 577-640 ...
    lo, hi = t9["permitted"]
    assert lo <= 577 and hi == 640
    # ... and diagonal for the upper rows 513-576: no row there sees it fully masked, and the rows before
    # the diagonal's last one are triangular (row 576 sees columns 513..576, all of them: c <= r).
    assert t9["masked"] is None
    assert t9["triangular"] == (513, 575)
    # Tile 10 (columns 577-640) is entirely future for rows 513-576 and diagonal for rows 577-640.
    assert t10["masked"] == (513, 576)
    assert t10["triangular"] == (577, 639)
    assert t10["permitted"] == (640, 640)


@pytest.mark.parametrize("i", [1, 2, 5, 17, 32])
def test_spec_skip_bound_is_2i_and_two_diagonal_tiles(i):
    # §2.1: query tile i loads j = 1 .. 2i; the tiles straddling the diagonal are j = 2i-1 and j = 2i.
    s = SPEC.schedule(i)
    assert s.rows == (128 * (i - 1) + 1, 128 * i)
    assert s.loaded == list(range(1, 2 * i + 1))
    assert s.masked == [2 * i - 1, 2 * i]
    assert SPEC.kv_rows_loaded(i) == 128 * i


def test_spec_json_of_tile_5():
    j = SPEC.schedule(5).to_json()
    assert j["query_tile"] == 5 and j["rows"] == [513, 640] and j["masked"] == [9, 10]
    assert j["loaded"] == list(range(1, 11)) and j["skipped"] == list(range(11, 65))


def test_unmasked_loads_everything_masks_nothing():
    g = Grid(4096, 4096, 128, 64, causal=False)
    s = g.schedule(5)
    assert s.loaded == list(range(1, 65)) and s.masked == [] and s.skipped == []
    assert g.kv_rows_loaded(5) == 4096


# --- properties against a dense causal mask ---------------------------------------------------------
windows = st.one_of(st.none(), st.tuples(st.integers(-1, 50), st.integers(-1, 50)),
                    st.tuples(st.integers(-1, 3), st.integers(-1, 3)))
grids = st.builds(
    lambda nq, nk, bq, bkv, causal, window: Grid(nq, nk, bq, bkv, causal=causal, window=window),
    st.integers(1, 97), st.integers(1, 97), st.integers(1, 40), st.integers(1, 40), st.booleans(), windows)


def _dense(g: Grid) -> np.ndarray:
    """The visibility rule written out here (mods contract), not taken from tiles.py."""
    r = np.arange(1, g.nq + 1)[:, None]
    c = np.arange(1, g.nk + 1)[None, :]
    left, right = (-1, -1) if g.window is None else g.window
    right = 0 if g.causal else right
    keep = np.ones((g.nq, g.nk), bool)
    if left >= 0:
        keep &= c >= r + (g.nk - g.nq) - left
    if right >= 0:
        keep &= c <= r + (g.nk - g.nq) + right
    return keep


@settings(max_examples=150, deadline=None)
@given(grids)
def test_partition_of_kv_tiles(g):
    every = list(range(1, g.n_kv_tiles + 1))
    for i in range(1, g.n_q_tiles + 1):
        s = g.schedule(i)
        assert sorted(s.loaded + s.skipped) == every
        assert sorted(s.full + s.masked) == s.loaded
        assert not set(s.full) & set(s.masked)
        assert s.left_masked + s.full + s.right_masked == s.loaded  # in this order
        assert s.masked == s.left_masked + s.right_masked
        if g.bounds[0] < 0:  # no left bound: full tiles first, as kv_bounds says
            assert s.full == s.loaded[: len(s.full)] and s.loaded == list(range(1, len(s.loaded) + 1))
            assert g.kv_bounds(i) == (len(s.full), len(s.loaded))
        else:
            with pytest.raises(NotImplementedError, match="kv_bounds: supported without a left window"):
                g.kv_bounds(i)


@settings(max_examples=150, deadline=None)
@given(grids)
def test_closed_form_agrees_with_brute_force(g):
    allowed = _dense(g)
    for i in range(1, g.n_q_tiles + 1):
        s = g.schedule(i)
        r0, r1 = s.rows
        assert (r0, r1) == ((i - 1) * g.block_q + 1, min(i * g.block_q, g.nq))
        rows_read = 0
        for j in range(1, g.n_kv_tiles + 1):
            c0, c1 = (j - 1) * g.block_kv + 1, min(j * g.block_kv, g.nk)
            block = allowed[r0 - 1:r1, c0 - 1:c1]
            if not block.any():
                assert j in s.skipped, (i, j)
            elif block.all():
                assert j in s.full, (i, j)
                rows_read += c1 - c0 + 1
            else:
                assert j in s.masked, (i, j)
                rows_read += c1 - c0 + 1
                rc = s.row_classes[j]
                left, right = g.bounds
                for r in range(r0, r1 + 1):
                    n = int(allowed[r - 1, c0 - 1:c1].sum())
                    hi_r = r + g.nk - g.nq + right if right >= 0 else g.nk + c1  # the row's window edges
                    kind = ("permitted" if n == c1 - c0 + 1 else
                            ("masked" if hi_r < c0 else "left_masked") if n == 0 else
                            "triangular" if hi_r < c1 else "left_edge")
                    span = rc[kind]
                    assert span is not None and span[0] <= r <= span[1], (i, j, r, kind, rc)
                    assert sum(x is not None and x[0] <= r <= x[1] for x in rc.values()) == 1, (r, rc)
                assert set(rc) == ({"masked", "triangular", "permitted"}
                                   | ({"left_edge", "left_masked"} if left >= 0 else set()))
        assert g.kv_rows_loaded(i) == rows_read


@settings(max_examples=150, deadline=None)
@given(grids)
def test_window_kv_bounds0_is_kv_tiles_in_keys(g):
    """The kernels' 0-based element bounds (`window_kv_bounds0`) and Grid's 1-based tiles are one answer."""
    bc = g.block_kv
    for i in range(1, g.n_q_tiles + 1):
        r0, r1 = g.rows(i)
        lo, full_lo, full_hi, hi = window_kv_bounds0(r0 - 1, r1 - r0 + 1, g.nq, g.nk, bc, g.causal, g.window)
        s = g.schedule(i)
        keys = lambda tiles: (min((t - 1) * bc for t in tiles), min(max(tiles) * bc, g.nk))  # noqa: E731
        assert (lo, hi) == (keys(s.loaded) if s.loaded else (0, 0))
        if s.full:
            assert (full_lo, full_hi) == keys(s.full)
            assert s.left_masked == [t for t in s.loaded if (t - 1) * bc < full_lo]
        else:
            assert full_lo == full_hi == hi and s.masked == s.left_masked


@settings(max_examples=100, deadline=None)
@given(grids)
def test_zero_based_twin_matches(g):
    if not g.causal or g.window is not None:
        return
    for i in range(1, g.n_q_tiles + 1):
        n_full, n_loaded = g.kv_bounds(i)
        lo, hi = causal_kv_bounds0(i - 1, g.nq, g.nk, g.block_q, g.block_kv)
        assert (lo, hi) == (min(n_full * g.block_kv, g.nk), min(n_loaded * g.block_kv, g.nk))


@settings(max_examples=100, deadline=None)
@given(grids)
def test_permitted_matches_dense_mask(g):
    allowed = _dense(g)
    for r in {1, g.nq, (g.nq + 1) // 2}:
        for c in {1, g.nk, (g.nk + 1) // 2}:
            assert g.permitted(r, c) == bool(allowed[r - 1, c - 1])


# --- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("i", [0, 33, -1, True, 2.0])
def test_query_tile_out_of_range(i):
    with pytest.raises(InputError, match=r"query_tile: expected an integer in 1\.\.32, got"):
        SPEC.schedule(i)


@pytest.mark.parametrize("kw", [dict(nq=0), dict(nk=-3), dict(block_q=0), dict(block_kv=-64)])
def test_non_positive_sizes(kw):
    args = dict(nq=16, nk=16, block_q=4, block_kv=4) | kw
    name = next(iter(kw))
    with pytest.raises(InputError, match=rf"{name}: expected a positive integer, got"):
        Grid(**args)


# --- closed forms -------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 60), m=st.integers(1, 50), a=st.integers(0, 120), b=st.integers(0, 120))
def test_floor_sum_equals_the_sum(n, m, a, b):
    assert floor_sum(n, m, a, b) == sum((a * t + b) // m for t in range(n))


@settings(max_examples=300, deadline=None)
@given(nq=st.integers(1, 400), nk=st.integers(1, 400), bq=st.integers(1, 80), bkv=st.integers(1, 80),
       causal=st.booleans())
def test_kv_rows_total_is_the_sum_over_query_tiles(nq, nk, bq, bkv, causal):
    g = Grid(nq, nk, bq, bkv, causal=causal)
    assert g.kv_rows_total() == sum(g.kv_rows_loaded(i) for i in range(1, g.n_q_tiles + 1))


def test_kv_rows_total_is_constant_time():
    import time

    t0 = time.perf_counter()
    g = Grid(10**18, 10**18 + 12345, 128, 1, causal=True)
    g.kv_rows_total()
    for w in ((4096, 0), (10**15, 17), (-1, 10**9), (3, -1)):
        Grid(10**18, 10**18 - 999, 128, 1, causal=False, window=w).kv_rows_total()
    assert time.perf_counter() - t0 < 0.05


def _brute_pairs(g: Grid) -> tuple[int, int]:
    """The loaded (query tile, KV tile) pairs from the dense mask: a tile is loaded iff some row of the query
    tile sees a key in it; and the query tiles that load the last KV tile."""
    allowed = _dense(g)
    pairs = last = 0
    for i in range(1, g.n_q_tiles + 1):
        r0, r1 = g.rows(i)
        for j in range(1, g.n_kv_tiles + 1):
            c0, c1 = g.cols(j)
            if allowed[r0 - 1:r1, c0 - 1:c1].any():
                pairs += 1
                last += j == g.n_kv_tiles
    return pairs, last


@pytest.mark.parametrize("seed", range(4))
def test_loaded_pairs_closed_form_equals_brute_force_with_windows(seed):
    rng = np.random.default_rng(seed)
    for _ in range(250):
        nq, nk, bq, bk = (int(x) for x in rng.integers(1, [160, 160, 33, 33]))
        side = lambda: int(rng.choice([-1, 0, 1, int(rng.integers(0, 200))]))  # noqa: E731
        g = Grid(nq, nk, bq, bk, causal=bool(rng.random() < 0.5), window=(side(), side()))
        assert g.loaded_pairs() == _brute_pairs(g), (nq, nk, bq, bk, g.causal, g.window)
        assert g.visible_pairs() == int(_dense(g).sum()), (nq, nk, g.causal, g.window)
        assert g.kv_rows_total() == sum(g.kv_rows_loaded(i) for i in range(1, g.n_q_tiles + 1))


def test_window_grid_worked_example():
    """N = 4,096, B_r = 128, B_c = 64, causal (forces right = 0), left = 1,024: query tile 20 (rows
    2,433..2,560) loads keys 1,409..2,560 -> KV tiles 23..40; every row sees keys 1,536..2,433, which
    hold tiles 25 (1,537..1,600) .. 38 (2,369..2,432) whole; 23, 24 straddle the left edge, 39, 40 the
    diagonal."""
    g = Grid(4096, 4096, 128, 64, causal=True, window=(1024, 5))
    t = g.kv_tiles(20)
    assert t == (23, 25, 38, 40) and g.schedule(20).left_masked == [23, 24]
    assert g.schedule(20).right_masked == [39, 40] and g.kv_rows_loaded(20) == 18 * 64
    assert g.window == (1024, 5) and g.bounds == (1024, 0)


def test_grid_rejects_a_bad_window():
    with pytest.raises(InputError, match="window: expected None or a pair"):
        Grid(16, 16, window=(-2, 0))


@pytest.mark.parametrize("num_m", list(range(1, 40)) + [213, 214])
def test_persistent_items_cover_every_tile_once_at_one_cost(num_m):
    """kernels/fwd_hopper.py ``_work``'s causal items (`persistent_item`): every query tile once, and with
    Nq = Nk (square tiles) every item loads the same number of KV tiles, so persistent CTAs stay in step."""
    items = persistent_items(num_m)
    assert len(items) == (num_m + 1) // 2
    tiles = [h for h, _ in items] + [lt for _, lt in items if lt is not None]
    assert sorted(tiles) == list(range(num_m))
    costs = {(h + 1) + (0 if lt is None else lt + 1) for h, lt in items}
    assert costs == {num_m + 1 if num_m % 2 == 0 else num_m}
    assert all(lt is None or h > lt for h, lt in items)  # the heavy tile first
    with pytest.raises(ValueError, match="k: expected 0 <= k <"):
        persistent_item(len(items), num_m)


@pytest.mark.parametrize("n,nk,left,rows", [
    (32768, 32768, 16384, 128), (32768, 32768, 12288, 128), (4096, 4096, 1000, 128), (4096, 4096, 1, 128),
    (5000, 5000, 4999, 128), (3000, 3000, 20000, 128), (1000, 3000, 2500, 128), (1000, 3000, 1500, 128),
    (4000, 4000, 385, 64), (3000, 3100, 900, 128)])
def test_a_causal_windows_ramp_goes_in_pairs_and_every_item_costs_about_one_full_tile(n, nk, left, rows):
    """A causal window (left, 0): `persistent_ramp` counts the first tiles whose windows reach before key 0
    (each loads fewer KV tiles than the rest); `persistent_item` runs the rest alone and pairs the ramp, so
    every item loads within one KV tile of the same count (the programs stay in step) and every tile runs
    once. Kernels/fwd_hopper.py ``_ramp`` and ``_work`` compute the same on the GPU."""
    num_m = -(-n // rows)
    ramp = persistent_ramp(num_m, rows, n, nk, True, (left, 0))
    cost = []
    for j in range(num_m):
        lo, _, _, hi = window_kv_bounds0(j * rows, min(rows, n - j * rows), n, nk, rows, True, (left, 0))
        cost.append(-(-hi // rows) - lo // rows)
    if ramp == 0:  # keys before the first query's: no tile loads 1, 2, ...; the tiles alone, in turn
        assert nk - n >= rows and persistent_items(num_m, 0) == [(j, None) for j in range(num_m)]
        return
    assert all(c >= max(cost) - 1 for c in cost[ramp:]) and all(c < max(cost) for c in cost[:ramp - 1])
    items = persistent_items(num_m, ramp)
    tiles = [h for h, _ in items] + [lt for _, lt in items if lt is not None]
    assert sorted(tiles) == list(range(num_m))
    item_cost = [cost[h] + (0 if lt is None else cost[lt]) for h, lt in items]
    assert max(item_cost) - min(item_cost) <= (2 if ramp < num_m else 1), item_cost
    assert persistent_ramp(num_m, rows, n, nk, False, (left, 5)) == 0  # a right side: tiles alone, in turn
    assert persistent_ramp(num_m, rows, n, nk, True, (-1, 0)) == persistent_ramp(num_m, rows, n, nk, True) \
        == num_m


@pytest.mark.parametrize("blocks,heads,tail", [(5, 3, 1), (5, 3, 3), (7, 10, 4), (7, 10, 10), (1, 1, 1),
                                                (64, 4, 4), (3, 9, 2)])
def test_launch_tile_covers_the_grid_once(blocks, heads, tail):
    """`launch_tile`: every (rank, head) of the grid once; tail 1 is the grid's own order (x fastest); the
    first heads - tail heads keep it, then the last ``tail`` heads go rank by rank (all ranks 0 first: the
    heaviest tiles first among them)."""
    got = [launch_tile(p, blocks, heads, tail) for p in range(blocks * heads)]
    assert sorted(got) == [(r, h) for r in range(blocks) for h in range(heads)]
    lead = (heads - tail) * blocks
    assert got[:lead] == [(p % blocks, p // blocks) for p in range(lead)]
    assert got[lead:] == [(r, h) for r in range(blocks) for h in range(heads - tail, heads)]
    if tail == 1:
        assert got == [(p % blocks, p // blocks) for p in range(blocks * heads)]


def test_launch_tail_and_its_bad_values():
    """Causal: the last ceil(TAIL_WAVES sms / blocks) heads interleave (all when fewer); unmasked: none."""
    assert TAIL_WAVES == 4
    assert launch_tail(True, 64, 48, 132) == 9 and launch_tail(True, 64, 4, 132) == 4
    assert launch_tail(True, 1024, 48, 132) == 1 and launch_tail(False, 64, 48, 132) == 1
    with pytest.raises(InputError, match="pid: expected an integer from 0 to 5"):
        launch_tile(6, 3, 2, 1)
    with pytest.raises(InputError, match="tail: expected an integer from 1 to heads = 2"):
        launch_tile(0, 3, 2, 3)
    with pytest.raises(InputError, match="sms"):
        launch_tail(True, 4, 4, 0)


# --- sliding windows ------------------------------------------------------------------------------
def _visible(nq, nk, causal, window):
    left, right = normalize_window(causal, window)
    off = nk - nq
    return [[(left < 0 or c >= r + off - left) and (right < 0 or c <= r + off + right) for c in range(nk)]
            for r in range(nq)]


@pytest.mark.parametrize("nq,nk,bq,bk", [(37, 37, 8, 8), (20, 53, 16, 8), (53, 20, 8, 16), (64, 64, 16, 16)])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (0, 0)), (True, (1, 0)),
                                           (False, (5, 5)), (False, (-1, 7)), (True, (13, -1)),
                                           (False, (0, 0)), (False, (100, 100)), (False, (3, -1))])
def test_window_bounds_are_exact(nq, nk, bq, bk, causal, window):
    """Loaded keys hold every visible key; the unmasked range is visible to every row; the first and last
    loaded tiles each hold a visible key (no tile is loaded for nothing)."""
    vis = _visible(nq, nk, causal, window)
    for r0 in range(0, nq, bq):
        rows = range(r0, min(r0 + bq, nq))
        lo, full_lo, full_hi, hi = window_kv_bounds0(r0, len(rows), nq, nk, bk, causal, window)
        assert 0 <= lo <= full_lo <= full_hi <= hi <= nk and lo % bk == 0
        seen = [c for c in range(nk) if any(vis[r][c] for r in rows)]
        if not seen:
            assert lo == hi
            continue
        assert lo <= seen[0] and seen[-1] < hi
        assert seen[0] < lo + bk and seen[-1] >= (hi - 1) // bk * bk
        assert all(vis[r][c] for r in rows for c in range(full_lo, full_hi))
        if full_lo < full_hi:
            assert full_lo % bk == 0 and (full_hi % bk == 0 or full_hi == nk)
        if causal and window is None:  # the causal special case agrees with the two-stage bounds
            a, b = causal_kv_bounds0(r0 // bq, nq, nk, bq, bk)
            assert hi == b and (full_hi if full_lo < full_hi else 0) == min(a, b)


def test_window_rejects_bad_values():
    for bad in ((-2, 0), (1,), (1.5, 2), "1,2", (True, 0), (0, -3)):
        with pytest.raises(InputError, match="window"):
            normalize_window(False, bad)
    assert normalize_window(True, (4, 9)) == (4, 0) and normalize_window(False, None) == (-1, -1)


def test_window_span_and_bounded_window():
    from attnscope.errors import InputError
    from attnscope.model.tiles import bounded_window, window_span

    assert window_span((3, 0), 10) == 3 and window_span((-1, 5), 10) == 15 and window_span((20, -1), 10) == 20
    assert bounded_window(True, (7, 9)) == (7, 0) and bounded_window(False, (-1, 4)) == (-1, 4)
    for causal, window in ((False, None), (False, (-1, -1)), (True, (-1, 3))):
        with pytest.raises(InputError, match="window: expected a window bounding"):
            bounded_window(causal, window)
