"""The solver entry point: ``schedule(graph, machine, options) -> Schedule``.

Steps: validate the graph → normalize costs (paper §5.2) → lower bounds ResMII/RecMII → search → verify.
The search is either a phase-1 modulo search (``options.ws=False``; :mod:`twill.solve.strategies`: by default
II upward from ``max(ResMII, RecMII)``, at the first feasible II minimise L, every smaller II proved
infeasible) or the joint SWP + WS search of :mod:`twill.solve.joint.search` (``options.ws=True``).

Importing this package does not import OR-Tools; the solvers load it when they run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from twill.errors import GraphError, InfeasibleScheduleError
from twill.ir.graph import LoopGraph
from twill.ir.validate import validate_graph
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.schedule.vocab import Status
from twill.solve.options import SolveOptions

__all__ = ["SolveOptions", "normalized", "schedule"]


def normalized(graph: LoopGraph, options: SolveOptions) -> tuple[LoopGraph, dict[str, Any]]:
    """The graph the solver works on and the ``stats["normalization"]`` record."""
    if not options.normalize:
        return graph, {"enabled": False}
    from twill.solve.normalize import NORMALIZE_TIME_LIMIT, normalize_graph

    limit = min(NORMALIZE_TIME_LIMIT, options.time_limit / 4)
    new, norm = normalize_graph(graph, options.resolution, time_limit=limit, workers=1)
    return new, norm.to_dict()


def _elapsed(start: float) -> float:
    return time.perf_counter() - start


def _modulo_schedule(graph: LoopGraph, machine: Machine, units: dict[str, int], options: SolveOptions, *,
                     res: int, rec: int, started: float) -> Schedule:
    """The schedule without warp specialization, found by ``options.strategy``
    (:mod:`twill.solve.strategies`), with its statistics."""
    from twill.ir.bounds import length_lower_bound
    from twill.solve.strategies import STRATEGIES

    lower = max(res, rec)
    walk = STRATEGIES[options.strategy](graph, units, options, lower_bound=lower, started=started)
    result = walk.result
    proven = result.status == Status.OPTIMAL and walk.ii_lower_bound == result.ii
    stats: dict[str, Any] = {
        "search": "modulo" if options.strategy == "linear" else options.strategy, "res_mii": res,
        "rec_mii": rec, "mii": lower, "tried": [a.to_dict() for a in walk.tried], "length": result.length,
        "length_lower_bound": max(result.length_bound, length_lower_bound(graph, result.ii)),
        "stages": max(t // result.ii for t in result.starts.values()) + 1,
    }
    stats["gap"] = result.length - stats["length_lower_bound"]
    # phase 1 is always CP-SAT (twill.solve.modulo), whichever solver the joint search would use
    return Schedule(graph=graph, arch=machine.name, solver="cpsat",
                    status=Status.OPTIMAL if proven else Status.FEASIBLE, ii=result.ii,
                    ii_lower_bound=walk.ii_lower_bound, starts=dict(result.starts),
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

    The returned :class:`Schedule` refers to the (normalized) graph the solver saw, and records the digest of
    ``graph`` (:attr:`Schedule.graph_digest`); ``stats`` holds
    ``res_mii``, ``rec_mii``, ``normalization`` (raw -> normalized map, F, U, cycles per unit), the IIs tried
    and the L gap. Raises :class:`InfeasibleScheduleError` (no schedule up to max II or within the time
    limit), :class:`~twill.errors.GraphError` (malformed graph) or :class:`VerificationError` (a solver bug).
    """
    from twill.ir.bounds import rec_mii, res_mii
    from twill.ir.digest import graph_digest
    from twill.schedule.verify import verify

    started = time.perf_counter()
    validate_graph(graph, machine.units)
    unknown = sorted({name for ops in options.excluded_carries + options.excluded_orders for name in ops}
                     - set(graph.op_names))
    if unknown:
        raise GraphError(f"excluded carried sets or orders name ops that graph {graph.name!r} does not have: "
                         f"{', '.join(unknown)}")
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
            f"{options.max_ii}{options.advice('raise {}', 'max_ii')}")
    if options.ws:
        from twill.solve.joint.search import solve_joint

        result = solve_joint(work, machine, options, lower_bound=max(res, rec))
        stats = {"res_mii": res, "rec_mii": rec, **dict(result.stats), "normalization": norm}
        result = replace(result, stats=stats, solve_seconds=_elapsed(started))
    else:
        result = _modulo_schedule(work, machine, units, options, res=res, rec=rec, started=started)
        result = replace(result, stats={**dict(result.stats), "normalization": norm},
                         solve_seconds=_elapsed(started))
    result = replace(result, stats={**dict(result.stats), "proven": proof(result)}, graph_digest=graph_digest(graph))
    verify(result, machine, options)
    return result
