"""The command's entry points (pyproject's console scripts ``opt4torch`` and
``opt4torch-precompute``): the parser, built from each subcommand's module,
and the one place where errors become exit codes and messages.

May touch: the command line and the process's exit status; the commands
themselves are in their modules.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from .._engine import Opt4Error
from . import cluster, demo, inspection, pack, pools, precompute, simulate
from .common import UsageError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opt4torch",
        description="Belady-optimal (OPT) caching for PyTorch datasets.",
    )
    parser.add_argument("--version", action="version", version=f"opt4torch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    # In the order `opt4torch --help` lists them.
    precompute.add_parser(sub)
    inspection.add_parser(sub)
    simulate.add_parser(sub)
    cluster.add_parser(sub)
    pack.add_parser(sub)
    pools.add_cleanup_parser(sub)
    pools.add_top_parser(sub)
    demo.add_parser(sub)
    return parser


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except (Opt4Error, FileNotFoundError, ValueError) as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "interrupted\n")
    except BrokenPipeError:
        # The reader went away (`opt4torch simulate ... | head`): stop quietly,
        # as a pipeline expects, without a traceback from the interpreter's
        # final flush of stdout either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``opt4torch COMMAND ...``"""
    return _run(_parser(), argv)


def precompute_main(argv: Sequence[str] | None = None) -> int:
    """``opt4torch-precompute ...``: the earlier name of ``opt4torch precompute``."""
    parser = argparse.ArgumentParser(
        prog="opt4torch-precompute",
        description="Write a plan file (same as `opt4torch precompute`).",
    )
    precompute.add_arguments(parser)
    return _run(parser, argv)
