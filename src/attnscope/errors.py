"""The one exception type for bad input, and the small validators every layer shares.

`InputError` is a `ValueError` (so API users can catch `ValueError`); the CLI turns
it, and `NotImplementedError`, into one line on stderr and exit code 2. Anything else that escapes is
a bug and keeps its traceback.

Every message echoes the offending value through `short()`: at most ~60 characters, one line, control
characters escaped, never `repr()` of an unbounded object (a 5 MB string or a YAML alias bomb would
otherwise be expanded into the message).
"""

from __future__ import annotations

import reprlib
import sys
from typing import TypeGuard

#: Longest echo of a bad value inside an error message.
ECHO_CHARS = 60


class InputError(ValueError):
    """Bad input: the message names the argument and says what was expected and what was got."""


def visible(text: str) -> str:
    """`text` with every character that is not printable made visible as its escape: C0 and C1 controls
    (ESC, BEL, CR, ...), DEL, bidi overrides and other format characters, line separators. What a file
    or a path holds is printed through this, so it cannot move the cursor, clear the screen, retitle
    the window or plant a link."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def is_int(value: object) -> TypeGuard[int]:
    """Is ``value`` an int and not a bool (``True`` is an int to Python, never to an argument check)?"""
    return isinstance(value, int) and not isinstance(value, bool)


def short(value: object, limit: int = ECHO_CHARS) -> str:
    """A one-line, bounded description of `value` for an error message: at most `limit` characters,
    containers by a bounded repr or by type and length, control and bidi characters escaped."""
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        r = reprlib.Repr()  # bounded at every level: never walks more than a few items
        r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 3, 6, 6, 4, 6
        r.maxstring, r.maxlong, r.maxother = 30, 30, 30
        try:
            text = r.repr(value)
        except Exception:
            text = f"<{type(value).__name__}>"
        if len(text) > limit:
            return f"{type(value).__name__} of {len(value)} item{'' if len(value) == 1 else 's'}"
        return text
    if is_int(value) and value.bit_length() > 190:
        # ~57 digits: a giant int is never converted to text in full
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, str):
        value = value[: 4 * limit]  # still longer than `limit` once repr()'d, so cut below
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__: describe the type only
        text = f"<{type(value).__name__}>"
    text = visible(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finite_real(value: object) -> bool:
    """Is `value` an int or float, not a bool, not NaN or inf, nor an int too large for a float?"""
    # comparisons, not math.isfinite: torch.compile traces them on a symbolic float (a compiled function's
    # float argument), an int past the float range compares exactly. NaN is ruled out by ``==`` first: a
    # symbolic float's ordering comparison with a NaN value fails inside the compiler
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) <= sys.float_info.max


def expect(cond: bool, name: str, expected: str, got: object) -> None:
    """Raise `InputError("{name}: expected {expected}, got {short(got)}")` unless `cond`."""
    if not cond:
        raise InputError(f"{name}: expected {expected}, got {short(got)}")


#: Largest size accepted for any dimension (sequence length, head dim, batch, heads, tile): far beyond
#: any real shape, small enough that every byte count, FLOP count and ratio stays inside float range.
MAX_DIM = 10**24


def positive_int(name: str, value: object) -> int:
    """Validate a positive integer (bools are refused) up to `MAX_DIM` and return it."""
    expect(is_int(value) and value > 0, name, "a positive integer", value)
    expect(value <= MAX_DIM, name, "a positive integer up to 10^24", value)  # type: ignore[operator]
    return value  # type: ignore[return-value]


def choice(name: str, value: object, valid) -> str:
    """Validate a string option against `valid`, listing the valid ones in the error."""
    valid = list(valid)
    expect(isinstance(value, str) and value in valid, name, "one of " + ", ".join(map(str, valid)), value)
    return value  # type: ignore[return-value]
