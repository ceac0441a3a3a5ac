"""The one exception type for bad input.

`InputError` is a `ValueError` (so API users catch `ValueError` as DESIGN.md promises); the CLI turns
it, and `NotImplementedError`, into one line on stderr and exit code 2. Anything else that escapes is
a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: the message names the argument and says what was expected and what was got."""


def expect(cond: bool, name: str, expected: str, got: object) -> None:
    """Raise `InputError("{name}: expected {expected}, got {got!r}")` unless `cond`."""
    if not cond:
        raise InputError(f"{name}: expected {expected}, got {got!r}")


def positive_int(name: str, value: object) -> int:
    """Validate a positive integer (bools are refused) and return it."""
    expect(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
           "a positive integer", value)
    return value  # type: ignore[return-value]


def choice(name: str, value: object, valid) -> str:
    """Validate a string option against `valid`, listing the valid ones in the error."""
    valid = list(valid)
    expect(value in valid, name, "one of " + ", ".join(map(str, valid)), value)
    return value  # type: ignore[return-value]
