"""Issue 11's size criterion, counted: the lines of src/attnscope that serve the features it had at commit
68a67d7 (8,066 lines then), against that count.

Every line of every ``*.py`` under src/attnscope is counted (``wc -l``: docstrings, comments and blank lines
included), then the lines that serve only features filed after 68a67d7 are set aside, each under its issue:

- whole modules (the backward kernel, varlen, the Hopper kernel, context parallelism, the serving and
  backward byte models, the hardened input readers);
- whole top-level definitions inside shared modules (a class, function or constant; its decorators
  included), e.g. decode's plan object and paged-cache checks, the Hopper dispatch table, the backward
  reference, the byte sweep and calibration of issue 18.

Lines inside a shared definition that grew for a later feature (the paged loop inside the decode kernel,
the Nq > 1 rows, new CLI flags) are NOT set aside: the rest is an upper bound on the old features' lines.
A listed name that no longer exists is an error (the list cannot go stale silently). CPU only; imports
nothing from the package:

    python bench/size.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "attnscope"
BEFORE = 8066  # wc -l over src/attnscope/**/*.py at 68a67d7, when issue 11 was filed

#: Modules that hold only post-filing features -> the issue that asked for them.
MODULES = {
    "inputs.py": 12,  # hardening: bounded, safe readers of every input file
    "kernels/bwd.py": 13, "model/backward.py": 13,  # backward
    "kernels/varlen.py": 14, "model/serving.py": 14, "cli/serving.py": 14,  # serving layouts
    "kernels/fwd_hopper.py": 15,  # the Gluon Hopper kernel
    "kernels/merge.py": 16, "distributed/__init__.py": 16, "distributed/ring.py": 16,  # context parallelism
    "model/ring.py": 16, "cli/ring.py": 16,
    "model/dispatch.py": 15,  # the Gluon Hopper kernel's dispatch rule
    "model/l2_params.py": 18, "model/l2_reuse.py": 18,  # the measured re-read model's table and terms
}

#: Top-level definitions in shared modules that serve only post-filing features -> issue.
DEFINITIONS = {
    "errors.py": {"short": 12, "ECHO_CHARS": 12, "finite_real": 12, "MAX_DIM": 12},
    "cli/__init__.py": {"_flag_name": 12},  # argparse errors name the flag
    "measure/bench.py": {"_ROW_FIELDS": 12, "_OPTIONAL": 12, "_field_ok": 12},  # --from-json rows checked
    "report/render.py": {"_INVISIBLE": 12, "_visible": 12},  # control and bidi characters shown
    "report/figures.py": {"_finite": 12},  # no non-finite number in an SVG
    "reference.py": {"attention_backward": 13, "_reduce_to": 13,
                     "TRACE_MAX_ABS": 12},
    "checks.py": {"check_backward": 13, "GRAD_FACTOR": 13},
    "kernels/decode.py": {"DecodePlan": 14, "decode_plan": 14, "_dense_pages": 14,
                          "_check_block_table_values": 14, "PAGE_SIZES": 14, "_check_out": 14},
    "kernels/fwd.py": {"IMPLS": 15, "_hopper_possible": 15, "_pick_impl": 15, "_modded": 35},
    # l2.py was 342 lines when issue 11 moved the estimate there; issue 18's measured re-read model grew it
    "model/l2.py": {"_survival": 18, "_retained": 18, "spill_bytes": 18, "dead_frame_evicted": 18},
    "measure/ncu.py": {"exact_bytes": 18, "Point": 18, "measure_many": 18, "_call": 18},
    "measure/physical.py": {"FIELDS": 18, "point": 18, "parse_grid": 18, "compare": 18,
                            "summary_lines": 18, "sweep_json": 18, "rows_from_json": 18,
                            "calibration_rows": 18, "CALIBRATION": 18},
    "cli/gpu.py": {"_bytes_sweep": 18, "_print_rows": 18, "_env": 18, "_write_or_print": 18},
}


def _definitions(path: Path) -> dict[str, int]:
    """{top-level name: its lines (decorators included)} of one module."""
    sizes = {}
    for node in ast.parse(path.read_text()).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        for name in names:
            sizes[name] = node.end_lineno - first + 1
    return sizes


def count(root: Path = ROOT) -> dict:
    """Total lines, the lines set aside per issue (modules, definitions), and the rest."""
    lines = {p.relative_to(root).as_posix(): len(p.read_text().splitlines())
             for p in sorted(root.rglob("*.py"))}
    aside: dict[int, int] = {}
    rows = []
    for mod, issue in MODULES.items():
        if mod not in lines:
            raise SystemExit(f"size.py: module {mod} is listed but does not exist")
        aside[issue] = aside.get(issue, 0) + lines[mod]
        rows.append((issue, mod, lines[mod]))
    for mod, names in DEFINITIONS.items():
        sizes = _definitions(root / mod)
        for name, issue in names.items():
            if name not in sizes:
                raise SystemExit(f"size.py: {mod}: {name} is listed but not defined there")
            aside[issue] = aside.get(issue, 0) + sizes[name]
            rows.append((issue, f"{mod}: {name}", sizes[name]))
    total = sum(lines.values())
    return {"total": total, "aside": aside, "rows": rows, "rest": total - sum(aside.values())}


def main() -> int:
    c = count()
    for issue, what, n in sorted(c["rows"]):
        print(f"  issue {issue:2d}  {n:5d}  {what}")
    print(f"src/attnscope: {c['total']:,} lines")
    for issue, n in sorted(c["aside"].items()):
        print(f"  set aside, issue {issue}: {n:,}")
    verdict = "smaller" if c["rest"] < BEFORE else "NOT smaller"
    print(f"the features of 68a67d7: at most {c['rest']:,} lines, {verdict} than the {BEFORE:,} of 68a67d7")
    return 0


if __name__ == "__main__":
    sys.exit(main())
