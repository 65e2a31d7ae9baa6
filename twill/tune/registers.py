"""Registers decided by ptxas: a schedule search that compiles each schedule it finds and searches on when the
kernel spills.

The model counts registers per thread (REGISTER LIMIT, docs/model.md "Registers"); ptxas allocates them, and the
two disagree in both directions. On the attention backward at head dim 64 with 128-row query blocks (FA3's
tile), the model's count is above the budget, yet ptxas fits the hand-built kernel without spilling; with a few
registers more for tile values, the solver's first schedule at the same count spills (docs/performance.md,
"The 128-row tile from the solver"). A per-thread count cannot tell such schedules apart, so
:func:`schedule_without_spills` asks ptxas:

1. solve at the graph's register reserve (:meth:`Machine.reserved_regs
   <twill.machine.models.Machine.reserved_regs>`); while no schedule exists, lower the reserve by one
   ``setmaxnreg`` step, down to ``floor`` (the model's count is an estimate: this lets tile values use
   registers it keeps for bookkeeping). The first time, the floor is solved first: when it has no schedule
   either, something other than the registers stands in the way, and the search ends at once;
2. render the schedule's Gluon kernel and compile it for sm_90 on the CPU (:func:`~twill.tune.spills.gluon_spills`);
3. when ptxas spills or serializes the wgmmas, or the generator cannot build the kernel, exclude what the
   schedule's register pressure comes from and solve again, up to ``attempts`` schedules:

   * the set of register values it carries into a later stage (:meth:`Schedule.carried
     <twill.schedule.result.Schedule.carried>`, :attr:`SolveOptions.excluded_carries
     <twill.solve.options.SolveOptions.excluded_carries>`): a later schedule must keep one of them in its own
     stage, so every schedule that carries that set or more is excluded;
   * when it carries none, the order its register values start in (:meth:`Schedule.register_order
     <twill.schedule.result.Schedule.register_order>`, :attr:`SolveOptions.excluded_orders
     <twill.solve.options.SolveOptions.excluded_orders>`): a later schedule must start two consecutive ones
     the other way round.

   What is excluded stays excluded if the reserve is lowered later. The search ends without a schedule when
   ``attempts`` are rejected, when a rejected schedule leaves nothing to exclude, when ptxas fails to compile
   two schedules in a row with the same error (its register allocation cannot meet the budget), or (re-raising
   the generator's error) when the generator refuses two schedules in a row for the same reason: that is its
   answer for the graph, not for a schedule.

On that backward tile there is no schedule at the default reserve; with a lower one the search compiles and
excludes until a schedule compiles cleanly (the run, and how its kernel compares with the hand-built one:
docs/performance.md, "The 128-row tile from the solver").

The first schedule whose kernel compiles cleanly is returned; its ``stats["registers"]`` records every step.
Each solve is the joint search with every other family in force, and the result is verified as usual.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from twill.errors import InfeasibleScheduleError, SpillsError, UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine
from twill.tune.spills import gluon_spills, ptxas_rejection

#: Schedules compiled at most before the search gives up.
ATTEMPTS = 16

#: Lowest register reserve the search goes down to (registers per thread).
FLOOR = 0


def schedule_without_spills(graph: LoopGraph, machine: Machine, options: Any = None, *, persistent: bool = False,
                            attempts: int = ATTEMPTS, floor: int = FLOOR) -> Any:
    """The best schedule of ``graph`` (a built-in kernel on Hopper) whose Gluon kernel ptxas compiles without
    spilling, found as the module docstring says. ``options`` are the :class:`~twill.solve.options.SolveOptions`
    of every solve (their ``progress`` hears each step). Raises :class:`InfeasibleScheduleError` (the solver's
    message at the graph's own reserve) when no schedule exists down to ``floor``,
    :class:`~twill.errors.SpillsError` (a subclass) when schedules were found but ptxas rejected every one, and
    the generator's :class:`UnsupportedFeatureError` when it refuses the graph whatever the schedule."""
    from twill.solve import schedule as solve
    from twill.solve.options import SolveOptions

    if machine.capability // 10 != 9:
        raise UnsupportedFeatureError(f"the ptxas-checked search compiles for sm_90 only, not {machine.arch}")
    options = options or SolveOptions()
    reserved = machine.reserved_regs(graph.attrs)
    steps: list[dict[str, Any]] = []
    carries, orders = tuple(options.excluded_carries), tuple(options.excluded_orders)
    refused = None     # the generator's last refusal: the same one twice is its answer for the graph
    first_error = None

    def attempt(regs: int) -> Any:
        work = replace(graph, attrs={**graph.attrs, "reserved_regs": regs})
        return solve(work, machine, replace(options, excluded_carries=carries, excluded_orders=orders))

    while True:
        try:
            found = attempt(reserved)
        except InfeasibleScheduleError as exc:
            steps.append({"reserved_regs": reserved, "ii": None, "verdict": "no schedule"})
            lower = reserved - machine.setmaxnreg_step
            if first_error is None and floor < lower:
                # before walking down, ask the floor: when even it has no schedule, the registers are not what
                # stands in the way, and the reserves between need no proof each
                first_error = str(exc)
                try:
                    attempt(floor)
                except InfeasibleScheduleError:
                    steps.append({"reserved_regs": floor, "ii": None, "verdict": "no schedule"})
                    raise InfeasibleScheduleError(f"{first_error} (nor with {floor} registers reserved)") from None
            first_error = first_error or str(exc)
            if lower < floor and all(s["ii"] is None for s in steps):
                others = ", ".join(str(s["reserved_regs"]) for s in steps[1:])
                raise InfeasibleScheduleError(first_error + (f" (nor with {others} registers reserved)" if others
                                                             else "")) from None
            if lower < floor:
                raise SpillsError(_failure(graph, steps, str(exc))) from None
            options.report(f"registers: no schedule with {reserved} reserved registers; trying {lower}")
            reserved = lower
            continue
        try:
            report = gluon_spills(found, machine, persistent)
            verdict, refused = ptxas_rejection(report), None
        except UnsupportedFeatureError as exc:
            if str(exc) == refused:
                raise
            report, verdict, refused = None, f"the generator cannot build it: {exc}", str(exc)
        steps.append({"reserved_regs": reserved, "ii": found.ii, "carried": list(found.carried()), "ptxas": report,
                      "verdict": verdict or "clean"})
        if verdict is None:
            return replace(found, stats={**found.stats, "registers": {"reserved_regs": reserved, "steps": steps}})
        rejected = sum(s["ii"] is not None for s in steps)
        if report and report.get("ptxas_error") and len(steps) > 1 and steps[-2].get("verdict") == verdict:
            raise SpillsError(_failure(graph, steps, "ptxas fails the same way on two schedules in a row: the "
                                       "register budget, not the schedule, is what it cannot meet"))
        carried, order = found.carried(), found.register_order()
        if not carried and len(order) < 2:
            if refused is not None:
                raise UnsupportedFeatureError(refused)
            raise SpillsError(_failure(graph, steps, "the last schedule carries no register value and has fewer "
                                       "than two to start in another order: nothing is left to exclude"))
        cut = f"carrying {', '.join(carried)} together" if carried else f"the order {', '.join(order)}"
        options.report(f"registers: schedule {rejected} (II {found.ii}, {reserved} reserved registers) rejected: "
                       f"{verdict}; {cut} is excluded")
        if rejected >= attempts:
            raise SpillsError(_failure(graph, steps, f"{attempts} schedules rejected"))
        if carried:
            carries += (carried,)
        else:
            orders += (order,)


def _failure(graph: LoopGraph, steps: list[dict[str, Any]], last: str) -> str:
    """One line: why the search ended without a schedule, with its steps."""
    tried = "; ".join(f"{s['reserved_regs']} reserved: " + ("no schedule" if s["ii"] is None
                                                             else f"II {s['ii']} {s['verdict']}") for s in steps)
    return f"graph {graph.name!r}: no schedule whose kernel ptxas compiles without spilling ({tried}); {last}"
