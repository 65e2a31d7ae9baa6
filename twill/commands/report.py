"""``twill report``: schedule a target and write one self-contained HTML page with the pictures, the tables,
the text schedule and the pipelined program.

The target is what ``twill schedule`` takes (a built-in kernel, a ``twill-graph/1`` file, a Triton
``path.py:fn``) or a schedule file written by ``twill schedule -o``, which is reported without solving.
"""

from __future__ import annotations

import argparse
from typing import Any

from twill.commands.common import (add_solve_arguments, add_target_arguments, input_files, machine_of, solve_options,
                                   target_options)
from twill.files import check_outputs, message_stream, write_text_output
from twill.errors import TwillError
from twill.schedule.document import is_schedule_file, load_schedule_document
from twill.targets import resolve_target


def _schedule(args: argparse.Namespace, machine: Any) -> Any:
    if is_schedule_file(args.target):
        return load_schedule_document(args.target)
    from twill.solve import schedule as solve

    return solve(resolve_target(args.target, target_options(args), machine), machine, solve_options(args))


def _cmd_report(args: argparse.Namespace) -> int:
    from twill.schedule.pipelined import format_pipelined, pipelined_program
    from twill.schedule.report import format_report

    check_outputs(files=[args.output], inputs=input_files(args))
    machine = machine_of(args)
    result = _schedule(args, machine)
    try:
        from twill.viz.report import render_report
    except ImportError as exc:
        raise TwillError(f"the HTML report needs matplotlib ({exc}); pip install matplotlib") from None
    page = render_report(result, machine, text_report=format_report(result, machine),
                         pipelined=format_pipelined(result, pipelined_program(result)))
    write_text_output(args.output, page)
    print(f"wrote {'stdout' if args.output == '-' else args.output}: {result.graph.name} on {machine.name}, "
          f"II {result.ii} ({result.status}), {len(result.warps)} warp groups", file=message_stream(args.output))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of a schedule",
                       description="Schedule a target (or read a schedule file written by 'twill schedule -o') "
                                   "and write one HTML page: timeline, modulo reservation table, dependence "
                                   "graph, register/memory pressure, tables, text schedule, pipelined program.")
    add_target_arguments(p)
    add_solve_arguments(p)
    p.add_argument("-o", "--output", metavar="FILE.html", required=True, help="the HTML file to write ('-' for stdout)")
    p.set_defaults(func=_cmd_report)
