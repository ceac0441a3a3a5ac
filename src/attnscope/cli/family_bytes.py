"""`attnscope bytes --estimate-only` for a grid (`--sweep GRID`, no GPU) and the decode estimate line of
`bytes --estimate-only --cache-lens`: each point's logical ledger, compulsory bytes and DRAM estimate
(model/backward_estimate.py for the backward, model/family_estimate.py for decode and varlen,
model/window_estimate.py for window, model/l2.py for the forward), or why it has none."""

from __future__ import annotations

import json

from attnscope.cli._out import MiB, _clean, console, print_json, table
from attnscope.inputs import write_atomic
from attnscope.measure import families, physical
from attnscope.model import l2 as l2_model
from attnscope.model import roofline


def sweep_estimates(args) -> int:
    """Every point of ``args.sweep`` estimated with no GPU, on ``args.device``'s L2 and SMs (or --l2-bytes,
    --sms); JSON with ``--json`` (stdout or FILE, as the measured sweep)."""
    dev = roofline.device(args.device)
    l2, sms = args.l2_bytes or dev.l2, args.sms or dev.sms
    rows = []
    for spec in physical.parse_grid(args.sweep):
        if spec.get("pass", "forward") == "forward":
            est = physical.estimate_of(spec, l2, sms)
            logical = l2_model.logical(spec["impl"], spec["n"], spec["d"], spec["heads"],
                                       spec.get("batch", 1), spec.get("dtype", "fp16"),
                                       bool(spec.get("causal")))
            why = physical.not_modelled_of(spec, l2)
            rows.append({"spec": spec, "label": physical.Row(spec, 1, 0, 0, ()).label(), "logical": logical,
                         "compulsory": est.compulsory, "estimate": None if why else est.total,
                         "note": why or "model/l2.py", "estimate_terms": []})
            continue
        r = families.row(spec, [1], l2, sms)
        rows.append({"spec": spec, "label": r.label(), "logical": r.logical, "compulsory": r.compulsory,
                     "estimate": r.estimate, "note": r.note,
                     "estimate_terms": [{"name": n, "bytes": b, "what": w} for n, b, w in r.terms]})
    out = {"kind": "attnscope-bytes-estimates", "env": {"device": dev.name, "l2_bytes": l2, "sms": sms},
           "rows": rows}
    if args.json == "-":
        print_json(out)
        return 0
    if args.json:  # a file, checked by the caller (`inputs.out_file`)
        write_atomic(args.json, json.dumps(_clean(out), indent=1) + "\n", "--json")
    trows = [[r["label"], f"{r['logical'] / MiB:,.2f}", f"{r['compulsory'] / MiB:,.2f}",
              f"{r['estimate'] / MiB:,.2f}" if r["estimate"] is not None else "-",
              "" if r["estimate"] is not None else r["note"]] for r in rows]
    console().print(table("DRAM bytes of the whole call, MiB: logical ledger, compulsory bytes and the "
                          "estimate (no GPU)",
                          ["point", "logical", "compulsory", "estimate", "why no estimate"], trows,
                          caption=f"{dev.label}, L2 {l2 / MiB:,.1f} MiB, {sms} SMs"))
    return 0


def decode_estimate_json(spec: dict, sms: int | None) -> dict:
    """The attnscope decode estimate of a `bytes --cache-lens` call as JSON: the estimate, or why not."""
    est, note = families.estimate(spec, sms=sms)
    return {"estimate": None if est is None else est.to_json(), "note": note}


def decode_estimate_line(spec: dict, sms: int | None) -> str:
    est, note = families.estimate(spec, sms=sms)
    if est is None:
        return f"DRAM estimate (model/family_estimate.py): none, {note}"
    terms = "; ".join(f"{n} {b / MiB:,.3f} MiB" for n, b, _ in est.terms)
    return (f"DRAM estimate (model/family_estimate.py): {est.total / MiB:,.3f} MiB = compulsory "
            f"{est.compulsory / MiB:,.3f} MiB + {terms}")
