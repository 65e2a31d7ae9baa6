"""The sound speed-ups of the joint search (docs/model.md §5) keep its answer.

Phase 1 of the CP-SAT joint search minimises the copies ``n = ⌈L/II⌉`` instead of L (``"Copies"``): the
least ``n`` must be the copies of LEN(M) at every II, on the built-in kernels and on random tile-kernel
graphs. Past the modulo-only II, the joint relaxation is solved first (``"Relaxation"``), and at the
modulo-only II it answers the UNSAT explanation's questions about the families it drops. The whole search
must return the same II, status, objective values and explanation with and without these.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
from graphs import with_register_free_op
from randgraphs import random_graph
from solved import solved_kernel

from twill.ir.validate import effective_units
from twill.kernels import build_kernel
from twill.machine import get_machine
from twill.schedule.vocab import RELAXABLE, Status
from twill.solve import SolveOptions, normalized, schedule
from twill.solve.joint import backend
from twill.solve.joint.search import RELAXATIONS, Search
from twill.solve.modulo import solve_modulo

#: (kernel, arch, kernel options) whose phase 1 is solved in about a second on the 2-core machine.
QUICK_KERNELS = [
    ("paper-example", "h100", {}),
    ("gemm", "b200", {}),
    ("flash-fwd", "h100", {"subtiles": 1}),
    ("flash-fwd", "b200", {"subtiles": 1}),
    ("flash-bwd", "h100", {}),
]

#: (kernel, arch, kernel options, solve options) of the end-to-end comparison; the slow ones take 5-60 s.
SEARCHES = [
    ("paper-example", "h100", {}, {}),
    ("gemm", "b200", {}, {}),
    ("flash-fwd", "h100", {"subtiles": 1}, {}),
    pytest.param("flash-fwd", "b200", {"subtiles": 1}, {}, marks=pytest.mark.slow),
    pytest.param("flash-fwd", "h100", {"subtiles": 2}, {}, marks=pytest.mark.slow),
    pytest.param("flash-fwd", "b200", {"subtiles": 2}, {}, marks=pytest.mark.slow),
    pytest.param("flash-bwd", "h100", {}, {}, marks=pytest.mark.slow),
    # The B200 backward (both budgets), whose search without the speed-ups takes ~10 s each, is compared with
    # the answers solved before any speed-up instead (tests/solve/test_pinned_answers.py), and its relaxation proofs and
    # UNSAT explanation are checked below.
]


def work_graph(kernel: str, arch: str, options: dict):
    """The normalized graph of a built-in kernel (what the search solves) and its machine."""
    machine = get_machine(arch)
    graph = build_kernel(kernel, machine, **options)
    return normalized(graph, SolveOptions().for_graph(graph))[0], machine


def check_copies(graph, units, iis) -> int:
    """At every II in ``iis`` where L is proved minimal, the least copies are ⌈LEN(M)/II⌉ and the proved lower
    end of L lies in ``[(n − 1)·II + 1, LEN(M)]``; returns how many IIs were compared."""
    compared = 0
    for ii in iis:
        least_length = solve_modulo(graph, units, ii, time_limit=30, workers=1)
        least_copies = solve_modulo(graph, units, ii, time_limit=30, workers=1, minimise="copies")
        if least_length.status == Status.INFEASIBLE:
            assert least_copies.status == Status.INFEASIBLE
            continue
        assert least_length.status == Status.OPTIMAL and least_copies.status == Status.OPTIMAL
        copies = math.ceil(least_length.length / ii)
        assert math.ceil(least_copies.length / ii) == copies
        assert (copies - 1) * ii < least_copies.length_bound <= least_length.length
        compared += 1
    return compared


@pytest.mark.parametrize("kernel,arch,options", QUICK_KERNELS)
def test_least_copies_are_the_copies_of_the_least_length_on_the_built_in_kernels(kernel, arch, options):
    graph, machine = work_graph(kernel, arch, options)
    units = effective_units(graph, machine.units)
    first = next(ii for ii in range(1, 100_000) if solve_modulo(graph, units, ii, time_limit=30).found)
    assert check_copies(graph, units, range(first, first + 6)) == 6


@pytest.mark.parametrize("seed", range(6))
def test_least_copies_are_the_copies_of_the_least_length_on_random_graphs(seed):
    machine = get_machine("h100")
    graph = random_graph(10, seed)
    work = normalized(graph, SolveOptions(resolution=60).for_graph(graph))[0]
    units = effective_units(work, machine.units)
    first = next(ii for ii in range(1, 100_000) if solve_modulo(work, units, ii, time_limit=30).found)
    assert check_copies(work, units, range(first, first + 8)) == 8


def test_minimise_names_an_objective():
    graph, machine = work_graph("paper-example", "h100", {})
    with pytest.raises(ValueError, match="minimise"):
        solve_modulo(graph, dict(machine.units), 2, time_limit=5, minimise="stages")


#: The search without the speed-ups: phase 1 minimises L and no relaxation is solved.
PLAIN = backend.SearchSettings("length", relaxation=False)


def answer(result) -> tuple:
    """What the speed-ups must keep: II, its proof, the status, every objective's value and proof, and the
    UNSAT explanation at the modulo-only II."""
    return (result.ii, result.ii_lower_bound, result.status,
            [(o["name"], o["value"], o["proven"]) for o in result.stats["objectives"]],
            result.stats.get("blocked_by"))


@pytest.mark.parametrize("kernel,arch,options,solve_options", SEARCHES)
def test_the_joint_search_answers_the_same_without_the_speed_ups(kernel, arch, options, solve_options,
                                                                           monkeypatch):
    machine = get_machine(arch)
    graph = build_kernel(kernel, machine, **options)
    fast = solved_kernel(kernel, arch, options, **solve_options)  # the session's shared solve
    monkeypatch.setitem(backend.SEARCH_SETTINGS, "cpsat", PLAIN)
    assert answer(schedule(graph, machine, SolveOptions(**solve_options))) == answer(fast)


@pytest.mark.parametrize("seed", range(4))
def test_the_joint_search_answers_the_same_on_random_graphs(seed, monkeypatch):
    machine = get_machine("h100")
    graph = random_graph(10, seed)
    options = SolveOptions(resolution=60, time_limit=60)
    fast = schedule(graph, machine, options)
    monkeypatch.setitem(backend.SEARCH_SETTINGS, "cpsat", PLAIN)
    assert answer(schedule(graph, machine, options)) == answer(fast)


@pytest.mark.slow
def test_the_relaxation_proves_the_b200_backward_iis_past_the_modulo_only_ii():
    """B200 flash-bwd at FA4's budget: TMEM is full and the dQ chunk must cross from its 4-warp group to the
    MMA warp (dq_load -> dp), so the relaxation alone rules out every II between the modulo-only II and the
    final one; the modulo-only II keeps its full joint solve (the UNSAT explanation)."""
    result = solved_kernel("flash-bwd", "b200", reg_limit=136)
    rows = result.stats["tried"]
    modulo_ii = result.stats["modulo_ii"]
    assert [r["ii"] for r in rows if r.get("by") == "relaxation"] == list(range(modulo_ii + 1, result.ii))
    assert all(r["joint"] == "infeasible" and r["modulo"] == "optimal" for r in rows if r.get("by") == "relaxation")
    assert result.stats["blocked_by"] == ["memory_capacity"] and result.status == "optimal"


def test_the_concurrency_free_relaxation_proves_the_h100_forward_iis_past_the_modulo_only_ii():
    """H100 flash-fwd without sub-tiling: the first relaxation has a solution at the modulo-only II, the second
    (CONCURRENCY off) has none at any II up to the final one, which keeps its joint solve; the answer equals
    the search's without relaxations (test_the_joint_search_answers_the_same_without_the_speed_ups)."""
    result = solved_kernel("flash-fwd", "h100", {"subtiles": 1})
    rows = result.stats["tried"]
    modulo_ii = result.stats["modulo_ii"]
    relaxed = [r for r in rows if r.get("by") == "relaxation"]
    assert [r["ii"] for r in relaxed] == list(range(modulo_ii + 1, result.ii))
    assert all(r["relaxed"] == sorted(RELAXATIONS[1]) and r["joint"] == "infeasible" for r in relaxed)
    assert rows[-1]["ii"] == result.ii and rows[-1]["joint"] == "optimal" and result.status == "optimal"


class StubModel:
    """A joint model whose only blocking family is ``memory_capacity`` (and, with ``first_relaxation_feasible``,
    also the families the first relaxation drops, together); records the families each ``feasible_without``
    call drops."""

    def __init__(self, first_relaxation_feasible: bool = False):
        self.problem = SimpleNamespace(ii=10, copies=2, length_max=20)
        self.asked: list[frozenset] = []
        self.first_relaxation_feasible = first_relaxation_feasible

    def feasible_without(self, families, seconds):
        self.asked.append(frozenset(families))
        if "memory_capacity" in families:
            return Status.FEASIBLE
        if self.first_relaxation_feasible and frozenset(families) == RELAXATIONS[0]:
            return Status.FEASIBLE
        return Status.INFEASIBLE


def explained(solver: str, first_relaxation_feasible: bool = False) -> tuple[Search, StubModel]:
    """The explanation of :class:`StubModel` for the paper example (no warp-issue bound: every answer is
    asked of the model)."""
    model = StubModel(first_relaxation_feasible)
    machine = get_machine("h100")
    search = Search(build_kernel("paper-example", machine), machine, SolveOptions(solver=solver),
                    started=time.perf_counter(), deadline=time.perf_counter() + 60, lower_bound=1)
    search.explain(model)
    return search, model


def test_the_explanation_asks_only_about_families_the_infeasible_relaxation_keeps():
    search, model = explained("cpsat")
    assert model.asked[0] == RELAXATIONS[0]
    assert set(model.asked[1:]) == {frozenset({f}) for f in RELAXABLE if f not in RELAXATIONS[0]}
    assert search.blocked == ["memory_capacity"] and search.relaxations == list(RELAXATIONS)


def test_a_relaxation_with_a_solution_hands_over_to_the_next_one():
    """The first relaxation has a solution at the modulo-only II: it is not solved again, the second one is
    solved from the next II on, and every family is asked about."""
    search, model = explained("cpsat", first_relaxation_feasible=True)
    assert model.asked[0] == RELAXATIONS[0]
    assert set(model.asked[1:]) == {frozenset({f}) for f in RELAXABLE}
    assert search.blocked == ["memory_capacity"] and search.relaxations == list(RELAXATIONS[1:])


def test_the_explanation_of_a_backend_without_the_relaxation_asks_about_every_family():
    search, model = explained("yices")
    assert model.asked == [frozenset({f}) for f in RELAXABLE]
    assert search.blocked == ["memory_capacity"] and not search.relaxations


class IssueStub:
    """A joint model at II 5 that has a solution exactly when WARP ISSUE is switched off; records what it is
    asked."""

    def __init__(self):
        self.problem = SimpleNamespace(ii=5, copies=2, length_max=10)
        self.asked: list[frozenset] = []

    def feasible_without(self, families, seconds):
        self.asked.append(frozenset(families))
        return Status.FEASIBLE if "warp_issue" in families else Status.INFEASIBLE


def test_the_explanation_answers_below_the_warp_issue_bound_of_the_relaxed_families_without_a_solve():
    """The register-free graph of tests/graphs.py has warp-issue bound 6 at R = 240, also without WARP COUNT
    (the register file still admits two register groups) and without any family the bound does not use; only
    the problems without REGISTER FILE (bound 3) or WARP ISSUE (no bound) are asked of the model."""
    machine = get_machine("b200")
    search = Search(with_register_free_op(), machine, SolveOptions(solver="yices"),
                    started=time.perf_counter(), deadline=time.perf_counter() + 60, lower_bound=1)
    model = IssueStub()
    search.explain(model)
    assert model.asked == [frozenset({"register_file"}), frozenset({"warp_issue"})]
    assert search.blocked == ["warp_issue"]


def two_groups_graph():
    """tests/solve/test_joint.py's two independent 4-warp ops: with ``max_warps=4`` the modulo-only II 2 is blocked by
    WARP COUNT and by WARP ISSUE, so the explanation finds a schedule for two relaxed problems in turn."""
    from twill.ir.builder import GraphBuilder

    b = GraphBuilder("issue", units={"A": 1, "B": 1})
    b.op("x", uses={"A": 1}, cycles=2, warps=4, kind="alu", attrs={"role": "x"})
    b.op("y", uses={"B": 1}, cycles=2, warps=4, kind="alu", attrs={"role": "y"})
    return b.build()


def test_the_explanation_answers_the_same_without_the_witness_hint(monkeypatch):
    """Each relaxed question of the UNSAT explanation is hinted with the schedule of the previous one that had a
    solution (:meth:`CpsatJoint.hint_solution`); without the hints the search answers the same."""
    from twill.solve.joint.cpsat import CpsatJoint

    options = SolveOptions(normalize=False, time_limit=30, max_warps=4)
    hinted = []
    original = CpsatJoint.hint_solution
    monkeypatch.setattr(CpsatJoint, "hint_solution", lambda self, s: (hinted.append(s), original(self, s)))
    with_hints = schedule(two_groups_graph(), get_machine("h100"), options)
    assert hinted and with_hints.stats["blocked_by"]
    monkeypatch.setattr(CpsatJoint, "hint_solution", lambda self, s: None)
    assert answer(schedule(two_groups_graph(), get_machine("h100"), options)) == answer(with_hints)


def test_the_least_length_of_the_relaxation_bounds_the_joint_length():
    """H100 flash-fwd without sub-tiling: at the final II the concurrency-free relaxation has a schedule; its
    least L, proved, is at most the joint problem's least L, the lower end the joint solve starts from."""
    from twill.solve.joint import search

    result = solved_kernel("flash-fwd", "h100", {"subtiles": 1})
    graph, machine = work_graph("flash-fwd", "h100", {"subtiles": 1})
    row = result.stats["tried"][-1]
    outcome = search.relaxation(graph, machine, SolveOptions().for_graph(graph),
                                effective_units(graph, machine.units), ii=result.ii, length_min=row["length_min"],
                                drops=RELAXATIONS[1], deadline=time.perf_counter() + 60)
    assert outcome.status == Status.OPTIMAL
    least = {o["name"]: o for o in result.stats["objectives"]}["length"]
    assert least["proven"] and row["length_min"] <= outcome.solution.length <= least["value"] == result.length


def feasibility_only(relaxation):
    """``relaxation`` as the search solved it before its least L: the status alone, no schedule."""
    from dataclasses import replace

    def solve(*args, **kwargs):
        outcome = relaxation(*args, **kwargs)
        if not outcome.found:
            return outcome
        return replace(outcome, status=Status.FEASIBLE, solution=None)

    return solve


@pytest.mark.slow
def test_the_triton_subtiled_attention_answers_the_same_without_the_relaxation_length(monkeypatch):
    """The Triton ``attn_fwd_subtiled`` graph on B200: the concurrency-free relaxation at the final II 341 has
    the least L of the joint problem, and its schedule hints the joint solve (seconds instead of about ten);
    with the relaxation's status alone the search answers the same."""
    pytest.importorskip("triton")
    from triton_targets import triton_graph

    from twill.solve.joint import search

    graph, machine = triton_graph("flash_fwd_subtiled", "attn_fwd_subtiled", "b200"), get_machine("b200")
    fast = schedule(graph, machine, SolveOptions())
    monkeypatch.setattr(search, "relaxation", feasibility_only(search.relaxation))
    assert answer(schedule(graph, machine, SolveOptions())) == answer(fast)
    assert fast.status == Status.OPTIMAL


@pytest.mark.parametrize("seed", range(4))
def test_the_least_copies_check_answers_as_the_minimisation(seed, monkeypatch):
    """Phase 1 first asks for a schedule with the least copies the lower end of L allows
    (:func:`twill.solve.modulo.fits_copies`); the status, copies and proved lower end of L are those of the
    minimisation over every copy count, at every II from the first feasible one on a random graph."""
    from ortools.sat.python import cp_model

    from twill.solve import modulo

    machine = get_machine("h100")
    graph = random_graph(10, seed)
    work = normalized(graph, SolveOptions(resolution=60).for_graph(graph))[0]
    units = effective_units(work, machine.units)
    first = next(ii for ii in range(1, 100_000) if solve_modulo(work, units, ii, time_limit=30).found)

    def row(result):
        return result.status, math.ceil(result.length / result.ii) if result.found else None, result.length_bound

    checked = [row(solve_modulo(work, units, ii, time_limit=30, workers=1, minimise="copies"))
               for ii in range(first - 1, first + 6)]
    monkeypatch.setattr(modulo, "fits_copies", lambda *args, **kwargs: cp_model.UNKNOWN)
    assert [row(solve_modulo(work, units, ii, time_limit=30, workers=1, minimise="copies"))
            for ii in range(first - 1, first + 6)] == checked
