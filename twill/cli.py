"""The ``twill`` command line.

Subcommands live in ``twill.commands.*`` (one module per feature, see ``COMMAND_MODULES``). User errors
(:class:`~twill.errors.TwillError`) print one line on stderr and exit with status 2; output files are
written atomically, so a failure never leaves a partial file.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from twill.errors import TwillError

EXIT_USAGE = 2


def _fail(message: str) -> int:
    print(f"twill: error: {message}", file=sys.stderr)
    return EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit status 2 (no usage dump)."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        raise SystemExit(_fail(message))


#: Command modules, in the order ``twill --help`` lists them. Each defines ``register(subparsers)``, which
#: adds its subcommands with ``set_defaults(func=...)``. They must import quickly (no solver, no Triton at
#: import time): heavy modules are imported inside the command functions.
COMMAND_MODULES = (
    "twill.commands.schedule",   # twill schedule, twill kernels
    "twill.commands.triton",     # twill graph, twill inject
    "twill.commands.emit",       # twill emit
    "twill.commands.report",     # twill report
    "twill.commands.tune",       # twill tune
    "twill.commands.calibrate",  # twill calibrate
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(prog="twill", description="Optimal software pipelining and warp specialization for GPUs.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except SystemExit as exc:  # argparse --help (0) and our one-line usage errors (2)
        return int(exc.code or 0)
    except TwillError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted")


if __name__ == "__main__":
    sys.exit(main())
