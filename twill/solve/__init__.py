"""The solver entry point: ``schedule(graph, machine, options) -> Schedule``.

Steps: validate the graph → normalize costs (paper §5.2) → lower bounds ResMII/RecMII → search → verify.
The search is either the phase-1 modulo search of this module (``options.ws=False``: II upward from
``max(ResMII, RecMII)``, at the first feasible II minimise L, every smaller II proved infeasible) or the joint
SWP + WS search of :mod:`twill.solve.joint` (``options.ws=True``).

Importing this package does not import OR-Tools; the solvers load it when they run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from twill.errors import InfeasibleScheduleError
from twill.ir.graph import LoopGraph
from twill.ir.validate import validate_graph
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.solve.options import SolveOptions

__all__ = ["SolveOptions", "default_max_ii", "normalized", "schedule", "search_modulo"]


def normalized(graph: LoopGraph, options: SolveOptions) -> tuple[LoopGraph, dict[str, Any]]:
    """The graph the solver works on and the ``stats["normalization"]`` record."""
    if not options.normalize:
        return graph, {"enabled": False}
    from twill.solve.normalize import NORMALIZE_TIME_LIMIT, normalize_graph

    limit = min(NORMALIZE_TIME_LIMIT, options.time_limit / 4)
    new, norm = normalize_graph(graph, options.resolution, time_limit=limit, workers=1)
    return new, norm.to_dict()


def default_max_ii(graph: LoopGraph) -> int:
    """An II at which the loop surely schedules: ``Σ_v cycles(v) + Σ_e d_e`` (every iteration runs alone)."""
    return sum(op.cycles for op in graph.ops) + sum(e.delay for e in graph.edges)


def _elapsed(start: float) -> float:
    return time.perf_counter() - start


def search_modulo(graph: LoopGraph, units: dict[str, int], options: SolveOptions, *,
                  lower_bound: int, started: float) -> tuple[Any, list[dict[str, Any]]]:
    """Phase 1: try II = lower_bound, lower_bound + 1, ... up to max II; at the first II with a schedule,
    minimise L (from a greedy schedule when one exists, which is kept when CP-SAT finds nothing in time).
    Returns the :class:`~twill.solve.modulo.ModuloResult` and the list of IIs tried.

    Raises :class:`InfeasibleScheduleError` when every II up to max II is infeasible or the time limit runs
    out before any schedule is found.
    """
    from twill.solve.greedy import greedy_modulo
    from twill.solve.modulo import ModuloResult, solve_modulo

    max_ii = options.max_ii if options.max_ii is not None else max(lower_bound, default_max_ii(graph))
    tried: list[dict[str, Any]] = []
    for ii in range(lower_bound, max_ii + 1):
        remaining = options.time_limit - _elapsed(started)
        if remaining <= 0:
            break
        options.report(f"II {options.ii_text(ii)}: solving (lower bound {lower_bound}, elapsed "
                       f"{_elapsed(started):.1f} s)")
        greedy = greedy_modulo(graph, units, ii)
        result = solve_modulo(graph, units, ii, time_limit=remaining, workers=options.modulo_workers(graph),
                              seed=options.seed, hint=greedy, prove=True)
        if not result.found and result.status != "infeasible" and greedy is not None:
            # CP-SAT ran out of time: the greedy schedule, L unproven
            span = max(greedy[op.name] + op.cycles for op in graph.ops)
            result = ModuloResult("feasible", greedy, span, False, result.length_bound, ii, result.seconds,
                                  {"by": "greedy"})
        tried.append({"ii": ii, "status": result.status, "seconds": round(result.seconds, 3)})
        options.report(f"II {options.ii_text(ii)}: {result.status} ({result.seconds:.2f} s)")
        if result.found:
            return result, tried
        if result.status == "unknown":
            break
    proved = [row["ii"] for row in tried if row["status"] == "infeasible"]
    if len(tried) and tried[-1]["status"] == "infeasible" and tried[-1]["ii"] == max_ii:
        raise InfeasibleScheduleError(
            f"graph {graph.name!r} has no modulo schedule with II <= {options.ii_text(max_ii)} (II {lower_bound}..{max_ii} "
            f"proved infeasible); raise --max-ii")
    upto = f"; II {proved[0]}..{proved[-1]} proved infeasible" if proved else ""
    raise InfeasibleScheduleError(
        f"no schedule of graph {graph.name!r} found within the time limit of {options.time_limit:g} s"
        f"{upto}; raise --time-limit")


def _modulo_schedule(graph: LoopGraph, machine: Machine, units: dict[str, int], options: SolveOptions, *,
                     res: int, rec: int, started: float) -> Schedule:
    """The phase-1 schedule (no warp specialization) with its statistics."""
    from twill.solve.bounds import length_lower_bound

    lower = max(res, rec)
    result, tried = search_modulo(graph, units, options, lower_bound=lower, started=started)
    status = "optimal" if result.status == "optimal" else "feasible"
    stats: dict[str, Any] = {
        "search": "modulo", "res_mii": res, "rec_mii": rec, "mii": lower, "tried": tried,
        "length": result.length,
        "length_lower_bound": max(result.length_bound, length_lower_bound(graph, result.ii)),
        "stages": max(t // result.ii for t in result.starts.values()) + 1,
    }
    stats["gap"] = result.length - stats["length_lower_bound"]
    # search_modulo moves past an II only when it is proved infeasible, so result.ii is a proven bound.
    return Schedule(graph=graph, arch=machine.name, solver="cpsat", status=status, ii=result.ii,
                    ii_lower_bound=result.ii, starts=dict(result.starts),
                    solve_seconds=_elapsed(started), streaming_depth=options.streaming_depth, stats=stats)


def proof(result: Schedule) -> dict[str, bool]:
    """``stats["proven"]``: ``ii`` (II proved minimal: equal to its proven lower bound), then ``length`` and
    each secondary objective (``stats["objectives"]`` of a joint search; a modulo search proves L when its
    gap is 0). The status is ``optimal`` exactly when every entry is True."""
    proven = {"ii": result.ii == result.ii_lower_bound}
    records = result.stats.get("objectives")
    if records:
        proven.update({str(r["name"]): bool(r["proven"]) for r in records})
    else:
        proven["length"] = result.stats.get("gap") == 0
    return proven


def schedule(graph: LoopGraph, machine: Machine, options: SolveOptions = SolveOptions()) -> Schedule:
    """Schedule ``graph`` on ``machine``: validate → normalize → bounds → search → verify.

    The returned :class:`Schedule` refers to the (normalized) graph the solver saw; ``stats`` holds
    ``res_mii``, ``rec_mii``, ``normalization`` (raw -> normalized map, F, U, cycles per unit), the IIs tried
    and the L gap. Raises :class:`InfeasibleScheduleError` (no schedule up to max II or within the time
    limit), :class:`~twill.errors.GraphError` (malformed graph) or :class:`VerificationError` (a solver bug).
    """
    from twill.schedule.verify import verify
    from twill.solve.bounds import rec_mii, res_mii

    started = time.perf_counter()
    validate_graph(graph, machine.units)
    options = options.for_graph(graph)
    work, norm = normalized(graph, options)
    if norm.get("enabled"):
        options = replace(options, cycles_per_unit=norm.get("cycles_per_unit"))
    units = validate_graph(work, machine.units, max_ii=options.max_ii)
    res, rec = res_mii(work, units), rec_mii(work)
    options.report(f"bounds: ResMII {res}, RecMII {rec} (elapsed {_elapsed(started):.1f} s)")
    if options.max_ii is not None and max(res, rec) > options.max_ii:
        raise InfeasibleScheduleError(
            f"graph {graph.name!r} needs II >= {max(res, rec)} (ResMII {res}, RecMII {rec}) but max II is "
            f"{options.max_ii}; raise --max-ii")
    if options.ws:
        from twill.solve.joint.search import solve_joint

        result = solve_joint(work, machine, options, lower_bound=max(res, rec))
        stats = {"res_mii": res, "rec_mii": rec, **dict(result.stats), "normalization": norm}
        result = replace(result, stats=stats, solve_seconds=_elapsed(started))
    else:
        result = _modulo_schedule(work, machine, units, options, res=res, rec=rec, started=started)
        result = replace(result, stats={**dict(result.stats), "normalization": norm},
                         solve_seconds=_elapsed(started))
    result = replace(result, stats={**dict(result.stats), "proven": proof(result)})
    verify(result, machine, options)
    return result
