"""Argument helpers shared by the command modules: the target and solver arguments, their argparse types, and
what the parsed arguments ask for (:class:`~twill.targets.TargetOptions`, ``SolveOptions``, the machine, the
files a command reads).

The target (a built-in kernel, a graph file, a Triton or TileLang kernel) is described and resolved in
:mod:`twill.targets`; output files are checked and written through :mod:`twill.files`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from twill.errors import TwillError
from twill.machine.models import MACHINES, Machine, get_machine
from twill.targets import TargetOptions, target_file

#: Static kernel options: CLI flag -> (keyword of ``build_kernel``, type).
KERNEL_FLAGS: dict[str, tuple[str, type]] = {
    "--subtiles": ("subtiles", int),
    "--head-dim": ("head_dim", int),
    "--block-m": ("block_m", int),
    "--block-n": ("block_n", int),
    "--block-k": ("block_k", int),
    "--dtype": ("dtype", str),
    "--causal": ("causal", bool),
    "--kv-heads": ("kv_heads", int),
    "--v-transpose": ("v_transpose", str),
}

def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The positional target, ``--arch``, the static kernel options and the Triton target options."""
    parser.add_argument("target", help="built-in kernel name (see 'twill kernels'), a twill-graph/1 .json "
                                       "file, or a Triton or TileLang kernel path.py:fn")
    parser.add_argument("--arch", default=None, type=arch_choice,
                        help=f"target GPU: {', '.join(MACHINES)} (default h100, or the --machine file's)")
    parser.add_argument("--machine", default=None, metavar="FILE",
                        help="calibrated machine model (twill-machine/1, written by 'twill calibrate'); its "
                             "measured rates replace the datasheet costs")
    group = parser.add_argument_group("static kernel options (built-in kernels only)")
    for flag, (dest, typ) in KERNEL_FLAGS.items():
        if typ is bool:
            group.add_argument(flag, dest=dest, action="store_const", const=True, default=None,
                               help=f"kernel option {dest}")
        else:
            group.add_argument(flag, dest=dest, type=typ, default=None, help=f"kernel option {dest}")
    tri = parser.add_argument_group("Triton target options (path.py:fn targets only)")
    tri.add_argument("--signature", default=None,
                     help="types of the non-constexpr arguments, NAME=TYPE or TYPE in argument order; ':16' "
                          "marks divisibility by 16, e.g. 'a_ptr=*fp16:16,M=i32:16' or '*fp16:16,i32:16'")
    tri.add_argument("--constexpr", action="append", default=[], metavar="NAME=VAL",
                     help="a tl.constexpr value (repeatable), read by the Triton frontend")
    tri.add_argument("--num-warps", type=integer_in(*NUM_WARPS_RANGE), default=None, help="Triton num_warps")
    tri.add_argument("--num-stages", type=integer_in(*NUM_STAGES_RANGE), default=None, help="Triton num_stages")
    tri.add_argument("--loop", default=None, metavar="N|line:L",
                     help="the loop to schedule: index N (0 = first scf.for) or line:L (its Python source line); "
                          "without it, schedule and inject take every innermost loop that holds a dot, the other "
                          "commands need it when several do")
    tri.add_argument("--config", type=_config_choice, default=None, metavar="N|all",
                     help="which @triton.autotune config to compile (its constexprs, num_warps, num_stages); "
                          "twill inject also takes 'all': schedule every config, inject the fastest in the model")
    tl = parser.add_argument_group("TileLang target options (path.py:fn whose file imports tilelang)")
    tl.add_argument("--arg", dest="tl_args", action="append", default=[], metavar="NAME=VALUE",
                    help="an argument of the kernel factory (repeatable; a Python literal, else text)")


#: Ranges (inclusive) of the Triton options ``--num-warps`` (warps per CTA) and ``--num-stages``.
NUM_WARPS_RANGE = (1, 32)
NUM_STAGES_RANGE = (1, 64)


def arch_choice(text: str) -> str:
    """The argparse type of ``--arch``: a built-in machine's name, case-insensitively (an empty name is an
    error, not the default)."""
    name = text.lower()
    if name not in MACHINES:
        raise argparse.ArgumentTypeError(f"unknown architecture {text!r} (known: {', '.join(MACHINES)})")
    return name


def integer_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type reading an integer in ``[low, high]``; anything else is a one-line usage error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def option_type(name: str) -> Callable[[str], Any]:
    """The argparse type of the numeric solve option ``name``: the text read as its number (an integer, or
    seconds for a time limit) and checked against :data:`twill.solve.options.OPTION_RANGES` by
    :func:`~twill.solve.options.option_problem`, the check :class:`~twill.solve.options.SolveOptions` makes."""
    from twill.solve.options import SECONDS_OPTIONS, option_problem

    seconds = name in SECONDS_OPTIONS

    def parse(text: str) -> Any:
        value: Any = text
        try:
            value = float(text) if seconds else int(text)
        except ValueError:
            pass
        problem = option_problem(name, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = "seconds" if seconds else "integer"
    return parse


def _config_choice(text: str) -> int | str:
    """``--config``: a config index, or ``all``."""
    if text == "all" or text.isdigit():
        return text if text == "all" else int(text)
    raise argparse.ArgumentTypeError(f"--config takes a config index N or 'all', got {text!r}")


class DeprecatedAlias(argparse.Action):
    """An old spelling of option ``new``: stores like it and prints ``twill: warning: OLD is deprecated; use
    NEW`` on stderr."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"twill: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_solve_arguments(parser: argparse.ArgumentParser) -> None:
    """Solver options, mapped onto :class:`~twill.solve.options.SolveOptions` by :func:`solve_options`."""
    from twill.solve.options import DEFAULT_TIME_LIMIT, SOLVERS

    g = parser.add_argument_group("solver options")
    g.add_argument("--no-ws", dest="ws", action="store_false",
                   help="modulo schedule only, no warp specialization")
    g.add_argument("--time-limit", type=option_type("time_limit"), default=DEFAULT_TIME_LIMIT, metavar="S",
                   help=f"wall-clock seconds for the whole search (default {DEFAULT_TIME_LIMIT:g})")
    g.add_argument("--max-ii", type=option_type("max_ii"), default=None, metavar="N", help="give up past this II")
    g.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="schedule raw cycle counts (no cost normalization)")
    g.add_argument("--resolution", type=option_type("resolution"), default=300, metavar="U",
                   help="cost-normalization budget U = max sum of normalized costs (default 300)")
    g.add_argument("--solver", choices=SOLVERS, default="cpsat",
                   help="solver of the warp-specialization search (default cpsat; the modulo phase always "
                        "uses CP-SAT)")
    g.add_argument("--backend", dest="solver", choices=SOLVERS, action=DeprecatedAlias, new="--solver",
                   help=argparse.SUPPRESS)
    g.add_argument("--reg-limit", type=option_type("reg_limit"), default=None, metavar="R",
                   help="per-thread register budget of a compute warp group")
    g.add_argument("--max-warps", type=option_type("max_warps"), default=None, metavar="W",
                   help="size of the warp pool")
    g.add_argument("--no-cross-warp", dest="cross_warp", action="store_false",
                   help="forbid values crossing warp groups (paper's ablation)")
    g.add_argument("--streaming-depth", type=option_type("streaming_depth"), default=None, metavar="D",
                   help="buffers in flight for streaming TMA loads (default: the kernel's, else 2)")
    g.add_argument("--extra-copies", type=option_type("extra_copies"), default=0, metavar="N",
                   help="copies beyond Algorithm 1's that the search may try at an II before moving on "
                        "(default 0, the paper's; 1 finds schedules that need one more stage)")
    g.add_argument("--workers", type=option_type("workers"), default=2, help="CP-SAT search workers (default 2)")
    g.add_argument("--seed", type=option_type("seed"), default=0, help="CP-SAT random seed (default 0)")
    g.add_argument("--progress", action="store_true",
                   help="print progress lines on stderr even when it is not a terminal (on a terminal: always)")


def progress_printer(force: bool = False) -> Callable[[str], None] | None:
    """A progress callback printing to stderr, or None when stderr is not a terminal and ``force`` is off."""
    if not (force or sys.stderr.isatty()):
        return None

    def show(message: str) -> None:
        print(f"twill: {message}", file=sys.stderr, flush=True)

    return show


def solve_options(args: argparse.Namespace) -> Any:
    """The :class:`~twill.solve.options.SolveOptions` that the parsed solver arguments ask for."""
    from twill.solve.options import SolveOptions

    return SolveOptions(ws=args.ws, solver=args.solver, time_limit=args.time_limit, max_ii=args.max_ii,
                        normalize=args.normalize, resolution=args.resolution, reg_limit=args.reg_limit,
                        max_warps=args.max_warps, cross_warp=args.cross_warp,
                        streaming_depth=args.streaming_depth, workers=args.workers, seed=args.seed,
                        extra_copies=args.extra_copies, progress=progress_printer(args.progress))


def machine_of(args: argparse.Namespace) -> Machine:
    """The machine ``--machine FILE`` (calibrated) or ``--arch`` (built-in, default h100) names."""
    if getattr(args, "machine", None):
        from twill.machine.calibration import load_machine

        machine = load_machine(args.machine)
        if args.arch and args.arch != machine.name:
            raise TwillError(f"--arch {args.arch} contradicts --machine {args.machine} (a {machine.name} model)")
        return machine
    return get_machine(args.arch or "h100")


def kernel_options_given(args: argparse.Namespace) -> dict[str, Any]:
    """The static kernel options that were given on the command line."""
    return {dest: getattr(args, dest) for dest, _ in KERNEL_FLAGS.values() if getattr(args, dest, None) is not None}


def target_options(args: argparse.Namespace) -> TargetOptions:
    """The :class:`~twill.targets.TargetOptions` given by the target arguments
    (:func:`add_target_arguments`)."""
    return TargetOptions(kernel=kernel_options_given(args), signature=args.signature,
                         constexprs=tuple(args.constexpr), num_warps=args.num_warps, num_stages=args.num_stages,
                         loop=args.loop, config=args.config, tl_args=tuple(args.tl_args))


def input_files(args: argparse.Namespace) -> list[str]:
    """The files a command reads, as named on its command line: the target's file (a graph, a Triton or
    TileLang source, a TTGIR dump), ``--machine``, ``--schedule``, ``--from-raw`` and ``--clock-fit``."""
    names = [getattr(args, dest, None) for dest in ("machine", "schedule", "from_raw", "clock_fit")]
    target = getattr(args, "target", None)
    if target:
        names.append(target_file(target))
    return [name for name in names if name and name != "-" and os.path.isfile(name)]
