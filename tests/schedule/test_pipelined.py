"""The pipelined program Q: n = ⌈L/II⌉ copies, copy i at i·II, T = (n−1)·II + L, three sections."""

from __future__ import annotations

import pytest

from twill.kernels import build_kernel
from twill.machine import H100
from twill.schedule.pipelined import format_pipelined, pipelined_program, program_to_dict
from twill.schedule.result import Schedule, WarpGroup


def paper_schedule(**kw):
    g = build_kernel("paper-example", H100)
    fields = dict(graph=g, arch="h100", solver="manual", status="optimal", ii=2, ii_lower_bound=2,
                  starts={"S": 0, "P": 2, "O": 3})
    fields.update(kw)
    return Schedule(**fields)


def test_paper_example_program_matches_the_paper():
    q = pipelined_program(paper_schedule())
    assert (q.ii, q.length, q.copies, q.total) == (2, 4, 2, 6)     # Figure 3: T = 6
    cycles = {(x.op, x.copy): x.cycle for x in q.instances}
    assert cycles == {("S", 0): 0, ("P", 0): 2, ("O", 0): 3, ("S", 1): 2, ("P", 1): 4, ("O", 1): 5}
    assert [(x.op, x.copy) for x in q.section("prologue")] == [("S", 0)]
    # the steady state holds every op exactly once: S of the next iteration with P, O of this one
    assert sorted((x.op, x.copy) for x in q.section("steady")) == [("O", 0), ("P", 0), ("S", 1)]
    assert [(x.op, x.copy) for x in q.section("epilogue")] == [("P", 1), ("O", 1)]
    assert q.bounds("prologue") == (0, 2) and q.bounds("steady") == (2, 4) and q.bounds("epilogue") == (4, 6)


def test_text_names_sections_and_loop_iterations():
    text = format_pipelined(paper_schedule())
    assert text.splitlines()[0] == "pipelined program Q: II=2, L=4, copies n=2, T=(n-1)*II+L=6"
    assert "prologue (cycles 0-1):" in text
    assert "    t=2    P[j]  S[j+1]" in text      # same cycle: the older iteration first
    assert "    t=3    O[j]" in text
    assert "epilogue (cycles 4-5):" in text


def test_per_warp_group_text():
    s = paper_schedule(assignment={"S": 0, "O": 0, "P": 1},
                       warps=(WarpGroup(0, "mma", 4, 240, ("S", "O")), WarpGroup(1, "softmax", 4, 240, ("P",))))
    text = format_pipelined(s)
    mma = text.index("warp group 0 (mma, 4 warps):")
    soft = text.index("warp group 1 (softmax, 4 warps):")
    assert mma < soft
    assert "P[" not in text[mma:soft] and "S[" not in text[soft:]


def test_every_op_issues_once_per_copy_and_json_form():
    s = paper_schedule(starts={"S": 0, "P": 1, "O": 5}, ii=2, ii_lower_bound=2, status="feasible")
    q = pipelined_program(s)
    assert q.copies == 3 and q.total == 2 * 2 + 6
    for copy in range(q.copies):
        assert sorted(x.op for x in q.instances if x.copy == copy) == ["O", "P", "S"]
    assert len(q.section("steady")) == 3
    d = program_to_dict(q)
    assert d["sections"] == {"prologue": [0, 4], "steady": [4, 6], "epilogue": [6, 10]}
    assert len(d["instances"]) == 9
    with pytest.raises(ValueError, match="unknown section"):
        q.section("middle")
