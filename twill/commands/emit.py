"""``twill emit gluon`` (schedule -> warp-specialized Gluon kernel source) and ``twill bench`` (GPU).

    twill emit gluon gemm --block-n 128 -o gemm_ws.py
    twill emit gluon flash-fwd --subtiles 2 --head-dim 128 --streaming-depth 3 -o fa_ws.py
    twill emit gluon --schedule fa.schedule.json -o fa_ws.py       # a schedule written by 'twill schedule -o'
    twill bench generate benchmarks/gluon_kernels                  # CPU: emit the benchmark suite
    twill bench run benchmarks/gluon_kernels --out results/        # GPU: check + time vs cuBLAS/cuDNN/FA2/Pallas
"""

from __future__ import annotations

import argparse
import os

from twill.commands.common import (add_solve_arguments, add_target_arguments, check_outputs,
                                   load_schedule_document, machine_of, resolve_target, solve_options,
                                   write_text_output)
from twill.errors import TwillError


def _schedule_for(args: argparse.Namespace):
    if args.schedule:
        if args.target:
            raise TwillError("give either a target or --schedule FILE, not both")
        return load_schedule_document(args.schedule)
    if not args.target:
        raise TwillError("emit needs a target (built-in kernel, graph .json) or --schedule FILE")
    from twill.solve import schedule

    machine = machine_of(args)
    graph = resolve_target(args, machine)
    return schedule(graph, machine, solve_options(args))


def _cmd_emit_gluon(args: argparse.Namespace) -> int:
    from twill.codegen.gluon import emit_gluon

    check_outputs(files=[args.output])
    source = emit_gluon(_schedule_for(args))
    if args.output == "-":
        print(source, end="")
        return 0
    write_text_output(args.output, source)
    print(f"wrote {args.output}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from twill.codegen.gluon import bench

    if args.step == "generate":
        for row in bench.generate(args.kernel_dir, arch=args.arch):
            print(f"{row['name']:32s} {row['solver']:7s} II {row['ii']:5d} rings {row['rings']}")
        return 0
    if args.step == "sanity":
        return 1 if bench.sanity(args.kernel_dir, args.only) else 0
    bench.run(args.kernel_dir, args.out, only=args.only, quick=args.quick)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emit", help="emit kernel source from a schedule")
    backends = p.add_subparsers(dest="backend", metavar="BACKEND")
    backends.required = True
    g = backends.add_parser("gluon", help="warp-specialized Gluon kernel for Hopper (sm_90)")
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
    g.set_defaults(func=_cmd_emit_gluon)

    b = sub.add_parser("bench", help="emit, check and time the Gluon benchmark suite (run: GPU)")
    b.add_argument("step", choices=("generate", "run", "sanity"),
                   help="generate: emit the suite (CPU); run: check + time on the GPU; sanity: one small "
                        "checked launch per kernel (for compute-sanitizer)")
    b.add_argument("kernel_dir", nargs="?", default="benchmarks/gluon_kernels",
                   help="folder of emitted kernels and manifest.json (default benchmarks/gluon_kernels)")
    b.add_argument("--arch", default="h100", type=str.lower, help="target GPU for generate (default h100)")
    b.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results",
                   help="where run writes gluon_bench.json")
    b.add_argument("--only", nargs="*", default=None, help="substrings of variant names to include")
    b.add_argument("--quick", action="store_true", help="fewer sizes")
    b.set_defaults(func=_cmd_bench)
