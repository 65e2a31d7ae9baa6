"""Solver options shared by every backend and search driver."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from twill.errors import TwillError
from twill.ir.graph import LoopGraph
from twill.ir.validate import MAX_DEPTH

#: The solvers of the joint search (``--solver``); the modulo phase always uses CP-SAT.
SOLVERS = ("cpsat", "yices")

#: How a search without warp specialization walks the IIs (:mod:`twill.solve.strategies`).
STRATEGIES = ("linear", "window")

#: Seconds the ``window`` strategy gives one II at most.
WINDOW_II_LIMIT = 20.0

#: Wall-clock seconds for a whole search: room for the slowest built-in, the Blackwell flash-bwd, on a 2-core
#: host (its time: docs/performance.md, "Solve time").
DEFAULT_TIME_LIMIT = 600.0

#: Ring depth of streaming loads when neither the options nor the graph give one.
DEFAULT_STREAMING_DEPTH = 2

#: Graphs up to this many ops get one CP-SAT worker for every phase-1 (modulo) solve: those models are tiny
#: (one start per op) and the portfolio start-up of a second worker dominates them (b200 flash-fwd
#: --subtiles 1, 87 IIs: 3.8 s -> 2.6 s; a random 60-op graph --no-ws: 120 s with two workers, 4.2 s with
#: one).
SMALL_MODULO_OPS = 64

#: Inclusive ranges of the numeric options: :class:`SolveOptions` refuses a value outside them (:func:`option_problem`)
#: and the command line checks its flags against the same (:func:`twill.commands.common.option_type`). A time limit
#: must also be above its lower end.
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "time_limit": (0.0, 1e6),           # seconds; 11.6 days is no limit in practice, and finite
    "window_ii_limit": (0.0, 1e6),
    "max_ii": (1, 10**7),
    "resolution": (1, 100_000),         # U: the normalized times (and the model) grow with it
    "reg_limit": (24, 255),             # setmaxnreg's least budget .. the 255-register cap
    "max_warps": (1, 32),               # 1024 threads per CTA on every machine
    "streaming_depth": (1, MAX_DEPTH),
    "workers": (1, 256),
    "seed": (0, 2**31 - 1),             # CP-SAT's random_seed is a 32-bit integer
    "extra_copies": (0, 16),
}

#: The options in seconds (any finite number above the lower end); the others are integers.
SECONDS_OPTIONS = ("time_limit", "window_ii_limit")
#: The options that may be None (not given: the graph's or the machine's value).
_OPTIONAL = ("max_ii", "reg_limit", "max_warps", "streaming_depth")


def option_problem(name: str, value: object) -> str | None:
    """What is wrong with ``value`` for the numeric option ``name`` of :data:`OPTION_RANGES` (``must be an
    integer in [1, 256], got 100000``), or None when it is in range. Integers must be integers (not booleans or
    floats); seconds any finite number above the lower end."""
    low, high = OPTION_RANGES[name]
    if name in SECONDS_OPTIONS:
        ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
              and low < value <= high)
        return None if ok else f"must be a positive number of seconds, at most {high:g}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"must be an integer in [{low}, {high}], got {value!r}"
    return None


#: Shares of the time left that one phase may use (docs/cli.md, "Statuses, limits and exit codes"): the
#: phase-1 solve at one II, the joint relaxation and the joint solve at one II, and the UNSAT explanation.
#: The secondary objectives get whatever is left once a joint schedule is found.
PHASE_SHARES = {"modulo": 0.25, "relaxation": 0.1, "joint": 0.5, "explain": 0.2}

#: With less than this share of the time limit left and no joint schedule yet, the joint search stops the
#: II-by-II search and looks for any verified joint schedule at a larger II (greedy start times, the warp
#: assignment solved alone). The II-by-II solves take their shares of the time before this reserve.
LAST_RESORT_SHARE = 0.25


#: The flags of the solve options on the command line (``twill schedule``, ``emit``, ``report``, ``inject``;
#: :func:`twill.commands.common.add_solve_arguments`): option -> flag, for :attr:`SolveOptions.flags`.
COMMAND_FLAGS: tuple[tuple[str, str], ...] = (
    ("time_limit", "--time-limit"), ("max_ii", "--max-ii"), ("resolution", "--resolution"),
    ("reg_limit", "--reg-limit"), ("max_warps", "--max-warps"), ("cross_warp", "--no-cross-warp"),
    ("streaming_depth", "--streaming-depth"), ("extra_copies", "--extra-copies"), ("ws", "--no-ws"))


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """How to search for a schedule.

    Attributes:
        ws: solve jointly for software pipelining *and* warp specialization (paper Algorithm 1). False gives
            the phase-1 modulo schedule only. Default True.
        solver: ``cpsat`` (OR-Tools CP-SAT, compact encoding; default) or ``yices`` (the paper's
            time-indexed QF_LIA formulation; needs ``pip install twill-gpu[yices]``).
        time_limit: wall-clock seconds for the whole search. When it runs out the best schedule found so
            far is returned with status ``feasible`` and the remaining gap. Default 600.
        max_ii: give up (status ``infeasible``) past this II. ``None`` = sum of all op cycles plus all
            edge delays (normalized), an II at which the loop runs without overlap.
        normalize: run cost normalization (paper §5.2) before scheduling. Default True.
        resolution: U, the upper bound on the sum of normalized costs. Smaller = coarser, faster. Default 300.
        reg_limit: per-thread register budget of a compute warp group; ``None`` = the machine's
            default for the kernel (255-register cap, setmaxnreg granularity).
        max_warps: size of the warp pool; ``None`` = the machine's limit per CTA.
        cross_warp: allow values to cross warp groups through shared memory (paper: cross-warp spills).
            False is the paper's third UNSAT ablation.
        streaming_depth: buffers in flight for streaming TMA loads (an outer tuning knob, paper §5.3).
            ``None`` (the default) takes the kernel graph's ``attrs["streaming_depth"]``, else
            ``DEFAULT_STREAMING_DEPTH``; :meth:`for_graph` resolves it.
        workers: CP-SAT search workers. Default 2 (the CI machine's cores).
        seed: CP-SAT random seed, for reproducible tie-breaking.
        strategy: how a search without warp specialization walks the IIs: ``linear`` (upward from the lower
            bound; the default) or ``window`` (steps of 1/8 of the bound, then bisection; Triton's sm_90
            window, :func:`twill.integrations.triton.inject.solve_for_triton`). See :mod:`twill.solve.strategies`.
        window_ii_limit: seconds the ``window`` strategy gives one II at most. Default 20.
        extra_copies: copies beyond Algorithm 1's ``n = ⌈LEN(M)/I⌉`` that the joint search may use at an II
            before it moves on (docs/model.md §5, "Copies"). The paper never tries more (0); 1 also finds the
            schedules that need one more stage, such as a compute group issuing the next S ahead when the
            modulo-only schedule fits in one stage.
        excluded_carries: sets of register values that no schedule may carry all of into a later stage
            (:meth:`Schedule.carried <twill.schedule.result.Schedule.carried>`): each set needs one of its
            values consumed in its own stage. Joint search only.
            :func:`twill.tune.registers.schedule_without_spills` excludes the carried set of each schedule
            whose compiled kernel ptxas spills (docs/model.md, "Registers").
        excluded_orders: start orders of register values (:meth:`Schedule.register_order
            <twill.schedule.result.Schedule.register_order>`) that no schedule may repeat: each needs two of its
            consecutive ops started the other way round. Joint search only; the search above adds the order of a
            spilling schedule that carries nothing.
        cycles_per_unit: raw machine cycles per schedule time unit, set by ``schedule`` once the costs are
            normalized, so that progress lines and messages show raw cycles beside an II; ``None`` = raw.
        progress: called with a one-line status string while searching (current II, bound, elapsed).
        flags: the options the caller can change and how it spells them (option -> flag): the advice of a
            failed search names only these. Default :data:`COMMAND_FLAGS`; a command with fewer solve
            options (``twill tune``) passes its own, a caller with none ``()``.
    """

    ws: bool = True
    solver: str = "cpsat"
    time_limit: float = DEFAULT_TIME_LIMIT
    max_ii: int | None = None
    normalize: bool = True
    resolution: int = 300
    reg_limit: int | None = None
    max_warps: int | None = None
    cross_warp: bool = True
    streaming_depth: int | None = None
    workers: int = 2
    seed: int = 0
    strategy: str = "linear"
    window_ii_limit: float = WINDOW_II_LIMIT
    extra_copies: int = 0
    excluded_carries: tuple[tuple[str, ...], ...] = ()
    excluded_orders: tuple[tuple[str, ...], ...] = ()
    progress: Callable[[str], None] | None = field(default=None, compare=False)
    cycles_per_unit: float | None = field(default=None, compare=False)
    flags: tuple[tuple[str, str], ...] = field(default=COMMAND_FLAGS, compare=False)

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise TwillError(f"unknown solver {self.solver!r} (choose from {', '.join(SOLVERS)})")
        if self.strategy not in STRATEGIES:
            raise TwillError(f"unknown search strategy {self.strategy!r} (choose from {', '.join(STRATEGIES)})")
        if self.strategy != "linear" and self.ws:
            raise TwillError(f"the {self.strategy} strategy searches without warp specialization (ws=False)")
        for name, what in (("time_limit", "time limit"), ("window_ii_limit", "window II limit"),
                           ("max_ii", "max II"), ("resolution", "normalization resolution U"),
                           ("reg_limit", "register limit"), ("max_warps", "max warps"),
                           ("streaming_depth", "streaming depth"), ("workers", "workers"), ("seed", "seed"),
                           ("extra_copies", "extra copies")):
            value = getattr(self, name)
            problem = None if value is None and name in _OPTIONAL else option_problem(name, value)
            if problem:
                raise TwillError(f"{what} {problem}")
        for what, minimum, names in (("carried set", 1, self.excluded_carries), ("order", 2, self.excluded_orders)):
            for ops in names:
                if len(ops) < minimum or any(not isinstance(op, str) for op in ops):
                    raise TwillError(f"an excluded {what} must be a tuple of at least {minimum} op names, got {ops!r}")
        if (self.excluded_carries or self.excluded_orders) and not self.ws:
            raise TwillError("excluded carried sets and orders apply to the joint search (ws=True) only")

    def for_graph(self, graph: LoopGraph) -> "SolveOptions":
        """These options with ``streaming_depth`` resolved for ``graph`` (the graph's default, else 2)."""
        if self.streaming_depth is not None:
            return self
        depth = int(graph.attrs.get("streaming_depth", DEFAULT_STREAMING_DEPTH))
        return replace(self, streaming_depth=depth)

    def modulo_workers(self, graph: LoopGraph) -> int:
        """CP-SAT workers of a phase-1 solve: 1 for graphs up to :data:`SMALL_MODULO_OPS` ops, else
        ``workers``."""
        return 1 if len(graph.ops) <= SMALL_MODULO_OPS else self.workers

    def ii_text(self, ii: int) -> str:
        """``356 (~2054 cycles)`` when times are normalized, else ``356``."""
        if not self.cycles_per_unit or self.cycles_per_unit == 1:
            return f"{ii}"
        return f"{ii} (~{round(ii * self.cycles_per_unit)} cycles)"

    def flag(self, option: str) -> str | None:
        """How the caller spells ``option`` (``--max-ii``), or None when it cannot change it (:attr:`flags`)."""
        return dict(self.flags).get(option)

    def advice(self, text: str, option: str) -> str:
        """``text`` with the flag of ``option`` (``raise {}`` -> ``; raise --max-ii``) after a "; ", or empty when
        the caller cannot change ``option``."""
        flag = self.flag(option)
        return f"; {text.format(flag)}" if flag else ""

    def report(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)
