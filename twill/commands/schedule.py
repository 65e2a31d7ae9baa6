"""``twill kernels`` and ``twill schedule``."""

from __future__ import annotations

import argparse


def _cmd_kernels(args: argparse.Namespace) -> int:
    from twill.kernels import list_kernels

    for entry in list_kernels():
        print(f"{entry.name:16s} {entry.summary}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="list the built-in loop graphs")
    p.set_defaults(func=_cmd_kernels)
