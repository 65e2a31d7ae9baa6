"""The independent warp-specialization checker rejects each family's violation and accepts solver output."""

from __future__ import annotations

from dataclasses import replace

import pytest
from solved import solved_kernel

from twill.ir.builder import GraphBuilder
from twill.ir.validate import MAX_DEPTH
from twill.machine import get_machine
from twill.schedule.result import Schedule, WarpGroup
from twill.schedule.verify_ws import live_intervals, ws_violations
from twill.solve.options import SolveOptions

H100 = get_machine("h100")
B200 = get_machine("b200")


def graph_two_accumulators(spill: int = 0):
    b = GraphBuilder("pair", units={"A": 1, "B": 1, "tma": 1})
    ld = b.op("ld", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, kind="tma_load", smem=1024,
              attrs={"role": "load"})
    p = b.op("p", uses={"A": 1}, cycles=1, regs=150, warps=4, spill_cost=spill, kind="alu",
             attrs={"role": "p", "accumulator": True})
    c = b.op("c", uses={"B": 1}, cycles=1, regs=150, warps=4, kind="alu", attrs={"role": "c", "accumulator": True})
    b.edge(ld, p, delay=0)
    b.edge(p, p, distance=1)
    b.edge(c, c, distance=1)
    b.edge(p, c)
    return b.build()


def make(graph, starts, groups, ii=4, **kw):
    warps = tuple(WarpGroup(i, role, width, regs, tuple(ops)) for i, (role, width, regs, ops) in enumerate(groups))
    assignment = {n: g.id for g in warps for n in g.ops}
    return Schedule(graph=graph, arch="h100", solver="manual", status="feasible", ii=ii, ii_lower_bound=1,
                    starts=starts, assignment=assignment, warps=warps, **kw)


def valid():
    return make(graph_two_accumulators(), {"ld": 0, "p": 0, "c": 1},
                [("load", 1, 24, ["ld"]), ("compute", 4, 240, ["p"]), ("compute", 4, 240, ["c"])])


def messages(sched, machine=H100, options=None):
    return ws_violations(sched, machine, options)


def test_a_valid_hand_schedule_passes():
    assert messages(valid()) == []


def test_solver_output_passes_for_every_built_in_schedule_checked_here():
    for arch, kernel, opts in (("h100", "gemm", {}), ("b200", "gemm", {}), ("h100", "flash-fwd", {"subtiles": 2})):
        assert messages(solved_kernel(kernel, arch, opts), get_machine(arch)) == []


def test_warp_uniqueness_width_mismatch():
    s = valid()
    bad = replace(s, warps=(s.warps[0], replace(s.warps[1], num_warps=2), s.warps[2]))
    assert any(m.startswith("WARP UNIQUENESS") for m in messages(bad))


def test_variable_latency_group_holds_only_variable_latency_ops():
    s = make(graph_two_accumulators(), {"ld": 0, "p": 0, "c": 1},
             [("load", 4, 24, []), ("compute", 4, 240, ["p", "c"])])
    s = replace(s, warps=(WarpGroup(0, "load", 1, 24, ("ld",)), WarpGroup(1, "compute", 4, 240, ("p", "c"))),
                assignment={"ld": 0, "p": 1, "c": 1})
    assert not any(m.startswith("VARIABLE LATENCY") for m in messages(s))
    mixed = make(graph_two_accumulators(), {"ld": 0, "p": 0, "c": 1},
                 [("load", 1, 24, ["ld"]), ("compute", 4, 240, ["p", "c"])])
    mixed = replace(mixed, assignment={"ld": 1, "p": 1, "c": 1},
                    warps=(WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "compute", 4, 240, ("ld", "p", "c"))))
    assert any(m.startswith(("VARIABLE LATENCY", "WARP UNIQUENESS")) for m in messages(mixed))


def test_warp_count():
    assert any(m.startswith("WARP COUNT") for m in messages(valid(), options=SolveOptions(max_warps=8)))


def test_register_file_and_budget_legality():
    s = valid()
    fat = replace(s, warps=(s.warps[0], replace(s.warps[1], regs=256), replace(s.warps[2], regs=256)))
    assert any("REGISTER FILE" in m and "registers" in m for m in messages(fat))
    odd = replace(s, warps=(s.warps[0], replace(s.warps[1], regs=241), s.warps[2]))
    assert any("setmaxnreg" in m for m in messages(odd))


def test_register_limit_counts_live_values_per_group():
    merged = make(graph_two_accumulators(), {"ld": 0, "p": 0, "c": 1},
                  [("load", 1, 24, ["ld"]), ("compute", 4, 240, ["p", "c"])])
    assert any(m.startswith("REGISTER LIMIT") for m in messages(merged))


def test_liveness_of_an_in_place_accumulator_is_one_ii_per_copy():
    two_copies = replace(valid(), starts={"ld": 0, "p": 0, "c": 4})   # L = 5 at II 4: two copies
    intervals = {(n, i): (a, b) for n, i, a, b in live_intervals(two_copies)}
    assert intervals[("p", 0)] == (0, 4)            # until copy 1 issues at 0 + II
    assert intervals[("p", 1)] == (4, 9)            # the last copy: live to T = (n-1)·II + L


def test_cross_warp_spill_delay_and_ban():
    graph = graph_two_accumulators(spill=5)
    s = make(graph, {"ld": 0, "p": 0, "c": 1},
             [("load", 1, 24, ["ld"]), ("compute", 4, 240, ["p"]), ("compute", 4, 240, ["c"])], ii=8)
    assert any(m.startswith("CROSS-WARP SPILLS") and "spill 5" in m for m in messages(s))
    ok = replace(s, starts={"ld": 0, "p": 0, "c": 6})
    assert not any(m.startswith("CROSS-WARP SPILLS") for m in messages(ok))
    assert any("forbidden" in m for m in messages(ok, options=SolveOptions(cross_warp=False)))


def concurrency_graph():
    b = GraphBuilder("conc", units={"TC": 1, "EXP": 1})
    b.op("mma", uses={"TC": 1}, cycles=2, warps=4, warp_busy=1, kind="mma", attrs={"role": "mma"})
    b.op("use", uses={"EXP": 1}, cycles=1, warps=4, kind="exp2", attrs={"role": "exp"})
    b.op("other", uses={"EXP": 1}, cycles=1, warps=4, kind="exp2", attrs={"role": "exp"})
    b.edge("mma", "use", delay=2, blocking=True)
    return b.build()


def test_concurrency_and_warp_issue():
    graph = concurrency_graph()
    group = [("compute", 4, 240, ["mma", "use", "other"])]
    clash = make(graph, {"mma": 0, "other": 2, "use": 2}, group, ii=4)
    found = messages(clash)
    assert any(m.startswith("CONCURRENCY") and "'other'" in m for m in found)
    assert any(m.startswith("WARP ISSUE") for m in found)
    fine = make(graph, {"mma": 0, "other": 3, "use": 2}, group, ii=4)
    assert messages(fine) == []


def test_memory_capacity_of_the_streaming_ring():
    s = valid()
    small = replace(H100, smem_per_block=H100.smem_per_block // 4)      # the deepest ring, a quarter of the memory
    assert any(m.startswith("MEMORY CAPACITY") for m in
               messages(s, small, options=SolveOptions(streaming_depth=MAX_DEPTH)))


def test_tmem_capacity_on_blackwell():
    result = solved_kernel("flash-fwd", "b200", {"subtiles": 2})
    assert messages(result, B200) == []
    late = dict(result.starts)
    late["s_load_a"] += 2 * result.ii                 # S held two stages longer: a second TMEM buffer
    moved = replace(result, starts=late)
    assert any("tensor memory" in m for m in messages(moved, B200))


@pytest.mark.parametrize("family", ["WARP UNIQUENESS", "VARIABLE LATENCY", "WARP COUNT", "REGISTER FILE",
                                    "REGISTER LIMIT", "CROSS-WARP SPILLS", "CONCURRENCY", "WARP ISSUE",
                                    "MEMORY CAPACITY"])
def test_every_family_is_documented_in_the_module(family):
    import twill.schedule.verify_ws as module

    assert family in module.__doc__
