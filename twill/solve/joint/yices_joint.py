"""The Yices backend behind the :class:`~twill.solve.joint.backend.JointModel` protocol: the first feasible L of
a window, objectives minimised by binary search over ``objective ≤ k`` queries, the UNSAT explanation's
relaxations as switched queries, and the decoding of a model into a :class:`JointSolution`. The time-indexed
model itself is :mod:`twill.solve.joint.yices`."""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from twill.schedule.vocab import SECONDARY, Family, Objective, Status
from twill.solve.joint.problem import JointOutcome, JointProblem, JointSolution, ModelSize, ObjectiveRecord
from twill.solve.joint.yices import (YicesModel, add_hoist_term, build_model, length_formulas, query,
                                     smem_lower_bound, switches)


def value(m: YicesModel, term: int) -> int:
    """The integer value of ``term`` in the last satisfying model."""
    return int(m.model.get_integer_value(term))


def minimize(m: YicesModel, name: str, *, deadline: float, lower: int = 0) -> tuple[int, bool]:
    """Minimise ``m.objective[name]`` below its value in the current model: one ``objective ≤ lower`` query
    (the static bound is often the optimum; with a floor in ``m.floors``, first one query assuming the
    floor's term-by-term bounds, which meets the bound with fewer arithmetic steps and settles it when its
    model's value is ``lower``), then binary search over ``objective ≤ k`` queries; finally assert the best
    value. Returns (best, proved optimal)."""
    term = m.objective[name]
    floor = m.floors.get(name, [])
    if floor and m.model is not None:
        kept, m.model = m.model, None
        if query(m, floor, timeout=deadline - time.perf_counter()) == "sat" and value(m, term) == lower:
            kept.dispose()
            return _search_below(m, term, lower, lower, deadline=deadline)
        if m.model is not None:
            m.model.dispose()
        m.model = kept
    return _search_below(m, term, value(m, term), lower, deadline=deadline, probe=True)


def _search_below(m: YicesModel, term: int, best: int, lo: int, *, deadline: float, base: Sequence[int] = (),
                  probe: bool = False) -> tuple[int, bool]:
    """Binary search for the least ``term`` in ``[lo, best]`` with ``objective ≤ k`` queries under the
    assumptions ``base`` (the first query at ``lo`` when ``probe``); the last satisfying model is kept, and
    the best value asserted. Returns (best, proved optimal: no query timed out)."""
    proven = True
    while lo < best:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            proven = False
            break
        mid = lo if probe else (lo + best) // 2
        probe = False
        kept = m.model
        m.model = None
        answer = query(m, [*base, m.leq(term, m.integer(mid))], timeout=remaining)
        if answer == "sat":
            if kept is not None:
                kept.dispose()
            best = value(m, term)
        else:
            m.model = kept
            if answer == "unsat":
                lo = mid + 1
            else:
                proven = False
                break
    m.add("objective_fixes", [m.y.Terms.arith_eq_atom(term, m.integer(best))])
    return best, proven


def decode(m: YicesModel, length: int) -> JointSolution:
    """Start times M*(v) = t iff op[v,0,t], the slot of every op (one-hot), widths and budgets, objective
    values, from the last satisfying model."""
    p, model = m.problem, m.model
    starts: dict[str, int] = {}
    group: dict[str, int] = {}
    for v in m.graph.op_names:
        times = [t for t in range(m.span) if model.get_bool_value(m.op(v, 0, t))]
        assert len(times) == 1, f"op {v!r} issues at {times} in copy 0"
        starts[v] = times[0]
        slots = [g for g in range(p.slots) if model.get_bool_value(m.opw(v, g))]
        assert len(slots) == 1, f"op {v!r} is on slots {slots}"
        group[v] = slots[0]
    widths = tuple(value(m, w) for w in m.width)
    budgets = tuple(0 if widths[g] == 0 else (p.reg_limit if model.formula_true_in_model(m.heavy[g])
                                              else p.light_regs) for g in range(p.slots))
    objectives = {"length": length, **{name: value(m, term) for name, term in m.objective.items()}}
    return JointSolution(starts, length, group, widths, budgets, objectives)


def minimize_before_length(m: YicesModel, name: str, *, deadline: float,
                           lower: int = 0) -> tuple[int, bool] | Status:
    """Minimise ``m.objective[name]`` (at least ``lower``) over every L of the window (the windows at
    L_max), then assert its best value: binary search over ``objective ≤ k`` queries. Returns (best, proved
    optimal), or ``infeasible`` / ``unknown`` when the window has no schedule."""
    p = m.problem
    base = length_formulas(m, p.length_max)
    answer = query(m, base, timeout=deadline - time.perf_counter())
    if answer != "sat":
        return Status.INFEASIBLE if answer == "unsat" else Status.UNKNOWN
    term = m.objective[name]
    return _search_below(m, term, value(m, term), lower, deadline=deadline, base=base)


def model_length(m: YicesModel) -> int:
    """L of the last satisfying model: ``max_v M*(v) + cycles(v)`` over copy 0."""
    starts = decode(m, 0).starts
    return max(starts[op.name] + op.cycles for op in m.graph.ops)


def search_lengths(m: YicesModel, *, deadline: float, report: Callable[[str], None],
                   known: int | None = None, assume: Sequence[int] = ()) -> tuple[int, bool] | Status:
    """The least L in [length_min, length_max] at the model's I under the formulas ``assume``, by queries
    assuming :func:`length_formulas` of L (:func:`~twill.solve.joint.yices.query`): first L = length_min
    (often the answer), then binary search below the best L found (``known`` when the last model already
    meets L there, else length_max); a satisfiable query moves the upper end to its model's own L (the
    formulas of L are monotone in L).
    Returns (L, proved least: no query timed out), its formulas and ``assume`` then asserted with the model
    of that L kept; ``infeasible`` (no L) or ``unknown`` (time out before any L)."""
    p = m.problem
    lo, best = p.length_min, known
    probe, proven = True, True
    while lo < (p.length_max + 1 if best is None else best):
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            proven = False
            break
        length = lo if probe else (lo + (p.length_max if best is None else best - 1)) // 2
        probe = False
        began = time.perf_counter()
        kept, m.model = m.model, None
        answer = query(m, [*assume, *length_formulas(m, length)], timeout=remaining)
        report(f"II {p.ii}, L {length} (T {p.horizon(length)}): {answer} ({time.perf_counter() - began:.2f} s)")
        if answer == "sat":
            if kept is not None:
                kept.dispose()
            best = model_length(m)
        else:
            m.model = kept
            if answer == "unknown":
                proven = False
                break
            lo = length + 1
    if best is None:
        return Status.INFEASIBLE if proven else Status.UNKNOWN
    m.add("objective_fixes", assume)
    m.add("completion", length_formulas(m, best))
    return best, proven


def stage_lower_bound(problem: JointProblem, length: int) -> int:
    """Stages at L = ``length``: some op ``v`` ends at L, so it issues at ``L − cycles(v) ≥ L − max cycles``,
    in stage ``⌊(L − max cycles) / I⌋`` or later (at least 1 stage)."""
    longest = max(op.cycles for op in problem.graph.ops)
    return max(1, (length - longest) // problem.ii + 1)


class YicesJoint:
    """The time-indexed model of a :class:`JointProblem` behind the
    :class:`~twill.solve.joint.backend.JointModel` protocol. The first solve (``length``) asks L = LEN(M),
    then binary-searches L (:func:`search_lengths`; with hoistable pairs ``unhoisted`` comes first,
    :meth:`_first`), so its L is minimal when no query times out; every later objective is minimised by
    binary search over ``objective ≤ k`` queries (:func:`minimize`) and then asserted at its best value."""

    tie_break = "first model Yices returns at the last objective's optimum"

    def __init__(self, problem: JointProblem, *, hoist: Sequence[tuple[str, str]] = (),
                 report: Callable[[str], None] = lambda line: None):
        from twill.solve._yices_loader import load_yices

        self.problem = problem
        self.yices = load_yices()
        self.model = build_model(self.yices, problem)
        self.switched: YicesModel | None = None
        if hoist:
            add_hoist_term(self.model, hoist)
        lead = (Objective.UNHOISTED,) if hoist else ()
        self.objectives = (*lead, Objective.LENGTH, *SECONDARY)
        self.report = report
        self.fixed: dict[str, int] = {}
        self.length: int | None = None

    def hint(self, starts: Mapping[str, int]) -> None:
        """Yices takes no hint: every query is a satisfiability check."""

    def hint_solution(self, solution: JointSolution) -> None:
        """Yices takes no hint."""

    def pin(self, starts: Mapping[str, int]) -> None:
        """``op[v,0,t]`` for ``t = starts[v]``."""
        self.model.add("pinned", [self.model.op(name, 0, t) for name, t in starts.items()])

    def fix(self, objective: Objective, value: int) -> None:
        """Assert ``objective = value`` (already in force for L and every objective minimised here)."""
        if objective == Objective.LENGTH or self.fixed.get(objective) == value:
            return
        self.model.add("objective_fixes", [self.model.y.Terms.arith_eq_atom(self.model.objective[objective],
                                                                            self.model.integer(value))])
        self.fixed[objective] = value

    def bound(self, objective: Objective, value: int) -> None:
        """Assert ``objective ≤ value`` (the first solve's searches run under it)."""
        self.model.add("objective_bounds", [self.model.leq(self.model.objective[objective], self.model.integer(value))])

    def solve(self, objective: Objective, *, time_limit: float, workers: int | None = None) -> JointOutcome:
        began = time.perf_counter()
        deadline = began + time_limit
        if objective == Objective.LENGTH:
            return self._first(deadline, began)
        assert self.length is not None, "the first solve of a Yices model is its length"
        lower = {Objective.STAGES: stage_lower_bound(self.problem, self.length),
                 Objective.SMEM: smem_lower_bound(self.problem)}.get(objective, 0)
        best, proven = minimize(self.model, objective, deadline=deadline, lower=lower)
        self.fixed[objective] = best
        return JointOutcome(Status.OPTIMAL if proven else Status.FEASIBLE, decode(self.model, self.length),
                            time.perf_counter() - began)

    def _first(self, deadline: float, began: float) -> JointOutcome:
        """The least L. With hoistable pairs, ``unhoisted`` comes first, at its lower bound 0 when it can:
        the L search under ``unhoisted ≤ 0``; any L it finds proves the least ``unhoisted`` 0, and its least
        L is then the least L of those schedules. Only when no L of the window allows 0 is ``unhoisted``
        minimised over the whole window (from 1), asserted, and L searched under it."""
        m, settled = self.model, []
        if Objective.UNHOISTED in self.objectives:
            least = [m.leq(m.objective[Objective.UNHOISTED], m.zero)]
            found = search_lengths(m, deadline=deadline, report=self.report, assume=least)
            hoisted: tuple[int, bool] | Status = (0, True)
            if found == Status.INFEASIBLE:
                hoisted = minimize_before_length(m, Objective.UNHOISTED, deadline=deadline, lower=1)
                if isinstance(hoisted, Status):
                    return JointOutcome(hoisted, None, time.perf_counter() - began)
                found = search_lengths(m, deadline=deadline, report=self.report, known=model_length(m))
            self.fixed[Objective.UNHOISTED] = hoisted[0]
            settled.append(ObjectiveRecord(Objective.UNHOISTED, *hoisted))
        else:
            found = search_lengths(m, deadline=deadline, report=self.report)
        if isinstance(found, Status):
            return JointOutcome(found, None, time.perf_counter() - began)
        self.length, proven = found
        return JointOutcome(Status.OPTIMAL if proven else Status.FEASIBLE, decode(m, self.length),
                            time.perf_counter() - began, tuple(settled))

    def feasible_without(self, families: tuple[Family, ...], seconds: float) -> Status:
        """One query with the switches of ``families`` off (some L of the window) on a second, switched
        model of the problem, built at the first call: the switch literals would slow every query of the
        model the search solves, and only an infeasible modulo-only II asks for an explanation."""
        if self.switched is None:
            self.switched = build_model(self.yices, self.problem, switched=True)
        answer = query(self.switched, switches(self.switched, off=families), timeout=seconds)
        return {"sat": Status.FEASIBLE, "unsat": Status.INFEASIBLE}.get(answer, Status.UNKNOWN)

    def size(self) -> ModelSize:
        """Booleans plus integers, assertions (total and per family), the grid's horizon."""
        m = self.model
        return ModelSize(m.booleans + m.integers, sum(m.counts.values()), dict(m.counts),
                         {"booleans": m.booleans, "horizon": m.span})

    def close(self) -> None:
        self.model.close()
        if self.switched is not None:
            self.switched.close()
