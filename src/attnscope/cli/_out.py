"""Output helpers shared by the subcommands: JSON for machines, rich tables for people."""

from __future__ import annotations

import json
import math
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


def table(title: str, columns: list[str], rows: list[list], caption: str | None = None):
    """A rich table; numeric-looking columns right-aligned."""
    from rich.table import Table

    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def mib(b: int | float) -> str:
    return f"{b / MiB:,.2f}"
