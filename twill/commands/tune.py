"""``twill tune``: sweep a target's tile sizes, depths and register budgets, rank candidates by predicted time.

Axis flags take comma lists (``--block-m 128,256``); an axis not given takes the kernel's default sweep
(its family's ``DEFAULT_AXES``, :func:`twill.tune.space.default_axes`). See docs/tuning.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from twill.commands.common import input_files, machine_of
from twill.files import check_outputs, print_output, write_all, write_json_output, write_text_output
from twill.commands.common import NUM_STAGES_RANGE, NUM_WARPS_RANGE, arch_choice, integer_in, option_type
from twill.errors import TwillError
from twill.targets import python_target
from twill.tune.run import TuneRequest, tune


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
    "--v-transpose": ("v_transpose", str),
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


def _request(args: argparse.Namespace) -> TuneRequest:
    """The :class:`~twill.tune.run.TuneRequest` the parsed arguments ask for."""
    return TuneRequest(target=args.target, time_limit=args.time_limit,
                       axes=_axes(args, [a for a, _ in AXIS_FLAGS.values()]), shape=args.shape, causal=args.causal,
                       check_spills=args.check_spills, measure=args.measure, extra_copies=args.extra_copies,
                       signature=args.signature, constexprs=tuple(args.constexpr),
                       triton_axes=_axes(args, ("num_warps", "num_stages")), loop=args.loop)


def _cmd_tune(args: argparse.Namespace) -> int:
    """Check the outputs, run the tune (plan, sweep, rank, optionally measure), write and print."""
    if args.json == "-" and args.output == "-":
        raise TwillError("--json and -o cannot both be '-' (stdout); give one of them a file")
    check_outputs(files=[args.json, args.output], inputs=input_files(args))
    if args.output and python_target(args.target):
        raise TwillError("-o emits a Gluon kernel from a warp-specialized schedule; for a Triton target run "
                         "'twill inject' with the winning settings")
    triton_kernel = None
    if args.measure:
        from twill.tune.measure import require_gpu
        from twill.tune.measure_triton import measured_triton_kernel

        triton_kernel = measured_triton_kernel(args.target)
        require_gpu()
    machine = machine_of(args)
    outcome = tune(_request(args), machine, triton_kernel=triton_kernel, workers=args.workers,
                   ray_address=args.ray, use_cache=args.cache, progress_lines=args.progress)
    writers = []
    if args.json:
        doc = outcome.document()
        writers.append(lambda: write_json_output(args.json, doc))
    if args.output:
        winner = outcome.winner_source()
        writers.append(lambda: write_text_output(args.output, winner))
    write_all(writers)
    text = outcome.report(args.top)
    if args.output:
        text += f"\nwinner written to {'stdout' if args.output == '-' else args.output}"
    if "-" in (args.json, args.output):
        print(text, file=sys.stderr)            # stdout carries an output
    else:
        print_output(text)
    return 0


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
    tri.add_argument("--loop", default=None, metavar="N|line:L",
                     help="the loop to tune when several hold dots: index N or line:L (its Python source line)")
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
