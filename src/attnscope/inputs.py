"""Safe reading of every file the project takes in, and all-or-nothing writing of every file it produces.

Reading (`read_text`, `load_json`, `load_yaml`, `read_csv`): each takes the path and the *field* the
user knows it by (`"--samples"`, `"TRACE"`, `"--metrics BEFORE"`) and either returns the data or raises
one `InputError` line naming that field. The hostile cases, each a test in tests/test_hostile.py:

- kind: only a regular file is opened (`os.stat` first; a FIFO, a device, a directory or a socket is
  refused before any open, and the open is non-blocking), so no input can block the command;
- size: files over `MAX_BYTES` (64 MiB) are refused before reading, gzip counted while inflating;
- encoding: strict UTF-8 (a BOM is tolerated), the byte offset of the first bad byte is named;
- JSON objects: arrays + objects (`MAX_CONTAINERS`), values (`MAX_VALUES`) and nesting (`MAX_DEPTH`,
  100) are counted on the raw text, in bounded memory, before the parser builds anything: 64 MiB of
  `[[]],` is refused, never grown into gigabytes of Python objects; never a RecursionError;
- duplicate keys are refused in JSON and YAML alike (never "last one wins");
- giant integers: a literal with more than `MAX_INT_DIGITS` (30) digits is refused (no field needs
  more than 10^30, and Python's int/str conversion limit would otherwise raise mid-parse);
- YAML: YAML 1.2 core numbers (the 1.1 forms PyYAML would read differently -- octal 040, hex, binary,
  sexagesimal 1:30, underscores -- are refused naming the key), 1.2 core booleans (true/false only: `no`
  is a string) and no implicit timestamps (a date is a string); aliases and anchors refused (no alias
  bombs); only the safe tags; at most `MAX_YAML_BYTES` (1 MiB) and `MAX_YAML_NODES` values, so the
  pure-Python loader cannot take minutes;
- CSV: fields over the csv module's limit become one line, not `_csv.Error`; at most `MAX_CSV_CELLS`.

Writing (`write_all`, `write_atomic`, `out_file`, `out_dir`, `distinct`): every file of a command is
staged to a temp file in its directory and only then published with `os.replace`, all together: a
failure while checking or staging any of them leaves every earlier file as it was. New files get the
umask's mode. An output is never written through a symlink, over a directory or other non-regular
file, or over a file the same command read (`distinct` refuses that up front, by st_dev and st_ino, so
a symlink or a hard link to an input is caught too); `out_dir` checks `--out` up front (an existing
file, a path under a file, an unwritable place, a name too long) with one line.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import gzip
import io
import json
import os
import re
import stat
import sys
import tempfile
import zlib
from pathlib import Path

from attnscope.errors import InputError, short, visible

MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 100
MAX_INT_DIGITS = 30
#: JSON arrays + objects, and values, one file may hold: counted on the raw text before parsing, so
#: 64 MiB of `[[]],` or `1,` is refused instead of growing to gigabytes of Python objects. The worst
#: case under both, one object of 2.5 million distinct keys, peaks at about 650 MB RSS (the parser's
#: list of pairs, the keys and the dict side by side); 4 million of them took 1.1 GB.
MAX_CONTAINERS = 1_000_000
MAX_VALUES = 2_500_000
#: YAML is parsed by PyYAML's pure-Python loader (the checks below hook its composer): a few MB/s, so
#: its files (traces, grids: a few KB) are bounded far below `MAX_BYTES`, and so are their nodes.
MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_NODES = 100_000
#: Cells a CSV file may hold (samples, grids): a million TTFT samples is far more than any run.
MAX_CSV_CELLS = 2_000_000


def _name(path) -> str:
    return short(str(path))


# ------------------------------------------------------------------------------------------- reading
def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


#: (st_dev, st_ino) of every file this command has read: `out_file` refuses to replace one of them.
_READ: set[tuple[int, int]] = set()


def forget_reads() -> None:
    """Start a new command: the files read so far are no longer its inputs."""
    _READ.clear()


def read_text(path, field: str, gz: bool = False) -> str:
    """The file's text, strict UTF-8; `path == "-"` reads stdin; with `gz`, a gzip file decompressed (at
    most `MAX_BYTES` of it, counted while inflating: a gzip bomb is refused, not inflated). Only a
    regular file is opened (a FIFO, a device or a directory is refused by `stat` first, and the open is
    non-blocking). One InputError line on any problem."""
    if str(path) == "-":
        where = "stdin"
        if sys.stdin is None:  # `attnscope trace --input - <&-`
            raise InputError(f"{field}: expected text on stdin, got a closed stream")
        try:
            data = sys.stdin.buffer.read(MAX_BYTES + 1) if hasattr(sys.stdin, "buffer") else \
                sys.stdin.read(MAX_BYTES + 1).encode("utf-8", "surrogateescape")
        except (OSError, ValueError) as e:  # a stream that cannot be read (EISDIR, EIO, closed)
            reason = getattr(e, "strerror", None) or (str(e) or type(e).__name__)
            raise InputError(f"{field}: expected text on stdin, got an unreadable stream "
                             f"({visible(reason)[:50]})") from None
    else:
        where = _name(path)
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{field}: expected a readable file, got {_kind(st.st_mode)} {where}")
            if st.st_size > MAX_BYTES:
                raise InputError(f"{field}: expected a file of at most {MAX_BYTES // 2**20} MiB, got "
                                 f"{st.st_size:,} bytes in {where}")
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
            with open(fd, "rb") as raw:
                st = os.fstat(fd)  # the file opened, not a name swapped in since the stat
                if not stat.S_ISREG(st.st_mode):
                    raise InputError(f"{field}: expected a readable file, got {_kind(st.st_mode)} {where}")
                _READ.add((st.st_dev, st.st_ino))
                with gzip.GzipFile(fileobj=raw, mode="rb") if gz else contextlib.nullcontext(raw) as f:
                    data = f.read(MAX_BYTES + 1)
        except (OSError, EOFError, zlib.error) as e:  # gzip: a bad header, a truncated or corrupt stream
            what = "a readable gzip file" if gz else "a readable file"
            reason = getattr(e, "strerror", None) or (str(e) or type(e).__name__)[:50]
            raise InputError(f"{field}: expected {what}, got {where} ({visible(reason)[:50]})") from None
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


_NOT_STRUCTURE = bytes(c for c in range(256) if chr(c) not in '[]{}",')
_ESCAPE = re.compile(r"\\.", re.DOTALL)


def _check_size_json(text: str, field: str) -> None:
    """Depth, containers and values of a JSON text, counted on the raw text before anything is built
    (linear, never recursive, in bounded memory): escapes dropped, then what strings hold, leaving
    brackets and commas, scanned 1 MiB at a time. A backslash outside a string is invalid JSON, which
    the parser then names."""
    if "\\" in text:
        text = _ESCAPE.sub("", text)
    kept = text.encode("utf-8", "surrogatepass").translate(None, _NOT_STRUCTURE)
    in_string, containers, commas, pieces = False, 0, 0, []
    for start in range(0, len(kept), 2**20):
        parts = kept[start:start + 2**20].split(b'"')
        outside = b"".join(parts[1 if in_string else 0::2])
        in_string ^= len(parts) % 2 == 0  # an odd number of quotes in the chunk flips the state
        containers += outside.count(b"[") + outside.count(b"{")
        commas += outside.count(b",")
        pieces.append(outside.translate(None, b","))
    if containers > MAX_CONTAINERS:
        raise InputError(f"{field}: expected at most {MAX_CONTAINERS:,} JSON arrays and objects, got "
                         f"{containers:,}")
    if containers + commas > MAX_VALUES:
        raise InputError(f"{field}: expected at most {MAX_VALUES:,} JSON values, got about "
                         f"{containers + commas:,}")
    brackets = b"".join(pieces)
    for _ in range(MAX_DEPTH):  # each pass removes the innermost level (C speed, no Python loop per byte)
        inner = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if inner == brackets:  # all gone, or mismatched brackets: the parser names those
            return
        brackets = inner
    if brackets.replace(b"[]", b"").replace(b"{}", b"") != brackets:
        raise InputError(f"{field}: expected JSON nested at most {MAX_DEPTH} deep, got deeper")


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


def _json_object(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise InputError(f"unique keys in every object|a duplicate key {short(dup, 40)}")
    return d


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
    """Parse a JSON file (or `text`, already read) safely; see the module docstring. A path ending in
    ``.gz`` is read decompressed (`read_text`'s limits)."""
    text = read_text(path, field, gz=str(path).endswith(".gz")) if text is None else text
    _check_size_json(text, field)
    try:
        with gc_paused():
            return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_const,
                              object_pairs_hook=_json_object)
    except json.JSONDecodeError as e:
        raise InputError(f"{field}: expected valid JSON, got {e.msg} at line {e.lineno} column {e.colno} "
                         f"of {'stdin' if str(path) == '-' else _name(path)}") from None
    except InputError as e:
        expected, got = str(e).split("|", 1)
        raise InputError(f"{field}: expected {expected}, got {got}") from None
    except RecursionError:  # belt and braces: the pre-scan should have caught it
        raise InputError(f"{field}: expected JSON nested at most {MAX_DEPTH} deep, got deeper") from None


#: YAML 1.2 core numbers: decimal only, no leading zero, a float has a dot or an exponent.
_YAML_INT = re.compile(r"^[-+]?(0|[1-9][0-9]*)$")
_YAML_FLOAT = re.compile(r"^[-+]?((0|[1-9][0-9]*)\.[0-9]*|\.[0-9]+"
                         r"|(0|[1-9][0-9]*)(\.[0-9]*)?[eE][-+]?[0-9]+)$"
                         r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")
#: What YAML 1.1 (PyYAML's default) would read as a number and 1.2 core would not, or as another one:
#: octal (040 = 32), hex (0x20), binary, sexagesimal (1:30 = 90), underscores (1_000): refused.
_YAML_ODD_NUMBER = re.compile(r"^[-+]?(0[bBoOxX][0-9a-fA-F_]*|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"
                              r"|[0-9][0-9_]*\.?[0-9_]*([eE][-+]?[0-9]+)?|\.[0-9_]+([eE][-+]?[0-9]+)?)$")
_ODD_TAG = "tag:attnscope:odd-number"
#: YAML 1.2 core booleans (1.1 also reads yes/no/on/off, so `model: no` became False); 1.2 core has no
#: implicit timestamps (`title: 2026-12-01` is the string).
_YAML_BOOL = re.compile(r"^(true|True|TRUE|false|False|FALSE)$")
_YAML_11_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool",
                 "tag:yaml.org,2002:timestamp")
_NUMBER_FIRST = list("-+.0123456789")


def _odd_number(node, key=None) -> InputError:
    at = f"{short(key, 40)} at line" if key is not None else "a value at line"
    return InputError(f"a plain decimal number (YAML 1.2: no octal, hex, sexagesimal or '_'; quote it for a "
                      f"string)|{short(node.value, 30)} for {at} {node.start_mark.line + 1}")


def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2 core numbers (`_YAML_INT`, `_YAML_FLOAT`; the 1.1 forms that differ
        are refused), without aliases/anchors, with duplicate-key, depth and node-count checks."""

        depth = 0
        nodes = 0

        def compose_node(self, parent, index):
            ev = self.peek_event()
            if isinstance(ev, yaml.AliasEvent):
                raise InputError(f"no YAML aliases (*{short(ev.anchor, 30)}); write the value out|an alias "
                                 f"at line {ev.start_mark.line + 1}")
            if getattr(ev, "anchor", None) is not None:
                raise InputError(f"no YAML anchors (&{short(ev.anchor, 30)})|an anchor at line "
                                 f"{ev.start_mark.line + 1}")
            self.nodes += 1
            if self.nodes > MAX_YAML_NODES:
                raise InputError(f"at most {MAX_YAML_NODES:,} YAML values|more at line "
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
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=True)
                if value_node.tag == _ODD_TAG:
                    raise _odd_number(value_node, key)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: SafeLoader raises its own error below
                    continue
                if dup:
                    raise InputError(f"unique keys|a duplicate key {short(key, 40)} at line "
                                     f"{key_node.start_mark.line + 1}")
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {  # 1.2 core: no 1.1 numbers, yes/no/on/off bools or timestamps
        first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_11_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for first in "tTfF":
        Loader.yaml_implicit_resolvers.setdefault(first, []).insert(0, ("tag:yaml.org,2002:bool", _YAML_BOOL))
    for tag, rx in (("tag:yaml.org,2002:int", _YAML_INT), ("tag:yaml.org,2002:float", _YAML_FLOAT),
                    (_ODD_TAG, _YAML_ODD_NUMBER)):
        for first in _NUMBER_FIRST:  # before the timestamp resolver, in this order
            Loader.yaml_implicit_resolvers.setdefault(first, [])
            Loader.yaml_implicit_resolvers[first] = [
                *[r for r in Loader.yaml_implicit_resolvers[first] if r[0] in (
                    "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", _ODD_TAG)],
                (tag, rx),
                *[r for r in Loader.yaml_implicit_resolvers[first] if r[0] not in (
                    "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", _ODD_TAG)]]

    def _int(loader, node):
        if len(node.value.lstrip("+-")) > MAX_INT_DIGITS:
            raise InputError(f"an integer of at most {MAX_INT_DIGITS} digits|{len(node.value)} digits at "
                             f"line {node.start_mark.line + 1}")
        if not _YAML_INT.match(node.value):  # an explicit !!int tag on a 1.1 form
            raise _odd_number(node)
        return int(node.value)

    def _odd(loader, node):
        raise _odd_number(node)

    Loader.add_constructor("tag:yaml.org,2002:int", _int)
    Loader.add_constructor(_ODD_TAG, _odd)
    return Loader


def load_yaml(path, field: str, text: str | None = None):
    """Parse a YAML file (or `text`) safely: at most `MAX_YAML_BYTES`, YAML 1.2 core numbers, safe tags
    only, no aliases/anchors, no duplicate keys."""
    import yaml

    text = read_text(path, field) if text is None else text
    where = "stdin" if str(path) == "-" else _name(path)
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"{field}: expected YAML of at most {MAX_YAML_BYTES // 1024:,} KiB (JSON takes up "
                         f"to {MAX_BYTES // 2**20} MiB), got {len(text):,} characters in {where}")
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
    """Rows of a CSV file (blank rows dropped; LF, CRLF and CR line ends); a field over the csv module's
    limit (128 Ki characters) is one InputError line, not `_csv.Error`; more than `MAX_CSV_CELLS` cells
    are refused while reading (64 MiB of one-character rows would be gigabytes of lists)."""
    text = read_text(path, field) if text is None else text
    rows, cells = [], 0
    try:
        for r in csv.reader(io.StringIO(text, newline="")):  # "\n", "\r\n" and CR-only line ends
            if r and any(c.strip() for c in r):
                cells += len(r)
                if cells > MAX_CSV_CELLS:
                    raise InputError(f"{field}: expected at most {MAX_CSV_CELLS:,} CSV cells, got more (row "
                                     f"{len(rows) + 1:,})")
                rows.append(r)
    except csv.Error as e:
        raise InputError(f"{field}: expected CSV with fields under {csv.field_size_limit():,} characters, "
                         f"got {short(str(e), 50)}") from None
    return rows


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def number_text(s: str) -> bool:
    """Is `s` a plain decimal number as a person writes it ("12", "-3.5", "1e3")? ASCII digits only (not
    "٣٠٠" or "３００", which float() would read), not "1_000", not "1OO", not "nan"/"inf", not a 400-digit
    integer."""
    s = s.strip()
    return len(s) <= 64 and _NUMBER.fullmatch(s) is not None


# ------------------------------------------------------------------------------------------- writing
def out_dir(path, field: str = "--out") -> Path:
    """Create (if needed) and return an output directory, or raise one line naming `field`."""
    p = Path(path)
    where = _name(path)
    try:
        if p.is_symlink() and not p.is_dir():
            what = "a symlink to something other than a directory" if p.exists() else "a dangling symlink"
            raise InputError(f"{field}: expected a directory, got {what} {where}")
        if p.exists() and not p.is_dir():
            raise InputError(f"{field}: expected a directory, got an existing file {where}")
        if p.resolve() == Path(p.anchor or "/").resolve():  # "/", "//", "/.", "/..": not for outputs
            raise InputError(f"{field}: expected a directory other than the file-system root, got {where}")
        parent = next((x for x in p.absolute().parents if x.exists()), p.absolute())
        if not parent.is_dir():
            raise InputError(f"{field}: expected a directory, got a path under the file {_name(parent)}")
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{field}: expected a writable directory, got {where} ({e.strerror})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{field}: expected a writable directory, got {where} (permission denied)")
    return p


def _inode(path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def distinct(outputs: dict, inputs: dict) -> None:
    """Refuse, up front, an output that is one of the inputs of the same command: the same name, a
    symlink to it or a hard link (same st_dev and st_ino). `outputs`/`inputs` map each flag to a path
    (None: not given); an output directory's files are given as outputs."""
    ins = {}
    for flag, path in inputs.items():
        if path is not None and str(path) != "-" and (node := _inode(path)) is not None:
            ins[node] = flag
    for flag, path in outputs.items():
        if path is not None and str(path) != "-" and (node := _inode(path)) in ins:
            raise InputError(f"{flag}: expected a file other than the input {ins[node]}, got "
                             f"{_name(path)} (writing it would destroy the input)")


def out_file(path, field: str = "--out") -> Path:
    """Check an output file's name before any work (what `write_atomic` refuses, up front): not a symlink,
    not a directory nor another non-regular file, inside an existing directory, not a file this process
    has read. Returns the path; one line naming `field` if not."""
    try:
        return _out_file(Path(path), _name(path), field)
    except OSError as e:  # a name too long, a loop of symlinks, ...
        raise InputError(f"{field}: expected a writable path, got {_name(path)} "
                         f"({e.strerror or e})") from None


def _out_file(p: Path, where: str, field: str) -> Path:
    refuse_symlinks([p], field)
    if p.is_dir():
        raise InputError(f"{field}: expected a file name, got a directory {where}")
    if p.exists() and not p.is_file():
        raise InputError(f"{field}: expected a regular file or nothing at {where}, got "
                         f"{_kind(os.stat(p).st_mode)}")
    if not p.parent.is_dir():
        raise InputError(f"{field}: expected a file in an existing directory, got {where}")
    if _inode(p) in _READ:
        raise InputError(f"{field}: expected a file other than an input of this command, got {where} "
                         "(writing it would destroy the input)")
    return p


def _file_mode() -> int:
    """The mode a new file gets under the process umask (what `open` would give; mkstemp gives 0600)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _utf8(text: str) -> bytes:
    """`text` as UTF-8; a byte a file name held that is not UTF-8 (os.fsdecode's surrogate escape) is
    written visibly as `\\xNN`, any other lone surrogate as `\\uNNNN`: never a UnicodeEncodeError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        text = re.sub("[\udc80-\udcff]", lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)
        return text.encode("utf-8", "backslashreplace")


def _stage(p: Path, data: str | bytes, mode: int) -> str:
    """Write `data` to a new temp file beside `p`; return its name (removed again on failure)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:40]}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(_utf8(data) if isinstance(data, str) else data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def write_all(files: dict, field: str = "--out") -> list[Path]:
    """Write several files all or nothing: each name is checked (`out_file`) and each content staged to
    a temp file in its directory before the first is published with `os.replace`; a failure while
    checking or staging leaves every earlier file as it was. New files get the umask's mode. `files`
    maps each path to its content (str or bytes), all produced before this call."""
    paths = {out_file(path, field): data for path, data in files.items()}
    mode = _file_mode()
    staged: list[tuple[str, Path]] = []
    try:
        for p, data in paths.items():
            try:
                staged.append((_stage(p, data, mode), p))
            except OSError as e:
                raise InputError(f"{field}: expected a writable place for {_name(p)}, got an error "
                                 f"({e.strerror or e}); nothing written") from None
        for i, (tmp, p) in enumerate(staged):
            try:
                os.replace(tmp, p)
            except OSError as e:
                done = ", ".join(_name(q) for _, q in staged[:i]) or "none"
                raise InputError(f"{field}: expected a writable place for {_name(p)}, got an error "
                                 f"({e.strerror or e}); written before it: {done}") from None
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # published ones are gone already
    return list(paths)


def write_atomic(path, data: str | bytes, field: str = "--out") -> Path:
    """Write `data` to `path` atomically (`write_all` of one file) and return the path."""
    return write_all({path: data}, field)[0]


def refuse_symlinks(paths, field: str = "--out") -> None:
    """One line if any of `paths` is a symlink: an output is never written through one."""
    for path in paths:
        if Path(path).is_symlink():
            raise InputError(f"{field}: expected a regular file or nothing at {_name(path)}, got a symlink "
                             "(refusing to write through it)")
