"""The II searches without warp specialization (``SolveOptions(ws=False)``), as strategies of one driver.

Each strategy walks IIs in its own order, solves phase 1 (:func:`twill.solve.modulo.solve_modulo`: minimise
L at one II) at each, and returns a :class:`Walk`: the schedule found, the :class:`Attempt` of every II it
tried and the smallest II not proved infeasible. ``linear`` (the default) goes upward from the lower bound
and stops at the first schedule, so its II is minimal. ``window`` (:data:`SolveOptions.strategy`, used for
Triton's sm_90 window, :func:`twill.integrations.triton.inject.solve_for_triton`) climbs in steps of 1/8 of the lower
bound, then bisects, for graphs whose infeasible IIs are hard to prove. The joint search (Algorithm 1) is
:mod:`twill.solve.joint.search`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from twill.errors import InfeasibleScheduleError
from twill.ir.graph import LoopGraph
from twill.schedule.vocab import Status
from twill.solve.attempt import Attempt
from twill.solve.options import SolveOptions


@dataclass(frozen=True)
class Walk:
    """What a strategy found: phase 1's result at the chosen II, the IIs tried and ``ii_lower_bound`` (every
    II below it is proved infeasible)."""

    result: Any
    tried: tuple[Attempt, ...]
    ii_lower_bound: int


def _elapsed(start: float) -> float:
    return time.perf_counter() - start


def max_ii_of(graph: LoopGraph, options: SolveOptions, lower_bound: int) -> int:
    """``options.max_ii``, else an II at which the loop surely schedules (every iteration alone)."""
    if options.max_ii is not None:
        return options.max_ii
    return max(lower_bound, sum(op.cycles for op in graph.ops) + sum(e.delay for e in graph.edges))


def linear(graph: LoopGraph, units: Mapping[str, int], options: SolveOptions, *, lower_bound: int,
           started: float) -> Walk:
    """II = lower_bound, lower_bound + 1, ... up to max II; at the first II with a schedule, minimise L (from
    a greedy schedule when one exists, which is kept when CP-SAT finds nothing in time). The search moves
    past an II only when it is proved infeasible, so the II found is minimal.

    Raises :class:`InfeasibleScheduleError` when every II up to max II is infeasible or the time limit runs
    out before any schedule is found.
    """
    from twill.solve.greedy import greedy_modulo
    from twill.solve.modulo import ModuloResult, solve_modulo

    max_ii = max_ii_of(graph, options, lower_bound)
    tried: list[Attempt] = []
    for ii in range(lower_bound, max_ii + 1):
        remaining = options.time_limit - _elapsed(started)
        if remaining <= 0:
            break
        options.report(f"II {options.ii_text(ii)}: solving (lower bound {lower_bound}, elapsed "
                       f"{_elapsed(started):.1f} s)")
        greedy = greedy_modulo(graph, units, ii)
        result = solve_modulo(graph, units, ii, time_limit=remaining, workers=options.modulo_workers(graph),
                              seed=options.seed, hint=greedy, prove=True)
        if not result.found and result.status != Status.INFEASIBLE and greedy is not None:
            # CP-SAT ran out of time: the greedy schedule, L unproven
            span = max(greedy[op.name] + op.cycles for op in graph.ops)
            result = ModuloResult(Status.FEASIBLE, greedy, span, False, result.length_bound, ii, result.seconds,
                                  {"by": "greedy"})
        tried.append(Attempt(ii, status=result.status, seconds=result.seconds))
        options.report(f"II {options.ii_text(ii)}: {result.status} ({result.seconds:.2f} s)")
        if result.found:
            return Walk(result, tuple(tried), ii)
        if result.status == Status.UNKNOWN:
            break
    proved = [a.ii for a in tried if a.status == Status.INFEASIBLE]
    if len(tried) and tried[-1].status == Status.INFEASIBLE and tried[-1].ii == max_ii:
        raise InfeasibleScheduleError(
            f"graph {graph.name!r} has no modulo schedule with II <= {options.ii_text(max_ii)} (II "
            f"{lower_bound}..{max_ii} proved infeasible){options.advice('raise {}', 'max_ii')}")
    upto = f"; II {proved[0]}..{proved[-1]} proved infeasible" if proved else ""
    raise InfeasibleScheduleError(
        f"no schedule of graph {graph.name!r} found within the time limit of {options.time_limit:g} s"
        f"{upto}{options.advice('raise {}', 'time_limit')}")


def _bound(low: int, infeasible: set[int]) -> int:
    """The largest II such that it and every II from ``low`` up to it are proved infeasible (``low - 1`` if
    ``low`` is not)."""
    excluded = low - 1
    while excluded + 1 in infeasible:
        excluded += 1
    return excluded


def window(graph: LoopGraph, units: Mapping[str, int], options: SolveOptions, *, lower_bound: int,
           started: float) -> Walk:
    """Upward in steps of 1/8 of the lower bound until a schedule is found, then bisection between the
    highest II not yet excluded and the best found, then every II between the bound and the best not yet
    decided (bisection skips those below an undecided one); each II gets at most ``options.window_ii_limit``
    seconds. ``ii_lower_bound`` is the smallest II not proved infeasible."""
    from twill.solve.modulo import solve_modulo

    tried: list[Attempt] = []
    infeasible: set[int] = set()

    def attempt(ii: int) -> Any:
        remaining = options.time_limit - _elapsed(started)
        if remaining <= 0.5:
            return None
        r = solve_modulo(graph, units, ii, time_limit=min(options.window_ii_limit, remaining),
                         workers=options.workers, seed=options.seed)
        tried.append(Attempt(ii, status=r.status, seconds=r.seconds))
        options.report(f"II {options.ii_text(ii)}: {r.status} ({r.seconds:.1f} s)")
        if r.status == Status.INFEASIBLE:
            infeasible.add(ii)
        return r

    best, ii, step = None, lower_bound, max(1, lower_bound // 8)
    while best is None:
        r = attempt(ii)
        if r is None:
            raise InfeasibleScheduleError(f"no schedule of graph {graph.name!r} found within the time limit of "
                                          f"{options.time_limit:g} s (window search up to II {ii})"
                                          f"{options.advice('raise {}', 'time_limit')}")
        best, ii = (r, ii) if r.found else (None, ii + step)
    best = _bisect(attempt, _bound(lower_bound, infeasible) + 1, best)
    # bisection skips the IIs below an undecided one: try every II between the bound and the answer
    for ii in range(_bound(lower_bound, infeasible) + 1, best.ii):
        if any(a.ii == ii for a in tried):
            continue
        r = attempt(ii)
        if r is None:
            break
        if r.found:
            best = r
            break
    return Walk(best, tuple(tried), _bound(lower_bound, infeasible) + 1)


def _bisect(attempt: Callable[[int], Any], lo: int, best: Any) -> Any:
    """Bisection over ``[lo, best.ii − 1]``: the smallest II ``attempt`` finds a schedule at, or ``best``."""
    hi = best.ii - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        r = attempt(mid)
        if r is None:
            break
        if r.found:
            best, hi = r, mid - 1
        else:
            lo = mid + 1
    return best


#: ``SolveOptions.strategy`` -> the strategy.
STRATEGIES: dict[str, Callable[..., Walk]] = {"linear": linear, "window": window}
