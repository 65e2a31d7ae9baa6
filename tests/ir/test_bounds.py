"""ResMII, RecMII, the length lower bound and the joint problem's warp-issue bound."""

from __future__ import annotations

import json
import time
from pathlib import Path

from graphs import with_register_free_op
from solved import solved_kernel

from twill.ir import GraphBuilder
from twill.kernels import build_kernel
from twill.ir.validate import effective_units
from twill.machine import B200, H100, get_machine
from twill.schedule.vocab import Status
from twill.solve import SolveOptions, normalized, schedule
from twill.solve.joint.search import issue_bound, new_model, phase_one
from twill.ir.bounds import (asap_starts, dependence_closure, length_lower_bound, rec_mii, res_mii,
                                 warp_issue_bound)


def test_paper_example_bounds():
    g = build_kernel("paper-example", H100)
    assert res_mii(g, dict(g.units)) == 2          # S and O share the tensor core
    assert rec_mii(g) == 1                         # O -> O, d=1, δ=1


def test_res_mii_rounds_up_by_capacity():
    b = GraphBuilder("res", units={"alu": 2, "tc": 1})
    b.op("a", uses={"alu": 1}, cycles=3)
    b.op("b", uses={"alu": 1}, cycles=2)
    b.op("c", uses={"tc": 1}, cycles=2)
    g = b.build()
    assert res_mii(g, dict(g.units)) == 3          # ⌈5/2⌉ = 3 > 2


def test_rec_mii_is_max_over_cycles_of_ceiling_ratio():
    b = GraphBuilder("rec", units={"u": 1})
    for n in "abcd":
        b.op(n, uses={}, cycles=1)
    b.edge("a", "b", delay=3)
    b.edge("b", "a", delay=4, distance=2)          # ⌈7/2⌉ = 4
    b.edge("c", "d", delay=5)
    b.edge("d", "c", delay=0, distance=3)          # ⌈5/3⌉ = 2
    assert rec_mii(b.build()) == 4


def test_rec_mii_without_recurrence_is_one():
    b = GraphBuilder("dag", units={"u": 1})
    b.op("a", uses={"u": 1}, cycles=1)
    b.op("b", uses={"u": 1}, cycles=1)
    b.edge("a", "b", delay=9)
    assert rec_mii(b.build()) == 1


def test_asap_and_length_bound():
    g = build_kernel("paper-example", H100)
    assert asap_starts(g, 2) == {"S": 0, "P": 1, "O": 2}
    assert length_lower_bound(g, 2) == 3
    b = GraphBuilder("tight", units={"u": 1})
    b.op("x", uses={}, cycles=1)
    b.edge("x", "x", delay=5, distance=1)
    assert asap_starts(b.build(), 4) is None       # below RecMII = 5


def register_ops(width: int, busy: tuple[int, ...], *, loads: int = 0):
    b = GraphBuilder("issue", units={"alu": 4, "tma": 1})
    for k, cycles in enumerate(busy):
        b.op(f"v{k}", uses={"alu": 1}, cycles=cycles, regs=64, warps=width)
    for k in range(loads):
        b.op(f"load{k}", uses={"tma": 1}, cycles=1, warps=1, variable_latency=True)
    return b.build()


LIMITS = {"light_regs": 24, "regs_per_sm": 65536, "max_warps": 32, "slots": 8}


def test_warp_issue_bound_counts_the_register_groups_the_register_file_admits():
    graph = register_ops(8, (5, 5))
    one = warp_issue_bound(graph, reg_limit=240, **LIMITS)          # 2048 / (240·8) -> one 8-warp group
    assert (one.ii, one.groups, one.busy) == (10, 1, 10)
    two = warp_issue_bound(graph, reg_limit=120, **LIMITS)          # 2048 / (120·8) -> two
    assert (two.ii, two.groups) == (5, 2)
    light = warp_issue_bound(register_ops(4, (3, 3, 3), loads=1), reg_limit=240, **LIMITS)
    assert light.groups == (2048 - 24) // (240 * 4) and light.ii == 5   # ⌈9/2⌉, W_vl's light warp counted
    assert warp_issue_bound(register_ops(4, (3,)), reg_limit=240, **{**LIMITS, "slots": 2}).ii == 3
    assert warp_issue_bound(register_ops(8, (1,)), reg_limit=240, **LIMITS) is None


def test_joint_search_skips_iis_below_the_warp_issue_bound_after_the_modulo_ii():
    """B200 flash-fwd without sub-tiling: at budget 160 one 8-warp register group fits, so the II is at
    least the busy sum of its register ops; the modulo-only II gets phase 1 and the UNSAT explanation but no
    joint solve, and the explanation names what the search without the bound named."""
    result = solved_kernel("flash-fwd", "b200", {"subtiles": 1})
    tried = result.stats["tried"]
    assert tried[0]["ii"] == result.stats["modulo_ii"] and tried[0]["modulo"] == "optimal"
    skipped = [row for row in tried if row.get("by") == "warp_issue_bound"]
    assert skipped[0] is tried[0] and all(row["joint"] == "infeasible" for row in skipped)
    bound = skipped[0]["bound"]
    assert bound["groups"] == 1 and bound["warps"] == 8
    assert [row["ii"] for row in skipped] == list(range(tried[0]["ii"], bound["ii"]))
    assert bound["ii"] <= result.ii and result.status == "optimal"
    assert result.stats["blocked_by"] == ["register_file+cross_warp_spills"]


def test_dependence_closure_is_the_longest_path_at_the_ii():
    b = GraphBuilder("paths", units={"alu": 1})
    for name in "abc":
        b.op(name, uses={"alu": 1}, cycles=1)
    b.edge("a", "b", delay=3)
    b.edge("b", "c", delay=4)
    b.edge("a", "c", delay=5)
    b.edge("c", "a", delay=2, distance=1)
    g = b.build()
    closure = dependence_closure(g, 10)
    assert closure[("a", "c")] == 7                # through b (3 + 4) beats the direct edge (5)
    assert closure[("c", "b")] == 2 - 10 + 3       # around the back edge
    assert closure[("a", "a")] == 9 - 10           # the recurrence's weight, not positive at II 10
    assert dependence_closure(g, rec_mii(g) - 1) is None


def test_warp_issue_bound_counts_register_free_ops_that_no_light_group_can_take():
    """At R = 240 the register file holds W_vl and the MMA warp (24 each) and two 4-warp groups at 240
    (1920): 80 left, too few for a light 4-warp group (96), so the register-free op shares the two register
    groups: ⌈12 / 2⌉ = 6, not ⌈9 / 2⌉ = 5. At R = 232 a light group fits and the register ops bind again."""
    bound = warp_issue_bound(with_register_free_op(), reg_limit=240, **LIMITS)
    assert (bound.ii, bound.groups, bound.busy) == (6, 2, 12)
    assert warp_issue_bound(with_register_free_op(), reg_limit=232, **LIMITS).ii == 5


def test_the_register_free_bound_prunes_only_infeasible_iis():
    """The joint search skips II 5 by the bound and proves II 6 optimal; the joint problem at II 5 (solved
    on its own, copies from phase 1) has no solution, so the skip is sound."""
    graph = with_register_free_op(busy=30)
    options = SolveOptions(normalize=False, time_limit=60).for_graph(graph)
    result = schedule(graph, B200, options)
    skipped = [row["ii"] for row in result.stats["tried"] if row.get("by") == "warp_issue_bound"]
    assert result.status == "optimal" and result.ii == 60 and skipped and max(skipped) == 59
    units = effective_units(graph, B200.units)
    mod, _ = phase_one(graph, units, options, 59, deadline=time.perf_counter() + 30, previous=None, prove=True)
    model = new_model(graph, B200, options, units, ii=59, length_min=mod.length_bound)
    assert model.solve(None, time_limit=30).status == Status.INFEASIBLE


def test_warp_issue_bound_never_exceeds_a_proven_ii_of_the_built_in_kernels():
    """On every built-in kernel the bound of the normalized graph is at most the II the search proved
    optimal before the bound existed (tests/data/solve_baseline.json)."""
    rows = json.loads((Path(__file__).parents[1] / "data" / "solve_baseline.json").read_text())["rows"]
    for row in rows:
        machine = get_machine(row["arch"])
        graph = build_kernel(row["kernel"], machine, **row["options"])
        options = SolveOptions(reg_limit=row["reg_limit"]).for_graph(graph)
        work = normalized(graph, options)[0]
        bound = issue_bound(work, machine, options)
        assert row["status"] == "optimal" and (bound is None or bound.ii <= row["ii"]), row
