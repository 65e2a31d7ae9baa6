"""``twill kernels`` and ``twill schedule``."""

from __future__ import annotations

import argparse
import json
import sys

from twill.commands.common import (add_solve_arguments, add_target_arguments, input_files, machine_of, solve_options,
                                   target_options)
from twill.files import check_outputs, print_output, refuse_stdout, write_all, write_json_output
from twill.errors import TwillError
from twill.schedule.document import schedule_document
from twill.targets import resolve_targets


def _cmd_kernels(args: argparse.Namespace) -> int:
    from twill.kernels import list_kernels

    print_output("\n".join(f"{entry.name:16s} {entry.summary}" for entry in list_kernels()))
    return 0


def _plot_writers(args: argparse.Namespace, schedule, machine) -> list:
    """One writer per picture option given (for :func:`write_all`); each returns the paths it wrote."""
    if not (args.plot or args.plot_all):
        return []
    try:
        from twill import viz
    except ImportError as exc:
        raise TwillError(f"plotting is not available ({exc})") from None
    jobs = [(save, target) for save, target in ((viz.save_timeline, args.plot), (viz.save_all, args.plot_all))
            if target]
    writers = []
    for save, target in jobs:
        def write(save=save, target=target) -> list:
            try:
                written = save(schedule, machine, target)
            except OSError as exc:
                raise TwillError(f"cannot write picture {target!r}: {exc.strerror or exc}") from None
            return written if isinstance(written, list) else [written]

        writers.append(write)
    return writers


def _cmd_schedule(args: argparse.Namespace) -> int:
    from twill.schedule.report import format_report
    from twill.solve import schedule as solve

    refuse_stdout(args.plot, "--plot", "a picture is a binary file")
    refuse_stdout(args.plot_all, "--plot-all", "it is a folder of pictures")
    check_outputs(files=[args.output, args.plot], folders=[args.plot_all], inputs=input_files(args))
    machine = machine_of(args)
    options = solve_options(args)
    graphs = resolve_targets(args.target, target_options(args), machine)
    if len(graphs) > 1:
        return _schedule_loops(args, graphs, machine, options)
    graph = graphs[0]
    tilelang = graph.attrs.get("source") == "tilelang"
    if tilelang:
        from twill.integrations.tilelang.planner import format_plan, pipeline_plan, solve_for_tilelang

        result = solve_for_tilelang(graph, machine, options)
        plan = pipeline_plan(result)
    else:
        result = solve(graph, machine, options)
    program = None
    if args.pipelined:
        from twill.schedule.pipelined import pipelined_program

        program = pipelined_program(result)
    doc = schedule_document(result)
    if tilelang:
        doc["tilelang"] = plan.to_dict()
    if program is not None:
        from twill.schedule.pipelined import program_to_dict

        doc["pipelined"] = program_to_dict(program)
    writers = _plot_writers(args, result, machine)
    if args.output:
        writers.append(lambda: write_json_output(args.output, doc))
    write_all(writers)
    if args.json:
        if args.output != "-":          # '-o -' printed the same document
            print_output(json.dumps(doc, indent=2))
        return 0
    text = format_report(result, machine)
    if tilelang:
        text += "\n\n" + format_plan(plan, result)
    if program is not None:
        from twill.schedule.pipelined import format_pipelined

        text += "\n\n" + format_pipelined(result, program)
    if args.output == "-":
        print(text, file=sys.stderr)            # stdout carries the JSON
    else:
        print_output(text)
    return 0


def _schedule_loops(args: argparse.Namespace, graphs: list, machine, options) -> int:
    """``twill schedule`` of a Triton kernel with several loops that hold dots: each loop is solved; the report
    gives one schedule per loop, in program order, and the JSON is ``{"kernel": NAME, "loops": [...]}`` with
    one ``twill-schedule/1`` document per loop."""
    from twill.schedule.report import format_report
    from twill.solve import schedule as solve

    for flag, given in (("--plot", args.plot), ("--plot-all", args.plot_all)):
        if given:
            raise TwillError(f"{flag} draws one loop and the kernel has {len(graphs)} loops that hold dots: pick "
                             f"one with --loop N or --loop line:N")
    results = [solve(graph, machine, options) for graph in graphs]
    texts, docs = [], []
    for result in results:
        doc, text = schedule_document(result), format_report(result, machine)
        if args.pipelined:
            from twill.schedule.pipelined import format_pipelined, pipelined_program, program_to_dict

            program = pipelined_program(result)
            doc["pipelined"] = program_to_dict(program)
            text += "\n\n" + format_pipelined(result, program)
        docs.append(doc)
        texts.append(text)
    combined = {"kernel": graphs[0].name, "loops": docs}
    if args.output:
        write_json_output(args.output, combined)
    if args.json:
        if args.output != "-":
            print_output(json.dumps(combined, indent=2))
        return 0
    indices = ", ".join(str(g.attrs.get("loop_index")) for g in graphs)
    head = (f"{graphs[0].name}: {len(graphs)} loops hold dots (loops {indices}); each is scheduled below, "
            f"--loop N schedules one")
    text = "\n\n".join([head] + texts)
    if args.output == "-":
        print(text, file=sys.stderr)
    else:
        print_output(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="list the built-in loop graphs")
    p.set_defaults(func=_cmd_kernels)

    p = sub.add_parser("schedule", help="find an optimal modulo schedule (and warp specialization)",
                       description="Schedule a loop graph: cost normalization, ResMII/RecMII bounds, optimal "
                                   "modulo scheduling and, unless --no-ws, joint warp specialization.")
    add_target_arguments(p)
    add_solve_arguments(p)
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the twill-schedule/1 JSON instead of the report")
    out.add_argument("-o", "--output", metavar="FILE",
                     help="also write the twill-schedule/1 JSON to FILE ('-': stdout, the report goes to stderr)")
    out.add_argument("--pipelined", action="store_true",
                     help="also print the pipelined program (prologue / steady state / epilogue)")
    out.add_argument("--plot", metavar="FILE", help="save a timeline picture of the schedule")
    out.add_argument("--plot-all", metavar="DIR", help="save every picture of the schedule into DIR")
    p.set_defaults(func=_cmd_schedule)
