"""Output helpers shared by the subcommands: JSON for machines, rich tables for people."""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys

from attnscope.errors import InputError, short, visible
from attnscope.model.roofline import GiB, KiB, MiB  # noqa: F401 -- the sizes the subcommands print in


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


def console(quiet: bool = False):
    """The one rich console of the CLI: no markup, emoji codes or highlighting (text from files is data,
    never styling), every string printed through `errors.visible` (no raw control characters), no soft
    wrap; 200 columns when not a terminal (a pipe or a log file keeps every number whole). `quiet`: one
    that prints nothing (a command whose --json goes to stdout instead of its tables)."""
    from rich.console import Console

    class _DataConsole(Console):
        def print(self, *objects, **kwargs):
            super().print(*(visible(o) if isinstance(o, str) else o for o in objects), **kwargs)

    plain = {"highlight": False, "soft_wrap": False, "markup": False, "emoji": False}
    if quiet:
        return _DataConsole(file=io.StringIO(), **plain)
    c = _DataConsole(**plain)
    return c if c.is_terminal else _DataConsole(width=200, **plain)


_NUMBER = re.compile(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?\s*[x%]?")
_LABEL_MIN, _LABEL_MAX = 16, 24  # a label column keeps 16-24 characters (it wraps); a number all its digits


def table(title: str, columns: list[str], rows: list[list], caption: str | None = None):
    """A rich table, columns after the first right-aligned. A column of numbers keeps its longest number's
    width and never wraps (label columns wrap); a table still too wide is printed in parts, each
    repeating the first column, so neither a digit nor a row's label is lost."""
    return _Table(visible(title), [visible(c) for c in columns], [[visible(str(x)) for x in r] for r in rows],
                  None if caption is None else visible(caption))


class _Table:
    def __init__(self, title, columns, cells, caption):
        self.title, self.columns, self.cells, self.caption = title, columns, cells, caption
        cols = [[r[i].strip() for r in cells if i < len(r)] for i in range(len(columns))]
        self.numeric = [bool(c) and all(_NUMBER.fullmatch(x) or x in ("", "-") for x in c) for c in cols]

    def _width(self, i: int) -> int:
        """Characters column i needs at the least, with its padding and border."""
        from rich.cells import cell_len

        texts = [r[i] for r in self.cells if i < len(r)]
        words = [cell_len(w) for x in [self.columns[i], *texts] for w in x.split()] or [0]
        if self.numeric[i]:  # no_wrap: the header stays on one line too
            return max(map(cell_len, [self.columns[i], *texts])) + 3
        longest_word = min(max(words), _LABEL_MAX)  # wrapping at spaces, not inside a word
        return min(max(map(cell_len, texts), default=0), max(_LABEL_MIN, longest_word)) + 3

    def _rich(self, title, keep: list[int], caption):
        from rich.table import Table

        t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
        for i in keep:
            num = self.numeric[i]
            width = max((len(r[i]) for r in self.cells if i < len(r)), default=0) if num else None
            t.add_column(self.columns[i], justify="left" if i == 0 else "right", overflow="fold",
                         min_width=width, no_wrap=num)
        for r in self.cells:
            t.add_row(*(r[i] if i < len(r) else "" for i in keep))
        return t

    def __rich_console__(self, console, options):
        n = len(self.columns)
        widths = [self._width(i) for i in range(n)]
        room = options.max_width - 1 - widths[0]
        parts, part, used = [], [], 0
        for i in range(1, n):
            if part and used + widths[i] > room:
                parts.append(part)
                part, used = [], 0
            part.append(i)
            used += widths[i]
        parts.append(part)
        if len(parts) == 1:
            yield self._rich(self.title, list(range(n)), self.caption)
            return
        for k, part in enumerate(parts, start=1):
            yield self._rich(f"{self.title} (part {k} of {len(parts)})", [0, *part],
                             self.caption if k == len(parts) else None)


def ledger(row, mib: bool = True) -> list[list[str]]:
    """A traffic row's ledger as table rows: kernel, tensor, direction, bytes (and MiB), what."""
    return [[k.name, t.tensor, t.direction, f"{t.nbytes:,}", *([f"{t.nbytes / MiB:,.2f}"] if mib else []),
             t.what] for k in row.kernels for t in k.transfers]


def path_arg(text: str) -> str:
    """argparse `type=` of every file and directory flag: an empty name is refused (it read as "not
    given", e.g. `bytes --sweep ""` measured one point, or as the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file or directory name, got {text!r}")
    return text


def int_list(flag: str, text: str, least: int | None = None, most: int | None = None) -> list[int]:
    """A flag's comma-separated integers ("2,4,8"), each at least `least` when given, at most `most` of
    them when given; one line if not."""
    what = "comma-separated integers" if least is None else f"comma-separated integers >= {least}"
    from attnscope.inputs import number_text

    parts = text.split(",")
    if not all(number_text(x) and x.strip().lstrip("+-").isdigit() for x in parts):
        raise InputError(f"{flag}: expected {what}, got {short(text)}")
    out = [int(x) for x in parts]
    if least is not None and any(x < least for x in out):
        raise InputError(f"{flag}: expected {what}, got {short(text)}")
    if most is not None and len(out) > most:
        raise InputError(f"{flag}: expected at most {most} values, got {len(out):,}")
    return out
