"""The independent verifier rejects corrupted schedules and names the violated constraint."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from twill.errors import VerificationError
from twill.ir import GraphBuilder
from twill.kernels import build_kernel
from twill.machine import H100
from twill.schedule.result import Schedule
from twill.schedule.verify import modulo_usage, verify, violations


def sched(starts, ii=2, graph=None, **kw):
    graph = graph or build_kernel("paper-example", H100)
    fields = dict(graph=graph, arch="h100", solver="manual", status="feasible", ii=ii, ii_lower_bound=ii,
                  starts=starts)
    fields.update(kw)
    return Schedule(**fields)


def test_valid_schedule_has_no_violations():
    s = sched({"S": 0, "P": 2, "O": 3}, status="optimal")
    assert violations(s, H100) == []
    verify(s, H100)


def test_dependence_violation_is_named():
    s = sched({"S": 0, "P": 0, "O": 3})
    found = violations(s, H100)
    assert found == ["DEPENDENCE: S->P (d=1, δ=0) violated: t(P)=0 < t(S)+1=1"]
    with pytest.raises(VerificationError, match="DEPENDENCE: S->P") as info:
        verify(s, H100)
    assert info.value.violations == found


def test_loop_carried_dependence_violation_is_named():
    b = GraphBuilder("carry", units={"u": 1})
    b.op("a", uses={"u": 1}, cycles=1)
    b.edge("a", "a", delay=5, distance=1)
    s = sched({"a": 0}, ii=3, graph=b.build())
    assert violations(s, H100) == ["BOUND: II 3 is below the lower bound 5 (ResMII 1, RecMII 5)",
                                   "DEPENDENCE: a->a (d=5, δ=1) violated: t(a)+1·3=3 < t(a)+5=5"]


def test_modulo_capacity_violation_names_unit_residue_and_ops():
    s = sched({"S": 0, "P": 1, "O": 2})                   # S and O both at residue 0 on TC
    assert violations(s, H100) == ["CAPACITY: unit 'TC' at residue 0 (mod II=2) holds 2 > capacity 1: S, O"]


def test_graph_units_override_machine_units():
    s = sched({"S": 0, "P": 1, "O": 3})
    assert "TC" not in H100.units and violations(s, H100) == []
    usage = modulo_usage(s)
    assert usage["TC"] == {0: {"S": 1}, 1: {"O": 1}}


def test_unknown_unit_is_reported():
    b = GraphBuilder("nounits")
    b.op("a", uses={"warp_drive": 1}, cycles=1)
    s = sched({"a": 0}, ii=1, graph=b.build())
    assert violations(s, H100)[0].startswith("UNIT: unit 'warp_drive' used by a does not exist")


def test_negative_start_is_reported():
    s = sched({"S": -1, "P": 1, "O": 3})
    assert violations(s, H100) == ["START: op 'S' starts at -1 < 0"]


def test_status_and_bound_consistency():
    s = sched({"S": 0, "P": 2, "O": 3}, ii=2, ii_lower_bound=3)
    assert violations(s, H100) == ["BOUND: II 2 is below the proven lower bound 3"]
    s = sched({"S": 0, "P": 2, "O": 4}, ii=3, ii_lower_bound=2, status="optimal")
    assert violations(s, H100) == ["STATUS: status 'optimal' but II 3 > lower bound 2"]
    s = sched({"S": 0, "P": 2, "O": 3}, stats={"length": 7, "stages": 5})
    assert violations(s, H100) == ["BOUND: recorded length L=7 but the start times give L=4",
                                   "BOUND: recorded 5 stages but the start times give 2"]


def test_every_corruption_of_a_solved_schedule_is_caught():
    from twill.solve import SolveOptions, schedule

    good = schedule(build_kernel("paper-example", H100), H100, SolveOptions(ws=False))
    assert violations(good, H100) == []
    caught = 0
    for name in good.graph.op_names:
        for delta in (-1, 1):
            starts = dict(good.starts)
            starts[name] += delta
            if starts[name] < 0:
                continue
            bad = replace(good, starts=starts, stats={})
            found = violations(bad, H100)
            if found:
                caught += 1
                assert found[0].split(":")[0] in ("DEPENDENCE", "CAPACITY")
    # L = 4 at II = 2 leaves one cycle of slack at most: most one-cycle moves break a dependence or the TC
    assert caught >= 3


def test_verifier_imports_no_solver_code():
    code = ("import sys, twill.schedule.verify; "
            "bad = [m for m in sys.modules if m.startswith(('ortools', 'twill.solve'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_warp_families_are_checked_when_there_is_an_assignment():
    pytest.importorskip("twill.schedule.verify_ws")
    from twill.solve import SolveOptions, schedule

    good = schedule(build_kernel("paper-example", H100), H100, SolveOptions(ws=True))
    assert good.assignment and violations(good, H100) == []
    bad = replace(good, assignment={**good.assignment, "P": 99})
    found = violations(bad, H100)
    assert any(v.startswith("WARP UNIQUENESS: op 'P'") for v in found)
    with pytest.raises(VerificationError, match="WARP UNIQUENESS"):
        verify(bad, H100)
