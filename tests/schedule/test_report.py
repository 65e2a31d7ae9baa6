"""The plain-text report."""

from __future__ import annotations

from twill.kernels import build_kernel
from twill.machine import H100
from twill.schedule.report import format_report
from twill.schedule.result import Schedule, WarpGroup
from twill.solve import SolveOptions, schedule


def test_report_of_a_solved_schedule():
    s = schedule(build_kernel("paper-example", H100), H100, SolveOptions(ws=False))
    text = format_report(s, H100)
    lines = text.splitlines()
    assert lines[0] == "schedule of 'paper-example' on h100 (solver cpsat)"
    assert "status: optimal" in lines
    assert "II: 2    II lower bound 2 (ResMII 2, RecMII 1)" in lines
    assert any(line.startswith("L: 4    stages: 2    copies: 2") for line in lines)
    assert any(line.startswith("normalization: U=300, distortion F=0") for line in lines)
    assert "IIs tried: 2 optimal" in lines
    assert "unit utilization: EXP 50%, TC 100%" in lines
    table = lines[lines.index("ops (steady-state order):") + 1]
    assert table.split() == ["op", "kind", "start", "stage", "residue", "order", "cycles"]
    assert any(line.split()[:1] == ["O->O"] for line in lines)      # buffer depth table
    assert "warp groups" not in text and "blocked_by" not in text


def test_report_with_warps_blocked_by_and_normalization_off():
    g = build_kernel("paper-example", H100)
    s = Schedule(graph=g, arch="h100", solver="manual", status="feasible", ii=2, ii_lower_bound=2,
                 starts={"S": 0, "P": 2, "O": 3}, assignment={"S": 0, "O": 0, "P": 1},
                 warps=(WarpGroup(0, "mma", 4, 240, ("S", "O")), WarpGroup(1, "softmax", 4, 240, ("P",))),
                 stats={"normalization": {"enabled": False}, "blocked_by": ["II 1: CAPACITY of TC"]})
    text = format_report(s, H100)
    assert "normalization: off (raw cycle counts)" in text
    assert "  0 mma         4 warps, 240 regs: S[s0] -> O[s1]" in text
    assert "  1 softmax     4 warps, 240 regs: P[s1]" in text
    assert "blocked_by:\n  II 1: CAPACITY of TC" in text
    header = next(line for line in text.splitlines() if line.strip().startswith("op "))
    assert header.split()[-1] == "warp"


def test_tried_iis_with_the_same_outcome_are_merged_into_ranges():
    g = build_kernel("paper-example", H100)
    tried = ([{"ii": 7, "modulo": "optimal", "joint": "infeasible"}]
             + [{"ii": ii, "joint": "infeasible", "by": "warp_issue_bound"} for ii in (8, 9, 10)]
             + [{"ii": 11, "modulo": "optimal", "joint": "infeasible"},
                {"ii": 13, "modulo": "optimal", "joint": "infeasible"},
                {"ii": 14, "modulo": "optimal", "joint": "optimal"}])
    s = Schedule(graph=g, arch="h100", solver="manual", status="optimal", ii=14, ii_lower_bound=14,
                 starts={"S": 0, "P": 1, "O": 2}, stats={"tried": tried})
    assert ("IIs tried: 7 (modulo optimal, joint infeasible), 8-10 (joint infeasible, by warp_issue_bound), "
            "11 (modulo optimal, joint infeasible), 13 (modulo optimal, joint infeasible), "
            "14 (modulo optimal, joint optimal)") in format_report(s, H100).splitlines()


def test_extra_copies_rows_say_their_copies_and_what_they_asked_for():
    g = build_kernel("paper-example", H100)
    tried = [{"ii": 5, "modulo": "optimal", "joint": "infeasible", "copies": 1},
             {"ii": 5, "joint": "optimal", "by": "extra_copies", "copies": 2},
             {"ii": 5, "joint": "optimal", "by": "extra_copies", "copies": 3, "unhoisted_below": 1}]
    s = Schedule(graph=g, arch="h100", solver="manual", status="optimal", ii=5, ii_lower_bound=5,
                 starts={"S": 0, "P": 1, "O": 2}, stats={"tried": tried})
    assert ("IIs tried: 5 (modulo optimal, joint infeasible), 5 (joint optimal, by extra_copies: 2 copies), "
            "5 (joint optimal, by extra_copies: 3 copies, unhoisted < 1)") in format_report(s, H100).splitlines()


def test_raw_cycles_beside_every_normalized_time():
    from twill.kernels import build_kernel
    from twill.machine.models import H100
    from twill.schedule.report import format_report
    from twill.solve import SolveOptions, schedule

    messages: list[str] = []
    result = schedule(build_kernel("gemm", H100), H100, SolveOptions(progress=messages.append))
    scale = result.stats["normalization"]["cycles_per_unit"]
    text = format_report(result, H100)
    raw_ii = round(result.ii * scale)
    assert f"II: {result.ii} (~{raw_ii} cycles)" in text
    assert f"IIs tried: {result.ii} = ~{raw_ii} cycles (" in text
    header = next(line for line in text.splitlines() if line.strip().startswith("op "))
    assert "~raw start" in header
    mma_row = next(line.split() for line in text.splitlines() if line.strip().startswith("mma "))
    assert int(mma_row[3]) == round(result.start("mma") * scale)
    assert any(m.startswith(f"II {result.ii} (~{raw_ii} cycles):") for m in messages)
