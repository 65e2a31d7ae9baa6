"""Cost normalization (paper §5.2): small integers with nearly the raw ratios, zero stays zero."""

from __future__ import annotations

import pytest

from twill.errors import TwillError
from twill.ir import GraphBuilder
from twill.solve.normalize import cycle_quantities, normalize_graph, rrt_runs, solve_normalization


def _graph():
    b = GraphBuilder("costs", units={"tc": 1, "mufu": 1, "tma": 1})
    b.op("load", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, warp_busy=1)
    b.op("qk", uses={"tc": 1}, cycles=1024, warp_busy=32)
    b.op("exp", uses={"mufu": 1}, cycles=1024, spill_cost=64)
    b.op("pv", rrt=[{}] * 10 + [{"tc": 1}] * 1014)
    b.edge("load", "qk", delay=0)
    b.edge("qk", "exp")
    b.edge("exp", "pv")
    b.edge("pv", "pv", distance=1)
    return b.build()


def test_rrt_runs_groups_identical_rows():
    rrt = ((), (), (("tc", 1),), (("tc", 1),), ())
    assert rrt_runs(rrt) == [((), 2), ((("tc", 1),), 2), ((), 1)]


def test_cycle_quantities_are_distinct_positive_values():
    assert cycle_quantities(_graph()) == [1, 10, 32, 64, 1014, 1024]


def test_exact_ratios_are_found_with_the_smallest_sum():
    scaled, distortion, proven = solve_normalization([512, 1024, 2048], 300)
    assert scaled == [1, 2, 4]
    assert distortion == 0 and proven


def test_inexact_ratios_minimise_the_distortion():
    scaled, distortion, proven = solve_normalization([1000, 1023], 300)
    assert proven
    assert distortion == abs(1000 * scaled[1] - 1023 * scaled[0])
    # 1000/1023 has no exact representation within U=300; the best has distortion 1 (87:89).
    assert distortion == 1 and scaled == [87, 89]


def test_every_positive_value_stays_positive_and_sum_within_u():
    costs = [1, 7, 33, 1024, 4096]
    scaled, _, _ = solve_normalization(costs, 50)
    assert all(s >= 1 for s in scaled)
    assert sum(scaled) <= 50
    assert scaled == sorted(scaled)            # order of magnitudes is preserved


def test_resolution_below_value_count_is_a_clear_error():
    with pytest.raises(TwillError, match="resolution U=2"):
        solve_normalization([1, 2, 3], 2)


def test_normalize_graph_scales_every_quantity_and_keeps_zero():
    graph, norm = normalize_graph(_graph(), 300)
    m = norm.mapping
    load, qk, exp, pv = (graph.op(n) for n in ("load", "qk", "exp", "pv"))
    assert qk.cycles == m[1024] and exp.cycles == m[1024]
    assert qk.warp_busy == m[32] and exp.spill_cost == m[64]
    assert load.latency == 0 and load.warp_busy == m[1]
    assert pv.cycles == m[10] + m[1014]
    assert pv.rrt[: m[10]] == ((),) * m[10] and all(r == (("tc", 1),) for r in pv.rrt[m[10]:])
    delays = {(e.src, e.dst): e.delay for e in graph.edges}
    assert delays[("load", "qk")] == 0 and delays[("qk", "exp")] == m[1024]
    assert sum(m.values()) <= 300
    record = norm.to_dict()
    assert record["enabled"] and record["U"] == 300 and record["F"] == norm.distortion
    assert record["map"]["1024"] == m[1024]
    assert record["cycles_per_unit"] > 1


def test_single_value_maps_to_one():
    b = GraphBuilder("one", units={"u": 1})
    b.op("a", uses={"u": 1}, cycles=8)
    b.op("b", uses={"u": 1}, cycles=8)
    b.edge("a", "b")
    graph, norm = normalize_graph(b.build())
    assert norm.mapping == {8: 1} and norm.distortion == 0
    assert graph.op("a").cycles == 1 and graph.edges[0].delay == 1
