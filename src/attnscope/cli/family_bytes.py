"""`attnscope bytes --estimate-only` for a grid (`--sweep GRID`, no GPU) and the decode estimate line of
`bytes --estimate-only --cache-lens`: each point's logical ledger, compulsory bytes and DRAM estimate
(model/backward_estimate.py for the backward, model/family_estimate.py for decode and varlen,
model/window_estimate.py for window, model/l2.py for the forward), or why it has none."""

from __future__ import annotations

import json
import re

from attnscope.cli._out import MiB, _clean, console, int_list, print_json, table
from attnscope.errors import InputError, expect
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


def add_flags(p) -> None:
    """Add `bytes`'s flags of one point of another family (--family, --lengths, --deterministic, --kernels,
    --window) to its parser ``p``."""
    p.add_argument("--family", default=None, choices=("backward", "varlen", "window"),
                   help="one point of another kernel family (a sweep row's pass) against its ledger and "
                        "estimate: backward (--n, --causal, --deterministic, --kernels), varlen (--lengths), "
                        "window (--window); any of them with --window for attnscope")
    p.add_argument("--lengths", default=None, metavar="N1,N2,...",
                   help="--family varlen: the packed sequences' lengths (as `traffic --lengths`)")
    p.add_argument("--deterministic", action="store_true",
                   help="--family backward: attnscope's dQ in its own pass (default: atomic dQ)")
    p.add_argument("--kernels", default=None, choices=families.KERNELS,
                   help="--family backward: attnscope's kernels (default: the mode's, as a sweep row's)")
    p.add_argument("--window", default=None, metavar="L,R",
                   help="a sliding window (flash-attn's window_size; causal forces R = 0; write "
                        "negative values as --window=-1,8): one forward of --impl attnscope or flex "
                        "against the window family's ledger and estimate (model/window_estimate.py); "
                        "with --cache-lens the decode's window (L bounds)")


def family_spec(args, family: str) -> dict:
    """The spec of one point of ``family`` from `bytes`'s flags (`bytes --window L,R`: a windowed forward,
    --impl attnscope or flex; `--family backward` / `varlen`, optionally windowed), validated as a grid row
    (`physical.point`: one line naming the flag; the row's ``lens`` is --lengths)."""
    from attnscope.cli.analytic import window_arg

    win = window_arg(args.window)
    expect(win is not None or family != "window", "--window", "L,R with --impl flex (Flex's call here is a "
           "sliding-window one)" if args.impl == "flex" else "L,R with --family window", args.window)
    raw = {"pass": family, "impl": args.impl, "batch": args.batch, "heads": args.heads,
           "kv_heads": args.kv_heads or 0, "d": args.d, "dtype": args.dtype, "causal": args.causal,
           "window": list(win) if win else ""}
    if family != "varlen" or args.n != 4096:  # varlen takes --lengths (a given --n is refused by name)
        raw["n"] = args.n
    if family == "varlen":
        raw["lens"] = "" if args.lengths is None else int_list("--lengths", args.lengths,
                                                                 most=families.MAX_SEQUENCES)
    if family == "backward":
        raw |= {"deterministic": args.deterministic, "kernels": args.kernels or ""}
    try:
        return physical.point(raw, "row")
    except (InputError, NotImplementedError) as e:  # "row: field: ..." -> "--field: ..." (the flag given)
        flag = {"lens": "lengths"}
        raise type(e)(re.sub(r"^row: (\w+):", lambda m: f"--{flag.get(m[1], m[1]).replace('_', '-')}:",
                             str(e))) from None


def family_report(args, spec: dict, measured, l2: int | None, sms: int | None) -> int:
    """One family point of `bytes` (`family_spec`): the call's logical ledger, compulsory bytes and DRAM
    estimate (`families.ESTIMATES`' module, on --l2-bytes / --sms or the --device entry's), beside ncu's
    ``measured`` bytes (`ncu.Measured`) where it ran."""
    dev = roofline.device(args.device)
    l2, sms = l2 or dev.l2, sms or dev.sms
    r = families.row(spec, [measured.total if measured and measured.total else 1], l2, sms)
    errors = {"logical_error": r.error, **({"estimate_error": r.estimate_error} if r.estimate else {})} \
        if measured and measured.total else {}
    if args.json:
        print_json({"spec": spec, "label": r.label(), "ledger": r.ledger, "logical": r.logical,
                    "compulsory": r.compulsory, "estimate": r.estimate, "note": r.note,
                    "estimate_terms": [{"name": n, "bytes": b, "what": w} for n, b, w in r.terms],
                    "measured": measured.to_json() if measured else None, **errors,
                    "env": {"l2_bytes": l2, "sms": sms}})
        return 0
    vs = {k: f"{v:+.1%}" for k, v in errors.items()}
    rows = [[f"logical ledger ({r.ledger})", f"{r.logical / MiB:,.2f}", vs.get("logical_error", "")],
            ["compulsory (each input read once, each output written once)", f"{r.compulsory / MiB:,.2f}", ""],
            [f"DRAM estimate ({families.ESTIMATES[spec['pass']]})",
             "-" if r.estimate is None else f"{r.estimate / MiB:,.2f}", vs.get("estimate_error", "")]]
    rows += [[f"  {n}", f"{b / MiB:+,.3f}", ""] for n, b, _ in r.terms]
    if measured:
        rows.append([f"measured (ncu, cache-control {measured.cache_control})",
                     f"{measured.total / MiB:,.2f}", ""])
    console().print(table(f"DRAM bytes of the whole call, MiB: {r.label()}", ["", "MiB", "vs measured"], rows,
                          caption=f"L2 {l2 / MiB:,.1f} MiB, {sms} SMs"))
    for n, _, w in r.terms:
        console().print(f"{n}: {w}")
    if r.estimate is None:
        console().print(f"DRAM estimate: none, {r.note}")
    return 0
