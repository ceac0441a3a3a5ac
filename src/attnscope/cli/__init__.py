"""The `attnscope` command.

DESIGN: one subcommand per job; the parsers live beside the layer they serve, one file each, so every
file reads in one sitting and no file imports torch at module level:

    cli/analytic.py   traffic, footprint, tiles, amdahl       (model/)
    cli/reference.py  trace, verify                           (reference.py, kernels when they run)
    cli/report.py     report                                  (report/)
    cli/gpu.py        bench, which, bytes, share              (measure/; GPU)

Each module has `configure(subparsers)`, which adds its subcommands with `set_defaults(func=...)`; the
function takes the parsed args and returns the exit code. Bad input (`InputError`, a ValueError) and
unsupported combinations (`NotImplementedError`) print one line and exit 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from attnscope import __version__
from attnscope.errors import InputError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: one line, exit 2
        self.exit(2, f"attnscope {self.prog.split()[-1]}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from attnscope.cli import analytic, gpu, reference, report, ring

    parser = _Parser(prog="attnscope", description="Attention data movement, checkable; attention, fast.")
    parser.add_argument("--version", action="version", version=f"attnscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (analytic, reference, report, gpu, ring):
        module.configure(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (InputError, NotImplementedError) as e:
        print(f"attnscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `attnscope ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
