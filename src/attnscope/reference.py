"""The float64 reference: the readable specification the kernels are checked against (NumPy, no torch).

- `naive_attention`: the three-step baseline, S = Q K^T * scale, P = softmax(S), O = P V, with the whole
  ``Nq x Nk`` score matrix materialised (what the unfused path writes to HBM).
- `tiled_attention`: FlashAttention-2's forward as the kernel runs it (FA-2 Algorithm 1; spec §2, §3):
  query tiles outer, KV tiles inner, the skip bounds and the masked tiles (causal or a sliding window)
  from `model/tiles.py`, the mask applied before the running max, the unnormalised accumulator rescaled
  by ``alpha = exp(m_old - m_new)`` and one division at the end; ``normalized=True`` runs FA-1's form.
  Softcap caps each score tile; a sink is one more key with value 0, joined after the last tile.
- `attention_backward`: FA-2's backward (Algorithm 2), P recomputed from Q, K and the saved LSE,
  ``D = rowsum(dO * O)``, ``dS = P * (dP - D)``.
- `combine`: the Flash-Decoding reduction of split-KV partials ``(O_s, LSE_s)``, the decode kernel's
  second phase. `online_softmax_trace`: the recurrence for one query row's score tiles (spec §3.2).

Names follow the kernels: running max ``m_i``, normaliser ``l_i``, accumulator ``acc``, ``alpha``.
Conventions (the Triton kernels match them):

- Shapes ``q [..., Nq, d]``, ``k [..., Nk, d]``, ``v [..., Nk, dv]``; leading dims broadcast. Dim -3 is
  heads: with ``Hq % Hkv == 0`` (GQA/MQA) query head ``h`` reads kv head ``h // (Hq // Hkv)``.
- ``scale`` defaults to ``1/sqrt(d)``; LSE is the natural-log logsumexp of the *scaled* scores.
- Causal is bottom-right aligned (`model/tiles.py`): key ``c`` is visible to query ``r`` iff
  ``c <= r + (Nk - Nq)``; with ``Nq == Nk`` that is SDPA's ``is_causal``.
- ``exp(-inf - m)`` is 0, never NaN. A query row with no permitted key (the first ``Nq - Nk`` rows,
  causal, ``Nq > Nk``) gets an output row of zeros and ``LSE = -inf``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnscope.errors import InputError, finite_real, positive_int, short
from attnscope.model.tiles import Grid, normalize_window

__all__ = ["naive_attention", "permitted", "tiled_attention", "attention_backward", "combine",
           "online_softmax_trace", "TraceStep", "Trace"]


# --- inputs ---------------------------------------------------------------------------------------
def _as_float64(name: str, x, min_ndim: int) -> np.ndarray:
    try:
        a = np.asarray(x)
        if a.dtype.kind == "c":  # a cast would drop the imaginary part silently
            raise InputError(f"{name}: expected an array of real numbers, got complex values")
        a = a.astype(np.float64, copy=False)
    except (TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"{name}: expected an array of real numbers, got {type(x).__name__} ({e})") from e
    if a.ndim < min_ndim:
        raise InputError(f"{name}: expected an array with at least {min_ndim} dimensions, "
                         f"got shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise InputError(f"{name}: expected finite values, got {int(np.sum(~np.isfinite(a)))} non-finite")
    return a


def _prepare(q, k, v, scale):
    """Validate, convert to float64, expand GQA heads and broadcast the leading dims: returns
    ``q [*lead, Nq, d]``, ``k [*lead, Nk, d]``, ``v [*lead, Nk, dv]`` and the scale."""
    q, k, v = (_as_float64(name, x, 2) for name, x in (("q", q), ("k", k), ("v", v)))
    nq, d = q.shape[-2:]
    nk = k.shape[-2]
    if nq < 1 or d < 1:
        raise InputError(f"q: expected shape [..., Nq, d] with Nq >= 1 and d >= 1, got {q.shape}")
    if nk < 1:
        raise InputError(f"k: expected shape [..., Nk, d] with Nk >= 1, got {k.shape}")
    if k.shape[-1] != d:
        raise InputError(f"k: expected head dim d = {d} (as q), got shape {k.shape}")
    if v.shape[-2] != nk:
        raise InputError(f"v: expected Nk = {nk} rows (as k), got shape {v.shape}")
    if v.shape[-1] < 1:
        raise InputError(f"v: expected a value width >= 1, got shape {v.shape}")
    if k.shape[:-2] != v.shape[:-2]:
        raise InputError(f"v: expected leading dims {k.shape[:-2]} (as k), got shape {v.shape}")
    # GQA / MQA: dimension -3 is heads; repeat each kv head for its group of query heads.
    if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        hq, hkv = q.shape[-3], k.shape[-3]
        if hkv == 0 or hq % hkv:
            raise InputError(f"k: expected a number of heads (dim -3) dividing q's {hq}, got shape {k.shape}")
        k, v = (np.repeat(x, hq // hkv, axis=-3) for x in (k, v))
    try:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except ValueError as e:
        raise InputError(f"k: expected leading dims broadcastable with q's {q.shape[:-2]}, "
                         f"got shape {k.shape}") from e
    q, k, v = (np.broadcast_to(x, lead + x.shape[-2:]) for x in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not (finite_real(scale) and scale > 0):
        raise InputError(f"scale: expected a finite positive real number or None, got {short(scale)}")
    scale = float(scale)
    # |q.k| * scale <= max|q| * max|k| * d * scale: past float64's range a score would overflow to inf
    # (and the softmax to 0 or NaN), so such input is refused, not answered wrongly.
    qmax, kmax = (float(np.max(np.abs(x))) if x.size else 0.0 for x in (q, k))
    if qmax > 0 and kmax > 0 and (math.log(qmax) + math.log(kmax) + math.log(d) + math.log(scale)
                                  > math.log(np.finfo(np.float64).max) - math.log(max(nk, 2))):
        raise InputError(f"q: expected scores q.k * scale within float64 range, got max |q| = {qmax:.3g}, "
                         f"max |k| = {kmax:.3g}, scale = {scale:.3g} (d = {d}): the scores could overflow")
    return q, k, v, scale


def _keep(d: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
    """Boolean of ``d = c - (r + off)``'s shape: inside the effective window ``bounds = (left, right)``
    (-1 unbounded; causal alone is ``(-1, 0)``)."""
    left, right = bounds
    return ((left < 0) | (d >= -left)) & ((right < 0) | (d <= right))


def permitted(nq: int, nk: int, causal: bool = False, window=None) -> np.ndarray:
    """[Nq, Nk] boolean: key c visible to query r under ``causal`` and ``window`` (flash-attn's
    ``window_size``: `model.tiles.normalize_window`), bottom-right aligned (``off = Nk - Nq``)."""
    d = np.arange(nk)[None, :] - (np.arange(nq)[:, None] + (nk - nq))  # c - (r + off)
    return _keep(d, normalize_window(causal, window))


def _check_mods(causal, softcap, sinks, heads: int | None):
    """Validate ``softcap`` (finite, >= 0; 0 disables) and ``sinks`` (finite reals, one per query head: dim -3
    of q) and return ``(softcap, sinks as float64 [Hq, 1, 1] or None)``; ``causal`` must be a bool."""
    if not isinstance(causal, (bool, np.bool_)):
        raise InputError(f"causal: expected True or False, got {short(causal)}")
    if not (finite_real(softcap) and softcap >= 0):
        raise InputError(f"softcap: expected a finite real number >= 0 (0 disables), got {short(softcap)}")
    if sinks is None:
        return float(softcap), None
    sk = _as_float64("sinks", sinks, 1)
    if sk.ndim != 1 or heads is None or sk.shape[0] != heads:
        raise InputError(f"sinks: expected shape [Hq] = [{heads}] (one logit per query head, dim -3 of q), "
                         f"got {sk.shape}")
    return float(softcap), sk[:, None, None]


def _scores(q, k, scale, softcap, causal, window):
    """Scaled (and softcapped) scores [..., Nq, Nk], -inf where not permitted; also ``t = tanh(s/softcap)``
    (None without softcap) for the backward."""
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    t = None
    if softcap:
        with np.errstate(over="ignore"):  # a tiny softcap: s / softcap = +-inf, tanh saturates to +-1
            t = np.tanh(s / softcap)
        s = softcap * t
    if causal or window is not None:
        s = np.where(permitted(q.shape[-2], k.shape[-2], causal, window), s, -np.inf)
    return s, t


# --- the baseline ---------------------------------------------------------------------------------
def naive_attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False, *,
                    window=None, softcap: float = 0.0, sinks=None):
    """Attention the textbook way: three steps, the full score matrix materialised.

    Parameters
    ----------
    q, k, v : arrays [..., Nq, d], [..., Nk, d], [..., Nk, dv]; leading dims broadcast, dim -3 is heads
        (GQA when q's heads are a multiple of k's).
    causal : bool, default False: the bottom-right aligned mask (``c <= r + Nk - Nq``).
    scale : float, default ``1/sqrt(d)``.
    return_lse : bool, default False: also return the natural-log logsumexp of the scaled scores.
    window : (left, right) or None: flash-attn's ``window_size`` (`model.tiles.normalize_window`).
    softcap : float, default 0 (off): scaled scores become ``softcap * tanh(s / softcap)``.
    sinks : array [Hq] or None: one logit per query head (dim -3 of q) joining the softmax denominator
        with no value; the LSE includes it.

    Returns
    -------
    o : float64 array [..., Nq, dv]  (rows with no permitted key are zeros)
    lse : float64 array [..., Nq]    (only with ``return_lse``; -inf for rows with no permitted key, the
        sink's logit with sinks)

    Example
    -------
    >>> o = naive_attention(np.ones((4, 8)), np.ones((6, 8)), np.eye(6, 3), causal=True)
    """
    q, k, v, scale = _prepare(q, k, v, scale)
    softcap, sink = _check_mods(causal, softcap, sinks, q.shape[-3] if q.ndim >= 3 else None)
    s, _ = _scores(q, k, scale, softcap, causal, window)  # [..., Nq, Nk]   step 1: scores
    m = s.max(axis=-1, keepdims=True)  # [..., Nq, 1]
    if sink is not None:
        m = np.maximum(m, sink)
    m_safe = np.where(np.isneginf(m), 0.0, m)  # a row with no key: exp(-inf - 0) = 0, not NaN
    e = np.exp(s - m_safe)
    l_row = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        l_row = l_row + np.exp(sink - m_safe)  # the sink joins the denominator, with no value
    p = np.divide(e, l_row, out=np.zeros_like(e), where=l_row > 0)  # step 2: probabilities
    o = p @ v  # [..., Nq, dv]                                       step 3: output
    with np.errstate(divide="ignore"):
        lse = (m_safe + np.log(l_row))[..., 0]  # log(0) = -inf for rows with no key
    return (o, lse) if return_lse else o


# --- the online-softmax recurrence, one KV tile for a block of rows ----------------------------------
def _online_update(m_i, l_i, acc, s, v_j):
    """One KV tile of the FA-2 recurrence (spec §3.1) for rows m_i, l_i [..., R]; acc [..., R, dv];
    s [..., R, Bc] (masked entries -inf); v_j [..., Bc, dv]. Returns ``(m_new, alpha, l_new, acc_new)``."""
    m_new = np.maximum(m_i, s.max(axis=-1))  # [..., R]
    # While a row has seen no permitted key m_new = -inf; subtracting 0 instead keeps every exp(-inf - .)
    # exactly 0 (alpha and p), where -inf - (-inf) would be NaN.
    m_base = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m_i - m_base)  # [..., R]      rescales the old state onto the new max
    p = np.exp(s - m_base[..., None])  # [..., R, Bc]
    l_new = alpha * l_i + p.sum(axis=-1)
    acc_new = alpha[..., None] * acc + p @ v_j  # [..., R, dv]
    return m_new, alpha, l_new, acc_new


def _mask_tile(s: np.ndarray, row0: int, col0: int, offset: int, bounds=(-1, 0)) -> np.ndarray:
    """The mask on one straddling tile s [..., R, C] (rows ``row0..``, columns ``col0..``, 0-based) for the
    effective window ``bounds = (left, right)`` (-1 unbounded; causal alone is ``(-1, 0)``): -inf where
    column > row + offset + right or column < row + offset - left. Module-level, so a test can omit it and
    watch the checks catch that."""
    d = (col0 + np.arange(s.shape[-1])[None, :]) - (row0 + np.arange(s.shape[-2])[:, None] + offset)
    return np.where(_keep(d, bounds), s, -np.inf)


@dataclass(frozen=True)
class TraceStep:
    """The state of one query row after one KV tile: ``row`` 0-based, ``query_tile``/``kv_tile`` 1-based as in
    `model/tiles.py`; m, alpha, l arrays over the leading dims (floats when there are none), acc [..., dv];
    ``alpha`` is 0 on the first tile (no previous state to rescale)."""

    row: int
    query_tile: int
    kv_tile: int
    masked: bool
    m: np.ndarray
    alpha: np.ndarray
    l: np.ndarray
    acc: np.ndarray


def tiled_attention(q, k, v, causal: bool = False, scale: float | None = None, block_q: int = 128,
                    block_kv: int = 64, normalized: bool = False, trace_rows: Sequence[int] | None = None,
                    *, window=None, softcap: float = 0.0, sinks=None, _apply_mask: bool = True):
    """FlashAttention-2 forward, tile by tile, in float64 (the loop order and masking: module docstring).

    Parameters
    ----------
    q, k, v, causal, scale : as `naive_attention`.
    block_q, block_kv : int, default 128, 64: the tiles B_r and B_c (ragged last tiles are exact).
    window, softcap, sinks : as `naive_attention`. A query tile visits only the KV tiles
        `model.tiles.Grid.kv_tiles` loads (the kernels' `window_kv_bounds0`): left-masked, full and
        right-masked tiles, the mask applied on the masked ones only; skipped tiles are never read. The
        softcap is applied to each score tile after scaling; the sink joins each row's state after the last
        tile as one more key with value 0 (``m = max(m, sink)``, ``l = alpha l + exp(sink - m)``).
    normalized : bool, default False: FlashAttention-1's form, ``acc`` normalised (``o_i``) every tile.
    trace_rows : sequence of int, optional: 0-based query rows whose state (m, alpha, l, acc) is recorded
        after every tile they see.

    Returns
    -------
    o : float64 array [..., Nq, dv]  (zeros for a row with no permitted key)
    lse : float64 array [..., Nq]    (natural log; -inf for a row with no permitted key, the sink's logit
        with sinks)
    trace : dict row -> list[TraceStep]   (only when ``trace_rows`` is given)

    Example
    -------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 17, 8))
    >>> o, lse = tiled_attention(q, k, v, causal=True, block_q=8, block_kv=4)
    """
    q, k, v, scale = _prepare(q, k, v, scale)
    grid = Grid(q.shape[-2], k.shape[-2], positive_int("block_q", block_q),
                positive_int("block_kv", block_kv), causal=bool(causal), window=window)
    softcap, sink = _check_mods(causal, softcap, sinks, q.shape[-3] if q.ndim >= 3 else None)
    lead, nq, dv = q.shape[:-2], q.shape[-2], v.shape[-1]
    traced = [] if trace_rows is None else [trace_rows] if isinstance(trace_rows, int) else list(trace_rows)
    for r in traced:
        if not (isinstance(r, (int, np.integer)) and not isinstance(r, bool) and 0 <= r < nq):
            raise InputError(f"trace_rows: expected 0-based row indices in 0..{nq - 1}, got {r!r}")
    trace: dict[int, list[TraceStep]] = {int(r): [] for r in sorted(traced)}

    o, lse = np.zeros(lead + (nq, dv)), np.full(lead + (nq,), -np.inf)  # [..., Nq, dv], [..., Nq]
    for i in range(1, grid.n_q_tiles + 1):  # outer loop: one program (CTA) per query tile
        r0, r1 = grid.rows(i)  # 1-based inclusive
        q_i = q[..., r0 - 1:r1, :]  # [..., Br, d]   loaded once
        rows = r1 - r0 + 1
        m_i, l_i = np.full(lead + (rows,), -np.inf), np.zeros(lead + (rows,))
        acc = np.zeros(lead + (rows, dv))  # unnormalised (FA-2) or normalised o_i (FA-1)
        kv = grid.kv_tiles(i)  # tiles outside kv.first..kv.last are skipped (skip bounds), never read
        for j in range(kv.first, kv.last + 1):  # inner loop
            c0, c1 = grid.cols(j)
            k_j, v_j = k[..., c0 - 1:c1, :], v[..., c0 - 1:c1, :]  # [..., Bc, d], [..., Bc, dv]
            s = (q_i @ np.swapaxes(k_j, -1, -2)) * scale  # [..., Br, Bc]   never leaves the tile
            if softcap:
                with np.errstate(over="ignore"):  # as `_scores`: tanh saturates
                    s = softcap * np.tanh(s / softcap)
            masked = not kv.full_first <= j <= kv.full_last
            if masked and _apply_mask:
                s = _mask_tile(s, r0 - 1, c0 - 1, grid.offset, grid.bounds)  # before the running max sees it
            m_i, alpha, l_i, acc = _step(m_i, l_i, acc, s, v_j, normalized)
            for r in trace:
                if r0 - 1 <= r < r1:
                    t = r - (r0 - 1)
                    trace[r].append(TraceStep(row=r, query_tile=i, kv_tile=j, masked=masked,
                                              m=_scalar(m_i[..., t]), alpha=_scalar(alpha[..., t]),
                                              l=_scalar(l_i[..., t]), acc=acc[..., t, :].copy()))
        if sink is not None:  # one more key: logit sinks[h], value 0 (joins l, adds nothing to acc)
            s_sink = np.broadcast_to(sink, m_i.shape + (1,))  # [..., Br, 1]
            m_i, _, l_i, acc = _step(m_i, l_i, acc, s_sink, np.zeros(lead + (1, dv)), normalized)
        o_i, lse[..., r0 - 1:r1] = _normalise(m_i, l_i, acc)
        o[..., r0 - 1:r1, :] = acc if normalized else o_i  # FA-2: the one division, after the last tile
    return (o, lse) if trace_rows is None else (o, lse, trace)


def _step(m_i, l_i, acc, s, v_j, normalized: bool):
    """`_online_update` in FA-2's form, or in FA-1's (``acc`` holds the normalised ``o_i = acc / l``)."""
    acc_old = l_i[..., None] * acc if normalized else acc
    m_i, alpha, l_i, acc = _online_update(m_i, l_i, acc_old, s, v_j)
    if normalized:  # FA-1: o_i = (alpha l_old o_old + P V_j) / l_new; a row with l_new = 0 stays 0
        acc = _normalise(m_i, l_i, acc)[0]
    return m_i, alpha, l_i, acc


def _scalar(x):
    return float(x) if np.ndim(x) == 0 else x.copy()


def _normalise(m, l, acc):
    """``(acc / l, m + log l)`` for m, l [..., R] and acc [..., R, dv]; (0, -inf) where ``l = 0`` (no key)."""
    has_key = l > 0
    lse = np.where(has_key, m + np.log(np.where(has_key, l, 1.0)), -np.inf)
    return np.divide(acc, l[..., None], out=np.zeros_like(acc), where=has_key[..., None]), lse


# --- split-KV combine (Flash-Decoding's reduction) -------------------------------------------------
def combine(partials, sinks=None):
    """Merge split-KV partial results into the whole (the Flash-Decoding reduction).

    From each split's normalised output ``O_s`` and logsumexp ``LSE_s``: ``LSE = log sum_s exp(LSE_s)``,
    ``O = sum_s exp(LSE_s - LSE) O_s``. A split with no permitted key (``LSE_s = -inf``) weighs 0; a row
    for which every split is empty gets zeros and ``LSE = -inf``. An attention sink is one more partial
    with ``O = 0`` and ``LSE = sink`` (it joins the denominator once, however many splits there are).

    Parameters
    ----------
    partials : sequence of (o, lse) pairs, o [..., N, dv] and lse [..., N], all of one shape.
    sinks : array broadcastable to lse's shape [..., N] (e.g. [H, 1] for lse [H, N]) or None: the sink
        logits, merged as the partial ``(0, sinks)``.

    Returns
    -------
    o : float64 array [..., N, dv]
    lse : float64 array [..., N]

    Example
    -------
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 9, 16))
    >>> o, lse = combine([tiled_attention(q, k[a:b], v[a:b]) for a, b in ((0, 4), (4, 9))])
    """
    try:
        parts = list(partials)
    except TypeError as e:
        raise InputError("partials: expected a sequence of (o, lse) pairs, "
                         f"got {type(partials).__name__}") from e
    if not parts:
        raise InputError("partials: expected at least one (o, lse) pair, got none")
    arrays = []
    for n, part in enumerate(parts):
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise InputError(f"partials[{n}]: expected an (o, lse) pair, got {type(part).__name__}")
        o_s, lse_s = (np.asarray(x, dtype=np.float64) for x in part)
        if o_s.ndim < 1 or o_s.shape[:-1] != lse_s.shape:
            raise InputError(f"partials[{n}]: expected o [..., N, dv] and lse [..., N], got shapes "
                             f"{o_s.shape} and {lse_s.shape}")
        if arrays and o_s.shape != arrays[0][0].shape:
            raise InputError(f"partials[{n}]: expected o of shape {arrays[0][0].shape} (as partials[0]), "
                             f"got {o_s.shape}")
        if np.any(np.isnan(lse_s)) or np.any(np.isposinf(lse_s)) or not np.all(np.isfinite(o_s)):
            raise InputError(f"partials[{n}]: expected finite o and lse in [-inf, inf), got NaN or inf")
        arrays.append((o_s, lse_s))
    if sinks is not None:
        o0, lse0 = arrays[0]
        sk = _as_float64("sinks", sinks, 0)
        try:
            arrays.append((np.zeros_like(o0), np.broadcast_to(sk, lse0.shape)))
        except ValueError as e:
            raise InputError(f"sinks: expected a shape broadcastable to lse's {lse0.shape}, "
                             f"got {sk.shape}") from e
    o_all, lse_all = map(np.stack, zip(*arrays, strict=True))  # [S, ..., N, dv], [S, ..., N]
    m = lse_all.max(axis=0)  # [..., N]
    w = np.exp(lse_all - np.where(np.isneginf(m), 0.0, m))  # [S, ..., N]   exp(-inf - .) = 0
    return _normalise(m, w.sum(axis=0), np.sum(w[..., None] * o_all, axis=0))


# --- the trace of one row (spec §3.2) -------------------------------------------------------------
@dataclass(frozen=True)
class Trace:
    """`online_softmax_trace`'s result: the state after each of the n tiles as arrays (``m``, ``alpha``,
    ``l`` [n], ``acc`` [n, dv]; ``alpha[0] = 0``, tile 1 has no old state), the output ``acc[-1] / l[-1]``,
    ``weights`` (the global softmax over all K scores, [K]) and ``reference`` (their weighted sum)."""

    m: np.ndarray
    alpha: np.ndarray
    l: np.ndarray
    acc: np.ndarray
    output: list[float]
    reference: list[float]
    weights: list[float]
    max_abs_diff: float

    def step(self, j: int) -> dict:
        """Tile ``j + 1``'s state: keys tile (1-based), m, alpha (None for tile 1), l, acc."""
        return {"tile": j + 1, "m": float(self.m[j]), "alpha": None if j == 0 else float(self.alpha[j]),
                "l": float(self.l[j]), "acc": self.acc[j].tolist()}

    @property
    def steps(self) -> list[dict]:
        """Every tile's `step` (built on demand: a table shows a few, JSON all)."""
        return [self.step(j) for j in range(len(self.m))]

    def to_json(self) -> dict:
        return {"steps": self.steps, "output": self.output, "reference": self.reference,
                "weights": self.weights, "max_abs_diff": self.max_abs_diff}


#: Largest sum of |values| the float64 accumulator may hold: each |v| must stay within it over the number
#: of keys, so ``acc`` cannot overflow to inf. Scores may be any finite float (only differences are exp'd).
TRACE_MAX_ABS = 1e300


def online_softmax_trace(tiles) -> Trace:
    """Replay the online softmax for one query row whose scores arrive tile by tile (spec §3.2).

    All tiles at once: ``m_j`` a cumulative max, ``l_j`` and ``acc_j`` a prefix scan (the loop's states).

    Parameters
    ----------
    tiles : sequence of (scores, values): scores [n_j] (already scaled), values [n_j, dv]; any number of
        tiles, each non-empty, one value width throughout; all numbers finite, each |value| at most
        ``TRACE_MAX_ABS`` / (number of keys).

    Returns
    -------
    Trace: the state (m, alpha, l, acc) after each tile, the output ``acc / l``, and the check against
    the global softmax over all the scores at once.

    Example
    -------
    >>> t = online_softmax_trace([([8, 6], [[1, 2], [3, 4]]), ([10, 7], [[5, 6], [7, 8]])])
    >>> [round(x, 4) for x in t.output]
    [4.6025, 5.6025]
    """
    if isinstance(tiles, (str, bytes)) or not isinstance(tiles, Sequence) or len(tiles) == 0:
        raise InputError(f"tiles: expected a non-empty list of tiles, got {short(tiles)}")
    s, v, lengths = _tile_arrays(tiles)  # s [K], v [K, dv], lengths [n]
    starts = np.cumsum(lengths) - lengths  # [n] first key of each tile
    tile_of_key = np.repeat(np.arange(len(lengths)), lengths)  # [K]
    bad = ~np.isfinite(s) | ~np.all(np.isfinite(v), axis=1)  # [K] keys with a non-finite score or value
    if bad.any():  # the first tile with one; its scores before its values
        t = tile_of_key[np.argmax(bad)]
        s_t, v_t = s[tile_of_key == t], v[tile_of_key == t]
        what, x = ("scores", s_t) if not np.all(np.isfinite(s_t)) else ("values", v_t)
        raise InputError(f"tile {t + 1} {what}: expected finite numbers, got {x[~np.isfinite(x)][0]}")
    limit = TRACE_MAX_ABS / len(s)  # |v| within the accumulator's headroom
    if np.any(np.abs(v) > limit):
        i = np.argmax(np.abs(v) > limit)  # flat index of the first too large
        t, x = tile_of_key[i // v.shape[1]], float(v.flat[i])
        raise InputError(f"tile {t + 1} values: expected |v| <= {limit:.3g} (float64 headroom for the sum "
                         f"over {len(s):,} keys), got {short(x)}")

    m = np.maximum.accumulate(np.maximum.reduceat(s, starts))  # [n] running max after each tile
    alpha = np.exp(np.concatenate(([-np.inf], m[:-1])) - m)  # [n] exp(m_old - m); 0 on tile 1
    p = np.exp(s - m[tile_of_key])  # [K] each key against the max after its tile
    l_i = _linear_scan(alpha, np.add.reduceat(p, starts))  # [n]
    acc = _linear_scan(alpha, np.add.reduceat(p[:, None] * v, starts, axis=0))  # [n, dv]
    output = acc[-1] / l_i[-1]  # the one division

    w = np.exp(s - s.max())  # the global softmax over the whole row at once
    w /= w.sum()
    reference = w @ v
    return Trace(m=m, alpha=alpha, l=l_i, acc=acc, output=output.tolist(), reference=reference.tolist(),
                 weights=w.tolist(), max_abs_diff=float(np.max(np.abs(output - reference))))


def _linear_scan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x_j = a_j x_{j-1} + b_j`` (``x_{-1} = 0``) for every j: a prefix scan (Hillis-Steele) in log2(n)
    passes, each adding ``x_{j-span}`` weighted by the product of ``a`` over the span. a [n], b [n, ...]."""
    a, x = a.copy(), b.copy()
    span = 1
    while span < len(a):
        x[span:] = x[span:] + a[span:].reshape((-1,) + (1,) * (x.ndim - 1)) * x[:-span]
        a[span:] = a[span:] * a[:-span]
        span *= 2
    return x


_PLAIN_NUMBERS, _SEQUENCES = frozenset({int, float}), frozenset({tuple, list})


def _reals(xs) -> bool:
    """Is every element of ``xs`` a real number (numpy's too) and none a bool? A C-level pass over types."""
    types = set(map(type, xs))
    return types <= _PLAIN_NUMBERS or all(issubclass(t, (int, float, np.integer, np.floating))
                                          and not issubclass(t, (bool, np.bool_)) for t in types)


def _plain(x):
    return x.tolist() if isinstance(x, np.ndarray) else x


def _tile_arrays(tiles):
    """The tiles flattened to ``(s [K], v [K, dv], lengths [n])``, or an InputError naming the first bad
    tile. Each tile is checked by C-level passes (`set`, `map`) over its elements, not element by element."""
    chain = itertools.chain.from_iterable
    scores, rows, lengths = [], [], []
    for n, tile in enumerate(tiles, start=1):
        if not (isinstance(tile, (tuple, list)) and len(tile) == 2):
            raise InputError(f"tile {n}: expected a (scores, values) pair, got {short(tile)}")
        s, v = map(_plain, tile)
        if not (isinstance(s, (tuple, list)) and _reals(s)):
            raise InputError(f"tile {n} scores: expected a list of numbers, got {short(s)}")
        if not (isinstance(v, (tuple, list)) and set(map(type, v)) <= _SEQUENCES
                and len(set(map(len, v))) <= 1 and _reals(chain(v))):
            raise InputError(f"tile {n} values: expected a list of rows of numbers (of one width), "
                             f"got {short(v)}")
        if not s:
            raise InputError(f"tile {n} scores: expected at least one score, got an empty list")
        if len(v) != len(s):
            raise InputError(f"tile {n} values: expected {len(s)} rows (one per score), got {len(v)}")
        dv = len(rows[0]) if rows else len(v[0])
        if len(v[0]) != dv:
            raise InputError(f"tile {n} values: expected rows of width {dv} (as tile 1), got {len(v[0])}")
        if not dv:
            raise InputError(f"tile {n} values: expected rows of width >= 1, got width 0")
        scores += s
        rows += v
        lengths.append(len(s))
    try:
        return np.array(scores, dtype=np.float64), np.array(rows, dtype=np.float64), np.array(lengths)
    except OverflowError as e:  # an integer beyond float64
        raise InputError(f"tiles: expected numbers within float64's range, got {e}") from None


# --- the backward ---------------------------------------------------------------------------------
def attention_backward(do, q, k, v, o, lse, causal: bool = False, scale: float | None = None, *,
                       window=None, softcap: float = 0.0, sinks=None, dlse=None):
    """FlashAttention-2's backward (Algorithm 2) in float64, ``P = exp(S - LSE)`` recomputed from the saved
    LSE (0 where masked); GQA: the kv heads' gradients are summed over their group of query heads.

    Parameters
    ----------
    do, o : arrays [..., Hq, Nq, dv]: the upstream gradient and the forward's output.
    q, k, v : arrays [..., Hq, Nq, d], [..., Hkv, Nk, d], [..., Hkv, Nk, dv].
    lse : array [..., Hq, Nq]: the forward's logsumexp (-inf for rows with no permitted key).
    causal, scale, window, softcap, sinks : as `naive_attention`.
    dlse : array [..., Hq, Nq] or None: the upstream gradient of the LSE output, if it has one.

    Returns
    -------
    dq, dk, dv : float64 arrays shaped like q, k, v (rows with no permitted key contribute 0).
    dsinks : float64 array [Hq], only with ``sinks``: ``-sum_rows exp(sink - LSE) (D - dLSE)`` over the
        leading dims and rows.

    Example
    -------
    >>> o, lse = naive_attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = attention_backward(do, q, k, v, o, lse, causal=True)
    """
    k_shape, v_shape = np.shape(k), np.shape(v)
    q, k, v, scale = _prepare(q, k, v, scale)
    do = _as_float64("do", do, 2)
    o, lse = (np.asarray(x, dtype=np.float64) for x in (o, lse))
    if do.shape != q.shape[:-1] + (v.shape[-1],) or o.shape != do.shape:
        raise InputError(f"do: expected shape {q.shape[:-1] + (v.shape[-1],)} (as o), got {do.shape}")
    if lse.shape != q.shape[:-1]:
        raise InputError(f"lse: expected shape {q.shape[:-1]}, got {lse.shape}")
    softcap, sink = _check_mods(causal, softcap, sinks, q.shape[-3] if q.ndim >= 3 else None)
    g = np.zeros(lse.shape) if dlse is None else np.asarray(dlse, dtype=np.float64)
    if g.shape != lse.shape:
        raise InputError(f"dlse: expected shape {lse.shape} (as lse), got {g.shape}")
    s, t = _scores(q, k, scale, softcap, causal, window)  # [..., Nq, Nk]  recomputed, never stored
    keep = np.isfinite(lse)[..., None] & np.isfinite(s)  # P = 0 elsewhere and on rows with no permitted key
    lse_safe = np.where(np.isfinite(lse), lse, 0.0)[..., None]
    p = np.where(keep, np.exp(np.where(keep, s, 0.0) - lse_safe), 0.0)  # [..., Nq, Nk]
    d_row = np.sum(do * o, axis=-1, keepdims=True) - g[..., None]  # D = rowsum(dO * O) - dLSE  [..., Nq, 1]
    dv_full = np.swapaxes(p, -1, -2) @ do  # [..., Nk, dv]
    dp = do @ np.swapaxes(v, -1, -2)  # [..., Nq, Nk]
    ds = p * (dp - d_row)  # d(loss)/d(capped, scaled score)
    if t is not None:
        ds = ds * (1.0 - t * t)  # through softcap * tanh(s / softcap)
    dq = scale * (ds @ k)  # [..., Nq, d]
    dk_full = scale * (np.swapaxes(ds, -1, -2) @ q)  # [..., Nk, d]
    if sink is not None:
        p_sink = np.where(np.isfinite(lse), np.exp(sink[..., 0] - lse_safe[..., 0]), 0.0)  # [..., Hq, Nq]
        ds_sink = -(p_sink * d_row[..., 0])  # [..., Hq, Nq]
        dsinks = ds_sink.reshape((-1,) + ds_sink.shape[-2:]).sum(axis=(0, 2))
        return dq, _reduce_to(dk_full, k_shape), _reduce_to(dv_full, v_shape), dsinks
    return dq, _reduce_to(dk_full, k_shape), _reduce_to(dv_full, v_shape)


def _reduce_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a gradient over the GQA group (dim -3) and over broadcast leading dims back to ``shape``."""
    if len(shape) >= 3 and g.shape[-3] != shape[-3]:
        group = g.shape[-3] // shape[-3]
        g = g.reshape(g.shape[:-3] + (shape[-3], group) + g.shape[-2:]).sum(axis=-3)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape, strict=True)) if b == 1 and a != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
