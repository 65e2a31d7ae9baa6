"""``twill graph`` (save a target's loop graph) and ``twill inject`` (compile a Triton kernel with Twill's
software-pipelining schedule instead of Triton's own)."""

from __future__ import annotations

import argparse
import json
import re

from twill.commands.common import (add_solve_arguments, add_target_arguments, check_outputs, load_schedule_document,
                                   machine_of, resolve_target, schedule_document, solve_options, write_json_output)
from twill.errors import TwillError

_TRITON_TARGET = re.compile(r"^(?P<path>.+\.py):(?P<fn>[A-Za-z_][A-Za-z_0-9]*)$")


def _cmd_graph(args: argparse.Namespace) -> int:
    from twill.ir.io import graph_to_dict

    machine = machine_of(args)
    graph = resolve_target(args, machine)
    write_json_output(args.output, graph_to_dict(graph))
    kinds: dict[str, int] = {}
    for op in graph.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(f"{graph.name}: {len(graph.ops)} ops ({summary}), {len(graph.edges)} edges "
          f"({sum(e.loop_carried for e in graph.edges)} loop-carried) -> {args.output}")
    return 0


def _kernel_spec(args: argparse.Namespace, machine):
    from twill.frontends.triton import kernel_spec
    from twill.frontends.triton.compile import load_kernel

    match = _TRITON_TARGET.match(args.target)
    if not match:
        raise TwillError(f"twill inject needs a Triton kernel target path.py:fn, got {args.target!r}")
    if not args.signature:
        raise TwillError("twill inject needs --signature listing every non-constexpr argument, "
                         "e.g. --signature 'a_ptr=*fp16:16,M=i32:16'")
    fn = load_kernel(match["path"], match["fn"])
    return kernel_spec(fn, signature=args.signature, constexprs=list(args.constexpr),
                       num_warps=args.num_warps or 4, num_stages=args.num_stages, machine=machine)


def _cmd_inject(args: argparse.Namespace) -> int:
    from twill.codegen.triton import inject, solve_for_triton, write_outputs
    from twill.frontends.triton import lower_function

    machine = machine_of(args)
    check_outputs(folders=[args.output])
    spec = _kernel_spec(args, machine)
    if args.schedule:
        schedule = load_schedule_document(args.schedule)
    else:
        lowered, _ = lower_function(spec, machine)
        schedule = solve_for_triton(lowered.graph, machine, spec.capability, solve_options(args))
    result = inject(spec, schedule, machine, load_lead=args.load_lead)
    summary = write_outputs(result, schedule, args.output)
    write_json_output(f"{args.output}/schedule.json", schedule_document(schedule))
    print(json.dumps(summary, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graph", help="extract a loop graph and save it as twill-graph/1",
                       description="Build or extract the loop graph of a target (a built-in kernel, a graph "
                                   "file, or a Triton kernel path.py:fn compiled on this machine) and save it.")
    add_target_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="G.json", help="where to write the graph")
    p.set_defaults(func=_cmd_graph)

    p = sub.add_parser("inject", help="compile a Triton kernel with Twill's software-pipelining schedule",
                       description="Schedule the innermost loop of a Triton kernel (or take --schedule), write "
                                   "loop.stage/loop.cluster into its TTGIR before Triton's pipeliner, and "
                                   "compile it (Triton 3.6.0, no GPU needed). Writes the final and the "
                                   "scheduled TTGIR, PTX, cubin and summary.json into DIR and prints the "
                                   "summary: II, stages, buffers, shared memory.")
    add_target_arguments(p)
    add_solve_arguments(p)
    p.add_argument("--schedule", default=None, metavar="S.json",
                   help="use this schedule (twill schedule -o, or summary of an earlier run) instead of solving")
    p.add_argument("--load-lead", type=int, default=None, metavar="N",
                   help="stages between a streaming load and its first consumer (default num_stages - 1)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    p.set_defaults(func=_cmd_inject, ws=False)
