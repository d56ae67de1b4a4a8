"""sglang-specvocab (also python -m sglang_specvocab): one command, a subcommand per user task.

Exit status, the same for every subcommand:
  0    success;
  1    a check that ran and failed (lab, check-lossless: outputs differ; bench kernels: an output
       check failed);
  2    refused input: one 'error: ...' line on stderr, no traceback (bad arguments, configs,
       files; a server or a run that could not proceed);
  130  interrupted (Ctrl-C, or SIGTERM while servers run); cached results are kept.

This package only parses arguments and dispatches, one module per room of the package (lab, train, bench,
checks); each subcommand's work is in the module its runner names.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ...errors import SpecVocabError
from . import bench, checks, lab, train
from ._args import RAW, Parser

PROG = "sglang-specvocab"


def parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = Parser(prog=PROG, description=doc[0], epilog=doc[1], formatter_class=RAW)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for room in (lab, train, bench, checks):  # the order of --help
        room.add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; the exit status follows the module doc's rule (never raises for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or refused arguments (2, one error line already printed)
        return int(exc.code or 0)
    args.command_line = shlex.join([PROG, *argv])
    try:
        return int(args.run(args) or 0)
    except SpecVocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = getattr(args, "on_interrupt", None)
        print(f"{PROG}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 130
