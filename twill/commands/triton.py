"""``twill graph`` (save a target's loop graph) and ``twill inject`` (compile a Triton kernel with Twill's
software-pipelining schedule instead of Triton's own)."""

from __future__ import annotations

import argparse
import json
import os

from twill.commands.common import (add_solve_arguments, add_target_arguments, input_files, kernel_options_given,
                                   machine_of, solve_options, target_options)
from twill.files import check_outputs, message_stream, refuse_inputs_as_outputs, write_json_output
from twill.commands.common import NUM_STAGES_RANGE, integer_in
from twill.errors import TwillError
from twill.targets import resolve_target, tilelang_target

#: Files ``twill inject`` writes into its folder under fixed names (the others are named after the kernel).
INJECT_FIXED_FILES = ("schedule.json", "summary.json")


def _cmd_graph(args: argparse.Namespace) -> int:
    from twill.ir.io import graph_to_dict

    check_outputs(files=[args.output], inputs=input_files(args))
    machine = machine_of(args)
    graph = resolve_target(args.target, target_options(args), machine)
    write_json_output(args.output, graph_to_dict(graph))
    kinds: dict[str, int] = {}
    for op in graph.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    stream = message_stream(args.output)        # stderr when the graph went to stdout
    where = "stdout" if args.output == "-" else args.output
    print(f"{graph.name}: {len(graph.ops)} ops ({summary}), {len(graph.edges)} edges "
          f"({sum(e.loop_carried for e in graph.edges)} loop-carried) -> {where}", file=stream)
    if graph.attrs.get("loop_source"):
        print(f"loop: {graph.attrs['loop_source']}", file=stream)
    return 0


def _cmd_inject(args: argparse.Namespace) -> int:
    tilelang = tilelang_target(args.target, target_options(args))
    _refuse_ws_options(args, bool(tilelang))
    check_outputs(folders=[args.output])
    # the files of the folder an input could be: an earlier inject's schedule.json or summary.json
    refuse_inputs_as_outputs([os.path.join(args.output, name) for name in INJECT_FIXED_FILES], input_files(args))
    machine = machine_of(args)
    if tilelang:
        from twill.integrations.tilelang.planner import inject_tilelang

        if args.load_lead is not None:
            raise TwillError("--load-lead applies to Triton kernels; a TileLang loop's loads run num_stages ahead")
        summary = inject_tilelang(*tilelang, list(args.tl_args), machine, args.output, options=solve_options(args),
                                  schedule_file=args.schedule)
    elif args.ws:
        from twill.integrations.triton.warp_specialize import inject_ws_triton

        summary = inject_ws_triton(args.target, machine, args.output, options=solve_options(args),
                                   signature=args.signature, constexprs=args.constexpr, num_warps=args.num_warps,
                                   num_stages=args.num_stages, config=args.config, loop=args.loop)
    else:
        from twill.integrations.triton.inject import inject_triton

        summary = inject_triton(args.target, machine, args.output, options=solve_options(args),
                                signature=args.signature, constexprs=args.constexpr, num_warps=args.num_warps,
                                num_stages=args.num_stages, config=args.config, loop=args.loop,
                                schedule_file=args.schedule, load_lead=args.load_lead)
    print(json.dumps(summary, indent=2))
    return 0


#: Solver options of warp specialization, with their defaults: without --ws injection takes a
#: software-pipelining schedule only, so giving one of them is an error rather than silently ignored.
WS_OPTIONS = {"solver": ("--solver", "cpsat"), "reg_limit": ("--reg-limit", None),
              "max_warps": ("--max-warps", None), "cross_warp": ("--no-cross-warp", True)}


def _refuse_ws_options(args: argparse.Namespace, tilelang: bool) -> None:
    """Options ``twill inject`` cannot honour are errors: built-in kernel options, warp-specialization options
    without ``--ws``, and with ``--ws`` on a Triton kernel ``--load-lead``, ``--schedule`` and ``--config
    all``."""
    static = kernel_options_given(args)
    if static:
        raise TwillError(f"--{sorted(static)[0].replace('_', '-')} applies to built-in kernels only; twill inject "
                         f"compiles a Triton kernel: use --constexpr")
    if args.ws and not tilelang:
        # a Triton kernel's warp groups become Triton 3.6's Hopper partitions (one loop, solved here)
        refused = [flag for flag, value in (("--load-lead", args.load_lead), ("--schedule", args.schedule))
                   if value is not None] + (["--config all"] if args.config == "all" else [])
        if refused:
            raise TwillError(f"{refused[0]} does not apply to inject --ws of a Triton kernel: its partitions' "
                             f"rings are num_stages deep and its warp-specialized schedule is solved here, for "
                             f"one config")
    given = [flag for dest, (flag, default) in WS_OPTIONS.items() if getattr(args, dest) != default]
    if given and not args.ws:
        raise TwillError(f"{given[0]} applies to warp specialization, and without --ws twill inject compiles a "
                         f"software-pipelining schedule only; add --ws, or use 'twill schedule' for "
                         f"warp-specialized schedules")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graph", help="extract a loop graph and save it as twill-graph/1",
                       description="Build or extract the loop graph of a target (a built-in kernel, a graph "
                                   "file, or a Triton kernel path.py:fn compiled on this machine) and save it.")
    add_target_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="G.json",
                   help="where to write the graph ('-' for stdout)")
    p.set_defaults(func=_cmd_graph)

    p = sub.add_parser("inject", help="compile a Triton or TileLang kernel with Twill's software-pipelining "
                                      "schedule",
                       description="Schedule a loop of a Triton kernel path.py:fn (software pipelining "
                                   "only; or take --schedule), write loop.stage/loop.cluster into its TTGIR "
                                   "before Triton's pipeliner, and compile it (Triton 3.6.0, no GPU needed); "
                                   "with --ws (sm_90, --num-warps 4) write its warp groups as the partitions "
                                   "of Triton's Hopper warp specialization instead. "
                                   "Writes the final and the scheduled TTGIR, PTX, cubin, schedule.json and "
                                   "summary.json into DIR and prints the summary: II (normalized and cycles), "
                                   "its lower bound, stages, buffers, shared memory. A TileLang kernel "
                                   "(its file imports tilelang; factory arguments with --arg) gets its "
                                   "T.Pipelined loop rewritten with Twill's num_stages/stage/order: "
                                   "<file>_twill.py, its CUDA <file>_twill.cu (lowered without a GPU), "
                                   "schedule.json and summary.json; with --ws also <file>_twill_ws.py (its "
                                   "loop under a T.WSSchedule of Twill's warp assignment) and its CUDA. "
                                   "Warp-specialization options without --ws and built-in kernel options "
                                   "are refused.")
    add_target_arguments(p)
    add_solve_arguments(p)
    p.add_argument("--schedule", default=None, metavar="S.json",
                   help="use this schedule (twill schedule --no-ws -o, or the schedule.json of an earlier "
                        "inject) instead of solving")
    p.add_argument("--load-lead", type=integer_in(1, NUM_STAGES_RANGE[1]), default=None, metavar="N",
                   help="stages between a streaming load and its first consumer (default num_stages - 1)")
    p.add_argument("--ws", action="store_true",
                   help="solve with warp specialization. Triton kernels (sm_90, --num-warps 4): the warp groups "
                        "become the partitions of Triton 3.6's Hopper warp specialization (the loads' group the "
                        "producer, one compute group the consumer); the summary lists them. TileLang kernels: "
                        "also write <file>_twill_ws.py, the loop under a T.WSSchedule of Twill's warp "
                        "assignment, and its CUDA <file>_twill_ws.cu")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    p.set_defaults(func=_cmd_inject, ws=False)
