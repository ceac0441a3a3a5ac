"""The decode, varlen and backward estimates' constants (model/family_params.py) from measured probe sweeps
(no GPU).

    python bench/fit_family_params.py probe_decode.json probe_varlen.json probe_backward.json [--json OUT]

Each FILE is what ``attnscope bytes --sweep bench/grids/probe_{decode,varlen,backward}.csv --json FILE`` wrote
on the GPU; its decode, varlen and backward rows go to `attnscope.measure.family_fit.fit` (non-negative least
squares for every constant: the decode, backward and varlen spill-frame terms) with the recorded L2 and SM
count. Prints each constant (None: no row informs it; a value fixed at 0 with its negative unconstrained
value) and every row's estimate against ncu with the fitted constants, to be copied into
`H200_FAMILY_PARAMS` with the result files' names; judge the result on the held-out grids only.
"""

from __future__ import annotations

import argparse
import json

from attnscope.measure import families, family_fit, physical


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", metavar="FILE", help="sweep JSON files (bytes --sweep --json)")
    ap.add_argument("--json", metavar="OUT", default=None, help="also write the fit as JSON to OUT")
    args = ap.parse_args(argv)
    points, env = [], {}
    for path in args.sweeps:
        _, env = physical.rows_from_json(path)
        with open(path) as f:  # the write counters (the varlen spill frames are fitted on them)
            raw = json.load(f)["points"]
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
