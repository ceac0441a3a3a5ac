"""The constants of model/family_params.py from measured probe rows (`attnscope bytes --sweep
bench/grids/probe_{decode,varlen,backward}.csv --json F`): each decode and backward constant enters its
estimate linearly (a term's logical bytes x the constant), so one least-squares solve over the probe rows
gives them, with the estimate itself as the design (column f: the estimate with f = 1 less with f = 0, the
others 0); the varlen capacity and ramp (`l2_params.miss` between them) by a grid search (then steps of 0.005)
of the rows past `RESIDENT_BELOW`. A constant no row informs stays None. Pure Python + NumPy; no GPU.
"""

from __future__ import annotations

from dataclasses import fields, replace

from attnscope.measure import families
from attnscope.model import family_estimate as fe
from attnscope.model.backward_estimate import backward_estimate
from attnscope.model.family_params import RESIDENT_BELOW, FamilyParams

LINEAR = ("attnscope_partials_dram", "row_tile_kv_miss", "flash_partials_dram", "cudnn_kv_dram",
          "cudnn_gqa_kv_dram", "cudnn_other_per_row", "naive_bwd_s_dram", "portable_bwd_reread_dram",
          "hopper_bwd_reread_dram", "flash_bwd_reread_dram", "cudnn_bwd_reread_dram",
          "cudnn_bwd_other_per_row", "cudnn_bwd_gqa_dram")
#: The varlen search grid: capacity (steps of 0.02) and ramp - capacity (steps of 0.1), shares of the L2.
CAPACITIES = tuple(round(RESIDENT_BELOW + 0.02 * i, 2) for i in range(0, 80))
RAMP_WIDTHS = tuple(round(0.1 * i, 2) for i in range(1, 40))


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
                              dtype=spec["dtype"], heads=h, kv_heads=hkv, l2_bytes=l2_bytes,
                              params=params).total


def _footprint(spec: dict, l2_bytes: int | None) -> float:
    """The largest re-read footprint (share of the L2) a varlen point's estimate weighs."""
    est = fe.varlen_estimate(spec["impl"], spec["lens"], causal=spec["causal"], d=spec["d"],
                             dtype=spec["dtype"], heads=spec["heads"], kv_heads=spec.get("kv_heads"),
                             l2_bytes=l2_bytes,
                             params=FamilyParams(varlen_capacity=10.0, varlen_ramp=11.0))
    return max(est.facts.get("largest_footprint_l2", 0.0), est.facts.get("head_footprint_l2", 0.0))


def fit(points: list[tuple[dict, int]], l2_bytes: int | None = None, sms: int | None = None) -> dict:
    """``{"params": {field: value or None}, "rows": [{spec, measured, fitted estimate, error}]}`` from
    (decode / varlen spec, ncu bytes) pairs; values are rounded to 3 significant digits."""
    import numpy as np

    zero = FamilyParams(**dict.fromkeys(LINEAR, 0.0), varlen_capacity=10.0, varlen_ramp=11.0)  # resident
    dec = [(s, m) for s, m in points if s["pass"] in ("decode", "backward")]  # the linear constants
    got: dict = dict.fromkeys(f.name for f in fields(FamilyParams))
    if dec:
        base = np.array([_estimate(s, zero, l2_bytes, sms) for s, _ in dec])
        cols = np.array([[_estimate(s, replace(zero, **{f: 1.0}), l2_bytes, sms) for f in LINEAR]
                         for s, _ in dec]) - base[:, None]
        y = np.array([m for _, m in dec], dtype=float) - base
        used = [j for j in range(len(LINEAR)) if np.any(np.abs(cols[:, j]) > 0)]
        if used:  # relative errors weigh each row alike
            w = 1.0 / np.array([m for _, m in dec], dtype=float)
            sol, *_ = np.linalg.lstsq(cols[:, used] * w[:, None], y * w, rcond=None)
            for j, v in zip(used, sol, strict=True):
                got[LINEAR[j]] = float(f"{v:.3g}")
    var = [(s, m) for s, m in points if s["pass"] == "varlen"]
    if var:
        def sq(cap, ramp):
            p = replace(zero, varlen_capacity=cap, varlen_ramp=ramp)
            return sum((_estimate(s, p, l2_bytes, sms) / m - 1.0) ** 2 for s, m in var)

        best = min((sq(c, c + w), c, c + w) for c in CAPACITIES for w in RAMP_WIDTHS)
        _, c0, r0 = best  # then steps of 0.005 around it
        best = min((sq(c0 + 0.005 * i, r0 + 0.005 * j), c0 + 0.005 * i, r0 + 0.005 * j)
                   for i in range(-4, 5) for j in range(-20, 21) if r0 + 0.005 * j > c0 + 0.005 * i > 0)
        informed = any(_footprint(s, l2_bytes) > RESIDENT_BELOW for s, _ in var)
        if informed:
            got["varlen_capacity"], got["varlen_ramp"] = round(best[1], 3), round(best[2], 3)
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
    return {"params": got, "rows": rows}
