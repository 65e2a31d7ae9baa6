"""``twill emit gluon|pallas|tilelang``: schedule -> warp-specialized Gluon kernel, Pallas Mosaic GPU module or
TileLang module source.

    twill emit gluon gemm --block-n 128 -o gemm_ws.py
    twill emit gluon gemm --streaming-depth 3 --persistent -o gemm_persistent.py   # at most one CTA per SM
    twill emit gluon flash-fwd --subtiles 2 --head-dim 128 --streaming-depth 3 -o fa_ws.py
    twill emit gluon --schedule fa.schedule.json -o fa_ws.py       # a schedule written by 'twill schedule -o'
    twill emit gluon flash-bwd --head-dim 64 --block-m 128 --check-spills -o bwd.py   # registers checked by ptxas
    twill emit pallas gemm --streaming-depth 4 -o gemm_pallas.py
    twill emit tilelang flash-fwd --schedule fa.schedule.json -o fa_tilelang.py
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from twill.commands.common import (add_solve_arguments, add_target_arguments, input_files, machine_of, solve_options,
                                   target_options)
from twill.files import check_outputs, write_text_output
from twill.errors import TwillError
from twill.schedule.document import load_schedule_document
from twill.targets import is_triton_source, resolve_target


def _schedule_for(args: argparse.Namespace):
    if args.schedule:
        if args.target:
            raise TwillError("give either a target or --schedule FILE, not both")
        if getattr(args, "check_spills", False):
            raise TwillError("--check-spills solves the target with ptxas's checks; a --schedule FILE is emitted as "
                             "it is (check its kernel with 'twill tune --check-spills')")
        return load_schedule_document(args.schedule)
    if not args.target:
        raise TwillError("emit needs a target (built-in kernel, graph .json) or --schedule FILE")
    if is_triton_source(args.target):
        raise _not_from_triton(args.target)
    from twill.solve import schedule

    machine = machine_of(args)
    graph = resolve_target(args.target, target_options(args), machine)
    if graph.attrs.get("source") == "triton":
        raise _not_from_triton(args.target)
    options = solve_options(args)
    found = _refuse_before_solving(graph, args)
    if options.streaming_depth is None:
        from twill.kernels import emit_streaming_depth

        options = replace(options, streaming_depth=emit_streaming_depth(found, args.emit_to, graph))
    if args.emit_to == "tilelang":
        from twill.integrations.tilelang.planner import solve_for_tilelang

        return solve_for_tilelang(graph, machine, options)
    if getattr(args, "check_spills", False):
        from twill.tune.registers import schedule_without_spills

        return schedule_without_spills(graph, machine, options, persistent=getattr(args, "persistent", False))
    return schedule(graph, machine, options)


def _refuse_before_solving(graph, args: argparse.Namespace):
    """The family that emits ``graph`` for the backend; UnsupportedFeatureError, before any solve, when the
    backend has no body for the graph's kernel family (the registry's :func:`~twill.kernels.emitting_family`)
    or, for TileLang, the body refuses the graph."""
    from twill.kernels import emitting_family

    found = emitting_family(graph, args.emit_to, persistent=getattr(args, "persistent", False))
    if args.emit_to == "tilelang":
        found.body("tilelang").refuse(graph)
    return found


def _not_from_triton(target: str) -> TwillError:
    """Why a Triton kernel (or a graph extracted from one) cannot be emitted, and what to do."""
    return TwillError(f"twill emit cannot emit {target!r}, a Triton kernel or a graph extracted from one: "
                      f"the generators write the built-in gemm and flash-fwd kernels (and graphs with their "
                      f"roles), and a Triton loop graph lacks the addressing, masks and epilogue of the source "
                      f"kernel; compile the kernel with a Twill schedule by 'twill inject path.py:fn ...', or emit "
                      f"'gemm' / 'flash-fwd' with matching --block-m/--block-n/--block-k/--head-dim")


def _emitter(backend: str):
    """The ``schedule -> source`` function of ``backend`` (imported on use)."""
    if backend == "pallas":
        from twill.codegen.pallas import emit_pallas

        return emit_pallas
    if backend == "tilelang":
        from twill.codegen.tilelang import emit_tilelang

        return emit_tilelang
    from twill.codegen.gluon import emit_gluon

    return emit_gluon


def _cmd_emit(args: argparse.Namespace) -> int:
    check_outputs(files=[args.output], inputs=input_files(args))
    options = {"persistent": True} if getattr(args, "persistent", False) else {}  # code-generator choices
    source = _emitter(args.emit_to)(_schedule_for(args), **options)
    write_text_output(args.output, source)
    if args.output != "-":
        print(f"wrote {args.output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emit", help="emit kernel source from a schedule")
    backends = p.add_subparsers(dest="emit_to", metavar="BACKEND")
    backends.required = True
    for name, help_text in (("gluon", "warp-specialized Gluon kernel for Hopper (sm_90)"),
                            ("pallas", "JAX Pallas Mosaic GPU module for Hopper (emit_pipeline_warp_specialized)"),
                            ("tilelang", "TileLang 0.1.15 module for Hopper (T.WSSchedule, or T.Pipelined "
                                         "without warp specialization)")):
        g = backends.add_parser(name, help=help_text)
        # the target is optional here (--schedule replaces it): re-declare it after the shared arguments
        add_target_arguments(g)
        for action in g._actions:
            if action.dest == "target":
                action.nargs = "?"
                action.default = None
        add_solve_arguments(g)
        g.add_argument("--schedule", default=None, metavar="FILE",
                       help="emit from a schedule file written by 'twill schedule -o' instead of solving")
        g.add_argument("-o", "--output", required=True, metavar="FILE.py", help="output file ('-' for stdout)")
        if name == "gluon":
            g.add_argument("--check-spills", action="store_true",
                           help="solve with registers checked by ptxas: compile each schedule for sm_90 on the CPU "
                                "and search on while the kernel spills (lowering the model's register reserve "
                                "while no schedule exists); needs Triton")
            g.add_argument("--persistent", action="store_true",
                           help="GEMM, attention forward: a persistent kernel (at most one CTA per SM, each "
                                "walking output tiles or query blocks; the next tile's loads overlap the previous "
                                "tile's epilogue); same schedule")
        g.set_defaults(func=_cmd_emit)

