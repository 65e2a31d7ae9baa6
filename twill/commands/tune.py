"""``twill tune``: sweep a target's tile sizes, depths and register budgets, rank candidates by predicted time.

Axis flags take comma lists (``--block-m 128,256``); an axis not given takes the kernel's default sweep
(its family's ``DEFAULT_AXES``, :func:`twill.tune.space.default_axes`). See docs/tuning.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from twill.commands.common import input_files, machine_of
from twill.files import check_outputs, print_output, write_all, write_json_output, write_text_output
from twill.commands.common import NUM_STAGES_RANGE, NUM_WARPS_RANGE, arch_choice, integer_in, option_type
from twill.errors import TwillError
from twill.targets import python_target


def _boolean(text: str) -> bool:
    """``true`` or ``false`` (also ``1``/``0``); anything else is a ValueError."""
    value = {"true": True, "1": True, "false": False, "0": False}.get(text.lower())
    if value is None:
        raise ValueError(text)
    return value


_boolean.__name__ = "bool"

#: Axis flags of built-in kernels: flag -> (axis, value type).
AXIS_FLAGS: dict[str, tuple[str, Any]] = {
    "--subtiles": ("subtiles", int), "--head-dim": ("head_dim", int), "--block-m": ("block_m", int),
    "--block-n": ("block_n", int), "--block-k": ("block_k", int), "--dtype": ("dtype", str),
    "--warps": ("warps", int), "--streaming-depth": ("streaming_depth", option_type("streaming_depth")),
    "--reg-limit": ("reg_limit", option_type("reg_limit")), "--persistent": ("persistent", _boolean),
}

DEFAULT_TIME_LIMIT = 60.0

#: The most rows ``--top`` shows and candidates ``--measure`` times.
MAX_COUNT = 100_000


def _values(typ: Any):
    """An argparse type that reads a comma list of ``typ`` values into a tuple (a value that ``typ`` refuses with
    its own message, such as a solve option out of range, is refused with that message)."""
    def parse(text: str) -> tuple[Any, ...]:
        try:
            values = tuple(typ(v.strip()) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {typ.__name__}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        return values

    parse.__name__ = f"{typ.__name__} list"
    return parse


def _axes(args: argparse.Namespace, names: Any) -> dict[str, tuple[Any, ...]]:
    """The axes among ``names`` that were given on the command line."""
    return {axis: getattr(args, axis) for axis in names if getattr(args, axis, None) is not None}


def _triton_constexprs(items: list[str]) -> dict[str, tuple[Any, ...]]:
    """``--constexpr NAME=V1,V2`` items as ``{NAME: (V1, V2)}`` (values parsed as the Triton frontend does)."""
    from twill.integrations.triton.compile import parse_constexpr_value

    out: dict[str, tuple[Any, ...]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise TwillError(f"bad --constexpr {item!r}: expected NAME=V1,V2,...")
        out[name.strip()] = tuple(parse_constexpr_value(v.strip()) for v in values.split(",") if v.strip())
    return out


def _plan(args: argparse.Namespace, machine: Any) -> tuple[Any, list[Any], Any]:
    """``(space, jobs, shape)`` of the target; the shape is ``None`` for a Triton kernel without ``--shape``
    (its problem is known only once its graph is extracted)."""
    from twill.ir.io import graph_to_dict
    from twill.kernels import families
    from twill.tune.predict import PROBLEMS, default_shape, hooks, kernel_problem, parse_shape
    from twill.tune.space import graph_space, kernel_space, triton_space
    from twill.tune.sweep import Job

    match = python_target(args.target)
    hopper = machine.capability // 10 == 9
    if args.check_spills and not match and not hopper:
        raise TwillError(f"--check-spills compiles Gluon kernels for sm_90 only, not {machine.arch}")
    check = bool(args.check_spills or (args.measure and hopper))
    common = {"machine": machine, "time_limit": args.time_limit, "check_spills": check}
    kernel_axes = _axes(args, [a for a, _ in AXIS_FLAGS.values()])
    if match:
        if kernel_axes:
            raise TwillError(f"--{next(iter(kernel_axes)).replace('_', '-')} applies to built-in kernels and "
                             f"graphs; use --constexpr NAME=V1,V2 for a Triton target")
        if args.extra_copies:
            raise TwillError("--extra-copies applies to built-in kernels and graphs (a Triton kernel's search "
                             "is Triton's own modulo schedule)")
        if not os.path.isfile(match.path):
            raise TwillError(f"cannot read Triton source {match.path!r}: no such file")
        if not args.signature:
            raise TwillError("a Triton target needs --signature listing every non-constexpr argument")
        space = triton_space(_triton_constexprs(args.constexpr), _axes(args, ("num_warps", "num_stages")))
        from twill.files import read_text_file

        info = {"path": os.path.abspath(match.path), "fn": match.fn, "signature": args.signature,
                "source": read_text_file(match.path, "Triton source")}
        jobs = [Job(candidate=c, triton=info, **common) for c in space.candidates]
        shape = None
        if args.shape:
            sizes = len(args.shape.split(","))
            shape = parse_shape(args.shape, next((p for p, names in PROBLEMS.items() if len(names) == sizes),
                                                 list(PROBLEMS)[-1]))
        return space, jobs, shape
    if args.constexpr or args.signature or args.num_warps or args.num_stages:
        raise TwillError("--signature, --constexpr, --num-warps and --num-stages apply to Triton targets only")
    if args.causal and not getattr(hooks(args.target), "CAUSAL", False):
        causal = [f.name for f in families() if getattr(f.hooks(), "CAUSAL", False)]
        raise TwillError(f"--causal applies to {', '.join(causal)}, not {args.target!r}")
    if args.target.endswith(".json") or os.path.sep in args.target:
        from twill.ir.io import load_graph
        from twill.tune.predict import problem_of

        graph = load_graph(args.target)
        problem = problem_of(graph)
        space = graph_space(kernel_axes)
        shape = parse_shape(args.shape, problem) if args.shape else default_shape(problem,
                                                                                   graph.attrs.get("head_dim"))
        jobs = [Job(candidate=c, graph=graph_to_dict(graph), extra_copies=args.extra_copies, **common)
                for c in space.candidates]
        return space, jobs, shape
    from twill.kernels import build_kernel, kernel_options

    kernel_options(args.target)                     # unknown kernel: one clear error
    problem = kernel_problem(args.target)
    if problem is None:
        raise TwillError(f"kernel {args.target!r} has no problem shape to tune for "
                         f"(tunable: {', '.join(f.name for f in families() if f.tuned)})")
    if problem == "attention":
        given = kernel_axes.get("head_dim")
        if given is not None and len(given) != 1:
            raise TwillError("--head-dim takes one value (the shape's D)")
        shape = parse_shape(args.shape, problem) if args.shape else default_shape(problem, (given or (None,))[0])
        if given is not None and given[0] != shape["D"]:
            raise TwillError(f"--head-dim {given[0]} does not match the shape's D={shape['D']}")
        kernel_axes["head_dim"] = (shape["D"],)
        if args.causal:
            kernel_axes["causal"] = (True,)     # part of the problem, not a choice: one value
    else:
        shape = parse_shape(args.shape, problem) if args.shape else default_shape(problem)
    space = kernel_space(args.target, machine, kernel_axes, check_spills=common["check_spills"])
    jobs = [Job(candidate=c, graph=graph_to_dict(build_kernel(args.target, machine, **dict(c.options))),
                extra_copies=args.extra_copies, **common) for c in space.candidates]
    return space, jobs, shape


def _measured_triton_kernel(target: str) -> Any:
    """For ``--measure`` on a Triton target ``path.py:fn``: the kernel, once its module is known to define the
    ``twill_launch`` hook (a one-line error otherwise, before any solve); ``None`` for other targets."""
    match = python_target(target)
    if not match:
        return None
    from twill.integrations.triton.compile import load_kernel
    from twill.integrations.triton.measure import launch_hook

    fn = load_kernel(match.path, match.fn).fn
    launch_hook(fn)
    return fn


def _shape_from_results(records: list[dict[str, Any]]) -> Any:
    """The default shape of a Triton kernel's problem, read from its first solved graph."""
    from twill.tune.predict import default_shape, problem_of
    from twill.ir.io import graph_from_dict

    for record in records:
        if record["status"] == "ok":
            graph = graph_from_dict(record["schedule"]["loop_graph"])
            return default_shape(problem_of(graph), graph.attrs.get("head_dim"))
    raise TwillError("no candidate was scheduled; nothing to rank (see the reasons with --json)")


def _cmd_tune(args: argparse.Namespace) -> int:
    """Check the outputs, plan the space, run the sweep, rank, optionally measure, write and print."""
    from twill.tune.rank import format_ranking, rank, sweep_document
    from twill.tune.sweep import Progress, run_sweep

    if args.json == "-" and args.output == "-":
        raise TwillError("--json and -o cannot both be '-' (stdout); give one of them a file")
    check_outputs(files=[args.json, args.output], inputs=input_files(args))
    if args.output and python_target(args.target):
        raise TwillError("-o emits a Gluon kernel from a warp-specialized schedule; for a Triton target run "
                         "'twill inject' with the winning settings")
    triton_fn = _measured_triton_kernel(args.target) if args.measure else None
    if args.measure:
        from twill.tune.measure import require_gpu

        require_gpu()
    machine = machine_of(args)
    space, jobs, shape = _plan(args, machine)
    if not jobs:
        raise TwillError(f"every candidate was filtered out before solving ({len(space.rejected)}; "
                         f"first: {space.rejected[0][1] if space.rejected else 'none'})")
    for job in jobs:        # options no solver can take: one line now, rather than a cached error per candidate
        job.solve_options()
    progress = Progress(total=len(jobs), lines=args.progress)
    records = run_sweep(jobs, workers=args.workers, ray_address=args.ray, use_cache=args.cache,
                        progress=progress)
    shape = shape or _shape_from_results(records)
    results = rank(space.candidates, records, shape, machine)
    if args.measure and not any(r.prediction is not None for r in results):
        first = next((r.record.get("reason") for r in results if r.record.get("reason")), None)
        raise TwillError("no candidate was scheduled, nothing to measure" + (f": {first}" if first else ""))
    measured: list[dict[str, Any]] = []
    triton_measured: dict[str, Any] | None = None
    if args.measure and triton_fn is not None:
        from twill.integrations.triton.measure import measure_triton

        triton_measured = measure_triton(triton_fn, results, shape, args.measure, machine)
        measured = triton_measured["rows"]
    elif args.measure:
        from twill.tune.measure import format_measured, measure_candidates

        measured = measure_candidates(results, shape, args.measure)
    writers = []
    if args.json:
        doc = sweep_document(args.target, machine, shape, space, results, measured)
        if triton_measured is not None:
            doc["autotune_comparison"] = triton_measured["comparison"]
        writers.append(lambda: write_json_output(args.json, doc))
    if args.output:
        winner = _winner_source(results)
        writers.append(lambda: write_text_output(args.output, winner))
    write_all(writers)
    text = (f"tune {args.target} on {machine.name}, shape {shape.text()}: {len(jobs)} candidates "
            f"({progress.cached} cached)\n" + format_ranking(results, args.top, len(space.rejected)))
    if triton_measured is not None:
        from twill.integrations.triton.measure import format_triton_measured

        text += "\n\n" + format_triton_measured(triton_measured)
    elif measured:
        text += "\n\n" + format_measured(measured)
    if args.output:
        text += f"\nwinner written to {'stdout' if args.output == '-' else args.output}"
    if "-" in (args.json, args.output):
        print(text, file=sys.stderr)            # stdout carries an output
    else:
        print_output(text)
    return 0


def _winner_source(results: list[Any]) -> str:
    """The best-ranked schedule as a Gluon kernel's source."""
    from twill.codegen.gluon import emit_gluon

    best = next((r for r in results if r.prediction is not None), None)
    if best is None:
        raise TwillError("no candidate was scheduled; nothing to emit")
    return emit_gluon(best.schedule, bool(best.candidate.persistent))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``twill tune``."""
    p = sub.add_parser("tune", help="sweep tile sizes, depths and register budgets; rank by predicted time",
                       description="Solve every candidate of a target's search space in parallel (cached on "
                                   "disk), predict each schedule's kernel time on the problem shape and rank "
                                   "them. Axis flags take comma lists; an axis not given takes the kernel's "
                                   "default sweep.")
    p.add_argument("target", help="built-in kernel (gemm, flash-fwd, flash-bwd), a twill-graph/1 .json file, "
                                  "or a Triton kernel path.py:fn")
    p.add_argument("--arch", default=None, type=arch_choice,
                   help="target GPU (default h100, or the --machine file's)")
    p.add_argument("--machine", default=None, metavar="FILE",
                   help="calibrated machine model (twill-machine/1, from 'twill calibrate'): its measured rates, "
                        "clock, launch cost and memory bounds price every candidate")
    p.add_argument("--shape", default=None, help="problem size: M,N,K (GEMM) or B,H,S,D (attention); "
                                                 "default 4096,4096,4096 or 4,32,4096,head_dim")
    p.add_argument("--causal", action="store_true",
                   help="flash-fwd: a causal problem (each query attends to the keys up to its own position)")
    axes = p.add_argument_group("search axes (comma lists; built-in kernels, and the solver knobs for graphs)")
    for flag, (dest, typ) in AXIS_FLAGS.items():
        axes.add_argument(flag, dest=dest, type=_values(typ), default=None, metavar="V[,V...]")
    tri = p.add_argument_group("Triton target axes (path.py:fn)")
    tri.add_argument("--signature", default=None, help="argument types, e.g. 'a_ptr=*fp16:16,M=i32:16'")
    tri.add_argument("--constexpr", action="append", default=[], metavar="NAME=V1,V2",
                     help="values of a tl.constexpr to sweep (repeatable)")
    tri.add_argument("--num-warps", type=_values(integer_in(*NUM_WARPS_RANGE)), default=None, metavar="W[,W...]",
                     help="default 4")
    tri.add_argument("--num-stages", type=_values(integer_in(*NUM_STAGES_RANGE)), default=None,
                     metavar="S[,S...]", help="default 3")
    run = p.add_argument_group("sweep")
    run.add_argument("--workers", type=option_type("workers"), default=2,
                     help="parallel solves (processes; default 2)")
    run.add_argument("--ray", default=None, metavar="ADDRESS", help="run the sweep on the Ray cluster at ADDRESS")
    run.add_argument("--time-limit", type=option_type("time_limit"), default=DEFAULT_TIME_LIMIT, metavar="S",
                     help=f"seconds per candidate (default {DEFAULT_TIME_LIMIT:g})")
    run.add_argument("--extra-copies", type=option_type("extra_copies"), default=0, metavar="N",
                     help="copies beyond Algorithm 1's that each solve may try at an II (default 0; "
                          "docs/tuning.md says what 1 measured)")
    run.add_argument("--no-cache", dest="cache", action="store_false", help="solve everything again")
    run.add_argument("--progress", action="store_true", help="one progress line per candidate when stderr "
                                                             "is not a terminal")
    run.add_argument("--check-spills", action="store_true",
                     help="compile each candidate on the CPU and discard those whose kernel spills (slow)")
    out = p.add_argument_group("output")
    out.add_argument("--top", type=integer_in(1, MAX_COUNT), default=10, metavar="K",
                     help="rows of the ranking (default 10)")
    out.add_argument("--json", default=None, metavar="FILE",
                     help="write the whole sweep as twill-tune/1 JSON ('-' for stdout)")
    out.add_argument("-o", "--output", default=None, metavar="FILE.py",
                     help="emit the winner as a Gluon kernel ('-' for stdout)")
    out.add_argument("--measure", type=integer_in(1, MAX_COUNT), default=None, metavar="K",
                     help="compile and time the best K on the GPU (needs a CUDA GPU); a Triton target also times "
                          "every configuration with Triton's own schedule and runs @triton.autotune over them")
    p.set_defaults(func=_cmd_tune)
