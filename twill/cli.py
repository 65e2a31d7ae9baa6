"""The ``twill`` command line.

Subcommands live in ``twill.commands.*`` (one module per feature, see ``COMMAND_MODULES``). User errors
(:class:`~twill.errors.TwillError`) print one line on stderr and exit with status 2; output files are
written atomically, so a failure never leaves a partial file. Ctrl-C (SIGINT) and SIGTERM stop any command
at once with one line and exit status 130 or 143, writing nothing.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence

from twill.errors import TwillError
from twill.quote import printable

EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT      # 130, as a shell reports a command that Ctrl-C ended
EXIT_TERMINATED = 128 + signal.SIGTERM      # 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by the SIGTERM handler of :func:`main`: a ``KeyboardInterrupt``, so that
    whatever stops for Ctrl-C (a solver search, the tune worker pool, an output group) stops for it too."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _fail(message: str) -> int:
    print(f"twill: error: {printable(message)}", file=sys.stderr)
    return EXIT_USAGE


def _stopped(word: str, status: int) -> int:
    """The one line of a command stopped by a signal (on a terminal on a line of its own, after the ``^C``
    the terminal echoed or a progress bar); ``status``."""
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"twill: {word}", file=sys.stderr)
    return status


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
    "twill.commands.ops",        # twill ops prepare, twill ops regenerate
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
    """Run one ``twill`` command; its exit status. SIGTERM raises :class:`Terminated` while it runs (in the
    main thread; the previous handler is put back after)."""
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:                  # not the main thread: signals cannot reach this call anyway
        pass
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except SystemExit as exc:  # argparse --help (0) and our one-line usage errors (2)
        return int(exc.code or 0)
    except TwillError as exc:
        return _fail(str(exc))
    except Terminated:
        return _stopped("terminated", EXIT_TERMINATED)
    except KeyboardInterrupt:
        return _stopped("interrupted", EXIT_INTERRUPTED)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
