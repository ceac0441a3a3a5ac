"""The `attnscope` command.

DESIGN: one subcommand per job; the parsers live beside the layer they serve, one file each, so every
file reads in one sitting and no file imports torch at module level:

    cli/analytic.py   traffic, footprint, tiles, amdahl       (model/; serving.py: --lengths, --cache-lens)
    cli/reference.py  trace, verify                           (reference.py, kernels when they run)
    cli/report.py     report                                  (report/)
    cli/ring.py       ring                                    (model/ring.py)
    cli/gpu.py        bench, which, bytes, share              (measure/; GPU; share's closed-loop table
                                                              in cli/closed_loop.py)

Each module has `configure(subparsers)`, which adds its subcommands with `set_defaults(func=...)`; the
function takes the parsed args and returns the exit code. Bad input (`InputError`, a ValueError) and
unsupported combinations (`NotImplementedError`) print one line and exit 2, without a traceback; so does a
stdout that cannot be written (closed, a full disk), while a reader that left (`| head`) ends it quietly.
Every `type=int` / `type=float` flag takes plain ASCII decimal numbers only (`_strict`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import sys

from attnscope import __version__, inputs
from attnscope.errors import InputError, short, visible

_INTEGER = re.compile(r"[+-]?\d{1,4000}", re.ASCII)  # a longer one is refused by its range check anyway
_NONFINITE = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)


def _strict(kind):
    """argparse `type=` for `int` and `float` flags: a plain ASCII decimal number only, never what
    Python's int()/float() also take ("1_0", fullwidth "４０９６"). A float flag also passes "nan" and
    "[+-]inf" on, for its own check to name ("--softcap: expected a finite real number >= 0")."""
    def parse(text: str):
        if not (_INTEGER.fullmatch(text.strip()) if kind is int else
                inputs.number_text(text) or _NONFINITE.fullmatch(text.strip())):
            what = "an integer" if kind is int else "a decimal number"
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: expected {what} in ASCII "
                                             f"digits, got {short(text)}")
        return kind(text.strip())
    parse.__name__ = kind.__name__
    return parse


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.positionals: dict[str, str] = {}  # dest -> metavar: how `_flag_name` names a positional
        self.commands: dict[str, _Parser] = {}  # the top level's subcommands, by name
        for kind in (int, float):  # every `type=int` / `type=float` flag goes through `_strict`
            self.register("type", kind, _strict(kind))

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if not action.option_strings:
            self.positionals[action.dest] = action.metavar or action.dest.upper()
        return action

    def error(self, message: str):  # argparse's own usage errors: one line, exit 2
        # self.prog is "attnscope" for the top level and "attnscope traffic" for a subcommand
        message = visible(" ".join(message.split()))  # "unrecognized arguments" echoes them raw
        self.exit(2, f"{self.prog}: error: {message if len(message) <= 300 else message[:297] + '...'}\n")


def _flag_name(message: str, args, positionals: dict[str, str] | None = None) -> str:
    """Name the command-line flag, not the model's parameter: "nq: ..." -> "--n: ..." when the user
    gave --n, "block_kv: ..." -> "--block-kv: ..."; a positional argument by its metavar ("trace: ..."
    -> "TRACE: ..."), never as a flag it does not have. Messages already naming a flag or a file field
    are left as they are."""
    head, sep, rest = message.partition(": ")
    if not sep or head.startswith("-") or not head.isidentifier():
        return message
    if head in (positionals or {}):
        return f"{positionals[head]}: {rest}"
    given = vars(args)
    if head == "row" and "rows" in given:
        return f"--rows: {rest}"
    if head in ("nq", "nk") and given.get(head) is None and "n" in given:
        return f"--n: {rest}"
    head = _FLAG_OF.get(head, head) if _FLAG_OF.get(head) in given else head
    if head in given and head not in ("func", "command"):
        return f"--{head.replace('_', '-')}: {rest}"
    return message


#: Model parameters whose command-line flag has another name (`_flag_name`).
_FLAG_OF = {"num_splits": "splits", "lengths_q": "lengths", "lengths_k": "kv_lengths"}


def build_parser() -> _Parser:
    from attnscope.cli import analytic, gpu, reference, report, ring

    parser = _Parser(prog="attnscope", description="Attention data movement, checkable; attention, fast.",
                     epilog="\"spec §N\" in help and output: a section of the FlashAttention lesson the "
                            "analytic model reproduces; docs/model.md explains each one.")
    parser.add_argument("--version", action="version", version=f"attnscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (analytic, reference, report, gpu, ring):
        module.configure(sub)
    parser.commands = sub.choices  # name -> its _Parser
    return parser


#: Most command-line arguments read (the longest real command line has a few dozen).
MAX_ARGS = 1000


def _tolerant_streams() -> None:
    """Text the terminal's encoding cannot show degrades to escapes instead of raising
    (`PYTHONIOENCODING=ascii attnscope traffic`)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and getattr(stream, "errors", "") == "strict":
            stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _tolerant_streams()
    inputs.forget_reads()  # the files one command reads are the ones its outputs may not replace
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) > MAX_ARGS:  # argparse's time grows with the square of the argument count
        print(f"attnscope: error: expected at most {MAX_ARGS:,} command-line arguments, got {len(argv):,}",
              file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if sys.stdout is None:  # `attnscope traffic >&-`: nothing could be printed
        print(f"attnscope {args.command}: error: stdout: expected a writable terminal or file, got a closed "
              "stream", file=sys.stderr)
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not in the interpreter's exit
        return code
    except (InputError, NotImplementedError) as e:
        line = " ".join(str(e).split())  # always one line, and a bounded one
        line = visible(line if len(line) <= 300 else line[:297] + "...")
        positionals = parser.commands[args.command].positionals
        print(f"attnscope {args.command}: error: {_flag_name(line, args, positionals)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `attnscope ... | head`: the reader left; not an error of ours
        _drop_stdout()
        return 0
    except OSError as e:
        if e.errno not in _STDOUT_ERRNOS:
            raise
        where = _stdout_name()
        _drop_stdout()
        print(f"attnscope {args.command}: error: stdout: expected a writable terminal or file, got "
              f"{where} ({e.strerror or e})", file=sys.stderr)
        return 2


#: What a write to stdout can fail with: a full disk (`> /dev/full`), a closed or bad descriptor, I/O.
_STDOUT_ERRNOS = (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))


def _stdout_name() -> str:
    try:
        return short(os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}"))
    except (OSError, ValueError, AttributeError):
        return "stdout"


def _drop_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so what is still buffered cannot fail again at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
