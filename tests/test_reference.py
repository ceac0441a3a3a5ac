"""reference.py: the float64 naive, tiled (FA-2 and FA-1) and combine paths, the trace, and bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from attnscope import reference as R
from attnscope.errors import InputError
from attnscope.model.tiles import Grid

SPEC_TILES = [([8, 6], [[1, 2], [3, 4]]), ([10, 7], [[5, 6], [7, 8]])]


def rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def direct(q, k, v, causal, scale=None):
    """Row by row, with Python loops: the softmax over the keys each row may see (bottom-right)."""
    nq, nk, d = q.shape[0], k.shape[0], q.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o = np.zeros((nq, v.shape[1]))
    lse = np.full(nq, -np.inf)
    for r in range(nq):
        cols = [c for c in range(nk) if not causal or c <= r + nk - nq]
        if not cols:
            continue
        s = np.array([q[r] @ k[c] * scale for c in cols])
        w = np.exp(s - s.max())
        o[r] = (w / w.sum()) @ v[cols]
        lse[r] = s.max() + math.log(w.sum())
    return o, lse


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# --- naive and tiled against a row-by-row loop ------------------------------------------------------
@pytest.mark.parametrize("nq,nk", [(9, 9), (2, 5), (5, 2), (1, 7), (7, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_tiled_match_row_loop(rng, nq, nk, causal):
    q, k, v = rng.standard_normal((nq, 6)), rng.standard_normal((nk, 6)), rng.standard_normal((nk, 3))
    o_ref, lse_ref = direct(q, k, v, causal)
    o, lse = R.naive_attention(q, k, v, causal=causal, return_lse=True)
    o2, lse2 = R.tiled_attention(q, k, v, causal=causal, block_q=2, block_kv=3)
    for a, b in ((o, lse), (o2, lse2)):
        assert np.allclose(a, o_ref, rtol=0, atol=1e-13)
        assert np.array_equal(np.isneginf(b), np.isneginf(lse_ref))
        assert np.allclose(b[np.isfinite(lse_ref)], lse_ref[np.isfinite(lse_ref)], rtol=0, atol=1e-13)


def test_uniform_scores_average_the_values():
    # q = 0: every score is 0, so the output is the plain mean of the value rows
    v = np.arange(12.0).reshape(6, 2)
    o = R.tiled_attention(np.zeros((3, 4)), np.ones((6, 4)), v, block_q=2, block_kv=4)[0]
    assert np.allclose(o, v.mean(axis=0))


def test_bottom_right_alignment():
    # Nq = 2, Nk = 5: the last query sees every key, the first sees keys 0..3 (c <= r + 3)
    q = np.zeros((2, 1))
    v = np.eye(5)
    o = R.naive_attention(q, np.zeros((5, 1)), v, causal=True)
    assert np.allclose(o[0], [0.25, 0.25, 0.25, 0.25, 0])
    assert np.allclose(o[1], [0.2] * 5)


def test_lse_is_natural_log_of_scaled_scores(rng):
    q, k, v = rng.standard_normal((3, 4, 8)), rng.standard_normal((3, 9, 8)), rng.standard_normal((3, 9, 8))
    _, lse = R.tiled_attention(q, k, v, scale=0.3, block_q=2, block_kv=4)
    assert np.allclose(lse, logsumexp(0.3 * q @ np.swapaxes(k, -1, -2), axis=-1), rtol=0, atol=1e-13)


def test_default_scale_is_one_over_sqrt_d(rng):
    q, k, v = rng.standard_normal((4, 16)), rng.standard_normal((5, 16)), rng.standard_normal((5, 2))
    a = R.tiled_attention(q, k, v)[0]
    b = R.tiled_attention(q, k, v, scale=0.25)[0]
    assert np.array_equal(a, b)


def test_gqa_broadcasts_kv_heads(rng):
    q = rng.standard_normal((2, 8, 10, 4))
    k, v = rng.standard_normal((2, 2, 13, 4)), rng.standard_normal((2, 2, 13, 4))
    o, lse = R.tiled_attention(q, k, v, causal=True, block_q=4, block_kv=4)
    for b in range(2):
        for h in range(8):  # query head h reads kv head h // 4
            o_h, lse_h = direct(q[b, h], k[b, h // 4], v[b, h // 4], causal=True)
            assert np.allclose(o[b, h], o_h, rtol=0, atol=1e-13)
            assert np.allclose(lse[b, h], lse_h, rtol=0, atol=1e-13)


def test_empty_rows_are_zero_with_lse_minus_inf_and_no_invalid_arithmetic(rng):
    # Nq > Nk causal: rows 0..2 see no key. errstate(invalid='raise') fails on any -inf - (-inf).
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 2, 4)), rng.standard_normal((2, 2, 3))
    with np.errstate(invalid="raise"):
        for normalized in (False, True):
            o, lse, tr = R.tiled_attention(q, k, v, causal=True, block_q=2, block_kv=1, normalized=normalized,
                                           trace_rows=range(5))
            assert not np.any(o[:, :3]) and np.all(np.isneginf(lse[:, :3]))
            assert np.all(np.isfinite(lse[:, 3:]))
            # row 2 shares query tile 2 (rows 2, 3) with row 3, which loads KV tile 1: row 2's state stays
            # empty (m = -inf, l = 0) and its alpha is 0, never NaN
            assert [s.kv_tile for s in tr[2]] == [1]
            st_ = tr[2][0]
            assert np.all(np.isneginf(st_.m)) and not np.any(st_.l) and not np.any(st_.acc)
            assert not np.any(np.isnan(st_.alpha))
            assert tr[0] == [] and tr[1] == []  # query tile 1 loads nothing: skip bound
        o_n, lse_n = R.naive_attention(q, k, v, causal=True, return_lse=True)
    assert not np.any(o_n[:, :3]) and np.all(np.isneginf(lse_n[:, :3]))


# --- the trace --------------------------------------------------------------------------------------
def test_tiled_trace_reproduces_spec_3_2():
    # scores [8, 6, 10, 7] from q = [1], k = the scores, scale 1; two KV tiles of two keys
    q = np.array([[1.0]])
    k = np.array([[8.0], [6.0], [10.0], [7.0]])
    v = np.array([[1.0, 2], [3, 4], [5, 6], [7, 8]])
    o, lse, tr = R.tiled_attention(q, k, v, scale=1.0, block_q=1, block_kv=2, trace_rows=[0])
    s1, s2 = tr[0]
    assert (s1.kv_tile, s2.kv_tile) == (1, 2) and not s1.masked
    assert round(s1.m, 4) == 8.0 and round(s1.l, 4) == 1.1353
    assert np.round(s1.acc, 4).tolist() == [1.4060, 2.5413]
    assert s1.alpha == 0.0  # exp(-inf - 8): no previous state
    assert round(s2.m, 4) == 10.0 and round(s2.alpha, 4) == 0.1353 and round(s2.l, 4) == 1.2034
    assert np.round(s2.acc, 4).tolist() == [5.5388, 6.7422]
    assert np.round(o[0], 4).tolist() == [4.6025, 5.6025]


def test_trace_marks_masked_tiles_and_fully_masked_regions_leave_state_alone(rng):
    # N = 16, B_r = 8, B_c = 4: query tile 1 loads KV tiles 1, 2, both masked; rows 0..3 see nothing of
    # tile 2, so their state after tile 2 equals the state after tile 1, with alpha = 1.
    q, k, v = rng.standard_normal((3, 16, 8))
    _, _, tr = R.tiled_attention(q, k, v, causal=True, block_q=8, block_kv=4, trace_rows=[0, 3, 4, 12])
    grid = Grid(16, 16, 8, 4, causal=True)
    assert [s.kv_tile for s in tr[0]] == grid.schedule(1).loaded == [1, 2]
    assert all(s.masked for s in tr[0])
    for r in (0, 3):
        a, b = tr[r]
        assert b.alpha == 1.0 and b.m == a.m and b.l == a.l and np.array_equal(a.acc, b.acc)
    assert [s.masked for s in tr[12]] == [j in grid.schedule(2).masked for j in grid.schedule(2).loaded]
    assert tr[4][1].l > tr[4][0].l  # row 4 sees column 4 of tile 2


def test_online_softmax_trace_spec_example():
    t = R.online_softmax_trace(SPEC_TILES)
    assert [s["tile"] for s in t.steps] == [1, 2]
    assert t.steps[0]["alpha"] is None
    assert round(t.steps[1]["alpha"], 4) == 0.1353
    assert [round(s["l"], 4) for s in t.steps] == [1.1353, 1.2034]
    assert np.round(t.steps[1]["acc"], 4).tolist() == [5.5388, 6.7422]
    assert np.round(t.output, 4).tolist() == [4.6025, 5.6025]
    assert np.round(t.weights, 4).tolist() == [0.1125, 0.0152, 0.8310, 0.0414]
    assert t.max_abs_diff < 1e-12


def test_online_softmax_trace_agrees_with_tiled_on_random_tiles(rng):
    s = rng.standard_normal(11) * 3
    v = rng.standard_normal((11, 3))
    cuts = [0, 4, 5, 11]
    t = R.online_softmax_trace([(s[a:b], v[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)])
    o = R.naive_attention(np.ones((1, 1)), s[:, None], v, scale=1.0)
    assert np.allclose(t.output, o[0], rtol=0, atol=1e-13)
    assert np.allclose(t.reference, o[0], rtol=0, atol=1e-13)


@pytest.mark.parametrize("tiles,message", [
    ([], "tiles: expected a non-empty list"),
    ([([8, 6], [[1, 2]])], "tile 1 values: expected 2 rows (one per score), got 1"),
    ([([8], [[1, 2]]), ([9], [[1, 2, 3]])], "tile 2 values: expected rows of width 2 (as tile 1), got 3"),
    ([([], [])], "tile 1 scores: expected at least one score"),
    ([([8, float("nan")], [[1], [2]])], "tile 1 scores: expected finite numbers, got nan"),
    ([([8], [[float("inf")]])], "tile 1 values: expected finite numbers, got inf"),
    ([([8, "x"], [[1], [2]])], "tile 1 scores: expected a list of numbers"),
    ([([8, 6], [[1, 2], [3]])], "tile 1 values: expected a list of rows of numbers"),
    ([(8, [[1]], 3)], "tile 1: expected a (scores, values) pair"),
])
def test_online_softmax_trace_bad_input(tiles, message):
    with pytest.raises(InputError) as e:
        R.online_softmax_trace(tiles)
    assert message in str(e.value)


# --- FA-1 form, combine ------------------------------------------------------------------------------
def test_fa1_normalised_form_agrees(rng):
    q, k, v = rng.standard_normal((2, 3, 20, 8)), rng.standard_normal((2, 3, 33, 8)), rng.standard_normal(
        (2, 3, 33, 8))
    for causal in (False, True):
        a = R.tiled_attention(q, k, v, causal=causal, block_q=8, block_kv=8)
        b = R.tiled_attention(q, k, v, causal=causal, block_q=8, block_kv=8, normalized=True)
        assert rel(b[0], a[0]) < 1e-12 and np.allclose(a[1], b[1], rtol=0, atol=1e-12)


def test_combine_weights_splits_by_their_lse():
    # two splits of one row: scores [0] and [log 3] -> weights 1/4, 3/4
    o, lse = R.combine([(np.array([[1.0, 0]]), np.array([0.0])),
                        (np.array([[0.0, 1]]), np.array([math.log(3)]))])
    assert np.allclose(o, [[0.25, 0.75]]) and np.allclose(lse, [math.log(4)])


def test_combine_of_only_empty_splits_is_zero_and_minus_inf():
    empty = (np.zeros((2, 3)), np.full(2, -np.inf))
    with np.errstate(invalid="raise"):
        o, lse = R.combine([empty, empty])
    assert not np.any(o) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("partials,message", [
    ([], "partials: expected at least one (o, lse) pair, got none"),
    ([(np.zeros((2, 3)), np.zeros(3))], "partials[0]: expected o [..., N, dv] and lse [..., N]"),
    ([(np.zeros((2, 3)), np.zeros(2)), (np.zeros((2, 4)), np.zeros(2))],
     "partials[1]: expected o of shape (2, 3) (as partials[0]), got (2, 4)"),
    ([(np.zeros((2, 3)), np.array([0.0, np.nan]))], "partials[0]: expected finite o and lse"),
    ([np.zeros(3)], "partials[0]: expected an (o, lse) pair"),
    (5, "partials: expected a sequence of (o, lse) pairs, got int"),
])
def test_combine_bad_input(partials, message):
    with pytest.raises(InputError) as e:
        R.combine(partials)
    assert message in str(e.value)


# --- properties --------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), d=st.integers(1, 12), dv=st.integers(1, 6),
       block_q=st.integers(1, 20), block_kv=st.integers(1, 20), causal=st.booleans(), heads=st.sampled_from(
           [(1, 1), (2, 2), (4, 2), (3, 1)]), normalized=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_tiled_equals_naive_property(nq, nk, d, dv, block_q, block_kv, causal, heads, normalized, seed):
    r = np.random.default_rng(seed)
    hq, hkv = heads
    q = 3 * r.standard_normal((hq, nq, d))
    k, v = r.standard_normal((hkv, nk, d)), r.standard_normal((hkv, nk, dv))
    o_ref, lse_ref = R.naive_attention(q, k, v, causal=causal, return_lse=True)
    o, lse = R.tiled_attention(q, k, v, causal=causal, block_q=block_q, block_kv=block_kv,
                               normalized=normalized)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    if np.any(o_ref):
        assert rel(o, o_ref) < 1e-12
    else:
        assert not np.any(o)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    assert np.all(np.abs(lse[fin] - lse_ref[fin]) <= 1e-12 * np.maximum(1, np.abs(lse_ref[fin])))


@settings(max_examples=60, deadline=None)
@given(nq=st.integers(1, 6), nk=st.integers(1, 60), n_splits=st.integers(1, 8),
       seed=st.integers(0, 2**32 - 1))
def test_combine_of_random_splits_is_the_whole(nq, nk, n_splits, seed):
    r = np.random.default_rng(seed)
    q, k, v = r.standard_normal((2, nq, 8)) * 2, r.standard_normal((2, nk, 8)), r.standard_normal((2, nk, 5))
    cuts = [0, *sorted(r.integers(0, nk + 1, size=n_splits - 1).tolist()), nk]
    parts = []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        if b > a:
            parts.append(R.tiled_attention(q, k[:, a:b], v[:, a:b], block_kv=7))
        else:  # an empty split
            parts.append((np.zeros((2, nq, 5)), np.full((2, nq), -np.inf)))
    o, lse = R.combine(parts)
    o_ref, lse_ref = R.naive_attention(q, k, v, return_lse=True)
    assert rel(o, o_ref) < 1e-12
    assert np.allclose(lse, lse_ref, rtol=1e-12, atol=0)


# --- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    (dict(k=np.zeros((5, 3))), "k: expected head dim d = 4 (as q), got shape (5, 3)"),
    (dict(v=np.zeros((6, 4))), "v: expected Nk = 5 rows (as k), got shape (6, 4)"),
    (dict(q=np.zeros((3, 2, 4)), k=np.zeros((2, 5, 4)), v=np.zeros((2, 5, 4))),
     "k: expected a number of heads (dim -3) dividing q's 3, got shape (2, 5, 4)"),
    (dict(q=np.full((2, 4), np.nan)), "q: expected finite values, got 8 non-finite"),
    (dict(q=np.zeros(4)), "q: expected an array with at least 2 dimensions, got shape (4,)"),
    (dict(k=np.zeros((0, 4)), v=np.zeros((0, 4))), "k: expected shape [..., Nk, d] with Nk >= 1"),
    (dict(q=[["a"]]), "q: expected an array of real numbers"),
    (dict(scale=float("inf")), "scale: expected a finite positive real number or None, got inf"),
    (dict(scale="0.5"), "scale: expected a finite positive real number or None, got '0.5'"),
    (dict(block_q=0), "block_q: expected a positive integer, got 0"),
    (dict(block_kv=2.0), "block_kv: expected a positive integer, got 2.0"),
    (dict(trace_rows=[2]), "trace_rows: expected 0-based row indices in 0..1, got 2"),
])
def test_bad_input(kwargs, message):
    args = dict(q=np.zeros((2, 4)), k=np.zeros((5, 4)), v=np.zeros((5, 4)))
    args.update(kwargs)
    with pytest.raises(InputError) as e:
        R.tiled_attention(**args)
    assert message in str(e.value)
    if "block" not in message and "trace_rows" not in message:
        with pytest.raises(InputError, match=r"^\w+: expected"):
            R.naive_attention(**{n: args[n] for n in ("q", "k", "v")}, scale=args.get("scale"))


def test_light_core_imports_no_torch():
    code = ("import sys, attnscope.reference, attnscope.checks, attnscope.cli.reference; "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- score mods: window, softcap, sinks -----------------------------------------------------------
def _numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


@pytest.mark.parametrize("causal,window,softcap", [(True, (3, 2), 1.5), (False, (2, 1), 0.0),
                                                   (False, None, 0.7), (True, (0, 0), 0.0)])
def test_mods_backward_matches_finite_differences(causal, window, softcap):
    rng = np.random.default_rng(7)
    q, do = rng.standard_normal((2, 2, 4, 3, 3))  # each [B, Hq, Nq, d]
    k, v = rng.standard_normal((2, 2, 2, 6, 3))  # GQA: Hkv = 2
    sinks, dl = rng.standard_normal(4), rng.standard_normal((2, 4, 3))
    kw = dict(causal=causal, window=window, softcap=softcap)

    def loss(q_, k_, v_, s_):
        o, lse = R.naive_attention(q_, k_, v_, return_lse=True, sinks=s_, **kw)
        return float((o * do).sum() + (lse * dl).sum())

    o, lse = R.naive_attention(q, k, v, return_lse=True, sinks=sinks, **kw)
    grads = R.attention_backward(do, q, k, v, o, lse, sinks=sinks, dlse=dl, **kw)
    args = [q, k, v, sinks]
    for n, g in enumerate(grads):
        num = _numeric_grad(lambda x, n=n: loss(*[x if m == n else a for m, a in enumerate(args)]), args[n])
        np.testing.assert_allclose(g, num, atol=1e-6)


def test_window_softcap_sinks_dense_formulas():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 2, 5, 8))
    sinks = np.array([-30.0, 4.0])  # very negative: no effect; large: the sink takes most of the mass
    o, lse = R.naive_attention(q, k, v, window=(1, 0), softcap=2.0, sinks=sinks, return_lse=True)
    s = 2.0 * np.tanh(q @ np.swapaxes(k, -1, -2) / np.sqrt(8) / 2.0)
    r, c = np.arange(5)[:, None], np.arange(5)[None, :]
    s = np.where((c <= r) & (c >= r - 1), s, -np.inf)
    z = np.exp(s).sum(-1) + np.exp(sinks)[:, None]
    np.testing.assert_allclose(lse, np.log(z), rtol=1e-12)
    np.testing.assert_allclose(o, (np.exp(s) / z[..., None]) @ v, rtol=1e-12, atol=1e-15)
    # a row that sees no key: output 0, LSE the sink's (no NaN); without sinks -inf
    o, lse = R.naive_attention(q[:, :4], k[:, :2], v[:, :2], causal=True, sinks=sinks, return_lse=True)
    assert np.all(o[:, :2] == 0) and np.array_equal(lse[:, :2], np.repeat(sinks[:, None], 2, 1))
    with pytest.raises(InputError, match="sinks"):
        R.naive_attention(q, k, v, sinks=np.zeros(3))
    with pytest.raises(InputError, match="softcap"):
        R.naive_attention(q, k, v, softcap=-1.0)


def test_combine_merges_a_sink_once():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 3, 9, 8))
    sinks = rng.standard_normal(3)
    parts = [R.naive_attention(q, k[:, a:b], v[:, a:b], return_lse=True) for a, b in ((0, 2), (2, 5), (5, 9))]
    o, lse = R.combine(parts, sinks=sinks[:, None])
    o_ref, lse_ref = R.naive_attention(q, k, v, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(o, o_ref, atol=1e-13)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-13)


# --- the tiled forward under the mods -------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), block_q=st.integers(1, 12), block_kv=st.integers(1, 12),
       causal=st.booleans(), left=st.integers(-1, 45), right=st.integers(-1, 45),
       softcap=st.sampled_from([0.0, 0.5, 20.0]), sinks=st.booleans(), normalized=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_tiled_with_mods_equals_naive_property(nq, nk, block_q, block_kv, causal, left, right, softcap,
                                               sinks, normalized, seed):
    rng = np.random.default_rng(seed)
    q, k = 3 * rng.standard_normal((2, nq, 8)), rng.standard_normal((2, nk, 8))
    v = rng.standard_normal((2, nk, 4))
    mods = dict(window=(left, right), softcap=softcap, sinks=rng.uniform(-20, 20, 2) if sinks else None)
    o_ref, lse_ref = R.naive_attention(q, k, v, causal, return_lse=True, **mods)
    o, lse = R.tiled_attention(q, k, v, causal, block_q=block_q, block_kv=block_kv, normalized=normalized,
                               **mods)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert np.allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    assert np.allclose(lse[fin], lse_ref[fin], rtol=1e-12, atol=1e-12)


def test_tiled_window_row_with_no_key_is_zero_and_its_sink():
    """Window (0, 0) with Nq > Nk: the first Nq - Nk rows see no key: output 0, LSE = -inf, or the sink."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 4, 4))
    o, lse = R.tiled_attention(q, k, v, block_q=4, block_kv=2, window=(0, 0))
    assert not np.any(o[:, :5]) and np.all(np.isneginf(lse[:, :5])) and np.all(np.isfinite(lse[:, 5:]))
    sinks = np.array([-40.0, 7.0])
    o, lse = R.tiled_attention(q, k, v, block_q=4, block_kv=2, window=(0, 0), sinks=sinks)
    assert not np.any(o[:, :5]) and np.array_equal(lse[:, :5], np.repeat(sinks[:, None], 5, axis=1))
    # window (0, 0) elsewhere: each row sees its diagonal key alone, with the sink beside it
    s = np.einsum("hd,hd->h", q[:, 8], k[:, 3]) / 2
    assert np.allclose(lse[:, 8], np.logaddexp(s, sinks))
    assert np.allclose(o[:, 8], v[:, 3] / (1 + np.exp(sinks - s))[:, None])


@pytest.mark.parametrize("kwargs,message", [
    (dict(window=(-2, 0)), "window: expected None or a pair"), (dict(window=5), "window: expected"),
    (dict(softcap=-1.0), "softcap: expected a finite real number >= 0"),
    (dict(softcap=float("inf")), "softcap: expected"),
    (dict(sinks=np.zeros(3)), r"sinks: expected shape \[Hq\]"),
])
def test_tiled_mods_bad_input(kwargs, message):
    q = np.ones((2, 4, 4))
    with pytest.raises(InputError, match=message):
        R.tiled_attention(q, q, q, **kwargs)
