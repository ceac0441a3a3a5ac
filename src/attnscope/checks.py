"""The algorithm checks behind ``attnscope verify``: plain functions that return `CheckResult`s.

Reference checks (float64 NumPy, fresh seeded random inputs):

1. tiled = naive, unmasked and causal, over shapes with ragged tiles, Nq != Nk, GQA;
2. on a small causal case, every row's state (m, l, acc) after every loaded tile = direct sums over the
   permitted keys (the diagonal tiles, row by row);
3. omitting the mask while keeping the skip bound gives a *different* answer (passes when detected);
4. no NaN for fully-masked tile regions and rows with no permitted key (zeros, LSE = -inf);
5. FA-1's normalised form = FA-2's unnormalised form;
6. split-KV combine of partials = whole;
7. the backward (recomputed from LSE) = a central finite difference of the naive forward;
8. sliding windows: the tiled forward visiting only `model.tiles`' loaded tiles = the dense masked
   reference, and the tiles each row visits are exactly those holding a visible key;
9. softcap and sinks in the tiled online softmax = their dense formulas (large logits, extreme sinks);
10. split-KV combine with the sinks merged once = whole.

Kernel checks run the same comparisons on the Triton kernels through the public API, fp16 and bf16, on
a GPU or under the Triton CPU interpreter (`kernel_status`). `kernel_tolerance` is the project's one
kernel-vs-reference rule: error <= 2 x PyTorch's own error at that dtype + 1e-3 (3 x for gradients).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import warnings
from dataclasses import asdict, dataclass

import numpy as np

import attnscope
from attnscope import reference
from attnscope.errors import choice
from attnscope.kernels._common import interpreting
from attnscope.model.tiles import Grid

REL_TOL = 1e-12  # float64 tiled vs naive: the orderings differ, the mathematics does not
MASK_DETECT = 1e-6  # check 3 passes when omitting the mask moves the output by more than this
KERNEL_MODES = ("auto", "on", "off")
KERNEL_ABS_SLACK = 1e-3  # the "+ 1e-3" of the 2x-torch tolerance
GRAD_FACTOR = 3.0  # gradients: 3 x torch's own error + 1e-3 (one more rounding chain than the forward)
KERNEL_LSE_TOL = 2e-3  # fp32 LSE vs float64 over the same inputs: exp2/log2 rewriting, summation order


@dataclass(frozen=True)
class CheckResult:
    """One line of ``attnscope verify``. ``passed`` is None when the check was not run."""

    name: str
    passed: bool | None
    error: float | None  # the measured quantity (an error, or for check 3 the size of the difference)
    tolerance: float | None
    detail: str
    compare: str = "<"  # how error must stand to tolerance to pass: "<" (an error) or ">" (a detected effect)

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]

    def to_json(self) -> dict:
        return asdict(self) | {"status": self.status}


# --- comparison helpers ---------------------------------------------------------------------------
def rel_error(o, o_ref) -> float:
    """max |o - o_ref| / max |o_ref| (inf on NaN or shape mismatch; 0 when both are all zeros)."""
    o, o_ref = np.asarray(o, dtype=np.float64), np.asarray(o_ref, dtype=np.float64)
    if o.shape != o_ref.shape or np.isnan(o).any():
        return float("inf")
    diff = float(np.max(np.abs(o - o_ref), initial=0.0))
    return diff / max(float(np.max(np.abs(o_ref), initial=0.0)), np.finfo(np.float64).tiny)


def lse_error(lse, lse_ref) -> float:
    """max |lse - lse_ref| / max(1, |lse_ref|) over finite entries; inf if the -inf pattern differs."""
    lse, lse_ref = np.asarray(lse, dtype=np.float64), np.asarray(lse_ref, dtype=np.float64)
    if lse.shape != lse_ref.shape or np.isnan(lse).any() or not np.array_equal(np.isneginf(lse),
                                                                               np.isneginf(lse_ref)):
        return float("inf")
    fin = np.isfinite(lse_ref)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(lse[fin] - lse_ref[fin]) / np.maximum(1.0, np.abs(lse_ref[fin]))))


def _qkv(rng, lead_q, lead_kv, nq, nk, d, dv):
    # q with std 2: peaky rows, so the running max moves
    return (2.0 * rng.standard_normal(lead_q + (nq, d)), rng.standard_normal(lead_kv + (nk, d)),
            rng.standard_normal(lead_kv + (nk, dv)))


# (lead_q, lead_kv, Nq, Nk, d, dv, B_r, B_c): ragged tiles, Nq != Nk both ways, GQA, MQA, one row
SHAPES = (
    ((2, 3), (2, 3), 17, 17, 8, 8, 8, 4),
    ((2, 4), (2, 2), 97, 97, 16, 16, 16, 8),
    ((3, 2), (3, 1), 40, 23, 8, 5, 8, 4),
    ((1, 2), (1, 2), 5, 30, 8, 8, 4, 8),
    ((1, 1), (1, 1), 1, 1, 4, 4, 128, 64),
    ((1, 2), (1, 2), 300, 257, 32, 32, 128, 64),
)


def _worst_case(rng, shapes, err_of) -> tuple[float, str]:
    """The largest ``err_of(q, k, v, causal, B_r, B_c)`` over ``shapes`` x (unmasked, causal), and where."""
    worst, where = 0.0, ""
    for lead_q, lead_kv, nq, nk, d, dv, bq, bk in shapes:
        q, k, v = _qkv(rng, lead_q, lead_kv, nq, nk, d, dv)
        for causal in (False, True):
            err = err_of(q, k, v, causal, bq, bk)
            if err >= worst:
                worst = err
                where = (f"{'causal' if causal else 'unmasked'} {lead_q}/{lead_kv} Nq={nq} Nk={nk} d={d} "
                         f"B_r={bq} B_c={bk}")
    return worst, where


# --- the reference checks -------------------------------------------------------------------------
def check_tiled_equals_naive(rng) -> CheckResult:
    """Check 1: the tiled FA-2 forward equals the naive three-step baseline (O and LSE)."""
    def err(q, k, v, causal, bq, bk):
        o_ref, lse_ref = reference.naive_attention(q, k, v, causal=causal, return_lse=True)
        o, lse = reference.tiled_attention(q, k, v, causal=causal, block_q=bq, block_kv=bk)
        return max(rel_error(o, o_ref), lse_error(lse, lse_ref))

    worst, where = _worst_case(rng, SHAPES, err)
    return CheckResult("1 tiled = naive (unmasked and causal)", worst < REL_TOL, worst, REL_TOL,
                       f"{len(SHAPES)} shapes x 2 (ragged tiles, Nq != Nk, GQA); worst at {where}")


def check_diagonal_rows(rng, n: int = 16, block_q: int = 8, block_kv: int = 4, d: int = 8) -> CheckResult:
    """Check 2: after KV tile j, row r's (m, l, acc) are the max, sum exp(s - m) and sum exp(s - m) v over
    its permitted keys among the columns loaded so far; each row sees exactly its query tile's KV tiles."""
    grid = Grid(n, n, block_q, block_kv, causal=True)
    q, k, v = _qkv(rng, (), (), n, n, d, d)
    s_full = (q @ k.T) / np.sqrt(d)  # [N, N], computed directly
    o, lse, trace = reference.tiled_attention(q, k, v, causal=True, block_q=block_q, block_kv=block_kv,
                                              trace_rows=range(n))
    worst, states, problems = 0.0, 0, []
    for r in range(n):
        _, n_loaded = grid.kv_bounds(r // block_q + 1)
        steps = trace[r]
        if [st.kv_tile for st in steps] != list(range(1, n_loaded + 1)):
            problems.append(f"row {r} saw tiles {[st.kv_tile for st in steps]}, expected 1..{n_loaded}")
            continue
        for st in steps:
            c1 = grid.cols(st.kv_tile)[1]  # last column loaded so far (1-based)
            keep = np.arange(c1) <= r + grid.offset  # the permitted rule written out here, not from tiles
            s = s_full[r, :c1][keep]
            if s.size == 0:
                ok = np.isneginf(st.m) and st.l == 0 and not np.any(st.acc) and not np.isnan(st.alpha)
                worst = worst if ok else float("inf")
            else:
                m = s.max()
                p = np.exp(s - m)
                worst = max(worst, abs(st.m - m) / max(1.0, abs(m)), rel_error(st.l, p.sum()),
                            rel_error(st.acc, p @ v[:c1][keep]))
            states += 1
        keep = np.arange(n) <= r + grid.offset  # the whole row, once more, against the plain softmax
        w = np.exp(s_full[r][keep] - s_full[r][keep].max())
        worst = max(worst, rel_error(o[r], (w / w.sum()) @ v[keep]),
                    lse_error(lse[r], s_full[r][keep].max() + np.log(w.sum())))
    masked = {i: grid.schedule(i).masked for i in range(1, grid.n_q_tiles + 1)}
    detail = (f"N={n} B_r={block_q} B_c={block_kv}: {states} row states after each loaded tile "
              f"(masked tiles per query tile {masked}) against direct sums over permitted keys")
    return CheckResult("2 diagonal tiles, row by row", worst < REL_TOL and not problems, worst, REL_TOL,
                       "; ".join([detail, *problems[:3]]))


def check_mask_omitted(rng, n: int = 64, block_q: int = 16, block_kv: int = 8, d: int = 16) -> CheckResult:
    """Check 3: keep the skip bound, omit the mask -> a different answer. Passes when that is detected."""
    q, k, v = _qkv(rng, (1, 2), (1, 2), n, n, d, d)
    o_ref = reference.naive_attention(q, k, v, causal=True)
    o_bad, _ = reference.tiled_attention(q, k, v, causal=True, block_q=block_q, block_kv=block_kv,
                                         _apply_mask=False)
    diff = np.abs(o_bad - o_ref).max(axis=-1)  # [..., N]
    size = float(diff.max())
    rows = int(np.sum(diff.max(axis=tuple(range(diff.ndim - 1))) > MASK_DETECT))
    detected = size > MASK_DETECT
    verdict = "detected" if detected else "NOT detected: the unmasked skip-bounded loop matched"
    return CheckResult("3 mask omitted (skip bound kept) differs", detected, size, MASK_DETECT,
                       f"N={n} B_r={block_q} B_c={block_kv}: max |diff| = {size:.3g}, {rows} of {n} rows "
                       f"attend to future keys; {verdict}", compare=">")


def check_no_nan(rng) -> CheckResult:
    """Check 4: fully masked tile regions and rows with no permitted key give no NaN; empty rows give
    zeros and LSE = -inf, in the naive, FA-2, FA-1 and combine paths."""
    bad, count = [], 0  # count: NaN, plus one per path whose empty rows are not (zeros, -inf)
    for nq, nk, bq, bk in ((40, 23, 8, 4), (16, 16, 8, 4)):  # Nq - Nk rows see no key; masked upper halves
        q, k, v = _qkv(rng, (2,), (2,), nq, nk, 8, 8)
        empty = np.arange(nq) + (nk - nq) < 0  # rows with no permitted key
        tiles = {"causal": True, "block_q": bq, "block_kv": bk}
        o2, l2, tr = reference.tiled_attention(q, k, v, trace_rows=range(nq), **tiles)
        outs = {"naive": reference.naive_attention(q, k, v, causal=True, return_lse=True), "FA-2": (o2, l2),
                "FA-1": reference.tiled_attention(q, k, v, normalized=True, **tiles),
                "combine": reference.combine(split_kv(q, k, v, [0, nk // 2, nk // 2, nk], block_kv=bk)),
                "trace": [x for steps in tr.values() for st in steps for x in (st.m, st.alpha, st.l, st.acc)]}
        for name, arrays in outs.items():
            nans = sum(int(np.isnan(x).sum()) for x in arrays)
            if nans:
                bad.append(f"{name} Nq={nq} Nk={nk}: {nans} NaN")
            if name in ("naive", "FA-2", "FA-1") and not _empty_rows_ok(*arrays, empty):
                nans += 1
                bad.append(f"{name} Nq={nq} Nk={nk}: empty rows not (zeros, -inf)")
            count += nans
    detail = ("Nq=40 > Nk=23 (17 rows with no key) and N=16 (fully masked upper halves): naive, FA-2, "
              "FA-1, trace, combine with an empty split")
    return CheckResult("4 no NaN on masked regions and empty rows", not bad, float(count), 0.0,
                       detail + ("; " + "; ".join(bad[:3]) if bad else ""), compare="=")


def _empty_rows_ok(o, lse, empty) -> bool:
    """Rows ``empty`` of ``o`` are zeros, and ``lse`` is -inf on exactly those rows."""
    return not np.any(o[..., empty, :]) and bool(np.all(np.isneginf(lse) == empty))


def check_fa1_equals_fa2(rng) -> CheckResult:
    """Check 5: FlashAttention-1's normalised accumulator gives FlashAttention-2's result."""
    def err(q, k, v, causal, bq, bk):
        o2, l2 = reference.tiled_attention(q, k, v, causal=causal, block_q=bq, block_kv=bk)
        o1, l1 = reference.tiled_attention(q, k, v, causal=causal, block_q=bq, block_kv=bk, normalized=True)
        return max(rel_error(o1, o2), lse_error(l1, l2))

    worst, _ = _worst_case(rng, SHAPES[:4], err)
    return CheckResult("5 FA-1 normalised = FA-2 unnormalised", worst < REL_TOL, worst, REL_TOL,
                       "4 shapes x (unmasked, causal)")


def split_kv(q, k, v, cuts, scale=None, block_kv: int = 64, softcap: float = 0.0):
    """Split-KV partials: attention of ``q`` over each key slice ``cuts[s]:cuts[s+1]`` (non-causal),
    ``(o_s, lse_s)``; an empty slice gives ``(zeros, -inf)``."""
    parts = [reference.tiled_attention(q, k[..., a:b, :], v[..., a:b, :], scale=scale, block_kv=block_kv,
                                       softcap=softcap)
             if b > a else None for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    o_1, lse_1 = next(p for p in parts if p is not None)  # the shapes an empty split must have
    return [p if p is not None else (np.zeros_like(o_1), np.full_like(lse_1, -np.inf)) for p in parts]


def check_combine(rng) -> CheckResult:
    """Check 6: the Flash-Decoding combine of split-KV partials equals attention over all the keys
    (non-causal, as decode is; random splits, some empty)."""
    worst, cases = 0.0, 0
    for lead_q, lead_kv, nq, nk in (((2, 4), (2, 2), 1, 97), ((3, 2), (3, 2), 5, 64), ((1, 1), (1, 1), 1, 1)):
        q, k, v = _qkv(rng, lead_q, lead_kv, nq, nk, 16, 16)
        o_ref, lse_ref = reference.naive_attention(q, k, v, return_lse=True)
        for n_splits in (1, 2, 3, 7):
            cuts = [0, *map(int, np.sort(rng.integers(0, nk + 1, size=n_splits - 1))), nk]  # some empty
            o, lse = reference.combine(split_kv(q, k, v, cuts, block_kv=16))
            worst = max(worst, rel_error(o, o_ref), lse_error(lse, lse_ref))
            cases += 1
    return CheckResult("6 split-KV combine = whole", worst < REL_TOL, worst, REL_TOL,
                       f"{cases} cases: 1, 2, 3, 7 random splits (empty splits allowed), GQA, Nk up to 97")


def check_backward(rng, h: float = 1e-5, tol: float = 1e-7) -> CheckResult:
    """Check 7: `reference.attention_backward` against directional central differences of
    ``f = sum(dO * naive_attention(q, k, v))`` in float64, one random direction per input (q, k, v), over
    unmasked and causal cases with GQA, ragged Nq != Nk and rows with no permitted key."""
    worst, where = 0.0, ""
    for lead_q, lead_kv, nq, nk, d in (((2, 4), (2, 2), 9, 13, 8), ((1, 2), (1, 2), 13, 7, 4),
                                       ((1, 3), (1, 1), 17, 17, 8)):
        q, k, v = _qkv(rng, lead_q, lead_kv, nq, nk, d, d)
        do = rng.standard_normal(lead_q + (nq, d))
        for causal in (False, True):
            o, lse = reference.naive_attention(q, k, v, causal=causal, return_lse=True)
            grads = reference.attention_backward(do, q, k, v, o, lse, causal=causal)
            for i, name in enumerate("qkv"):
                e = rng.standard_normal(grads[i].shape)
                args_p, args_m = [q, k, v], [q, k, v]
                args_p[i], args_m[i] = args_p[i] + h * e, args_m[i] - h * e
                fd = (np.sum(do * reference.naive_attention(*args_p, causal=causal))
                      - np.sum(do * reference.naive_attention(*args_m, causal=causal))) / (2 * h)
                an = float(np.sum(grads[i] * e))
                err = abs(fd - an) / max(1.0, abs(an))
                if not np.isfinite(an) or err >= worst:
                    worst = err if np.isfinite(an) else float("inf")
                    where = f"d{name} {'causal' if causal else 'unmasked'} {lead_q}/{lead_kv} Nq={nq} Nk={nk}"
    return CheckResult("7 backward = finite difference of naive", bool(worst < tol), float(worst), tol,
                       f"dQ, dK, dV along random directions, 3 shapes x 2 (GQA, Nq != Nk, empty rows); "
                       f"worst at {where}")


# (Nq, Nk, B_r, B_c) x windows: (0, 0), (1, 0), W not a tile multiple, W > N, one side unbounded; with
# Nq > Nk some rows see no key, with a small window and Nq < Nk some tiles are skipped on both sides
WINDOW_SHAPES = ((37, 37, 8, 8), (20, 53, 8, 4), (53, 20, 16, 8), (64, 64, 16, 16))
WINDOWS = ((False, (0, 0)), (True, (1, 0)), (True, (13, 0)), (False, (5, 7)), (False, (-1, 6)),
           (True, (100, -1)), (False, (9, -1)), (False, (200, 200)))


def _visible(nq: int, nk: int, causal: bool, window) -> np.ndarray:
    """[Nq, Nk] bool: the mods contract's visibility rule written out here, not taken from tiles.py."""
    left, right = (-1, -1) if window is None else window
    right = 0 if causal else right
    d = np.arange(nk)[None, :] - (np.arange(nq)[:, None] + nk - nq)  # c - (r + off)
    return ((left < 0) | (d >= -left)) & ((right < 0) | (d <= right))


def check_window_schedule(rng) -> CheckResult:
    """Check 8: the tiled forward under a sliding window, visiting only the KV tiles `model.tiles` loads,
    equals the dense masked reference (O and LSE; empty rows zeros and -inf); every traced row saw
    exactly the tiles of its query tile that hold a key visible to one of its rows, in order."""
    worst, where, problems, cases = 0.0, "", [], 0
    for nq, nk, bq, bk in WINDOW_SHAPES:
        q, k, v = _qkv(rng, (2, 2), (2, 1), nq, nk, 8, 8)
        for causal, window in WINDOWS:
            vis = _visible(nq, nk, causal, window)
            o_ref, lse_ref = reference.naive_attention(q, k, v, causal=causal, return_lse=True, window=window)
            o, lse, tr = reference.tiled_attention(q, k, v, causal=causal, block_q=bq, block_kv=bk,
                                                   window=window, trace_rows=range(nq))
            err = max(rel_error(o, o_ref), lse_error(lse, lse_ref))
            if not _empty_rows_ok(o, lse, ~vis.any(axis=1)):
                err = float("inf")
            case = f"Nq={nq} Nk={nk} B_r={bq} B_c={bk} causal={causal} window={window}"
            if err >= worst:
                worst, where = err, case
            for r, steps in tr.items():
                r0 = r - r % bq
                seen = vis[r0:r0 + bq]  # the rows of r's query tile
                want = [j + 1 for j in range(-(-nk // bk)) if seen[:, j * bk:(j + 1) * bk].any()]
                if [st.kv_tile for st in steps] != want:
                    got = [st.kv_tile for st in steps]
                    problems.append(f"row {r} ({case}) visited {got}, expected {want}")
            cases += 1
    return CheckResult("8 window schedule = dense masked", worst < REL_TOL and not problems, worst, REL_TOL,
                       f"{cases} cases: windows (0,0) (1,0) (13,0) (5,7) (-1,6) (100,-1) (9,-1) (200,200), "
                       f"ragged tiles, Nq != Nk, GQA, empty rows; tiles visited = tiles with a visible key; "
                       f"worst at {where}" + ("; " + "; ".join(problems[:2]) if problems else ""))


def _dense_mods(q, k, v, scale, softcap, sinks, keep):
    """The dense formulas of softcap and sinks, written out: ``s' = c tanh(s scale / c)``, ``Z = sum_j
    exp(s'_j) + exp(sink)``, ``O = sum_j exp(s'_j) v_j / Z``, ``LSE = log Z`` (q [H, Nq, d], sinks [H])."""
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = np.where(keep, s, -np.inf)  # [H, Nq, Nk]
    z_log = np.logaddexp(np.logaddexp.reduce(s, axis=-1), sinks[:, None])  # [H, Nq]  log Z
    return np.exp(s - z_log[..., None]) @ v, z_log


def check_softcap_sinks(rng) -> CheckResult:
    """Check 9: softcap and sinks in the tiled online softmax equal the dense formulas (`_dense_mods`),
    unmasked, causal and windowed, with large logits (capped) and sinks from -30 to +30 (a row with no
    visible key: O = 0, LSE = its sink); FA-1's form too."""
    worst, where, cases = 0.0, "", 0
    for nq, nk, bq, bk, heads in ((17, 17, 8, 4, 3), (9, 30, 4, 8, 2), (30, 12, 8, 8, 2)):
        q, k, v = _qkv(rng, (heads,), (heads,), nq, nk, 16, 8)
        q = 8.0 * q  # scores of order 30: the cap bites, the exp needs its running max
        for (causal, window), softcap, sinks in (
                ((False, None), 5.0, rng.uniform(-30, 30, heads)),
                ((True, None), 30.0, np.full(heads, -30.0)),
                ((True, (3, 0)), 0.0, np.full(heads, 30.0)),
                ((False, (2, 1)), 1.0, rng.standard_normal(heads))):
            keep = _visible(nq, nk, causal, window)
            o_ref, lse_ref = _dense_mods(q, k, v, 1 / np.sqrt(16), softcap, sinks, keep)
            for normalized in (False, True):
                o, lse = reference.tiled_attention(q, k, v, causal=causal, block_q=bq, block_kv=bk,
                                                   window=window, softcap=softcap, sinks=sinks,
                                                   normalized=normalized)
                err = max(rel_error(o, o_ref), lse_error(lse, lse_ref))
                if err >= worst:
                    worst, where = err, (f"Nq={nq} Nk={nk} causal={causal} window={window} softcap={softcap} "
                                         f"FA-{1 if normalized else 2}")
                cases += 1
    return CheckResult("9 softcap and sinks (tiled) = dense formulas", worst < REL_TOL, worst, REL_TOL,
                       f"{cases} cases, logits ~30, sinks in [-30, 30], rows with no key; worst at {where}")


def check_combine_sinks(rng) -> CheckResult:
    """Check 10: the split-KV combine with the sinks merged once (`reference.combine(..., sinks=)`) equals
    attention with sinks over all the keys; a sink merged once per split would not (decode's rule)."""
    worst, cases = 0.0, 0
    for heads, nq, nk, softcap in ((4, 1, 97, 0.0), (2, 5, 64, 3.0), (3, 1, 1, 0.0)):
        q, k, v = _qkv(rng, (heads,), (heads,), nq, nk, 16, 16)
        sinks = rng.uniform(-5, 5, heads)
        o_ref, lse_ref = reference.naive_attention(q, k, v, return_lse=True, softcap=softcap, sinks=sinks)
        for n_splits in (1, 2, 3, 7):
            cuts = [0, *map(int, np.sort(rng.integers(0, nk + 1, size=n_splits - 1))), nk]  # some empty
            parts = split_kv(q, k, v, cuts, block_kv=16, softcap=softcap)
            o, lse = reference.combine(parts, sinks=sinks[:, None])
            worst = max(worst, rel_error(o, o_ref), lse_error(lse, lse_ref))
            cases += 1
    return CheckResult("10 split-KV combine with sinks = whole", worst < REL_TOL, worst, REL_TOL,
                       f"{cases} cases: 1, 2, 3, 7 random splits (empty allowed), the sink merged once, "
                       "softcap on some")


def reference_checks(seed: int = 0) -> list[CheckResult]:
    """Run the reference checks on fresh inputs drawn from ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return [check(rng) for check in (check_tiled_equals_naive, check_diagonal_rows, check_mask_omitted,
                                     check_no_nan, check_fa1_equals_fa2, check_combine, check_backward,
                                     check_window_schedule, check_softcap_sinks, check_combine_sinks)]


# --- the kernels ----------------------------------------------------------------------------------
def kernel_status(mode: str = "auto") -> tuple[bool, str, list[str]]:
    """Can the Triton kernels run here? Returns ``(runnable, how or why not, kernel modules present)``:
    never with ``off``; with ``auto`` when the kernel modules, torch and triton are there and a CUDA GPU
    or a user-set ``TRITON_INTERPRET=1``; ``on`` as auto, but not running is a failure (without a GPU the
    caller turns the interpreter on first, `interpreter_wanted`: this module writes no environment)."""
    choice("kernels", mode, KERNEL_MODES)
    if mode == "off":
        return False, "not run (--kernels off)", []
    present = [m for m in ("fwd", "decode") if _module_exists(f"attnscope.kernels.{m}")]
    if not present:
        return False, "not run: attnscope.kernels.fwd and attnscope.kernels.decode are not present", []
    hint = "(--kernels on runs them under the Triton CPU interpreter)"
    if not (_module_exists("torch") and _module_exists("triton")):
        why = "torch and triton are not installed (pip install 'attnscope[kernels]')"
    elif mode == "auto" and not interpreting() and not _nvidia_driver_present():  # no torch import (~1 s)
        why = f"no NVIDIA driver (so no CUDA GPU) and TRITON_INTERPRET is not set {hint}"
    else:
        import torch

        if torch.cuda.is_available():
            return True, f"on {torch.cuda.get_device_name()}", present
        if interpreting():
            return True, "on the CPU under TRITON_INTERPRET=1 (no CUDA GPU)", present
        if mode == "on" and "triton" in sys.modules:
            why = "no CUDA GPU, and triton was imported before TRITON_INTERPRET=1 could be set"
        else:
            why = f"no CUDA GPU and TRITON_INTERPRET is not set {hint}"
    return False, f"not run: {why}", present


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _nvidia_driver_present() -> bool:
    """A cheap necessary condition for a CUDA GPU: the driver's device node (Linux; /dev/dxg under WSL2)
    or nvidia-smi on the PATH."""
    return any(map(os.path.exists, ("/dev/nvidiactl", "/dev/dxg"))) or shutil.which("nvidia-smi") is not None


def interpreter_wanted(mode: str) -> bool:
    """True when ``mode`` is ``on``, there is no CUDA GPU and the Triton interpreter is off and can still
    be turned on (triton not yet imported): the caller then sets ``TRITON_INTERPRET=1`` before checking."""
    if mode != "on" or interpreting() or "triton" in sys.modules or not _module_exists("torch"):
        return False
    if _nvidia_driver_present():
        import torch

        return not torch.cuda.is_available()
    return True


def kernel_checks(seed: int = 0, mode: str = "auto"):
    """The kernel checks, one result at a time (the CLI prints each as it finishes), or one SKIP line
    (``auto``/``off``) or FAIL line (``on``) saying why not."""
    runnable, how, present = kernel_status(mode)
    if not runnable:
        yield CheckResult("kernels", False if mode == "on" else None, None, None, how)
        return
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = torch.cuda.get_device_name() if device.type == "cuda" else "Triton CPU interpreter"
    rng = np.random.default_rng(seed + 1)
    cases = {"fwd": [(f"K1 flash_attention = reference [{where}]", _kernel_fwd_equals_ref),
                     ("K4 flash_attention: no NaN, empty rows (zeros, -inf)", _kernel_fwd_empty_rows)],
             "decode": [(f"K1 flash_decode = reference [{where}]", _kernel_decode_equals_ref),
                        ("K6 flash_decode: any num_splits = reference", _kernel_decode_splits)]}
    for module, api in (("fwd", "flash_attention"), ("decode", "flash_decode")):
        if module not in present:
            yield CheckResult(api, None, None, None, f"not run: attnscope.kernels.{module} is not present")
        for name, fn in cases[module] if module in present else ():
            yield _guard(name, fn, torch, device, rng)


def _guard(name, fn, *args) -> CheckResult:
    """Run one kernel check, a generator of cases, and report its worst; an exception is its failure. The
    RuntimeWarnings NumPy raises for the Triton interpreter's masked-off lanes (log(0), exp(-inf - -inf))
    say nothing about the result: muted."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
            return _worst(list(fn(name, *args)))
    except Exception as e:  # a crashing kernel fails its check, it does not abort verify
        return CheckResult(name, False, None, None, f"raised {type(e).__name__}: {e}".splitlines()[0][:300])


def _np(t):
    return t.double().cpu().numpy()


def kernel_tolerance(torch_err: float, factor: float = 2.0) -> float:
    """The one kernel-vs-reference rule (flash-attn's test suite): a kernel's max abs error against the
    float64 reference may be ``factor`` x PyTorch's own error at the same dtype on the same inputs,
    plus 1e-3. factor = 2 for outputs, `GRAD_FACTOR` (3) for gradients."""
    return factor * torch_err + KERNEL_ABS_SLACK


def within_tolerance(err: float, torch_err: float, factor: float = 2.0) -> bool:
    """``err <= kernel_tolerance(torch_err, factor)``; False for NaN."""
    return err <= kernel_tolerance(torch_err, factor)


def torch_attention(q, k, v, causal: bool = False, window=None, softcap: float = 0.0, sinks=None):
    """PyTorch's own attention at q's dtype, the error `kernel_tolerance` scales: scores and softcap in q's
    dtype, the mask of `reference.permitted`, an fp32 softmax with the sink as one more column with no
    value, P cast back to q's dtype. q [B, Hq, Nq, d], k, v [B, Hkv, Nk, d] (GQA repeated); returns
    ``(o, lse)`` (natural log, fp32), differentiable in q, k, v and sinks; rows with no key and no sink
    give 0. Imports torch (a kernel check, never an analytic path)."""
    import math

    import torch

    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ kk.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = torch.as_tensor(reference.permitted(q.shape[2], k.shape[2], causal, window), device=q.device)
    s = s.float().masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return p.to(q.dtype) @ vv, lse


def _kernel_case(torch, device, rng, dtype, b, hq, hkv, nq, nk, d=64, causal=False, seqlens=None):
    """Fresh q [B, Hq, Nq, d], k, v [B, Hkv, Nk, d] at ``dtype``, int32 cache lengths, and ``judge(name,
    o, lse, what)``: a kernel's output against the float64 reference over the permitted keys (causal, or
    the first ``seqlens[b]`` of the cache) with the tolerance from PyTorch SDPA's own error."""
    q, k, v = (torch.from_numpy(x).to(dtype=dtype, device=device)
               for x in _qkv(rng, (b, hq), (b, hkv), nq, nk, d, d))
    lens = np.full(b, nk) if seqlens is None else np.asarray(seqlens)
    o_ref, lse_ref = np.zeros((b, hq, nq, d)), np.zeros((b, hq, nq))
    for i, n in enumerate(lens):
        o_ref[i], lse_ref[i] = reference.naive_attention(_np(q[i]), _np(k[i, :, :n]), _np(v[i, :, :n]),
                                                         causal=causal, return_lse=True)
    permitted = reference.permitted(nq, nk, causal)
    permitted = permitted & (np.arange(nk) < lens[:, None, None, None])  # [B, 1, Nq, Nk]
    # PyTorch SDPA's own error at this dtype, over the rows with a permitted key
    k_rep, v_rep = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))  # [B, Hq, Nk, d]
    mask = torch.as_tensor(permitted, device=device)
    o_sdpa = torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask)
    has_key = np.broadcast_to(permitted.any(axis=-1), o_ref.shape[:-1])
    torch_err = float(np.abs(_np(o_sdpa) - o_ref)[has_key].max(initial=0.0))

    def judge(name, o, lse, what) -> CheckResult:
        o, lse = _np(o), _np(lse)
        err = float(np.abs(o - o_ref).max()) if not np.isnan(o).any() else float("inf")
        tol, l_err = kernel_tolerance(torch_err), lse_error(lse, lse_ref)
        return CheckResult(name, err <= tol and l_err <= KERNEL_LSE_TOL, err, tol,
                           f"{what}; torch's own error {torch_err:.2e}; LSE rel err {l_err:.2e} "
                           f"(tol {KERNEL_LSE_TOL:g})", "<=")

    return q, k, v, torch.tensor(lens, dtype=torch.int32, device=device), judge


def _worst(results: list[CheckResult]) -> CheckResult:
    """The first failure, or else the case closest to its tolerance (a zero tolerance: an exact check)."""
    failed = [r for r in results if not r.passed]
    return failed[0] if failed else max(results, key=lambda r: r.error / r.tolerance if r.tolerance else 0.0)


# (B, Hq, Hkv, Nq, Nk, d, dtype): ragged lengths, Nq != Nk both ways, GQA 2 and 4, bf16 once
FWD_SHAPES = ((2, 4, 2, 97, 97, 64, "float16"), (1, 2, 2, 37, 100, 64, "float16"),
              (1, 4, 1, 70, 33, 128, "float16"), (1, 2, 2, 65, 65, 64, "bfloat16"))
DECODE = (3, 4, 2, 1, 100)  # B, Hq, Hkv, one new token, a cache of 100 ...
DECODE_SEQLENS = (97, 1, 50)  # ... filled to these lengths


def _kernel_fwd_equals_ref(name, torch, device, rng):
    for b, hq, hkv, nq, nk, d, dt in FWD_SHAPES:
        for causal in (False, True):
            q, k, v, _, judge = _kernel_case(torch, device, rng, getattr(torch, dt), b, hq, hkv, nq, nk, d,
                                             causal=causal)
            o, lse = attnscope.flash_attention(q, k, v, causal=causal, return_lse=True)
            yield judge(name, o, lse, f"worst of the shapes x 2: B={b} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} "
                                      f"d={d} {dt} {'causal' if causal else 'unmasked'}")


def _kernel_fwd_empty_rows(name, torch, device, rng):
    nq, nk = 40, 23
    q, k, v, _, _ = _kernel_case(torch, device, rng, torch.float16, 1, 2, 2, nq, nk, causal=True)
    o, lse = (_np(x) for x in attnscope.flash_attention(q, k, v, causal=True, return_lse=True))
    empty = np.arange(nq) + nk - nq < 0
    nans = int(np.isnan(o).sum() + np.isnan(lse).sum())
    ok_empty = _empty_rows_ok(o, lse, empty)
    yield CheckResult(name, nans == 0 and ok_empty, float(nans), 0.0,
                      f"causal Nq={nq} > Nk={nk}: {int(empty.sum())} rows with no key "
                      f"{'are' if ok_empty else 'are NOT'} zeros with LSE -inf; {nans} NaN", compare="=")


def _kernel_decode_equals_ref(name, torch, device, rng):
    for dtype in (torch.float16, torch.bfloat16):  # both kernels emulate bf16 under the interpreter (_tl.py)
        q, k, v, sl, judge = _kernel_case(torch, device, rng, dtype, *DECODE, seqlens=DECODE_SEQLENS)
        o, lse = attnscope.flash_decode(q, k, v, cache_seqlens=sl, return_lse=True)
        yield judge(name, o, lse, "B=3 Hq=4 Hkv=2 cache 100, cache_seqlens [97, 1, 50], d=64, fp16 and bf16 "
                                  f"(worst: {str(dtype).removeprefix('torch.')})")


def _kernel_decode_splits(name, torch, device, rng):
    q, k, v, sl, judge = _kernel_case(torch, device, rng, torch.float16, *DECODE, seqlens=DECODE_SEQLENS)
    for n in (1, 3, 8):
        o, lse = attnscope.flash_decode(q, k, v, cache_seqlens=sl, num_splits=n, return_lse=True)
        yield judge(name, o, lse, f"num_splits 1, 3, 8 (worst: {n}) on cache_seqlens [97, 1, 50]")


def iter_checks(seed: int = 0, kernels: str = "auto"):
    """The reference checks, then the kernel checks (or why not), one result at a time."""
    choice("kernels", kernels, KERNEL_MODES)
    yield from reference_checks(seed)
    yield from kernel_checks(seed, kernels)
