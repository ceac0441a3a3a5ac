"""Safe reading of every file the project takes in, and atomic writing of every file it produces.

Reading (`read_text`, `load_json`, `load_yaml`, `read_csv`): each takes the path and the *field* the
user knows it by (`"--samples"`, `"TRACE"`, `"--metrics BEFORE"`) and either returns the data or raises
one `InputError` line naming that field. The hostile cases, each a test in tests/test_hostile.py:

- size: files over `MAX_BYTES` (64 MiB) are refused before reading;
- encoding: strict UTF-8 (a BOM is tolerated), the byte offset of the first bad byte is named;
- nesting: JSON/YAML deeper than `MAX_DEPTH` (100) is refused by a linear pre-scan of brackets (JSON)
  or by the loader's own depth counter (YAML), never a RecursionError;
- giant integers: a literal with more than `MAX_INT_DIGITS` (30) digits is refused (no trace field
  needs more than 10^30, and Python's int/str conversion limit would otherwise raise mid-parse);
- YAML: aliases and anchors are refused (no alias bombs), duplicate keys are refused (never "last one
  wins"); only the safe tags;
- CSV: fields over the csv module's limit become one line, not `_csv.Error`.

Writing (`write_atomic`, `out_dir`): the content goes to a temp file in the destination directory and
is `os.replace`d over the name, so a reader never sees half a file and a crash leaves nothing; an
existing symlink at the destination is refused, never written through; `out_dir` checks `--out` up
front (an existing file, a path under a file, an unwritable place, a name too long) with one line.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import gzip
import io
import itertools
import json
import os
import re
import sys
import tempfile
import zlib
from pathlib import Path

from attnscope.errors import InputError, short

MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 100
MAX_INT_DIGITS = 30


def _name(path) -> str:
    return short(str(path))


# ------------------------------------------------------------------------------------------- reading
def read_text(path, field: str, gz: bool = False) -> str:
    """The file's text, strict UTF-8; `path == "-"` reads stdin; with `gz`, a gzip file decompressed (at
    most `MAX_BYTES` of it: a gzip bomb is refused, not inflated). One InputError line on any problem."""
    if str(path) == "-":
        data = sys.stdin.buffer.read(MAX_BYTES + 1) if hasattr(sys.stdin, "buffer") else \
            sys.stdin.read(MAX_BYTES + 1).encode("utf-8", "surrogateescape")
        where = "stdin"
    else:
        where = _name(path)
        try:
            if os.path.isdir(path):
                raise InputError(f"{field}: expected a readable file, got a directory {where}")
            if (size := os.stat(path).st_size) > MAX_BYTES:
                raise InputError(f"{field}: expected a file of at most {MAX_BYTES // 2**20} MiB, got "
                                 f"{size:,} bytes in {where}")
            with (gzip.open if gz else open)(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        except (OSError, EOFError, zlib.error) as e:  # gzip: a bad header, a truncated or corrupt stream
            what = "a readable gzip file" if gz else "a readable file"
            reason = getattr(e, "strerror", None) or (str(e) or type(e).__name__)[:50]
            raise InputError(f"{field}: expected {what}, got {where} ({reason})") from None
    if len(data) > MAX_BYTES:
        unzipped = " decompressed" if gz else ""
        raise InputError(f"{field}: expected at most {MAX_BYTES // 2**20} MiB{unzipped}, got more from "
                         f"{where}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{field}: expected UTF-8 text, got byte 0x{data[e.start]:02x} at offset {e.start} "
                         f"of {where}") from None
    return text.removeprefix("\ufeff")


_BRACKET_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_STRUCTURE = bytes(c for c in range(256) if chr(c) not in '[]{}"\\')


def _check_depth_json(text: str, field: str) -> None:
    """Bracket depth outside strings, linear and never recursive. Fast path (no backslash: every '"'
    delimits a string): brackets and quotes kept by `bytes.translate`, strings dropped, the maximum
    running depth taken; the exact scan runs for escapes or too deep a text, and names the offset."""
    if "\\" not in text:
        kept = text.encode("utf-8", "surrogatepass").translate(None, _NOT_STRUCTURE)
        brackets = b"".join(kept.split(b'"')[::2])
        if max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) <= MAX_DEPTH:
            return
    depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise InputError(f"{field}: expected JSON nested at most {MAX_DEPTH} deep, got deeper "
                                 f"(at offset {m.start()})")
        elif c in "]}":
            depth -= 1


def _json_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise InputError(f"an integer of at most {MAX_INT_DIGITS} digits|{len(s.lstrip('-'))} digits")
    return int(s)


def _json_float(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise InputError(f"a finite number|{short(s, 30)} (overflows a float)")
    return v


def _json_const(s: str):
    raise InputError(f"finite numbers (NaN and Infinity are not JSON)|{s}")


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cycle collector while a large acyclic structure is built (a parsed file): it would
    re-walk every container with nothing to free. Restored on exit."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def load_json(path, field: str, text: str | None = None):
    """Parse a JSON file (or `text`, already read) safely; see the module docstring."""
    text = read_text(path, field) if text is None else text
    _check_depth_json(text, field)
    try:
        with gc_paused():
            return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_const)
    except json.JSONDecodeError as e:
        raise InputError(f"{field}: expected valid JSON, got {e.msg} at line {e.lineno} column {e.colno} "
                         f"of {'stdin' if str(path) == '-' else _name(path)}") from None
    except InputError as e:
        expected, got = str(e).split("|", 1)
        raise InputError(f"{field}: expected {expected}, got {got}") from None
    except RecursionError:  # belt and braces: the pre-scan should have caught it
        raise InputError(f"{field}: expected JSON nested at most {MAX_DEPTH} deep, got deeper") from None


def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader without aliases/anchors, with duplicate-key and depth checks."""

        depth = 0

        def compose_node(self, parent, index):
            ev = self.peek_event()
            if isinstance(ev, yaml.AliasEvent):
                raise InputError(f"no YAML aliases (*{short(ev.anchor, 30)}); write the value out|an alias "
                                 f"at line {ev.start_mark.line + 1}")
            if getattr(ev, "anchor", None) is not None:
                raise InputError(f"no YAML anchors (&{short(ev.anchor, 30)})|an anchor at line "
                                 f"{ev.start_mark.line + 1}")
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise InputError(f"YAML nested at most {MAX_DEPTH} deep|deeper at line "
                                 f"{ev.start_mark.line + 1}")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: SafeLoader raises its own error below
                    continue
                if dup:
                    raise InputError(f"unique keys|a duplicate key {short(key, 40)} at line "
                                     f"{key_node.start_mark.line + 1}")
            return super().construct_mapping(node, deep=deep)

    def _int(loader, node):
        digits = re.sub(r"[^0-9a-fA-F]", "", node.value)
        if len(digits) > MAX_INT_DIGITS:
            raise InputError(f"an integer of at most {MAX_INT_DIGITS} digits|{len(digits)} digits at line "
                             f"{node.start_mark.line + 1}")
        return yaml.SafeLoader.construct_yaml_int(loader, node)

    Loader.add_constructor("tag:yaml.org,2002:int", _int)
    return Loader


def load_yaml(path, field: str, text: str | None = None):
    """Parse a YAML file (or `text`) safely: safe tags only, no aliases/anchors, no duplicate keys."""
    import yaml

    text = read_text(path, field) if text is None else text
    where = "stdin" if str(path) == "-" else _name(path)
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 -- a SafeLoader subclass
    except InputError as e:
        expected, got = str(e).split("|", 1)
        raise InputError(f"{field}: expected {expected}, got {got} of {where}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = short(getattr(e, "problem", None) or "a parse error", 50).strip("'\"")
        raise InputError(f"{field}: expected valid YAML, got {problem}{at} of {where}") from None
    except RecursionError:
        raise InputError(f"{field}: expected YAML nested at most {MAX_DEPTH} deep, got deeper") from None


def read_csv(path, field: str, text: str | None = None) -> list[list[str]]:
    """Rows of a CSV file (blank rows dropped); a field over the csv module's limit (128 Ki characters) is
    one InputError line, not `_csv.Error`."""
    text = read_text(path, field) if text is None else text
    try:
        return [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    except csv.Error as e:
        raise InputError(f"{field}: expected CSV with fields under {csv.field_size_limit():,} characters, "
                         f"got {short(str(e), 50)}") from None


def number_text(s: str) -> bool:
    """Is `s` a plain decimal number as a person writes it ("12", "-3.5", "1e3")? Not "1_000", not "1OO",
    not "nan"/"inf", not a 400-digit integer."""
    s = s.strip()
    return bool(re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", s)) and len(s) <= 64


# ------------------------------------------------------------------------------------------- writing
def out_dir(path, field: str = "--out") -> Path:
    """Create (if needed) and return an output directory, or raise one line naming `field`."""
    p = Path(path)
    where = _name(path)
    try:
        if p.is_symlink() and not p.is_dir():
            raise InputError(f"{field}: expected a directory, got a dangling symlink {where}")
        if p.exists() and not p.is_dir():
            raise InputError(f"{field}: expected a directory, got an existing file {where}")
        parent = next(x for x in p.absolute().parents if x.exists())  # the root always exists
        if not parent.is_dir():
            raise InputError(f"{field}: expected a directory, got a path under the file {_name(parent)}")
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{field}: expected a writable directory, got {where} ({e.strerror})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{field}: expected a writable directory, got {where} (permission denied)")
    return p


def out_file(path, field: str = "--out") -> Path:
    """Check an output file's name before any work (what `write_atomic` refuses, up front): not a symlink,
    not a directory, inside an existing directory. Returns the path; one line naming `field` if not."""
    p = Path(path)
    where = _name(path)
    refuse_symlinks([p], field)
    if p.is_dir():
        raise InputError(f"{field}: expected a file name, got a directory {where}")
    if not p.parent.is_dir():
        raise InputError(f"{field}: expected a file in an existing directory, got {where}")
    return p


def write_atomic(path, data: str | bytes, field: str = "--out") -> Path:
    """Write `data` to `path` atomically (a temp file in its directory, then os.replace) and return the
    path; a symlink or a directory at `path` is refused (`out_file`)."""
    p = out_file(path, field)
    where = _name(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:40]}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise InputError(f"{field}: expected a writable place for {where}, got an error "
                         f"({e.strerror or e})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return p


def refuse_symlinks(paths, field: str = "--out") -> None:
    """One line if any of `paths` is a symlink: an output is never written through one."""
    for path in paths:
        if Path(path).is_symlink():
            raise InputError(f"{field}: expected a regular file or nothing at {_name(path)}, got a symlink "
                             "(refusing to write through it)")


def write_all(files: dict, field: str = "--out") -> list[Path]:
    """Write several files so that a failure in producing any leaves none written: `files` maps each
    path to its content, all produced before this call; each is written atomically."""
    refuse_symlinks(files, field)  # up front, before the first byte lands
    return [write_atomic(path, data, field) for path, data in files.items()]
