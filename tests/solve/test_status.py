"""Statuses say exactly what is proven: no time-out is reported as a proof of infeasibility, and a schedule
whose secondary objective is unproven says which one (issue 17, items 1-2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from twill.cli import main
from twill.errors import InfeasibleScheduleError, TwillError
from twill.ir.builder import GraphBuilder
from twill.kernels import build_kernel
from twill.machine import H100
from twill.schedule.report import format_report
from twill.solve import SolveOptions, schedule
from twill.solve.joint import cpsat
from twill.solve.attempt import row_proven_infeasible


def test_a_time_out_at_the_last_ii_is_not_a_proof(monkeypatch):
    def time_out(self, objective, *, time_limit, workers=None):
        return cpsat.JointOutcome("unknown", None, time_limit)

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", time_out)
    # the search falls back to the modulo-only schedule with the kernel's warp groups (tests/solve/test_fallback.py);
    # the reason is the error it would have raised without one
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(max_ii=2, time_limit=30))
    assert result.status == "feasible"
    assert result.stats["fallback"] == ("no joint schedule of graph 'paper-example' found within the time limit of "
                                        "30 s (undecided: II 2); raise --time-limit")  # docs/cli.md shows this line


def test_only_proofs_count_as_infeasible_rows():
    assert row_proven_infeasible({"ii": 3, "modulo": "infeasible"})
    assert row_proven_infeasible({"ii": 3, "modulo": "optimal", "joint": "infeasible"})
    assert row_proven_infeasible({"ii": 3, "joint": "infeasible", "by": "warp_issue_bound"})
    assert not row_proven_infeasible({"ii": 3, "modulo": "unknown"})
    assert not row_proven_infeasible({"ii": 3, "modulo": "optimal", "joint": "unknown"})
    # LEN(M) not proven minimal: the joint problem's L range is not the algorithm's, no proof
    assert not row_proven_infeasible({"ii": 3, "modulo": "feasible", "joint": "infeasible"})


def test_a_proven_infeasible_range_still_says_so():
    b = GraphBuilder("accs", units={f"U{k}": 1 for k in range(3)})
    for k in range(3):      # three 150-register 4-warp accumulators: the register file holds two such groups
        b.edge(b.op(f"acc{k}", uses={f"U{k}": 1}, cycles=1, regs=150, warps=4, attrs={"accumulator": True}),
               f"acc{k}", distance=1)
    with pytest.raises(InfeasibleScheduleError, match=r"^graph 'accs' has no joint SWP\+WS schedule with II <= 3 "
                                                      r"\(II 1..3 proved infeasible\); use smaller tiles or fewer "
                                                      r"register-holding warps \("):
        schedule(b.build(), H100, SolveOptions(normalize=False, max_ii=3, time_limit=30))


@pytest.mark.parametrize("limit", [float("nan"), float("inf"), 0.0, -1.0])
def test_time_limits_that_are_not_positive_numbers_are_refused(limit):
    with pytest.raises(TwillError, match="time limit must be a positive number"):
        SolveOptions(time_limit=limit)


def test_nan_time_limit_on_the_command_line(capsys):
    assert main(["schedule", "paper-example", "--time-limit", "nan"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("twill: error: argument --time-limit: must be a positive number") \
        and err.count("\n") == 1


def test_a_proven_schedule_records_every_proof():
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(time_limit=60))
    assert result.status == "optimal"
    assert dict(result.stats["proven"]) == {"ii": True, "length": True, "stages": True, "warps": True,
                                            "smem": True, "prologue": True}
    modulo = schedule(build_kernel("paper-example", H100), H100, SolveOptions(ws=False))
    assert dict(modulo.stats["proven"]) == {"ii": True, "length": True}


def test_an_unproven_secondary_objective_is_named(monkeypatch):
    solve = cpsat.CpsatJoint.solve

    def unproven_smem(self, objective, *, time_limit, workers=None):
        outcome = solve(self, objective, time_limit=time_limit, workers=workers)
        return replace(outcome, status="feasible") if objective == "smem" else outcome

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", unproven_smem)
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(time_limit=60))
    assert result.status == "feasible" and result.ii == result.ii_lower_bound
    assert result.stats["proven"]["smem"] is False and result.stats["proven"]["length"] is True
    assert ("status: feasible (proven: II minimal, L minimal, stages, warps, prologue; "
            "not proven within the time limit: smem)") in format_report(result, H100).splitlines()


def test_greedy_starts_give_a_schedule_when_the_joint_solve_times_out(monkeypatch):
    solve = cpsat.CpsatJoint.solve
    calls = []

    def first_solve_times_out(self, objective, *, time_limit, workers=None):
        calls.append(objective)
        if len(calls) == 1:
            return cpsat.JointOutcome("unknown", None, time_limit)
        return solve(self, objective, time_limit=time_limit, workers=workers)

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", first_solve_times_out)
    b = GraphBuilder("vl", units={"tma": 1, "A": 1})
    ld = b.op("ld", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, kind="tma_load", smem=1024)
    b.edge(ld, b.op("x", uses={"A": 1}, cycles=2, warps=4, regs=8, kind="alu"))
    result = schedule(b.build(), H100, SolveOptions(normalize=False, time_limit=60))
    row = result.stats["tried"][-1]
    assert row["ii"] == 2 and row["joint"] == "unknown" and row["fixed_starts"] == "optimal"
    assert result.status == "feasible" and result.stats["proven"]["length"] is False
    assert result.warps       # a verified joint schedule (schedule() runs the verifier)


def test_the_last_resort_finds_a_schedule_at_a_larger_ii(monkeypatch):
    from twill.solve.joint import search

    monkeypatch.setattr(search, "LAST_RESORT_SHARE", 1.01)     # the search starts short of time
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(time_limit=60))
    assert result.stats["tried"][-1]["by"] == "last_resort" and result.warps
    assert result.status == "feasible" and result.stats["proven"] == {**result.stats["proven"], "ii": False}


def test_the_ii_loop_leaves_the_last_resort_its_reserve(monkeypatch):
    """The joint solves of the II loop (and the assignment for greedy starts after a time-out) ask for at most
    their share of the time before the last resort's reserve, so a search whose joint solves time out still
    reaches the last resort (docs/cli.md, "Time budget per phase")."""
    from twill.solve.joint import search
    from twill.solve.options import PHASE_SHARES

    limits = []

    def time_out(self, objective, *, time_limit, workers=None):
        limits.append(time_limit)
        return cpsat.JointOutcome("unknown", None, 0.0)

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", time_out)
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(max_ii=3, time_limit=60))
    assert "undecided: II 2, 3" in result.stats["fallback"]     # the search's reason to fall back
    assert len(limits) >= 2                                      # the joint solve at II 2 and at II 3
    assert max(limits) <= PHASE_SHARES["joint"] * (1 - search.LAST_RESORT_SHARE) * 60


def test_normalization_that_runs_out_of_time_falls_back_to_proportional_costs():
    from twill.solve.normalize import distortion_of, proportional, solve_normalization

    costs = [3, 7, 100, 250, 1024]
    scaled = proportional(costs, 40)
    assert all(c >= 1 for c in scaled) and sum(scaled) <= 40 and scaled == sorted(scaled)
    got, distortion, proven = solve_normalization(costs, 40, time_limit=1e-9)
    assert proven is False and got == scaled and distortion == distortion_of(costs, scaled)


def test_a_modulo_search_that_times_out_keeps_the_greedy_schedule(monkeypatch):
    import twill.solve.modulo as modulo

    def time_out(graph, units, ii, **kw):
        return modulo.ModuloResult("unknown", {}, 0, False, 0, ii, 0.0)

    monkeypatch.setattr(modulo, "solve_modulo", time_out)
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(ws=False, max_ii=3))
    assert result.stats["tried"] == [{"ii": 2, "status": "feasible", "seconds": 0.0}]
    # the greedy schedule sits at the lower bound, so the II is proven; L is not
    assert result.status == "feasible" and dict(result.stats["proven"]) == {"ii": True, "length": False}


def test_the_greedy_schedule_is_a_modulo_schedule():
    from twill.schedule.result import Schedule
    from twill.schedule.verify import violations
    from twill.solve.greedy import greedy_modulo
    from randgraphs import random_graph

    graph = random_graph(40, 3)
    placed = [ii for ii in range(1, 6000, 250) if greedy_modulo(graph, dict(H100.units), ii) is not None]
    assert placed
    for ii in placed:
        starts = greedy_modulo(graph, dict(H100.units), ii)
        sched = Schedule(graph=graph, arch="h100", solver="manual", status="feasible", ii=ii, ii_lower_bound=1,
                         starts=starts)
        assert violations(sched, H100) == []
