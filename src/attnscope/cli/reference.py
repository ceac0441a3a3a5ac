"""The reference subcommands: `trace` (the online-softmax state, spec §3.2) and `verify` (the checks).

Both run on a CPU in well under two seconds on the float64 reference (reference.py, checks.py); neither
imports torch at module level. `verify` imports torch only to ask whether the kernels can run.
"""

from __future__ import annotations

import os

from attnscope.cli._out import console, path_arg, print_json, table
from attnscope.errors import InputError, finite_real, short
from attnscope.inputs import gc_paused, load_json

# Spec §3.2: one query row, d = 2, two tiles of two keys each: (scores, values).
SPEC_TILES = [([8.0, 6.0], [[1.0, 2.0], [3.0, 4.0]]), ([10.0, 7.0], [[5.0, 6.0], [7.0, 8.0]])]
MATCH_TOL = 1e-9  # the trace and the global softmax differ only by float64 rounding


def configure(sub) -> None:
    """Add `trace` and `verify` to `sub` (argparse subparsers)."""
    p = sub.add_parser(
        "trace", help="online-softmax state (m, alpha, l, acc) after each tile, checked against the softmax",
        description="Replay FlashAttention-2's online softmax for one query row whose scores arrive tile by "
                    "tile: the state after each tile, the one final division, and the check against the "
                    "global softmax. With no --input: the spec's §3.2 two-tile example.")
    p.add_argument("--input", metavar="FILE", default=None, type=path_arg,
                   help='JSON file ("-" for stdin): {"tiles": [{"scores": [8, 6], '
                        '"values": [[1, 2], [3, 4]]}, ...]}; any number of tiles, scores already scaled, '
                        "one value width throughout (default: the spec's §3.2 example)")
    p.add_argument("--sink", type=float, default=None, metavar="X",
                   help="an attention sink: the logit X joins the softmax denominator with no value, as one "
                        "more key of value 0 after the last tile (it raises l and leaves acc unchanged)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser(
        "verify", help="check tiled = naive, the diagonal tiles, the mask, NaN-freedom, FA-1 = FA-2, "
                  "combine, windows, softcap and sinks",
        description="Check the algorithm on fresh seeded random inputs: one PASS/FAIL line per check with "
                    "the measured error; exit code 1 if any check fails. The Triton kernels are checked too "
                    "where they can run.")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: %(default)s)")
    p.add_argument("--kernels", default="auto", choices=("auto", "on", "off"),
                   help="check the Triton kernels too: auto = with a CUDA GPU or TRITON_INTERPRET=1; on = "
                        "always (the slow CPU interpreter without a GPU; a failure if they cannot run); off "
                        "= never (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=cmd_verify)


# --- trace ----------------------------------------------------------------------------------------
#: Steps shown in the table (first and last halves); --json always gives every step.
TABLE_STEPS = 40


def load_tiles(path: str) -> list[tuple[list, list]]:
    """Read the ``--input`` JSON into ``[(scores, values), ...]``; any problem is one InputError line
    (the numbers themselves are checked by `online_softmax_trace`)."""
    doc = load_json(path, "--input")
    if not isinstance(doc, dict) or "tiles" not in doc:
        raise InputError(f'--input: expected an object {{"tiles": [...]}}, got {short(doc)}')
    if extra := sorted(map(str, set(doc) - {"tiles"})):
        raise InputError(f'--input: expected an object with only "tiles", got an unknown field '
                         f"{short(extra[0])}")
    tiles = doc["tiles"]
    if not isinstance(tiles, list) or not tiles:
        raise InputError(f'tiles: expected a non-empty list of {{"scores": [...], "values": [[...], ...]}}, '
                         f"got {short(tiles)}")
    out = []
    for n, tile in enumerate(tiles, start=1):
        if type(tile) is not dict or len(tile) != 2 or "scores" not in tile or "values" not in tile:
            raise InputError(f'tile {n}: expected an object with exactly "scores" and "values", '
                             f"got {short(tile)}")
        out.append((tile["scores"], tile["values"]))
    return out


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, list):
        return "[" + ", ".join(f"{v:.4f}" for v in x) + "]"
    return f"{x:.4f}"


def _fmt_short(xs: list, keep: int = 8) -> str:
    """A list for a table cell: the first and last few entries, the count when elided."""
    if len(xs) <= keep:
        return _fmt(xs)
    return _fmt(xs[: keep // 2])[:-1] + f", ... ({len(xs) - keep:,} more), " + _fmt(xs[-(keep // 2):])[1:]


def cmd_trace(args) -> int:
    import numpy as np

    from attnscope.reference import online_softmax_trace

    # errstate: m_old - m_new = -inf near the float limit is exact (exp() = 0), not a warning to print;
    # gc_paused: a 200,000-tile input is a million containers the collector would re-walk for nothing.
    with gc_paused(), np.errstate(over="ignore"):
        tiles = load_tiles(args.input) if args.input else SPEC_TILES
        tr = online_softmax_trace(tiles)
        if args.sink is not None:  # the sink: one more key, value 0 (reference.tiled_attention does the same)
            if not finite_real(args.sink):
                raise InputError(f"--sink: expected a finite number, got {short(args.sink)}")
            tiles = [*tiles, ([args.sink], [[0.0] * len(tr.output)])]
            tr = online_softmax_trace(tiles)
        scale = max(1.0, max(abs(x) for x in tr.reference))
        ok = tr.max_abs_diff <= MATCH_TOL * scale
        if args.json:
            print_json(tr.to_json())
            return 0 if ok else 1

        n = len(tr.m)
        shown = [tr.step(j) for j in (range(n) if n <= TABLE_STEPS else
                                      [*range(TABLE_STEPS // 2), *range(n - TABLE_STEPS // 2, n)])]
        rows = [[st["tile"], _fmt_short([float(x) for x in tiles[st["tile"] - 1][0]]), _fmt(st["m"]),
                 _fmt(st["alpha"]), _fmt(st["l"]), _fmt_short(st["acc"])] for st in shown]
        src = "spec §3.2" if not args.input else args.input
        c = console()
        note = "alpha rescales the old l and acc onto the new max; tile 1 has no old state."
        if args.sink is not None:
            note += f" Tile {n} is the sink (logit {args.sink:g}, value 0)."
        if len(shown) < n:
            note += f" {n - len(shown):,} middle tiles not shown (of {n:,}); --json gives every step."
        c.print(table(f"Online softmax, one query row, state after each tile ({src})",
                      ["tile", "scores", "m", "alpha = exp(m_old - m)", "l", "acc (unnormalised)"], rows,
                      caption=note))
        all_scores = [float(x) for t in tiles for x in t[0]]
        c.print(f"output     O = acc / l = {_fmt_short(tr.output)}   (the one division, after the last tile)")
        c.print(f"reference  softmax over all scores {_fmt_short(all_scores)}: weights "
                f"{_fmt_short(tr.weights)}, weighted sum {_fmt_short(tr.reference)}")
        c.print(f"max |O - reference| = {tr.max_abs_diff:.2e}: "
                + ("match" if ok else f"MISMATCH (more than {MATCH_TOL:g} x {scale:.4g})"))
        return 0 if ok else 1


# --- verify ---------------------------------------------------------------------------------------
def _measure(r) -> str:
    if r.error is None:
        return ""
    tol = "" if r.tolerance is None else f" {r.compare} {r.tolerance:.0e}"
    return f"{r.error:.2e}{tol}"


def cmd_verify(args) -> int:
    from attnscope import checks

    if args.seed < 0:
        raise InputError(f"--seed: expected a non-negative integer, got {args.seed}")
    if checks.interpreter_wanted(args.kernels):  # --kernels on without a GPU: the Triton CPU interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    results = []
    for r in checks.iter_checks(args.seed, args.kernels):
        results.append(r)
        if not args.json:
            print(f"{r.status}  {r.name:<56} {_measure(r):>20}  {r.detail}", flush=True)
    failed = [r for r in results if r.passed is False]
    if args.json:
        print_json({"seed": args.seed, "kernels": args.kernels, "passed": not failed,
                    "checks": [r.to_json() for r in results]})
    else:
        n_pass = sum(r.passed is True for r in results)
        print(f"{n_pass} passed, {len(failed)} failed, {len(results) - n_pass - len(failed)} not run "
              f"(seed {args.seed})")
    return 1 if failed else 0

