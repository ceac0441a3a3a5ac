"""The decode, varlen and backward estimates' constants (model/family_params.py) from measured probe sweeps
(no GPU).

    python bench/fit_family_params.py probe_decode.json probe_varlen.json probe_backward.json [--json OUT]
    python bench/fit_family_params.py --hot SWEEP.json [SWEEP.json ...] [--json OUT]

Each FILE is what ``attnscope bytes --sweep bench/grids/probe_{decode,varlen,backward}.csv --json FILE`` wrote
on the GPU; its decode, varlen and backward rows go to `attnscope.measure.family_fit.fit` (non-negative least
squares for every constant: the decode, backward and varlen spill-frame terms) with the recorded L2 and SM
count. Prints each constant (None: no row informs it; a value fixed at 0 with its negative unconstrained
value) and every row's estimate against ncu with the fitted constants, to be copied into
`H200_FAMILY_PARAMS` with the result files' names; judge the result on the held-out grids only.

``--hot``: FA-2's hot-set curve for several K/V heads (model/l2_params.py `L2Params.hot_groups`). Each SWEEP
is what ``attnscope bytes --sweep GRID --json SWEEP`` wrote on the GPU. Its points of the class (SDPA FLASH,
causal, d > 64, B > 1, 1 < Hkv < H: `model.l2.hot_knots` picks `hot_groups` for them), every recorded run, are
fitted: the estimate is e0 + (e1 - e0) x share, where e0 and e1 are the estimate with a share of 0 and of 1
(`hot_miss`), and the share is piecewise linear in the footprint through knots at `L2Params.hot`'s footprints
(the first at share 0, as `hot`'s), so it is linear in the knots' shares: non-negative least squares on
relative errors. Prints the knots (to copy into `L2Params.hot_groups` with the files' names) and each run's
error with them; judge the result on a grid drawn after it, never on the sweeps it was fitted to.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from dataclasses import replace

from attnscope import inputs
from attnscope.measure import families, family_fit, physical
from attnscope.model import l2


def in_class(spec: dict) -> bool:
    """SDPA FLASH causal forward at d > 64, B > 1, with 1 < Hkv < H (`hot_groups`'s class)."""
    hkv = spec.get("kv_heads") or spec["heads"]
    return (spec.get("pass", "forward") == "forward" and spec["impl"] == "flash" and bool(spec.get("causal"))
            and spec["d"] > 64 and spec.get("batch", 1) > 1 and 1 < hkv < spec["heads"])


@contextmanager
def knots(table: tuple):
    """The estimate with ``table`` as `L2Params.hot_groups` (restored on exit)."""
    saved = l2.H200_L2_PARAMS
    l2.H200_L2_PARAMS = replace(saved, hot_groups=table)
    try:
        yield
    finally:
        l2.H200_L2_PARAMS = saved


def total(spec: dict, l2_bytes: int, sms: int) -> int:
    s = spec
    return l2.estimate("flash", s["n"], s["d"], s["heads"], s.get("batch", 1), s.get("dtype", "fp16"), True,
                       kv_heads=s.get("kv_heads"), l2_bytes=l2_bytes, sms=sms).total


def weights(x: float, xs: list[float]) -> list[float]:
    """Hat-function weights of ``x`` on the knots ``xs`` (`hot_miss`'s interpolation, flat past both ends)."""
    w = [0.0] * len(xs)
    if x <= xs[0]:
        w[0] = 1.0
    elif x >= xs[-1]:
        w[-1] = 1.0
    else:
        i = max(j for j in range(len(xs) - 1) if xs[j] <= x)
        t = (x - xs[i]) / (xs[i + 1] - xs[i])
        w[i], w[i + 1] = 1.0 - t, t
    return w


def fit(points: list[tuple[dict, int]], l2_bytes: int, sms: int) -> dict:
    """{"knots": ((footprint, share), ...), "rows": [{spec, measured, estimate, error}]} from (spec, ncu
    bytes) runs of the class; shares rounded to 2 decimals."""
    import numpy as np
    from scipy.optimize import nnls

    xs = [x for x, _ in l2.H200_L2_PARAMS.hot]
    with knots(((0.0, 0.0), (9.0, 0.0))):
        e0 = np.array([total(s, l2_bytes, sms) for s, _ in points], dtype=float)
    with knots(((0.0, 1.0), (9.0, 1.0))):
        e1 = np.array([total(s, l2_bytes, sms) for s, _ in points], dtype=float)
    meas = np.array([m for _, m in points], dtype=float)
    ratio = [l2.hot_footprint(s["batch"], 2 * s["n"] * s["d"] * (4 if s.get("dtype") == "fp32" else 2),
                              l2_bytes) for s, _ in points]
    # the first knot's share is 0, as `hot`'s: a rotation that small stays in the L2 (each set read once)
    a = (np.array([weights(r, xs) for r in ratio]) * ((e1 - e0) / meas)[:, None])[:, 1:]
    y = 1.0 - e0 / meas
    sol, _ = nnls(a, y)
    table = tuple((x, round(float(v), 2)) for x, v in zip(xs, [0.0, *sol], strict=True))
    with knots(table):
        est = [total(s, l2_bytes, sms) for s, _ in points]
    rows = [{"spec": s, "measured": m, "estimate": e, "error": e / m - 1.0}
            for (s, m), e in zip(points, est, strict=True)]
    return {"knots": table, "rows": rows}


def main_hot(args) -> int:
    points, used = [], set()
    for path in args.sweeps:
        rows, env = physical.rows_from_json(path)
        used.add((env["estimated_with"]["l2_bytes"], env["estimated_with"]["sms"]))
        points += [(r.spec, m) for r in rows if in_class(r.spec) for m in (r.runs or (r.measured,))]
    if len(used) != 1:
        raise SystemExit(f"sweeps: expected one L2 size and SM count, got {sorted(used)}")
    if not points:
        raise SystemExit("sweeps: expected points of the class (flash, causal, d > 64, B > 1, 1 < Hkv < H)")
    (l2_bytes, sms), = used
    out = fit(points, l2_bytes, sms)
    print(f"hot_groups = {out['knots']}  ({len(points)} runs)")
    for r in sorted(out["rows"], key=lambda r: r["error"]):
        print(f"  {physical.Row(r['spec'], r['measured'], r['estimate'], 0, ()).label()}: ncu "
              f"{r['measured']:,} B, estimate {r['estimate']:,} B ({r['error']:+.1%})")
    errs = [abs(r["error"]) for r in out["rows"]]
    print("within " + ", ".join(f"±{b}%: {sum(e <= b / 100 for e in errs)}/{len(errs)}" for b in (5, 10, 15)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", metavar="FILE", help="sweep JSON files (bytes --sweep --json)")
    ap.add_argument("--json", metavar="OUT", default=None, help="also write the fit as JSON to OUT")
    ap.add_argument("--hot", action="store_true",
                    help="fit FA-2's hot-set curve for several K/V heads (L2Params.hot_groups) instead")
    args = ap.parse_args(argv)
    if args.hot:
        return main_hot(args)
    points, env = [], {}
    for path in args.sweeps:
        _, env = physical.rows_from_json(path)
        raw = inputs.load_json(path, "sweep")["points"]  # the write counters (the varlen spill frames and
        # Flex's dirty-O room are fitted on them); .json or .json.gz
        writes = {json.dumps(physical.point(p["spec"], path), sort_keys=True): p["measured"]["write"]
                  for p in raw if p.get("measured")}
        points += [(r.spec, r.measured, writes.get(json.dumps(r.spec, sort_keys=True)))
                   for r in env["family_rows"] if r.spec["pass"] in ("decode", "varlen", "backward")]
    used = env.get("estimated_with", {})
    out = family_fit.fit(points, used.get("l2_bytes"), used.get("sms"))
    for name, value in out["params"].items():
        why = f"  (least squares {out['zeroed'][name]}: a byte term below 0, fixed at 0)" \
            if name in out["zeroed"] else ""
        print(f"{name} = {value}{why}")
    for r in out["rows"]:
        est = "-" if r["estimate"] is None else f"{r['estimate']:,.0f} B ({r['error']:+.1%})"
        print(f"{families.label(r['spec'])}: ncu {r['measured']:,} B, estimate {est} {r['note']}".rstrip())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
