"""The constants of model/family_params.py from measured probe rows (`attnscope bytes --sweep
bench/grids/probe_{decode,varlen,backward}.csv --json F`): each decode and backward constant enters its
estimate linearly (a term's logical bytes x the constant), so one least-squares solve over the probe rows
gives them, with the estimate itself as the design (column f: the estimate with f = 1 less with f = 0, the
others 0), relative errors weighing each row alike. A byte term cannot be negative: the solve is
non-negative least squares, and a constant whose unconstrained value is below 0 is reported ("measured ~0").
A constant no row informs stays None; a row the estimate does not model (it refuses the shape) is skipped.
The varlen spill frames (`WRITE_FIT`) are fitted the same way on the write counters of attnscope's varlen
rows (Flex's rows and those without a finished program's frame only print their estimate). The one constant
that is not linear, `varlen_qo_weight` (it moves a miss curve's argument), is fitted first, by a search over
its values (`QO_WEIGHTS`) on the read counters of attnscope's varlen rows (the reads hold no frame term);
`flex_o_weight` (the room of Flex's Q/O in its dirty-O credit) is searched over the same values but 0 on the
write counters of Flex's varlen rows (absolute write error over each row's total: a resident call writes ~0).
`attnscope_partials_onset` (where the decode partials start to leave the L2) is searched over `ONSETS`, the
linear constants solved at each value, the least total squared relative error of the decode and backward
rows taking it (the partials' share is linear in its slope below its cap of 1). Pure Python + NumPy/SciPy; no
GPU.
"""

from __future__ import annotations

from dataclasses import fields, replace

from attnscope.measure import families
from attnscope.model import family_estimate as fe
from attnscope.model.backward_estimate import backward_estimate
from attnscope.model.family_params import FamilyParams
from attnscope.model.traffic import DTYPE_BYTES

#: constants fitted by a search (not linear in their estimate): the varlen Q/O room, on the read counters
SEARCHED = ("varlen_qo_weight", "flex_o_weight", "attnscope_partials_onset")
LINEAR = tuple(f.name for f in fields(FamilyParams) if f.name not in SEARCHED)  # linear in their estimates
#: constants of a write-only term, fitted on the write counters (on the totals, a read-side miss of the same
#: rows would leak into them): the varlen spill frames
WRITE_FIT = ("varlen_frame_d128", "varlen_frame_d128_causal", "varlen_frame_d64")
#: `varlen_qo_weight`'s search: 0 to 3 K/V bytes per Q/O byte in steps of 0.01 (the dense forward's
#: measured patterns: 0.58 to 1.15)
QO_WEIGHTS = tuple(round(0.01 * i, 2) for i in range(301))
#: `attnscope_partials_onset`'s search: 0 to 3 L2 sizes streamed in steps of 0.05
ONSETS = tuple(round(0.05 * i, 2) for i in range(61))


def _estimate(spec: dict, params: FamilyParams, l2_bytes: int | None, sms: int | None) -> float:
    args = {"params": params, "sms": sms, "l2_bytes": l2_bytes}
    if spec["pass"] == "backward":
        return backward_estimate(**families.backward_args(spec), **args).total
    if spec["pass"] == "decode":
        return fe.decode_estimate(**families.decode_args(spec), **args).total
    return fe.varlen_estimate(**families.varlen_args(spec), **args).total


def _modelled(spec: dict, zero: FamilyParams, l2_bytes: int | None, sms: int | None) -> bool:
    """Whether the estimate models the point at all (every constant given): a point it refuses (a shape
    outside the model, `NotImplementedError`) informs no constant; its row says why."""
    try:
        _estimate(spec, zero, l2_bytes, sms)
    except NotImplementedError:
        return False
    return True


def _reads(spec: dict, params: FamilyParams, l2_bytes: int | None, sms: int | None) -> float:
    """A varlen point's estimated DRAM reads: Q, K, V, the metadata and the K/V re-reads (no frame term)."""
    h = spec["heads"]
    hkv = spec.get("kv_heads") or h
    est = fe.varlen_estimate(**families.varlen_args(spec), sms=sms, l2_bytes=l2_bytes, params=params)
    qkv = sum(spec["lens"]) * spec["d"] * DTYPE_BYTES[spec["dtype"]] * (h + 2 * hkv)
    return qkv + sum(b for n, b, _ in est.terms if n in ("work_list", "kv_rereads"))


def _search(field: str, values, rows: list, error, zero: FamilyParams, got: dict) -> None:
    """A constant that is not linear in its estimate: the one of ``values`` with the least sum of squared
    ``error(params, row)`` over the ``rows`` whose error moves with it (the least such value where several
    tie), into ``got[field]``; left None when no row's error moves with it."""
    table = {v: [error(replace(zero, **{field: v}), r) for r in rows] for v in values} if rows else {}
    moving = [j for j in range(len(rows)) if len({round(e[j], 12) for e in table.values()}) > 1]
    if moving:
        got[field] = min(values, key=lambda v: (sum(table[v][j] ** 2 for j in moving), v))


def _writes(spec: dict, params: FamilyParams, l2_bytes: int | None, sms: int | None) -> float:
    """A varlen point's estimated DRAM writes: O, the spill frames written back, less the dirty-O credit."""
    h = spec["heads"]
    est = fe.varlen_estimate(**families.varlen_args(spec), sms=sms, l2_bytes=l2_bytes, params=params)
    o = sum(spec["lens"]) * h * spec["d"] * DTYPE_BYTES[spec["dtype"]]
    return o + sum(b for n, b, _ in est.terms if n in ("spill", fe.CREDIT))


def _solve(rows: list, names: tuple, value, got: dict, zeroed: dict, zero: FamilyParams) -> float:
    """Non-negative least squares of ``names`` over ``rows`` (spec, total, target counter): the design is
    ``value(spec, params)``'s slope in each constant at 0 (the others 0), fitted to ``target`` less the all-0
    value, each row weighed by 1 / its total; fills ``got`` and ``zeroed``, returns the squared residual."""
    import numpy as np
    from scipy.optimize import nnls

    if not rows:
        return 0.0
    base = np.array([value(s, zero) for s, _, _ in rows])
    step = 1e-3  # each constant's column is its term's slope at 0 (a capped share is linear below its cap)
    cols = np.array([[value(s, replace(zero, **{f: step})) for f in names] for s, _, _ in rows])
    cols = (cols - base[:, None]) / step
    y = np.array([t for _, _, t in rows], dtype=float) - base
    used = [j for j in range(len(names)) if np.any(np.abs(cols[:, j]) > 0)]
    w = 1.0 / np.array([m for _, m, _ in rows], dtype=float)  # relative errors weigh each row alike
    if not used:
        return float(np.sum((y * w) ** 2))
    a_w, y_w = cols[:, used] * w[:, None], y * w
    free, *_ = np.linalg.lstsq(a_w, y_w, rcond=None)
    sol, residual = nnls(a_w, y_w)
    for j, v, f in zip(used, sol, free, strict=True):
        got[names[j]] = float(f"{v:.3g}")
        if f < 0:
            zeroed[names[j]] = float(f"{f:.3g}")
    return float(residual) ** 2


def fit(points: list[tuple], l2_bytes: int | None = None, sms: int | None = None) -> dict:
    """``{"params": {field: value or None}, "zeroed": {field: its negative unconstrained value}, "rows":
    [{spec, measured, fitted estimate, error, note}]}`` from (decode / varlen / backward spec, ncu bytes[,
    ncu write bytes]) tuples; values are rounded to 3 significant digits (`varlen_qo_weight`: to its search
    step). A constant whose unconstrained least-squares value is negative (a byte term below zero: not
    physical) is 0 and listed in "zeroed". The decode and backward constants are fitted on the totals;
    `varlen_qo_weight` on the read counters and then `WRITE_FIT` on the write counters of the attnscope varlen
    points that carry them, `flex_o_weight` on the write counters of the Flex varlen points."""
    zero = FamilyParams(**dict.fromkeys(LINEAR, 0.0), attnscope_partials_onset=0.0)
    got: dict = dict.fromkeys(f.name for f in fields(FamilyParams))
    zeroed: dict = {}
    lin = [(s, m, m) for s, m, *_ in points
           if s["pass"] in ("decode", "backward") and _modelled(s, zero, l2_bytes, sms)]
    names = tuple(f for f in LINEAR if f not in WRITE_FIT)
    solves = {}  # onset -> (residual, got, zeroed)
    for onset in ONSETS:
        g, z = dict(got), {}
        r = _solve(lin, names, lambda s, p: _estimate(s, p, l2_bytes, sms), g, z,
                   replace(zero, attnscope_partials_onset=onset))
        solves[onset] = (round(r, 12), g, z)
    onset = min(ONSETS, key=lambda o: (solves[o][0], o))
    moves = len({v[0] for v in solves.values()}) > 1  # some row's estimate moves with the onset
    got, zeroed = solves[onset][1], solves[onset][2]
    got["attnscope_partials_onset"] = onset if moves else None
    any_w = replace(zero, varlen_qo_weight=1.0)  # which rows the estimate models at all, whatever the room
    read = [(s, m, m - w[0]) for s, m, *w in points
            if s["pass"] == "varlen" and s["impl"] == "attnscope" and w and w[0] is not None
            and _modelled(s, any_w, l2_bytes, sms)]
    # the Q/O room: relative read error of attnscope's rows
    _search("varlen_qo_weight", QO_WEIGHTS, read, lambda p, r: _reads(r[0], p, l2_bytes, sms) / r[2] - 1.0,
            zero, got)
    zero = replace(zero, varlen_qo_weight=got["varlen_qo_weight"])
    wrote = [(s, m, w[0]) for s, m, *w in points
             if s["pass"] == "varlen" and s["impl"] == "attnscope" and w and w[0] is not None
             and _modelled(s, zero, l2_bytes, sms)]
    _solve(wrote, WRITE_FIT, lambda s, p: _writes(s, p, l2_bytes, sms), got, zeroed, zero)
    any_o = replace(zero, flex_o_weight=1.0)
    flex = [(s, m, w[0]) for s, m, *w in points
            if s["pass"] == "varlen" and s["impl"] == "flex" and w and w[0] is not None
            and _modelled(s, any_o, l2_bytes, sms)]
    # Flex's dirty-O room: write error over each row's total (a resident call writes ~0)
    _search("flex_o_weight", [w for w in QO_WEIGHTS if w > 0], flex,
            lambda p, r: (_writes(r[0], p, l2_bytes, sms) - r[2]) / r[1], zero, got)
    params = FamilyParams(**got)
    rows = []
    for s, m, *_ in points:
        try:
            e = _estimate(s, params, l2_bytes, sms)
        except NotImplementedError as exc:
            rows.append({"spec": s, "measured": m, "estimate": None, "error": None,
                         "note": fe.error_text(exc)})
            continue
        rows.append({"spec": s, "measured": m, "estimate": e, "error": e / m - 1.0, "note": ""})
    return {"params": got, "zeroed": zeroed, "rows": rows}
