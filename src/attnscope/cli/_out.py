"""Output helpers shared by the subcommands: JSON for machines, rich tables for people."""

from __future__ import annotations

import json
import math
import re
import sys

MiB = 1024**2
GiB = 1024**3
KiB = 1024


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def print_json(obj) -> None:
    """Print strict JSON (non-finite floats become null / "inf" / "-inf")."""
    json.dump(_clean(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def console():
    """The one rich console of the CLI: no highlighting, no soft wrap; 200 columns when not a terminal
    (a pipe or a log file keeps every number whole)."""
    from rich.console import Console

    c = Console(highlight=False, soft_wrap=False)
    return c if c.is_terminal else Console(highlight=False, soft_wrap=False, width=200)


_NUMBER = re.compile(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?\s*[x%]?")


def table(title: str, columns: list[str], rows: list[list], caption: str | None = None):
    """A rich table; columns after the first right-aligned.

    Numbers are never cut with an ellipsis on a narrow terminal (80-100 columns): a column whose cells
    are all numbers gets the width of its longest number (`min_width`) and no wrapping; the label
    columns wrap instead, and anything still too wide folds onto a second line rather than losing
    digits (`overflow="fold"`).
    """
    from rich.table import Table

    cells = [[str(x) for x in r] for r in rows]
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, c in enumerate(columns):
        col = [r[i] for r in cells if i < len(r)]
        numeric = bool(col) and all(_NUMBER.fullmatch(x.strip()) or x.strip() in ("", "-") for x in col)
        width = max((len(x) for x in col), default=0) if numeric else None
        t.add_column(c, justify="left" if i == 0 else "right", overflow="fold",
                     min_width=width, no_wrap=numeric)
    for r in cells:
        t.add_row(*r)
    return t


def mib(b: int | float) -> str:
    return f"{b / MiB:,.2f}"
