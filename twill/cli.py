"""The ``twill`` command line.

Every subcommand is one ``_cmd_*`` function registered in :func:`build_parser`. User errors
(:class:`~twill.errors.TwillError`) print one line on stderr and exit with status 2; output files are
written atomically, so a failure never leaves a partial file.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from twill.errors import TwillError

EXIT_USAGE = 2


def _fail(message: str) -> int:
    print(f"twill: error: {message}", file=sys.stderr)
    return EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit status 2 (no usage dump)."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        raise SystemExit(_fail(message))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


# ---------------------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------------------

def _cmd_kernels(args: argparse.Namespace) -> int:
    from twill.kernels import list_kernels

    for entry in list_kernels():
        print(f"{entry.name:16s} {entry.summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="twill", description="Optimal software pipelining and warp specialization for GPUs.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("kernels", help="list the built-in loop graphs")
    p.set_defaults(func=_cmd_kernels)
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
