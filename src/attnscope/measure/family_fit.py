"""The constants of model/family_params.py from measured probe rows (`attnscope bytes --sweep
bench/grids/probe_{decode,varlen,backward}.csv --json F`): each decode and backward constant enters its
estimate linearly (a term's logical bytes x the constant), so one least-squares solve over the probe rows
gives them, with the estimate itself as the design (column f: the estimate with f = 1 less with f = 0, the
others 0), relative errors weighing each row alike. A byte term cannot be negative: the solve is
non-negative least squares, and a constant whose unconstrained value is below 0 is reported ("measured ~0").
A constant no row informs stays None; a row the estimate does not model (it refuses the shape) is skipped.
The varlen rows need no constant (their estimate is the forward's L2 rules); they are estimated and printed
beside the others. Pure Python + NumPy/SciPy; no GPU.
"""

from __future__ import annotations

from dataclasses import fields, replace

from attnscope.measure import families
from attnscope.model import family_estimate as fe
from attnscope.model.backward_estimate import backward_estimate
from attnscope.model.family_params import FamilyParams

LINEAR = tuple(f.name for f in fields(FamilyParams))  # every constant enters its estimate linearly


def _estimate(spec: dict, params: FamilyParams, l2_bytes: int | None, sms: int | None) -> float:
    h = spec["heads"]
    hkv = spec.get("kv_heads") or h
    if spec["pass"] == "backward":
        return backward_estimate(**families.backward_args(spec), sms=sms, l2_bytes=l2_bytes,
                                 params=params).total
    if spec["pass"] == "decode":
        return fe.decode_estimate(spec["impl"], spec["cache_lens"], nq=spec.get("nq", 1), d=spec["d"],
                                  dtype=spec["dtype"], heads=h, kv_heads=hkv, page_size=spec.get("page_size"),
                                  kv_dtype=spec.get("kv_dtype"), splits=spec.get("splits"), sms=sms,
                                  l2_bytes=l2_bytes, params=params).total
    return fe.varlen_estimate(spec["impl"], spec["lens"], causal=spec["causal"], d=spec["d"],
                              dtype=spec["dtype"], heads=h, kv_heads=hkv, sms=sms, l2_bytes=l2_bytes,
                              params=params).total


def _modelled(spec: dict, zero: FamilyParams, l2_bytes: int | None, sms: int | None) -> bool:
    """Whether the estimate models the point at all (every constant given): a point it refuses (a shape
    outside the model, `NotImplementedError`) informs no constant; its row says why."""
    try:
        _estimate(spec, zero, l2_bytes, sms)
    except NotImplementedError:
        return False
    return True


def fit(points: list[tuple[dict, int]], l2_bytes: int | None = None, sms: int | None = None) -> dict:
    """``{"params": {field: value or None}, "zeroed": {field: its negative unconstrained value}, "rows":
    [{spec, measured, fitted estimate, error, note}]}`` from (decode / varlen / backward spec, ncu bytes)
    pairs; values are rounded to 3 significant digits. A constant whose unconstrained least-squares value is
    negative (a byte term below zero: not physical) is 0 and listed in "zeroed"."""
    import numpy as np
    from scipy.optimize import nnls

    zero = FamilyParams(**dict.fromkeys(LINEAR, 0.0))
    lin = [(s, m) for s, m in points
           if s["pass"] in ("decode", "backward") and _modelled(s, zero, l2_bytes, sms)]
    got: dict = dict.fromkeys(LINEAR)
    zeroed: dict = {}
    if lin:
        base = np.array([_estimate(s, zero, l2_bytes, sms) for s, _ in lin])
        cols = np.array([[_estimate(s, replace(zero, **{f: 1.0}), l2_bytes, sms) for f in LINEAR]
                         for s, _ in lin]) - base[:, None]
        y = np.array([m for _, m in lin], dtype=float) - base
        used = [j for j in range(len(LINEAR)) if np.any(np.abs(cols[:, j]) > 0)]
        w = 1.0 / np.array([m for _, m in lin], dtype=float)  # relative errors weigh each row alike
        if used:
            a_w, y_w = cols[:, used] * w[:, None], y * w
            free, *_ = np.linalg.lstsq(a_w, y_w, rcond=None)
            sol, _ = nnls(a_w, y_w)
            for j, v, f in zip(used, sol, free, strict=True):
                got[LINEAR[j]] = float(f"{v:.3g}")
                if f < 0:
                    zeroed[LINEAR[j]] = float(f"{f:.3g}")
    params = FamilyParams(**got)
    rows = []
    for s, m in points:
        try:
            e = _estimate(s, params, l2_bytes, sms)
        except NotImplementedError as exc:
            rows.append({"spec": s, "measured": m, "estimate": None, "error": None,
                         "note": fe.error_text(exc)})
            continue
        rows.append({"spec": s, "measured": m, "estimate": e, "error": e / m - 1.0, "note": ""})
    return {"params": got, "zeroed": zeroed, "rows": rows}
