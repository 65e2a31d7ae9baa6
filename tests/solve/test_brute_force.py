"""Property tests: CP-SAT's minimal II and L equal a brute-force enumerator's (and the phase-1 projections
never rule out an II the enumerator schedules); twill-graph/1 round trips.

The enumerator is independent of the solver: for every assignment of residues ``r_v ∈ [0, II)`` that
respects the modulo capacities, the least stages ``k_v`` satisfying the dependences
``r_dst + II·k_dst + II·δ ≥ r_src + II·k_src + d`` follow from a longest-path computation, and they give
the shortest schedule with those residues.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twill.ir import Edge, LoopGraph, Op, graph_from_dict, graph_to_dict
from twill.machine import H100
from twill.solve import SolveOptions, schedule
from twill.solve.modulo import projection_infeasible

UNITS = ("u", "v")


@st.composite
def graphs(draw, max_ops=4):
    caps = {u: draw(st.integers(1, 2)) for u in UNITS}
    n = draw(st.integers(1, max_ops))
    ops = []
    for k in range(n):
        rows = draw(st.lists(st.dictionaries(st.sampled_from(UNITS), st.integers(1, 1), max_size=2),
                             min_size=1, max_size=3))
        ops.append(Op(name=f"o{k}", rrt=tuple(rows), kind=draw(st.sampled_from(["op", "mma", "alu"]))))
    edges = []
    for _ in range(draw(st.integers(0, 5))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        # distance-0 edges only go forward, so there is never a zero-distance cycle
        distance = draw(st.integers(0, 2)) if a < b else draw(st.integers(1, 2))
        edges.append(Edge(f"o{a}", f"o{b}", draw(st.integers(0, 3)), distance, draw(st.booleans())))
    return LoopGraph("random", tuple(ops), tuple(edges), caps)


def capacity_ok(graph: LoopGraph, ii: int, residues: dict[str, int]) -> bool:
    load: dict[tuple[str, int], int] = {}
    for op in graph.ops:
        for c, row in enumerate(op.rrt):
            for unit, count in row:
                key = (unit, (residues[op.name] + c) % ii)
                load[key] = load.get(key, 0) + count
    return all(total <= graph.units[unit] for (unit, _), total in load.items())


def least_stages(graph: LoopGraph, ii: int, residues: dict[str, int]) -> dict[str, int] | None:
    k = {name: 0 for name in graph.op_names}
    need = [(e.src, e.dst, -(-(e.delay - ii * e.distance - residues[e.dst] + residues[e.src]) // ii))
            for e in graph.edges]
    for _ in range(len(k) + 1):
        changed = False
        for src, dst, w in need:
            if k[src] + w > k[dst]:
                k[dst] = k[src] + w
                changed = True
        if not changed:
            return k
    return None


def brute_force(graph: LoopGraph, max_ii: int = 40) -> tuple[int, int]:
    """(minimal II, minimal L at that II) by enumeration."""
    for ii in range(1, max_ii + 1):
        best = None
        for combo in itertools.product(range(ii), repeat=len(graph.ops)):
            residues = dict(zip(graph.op_names, combo))
            if not capacity_ok(graph, ii, residues):
                continue
            k = least_stages(graph, ii, residues)
            if k is None:
                continue
            length = max(residues[op.name] + ii * k[op.name] + op.cycles for op in graph.ops)
            best = length if best is None else min(best, length)
        if best is not None:
            return ii, best
    raise AssertionError("brute force found no schedule")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_cpsat_matches_brute_force(graph):
    result = schedule(graph, H100, SolveOptions(ws=False, normalize=False, workers=1, time_limit=30))
    assert result.status == "optimal"
    assert (result.ii, result.length) == brute_force(graph)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_projections_prove_only_iis_the_enumerator_finds_infeasible(graph):
    min_ii, _ = brute_force(graph)
    units = dict(graph.units)
    for ii in range(max(1, min_ii - 3), min_ii + 1):
        if projection_infeasible(graph, units, ii, time_limit=10) is not None:
            assert ii < min_ii


JSON_SCALARS = st.one_of(st.integers(-5, 5), st.booleans(), st.text(max_size=4), st.none())


@st.composite
def rich_graphs(draw):
    """Graphs that use every optional field of twill-graph/1, for the round trip."""
    base = draw(graphs(max_ops=5))
    ops = tuple(Op(name=op.name, rrt=op.rrt, kind=op.kind,
                   latency=draw(st.none() | st.integers(0, 9)), regs=draw(st.integers(0, 255)),
                   warps=draw(st.sampled_from([1, 2, 4, 8])), variable_latency=draw(st.booleans()),
                   spill_cost=draw(st.integers(0, 9)), smem=draw(st.integers(0, 1 << 16)),
                   tmem=draw(st.integers(0, 1 << 16)), warp_busy=draw(st.none() | st.integers(0, 9)),
                   attrs=draw(st.dictionaries(st.text(min_size=1, max_size=4), JSON_SCALARS, max_size=3)))
                for op in base.ops)
    units = draw(st.none() | st.just(dict(base.units)))
    attrs = draw(st.dictionaries(st.text(min_size=1, max_size=4), JSON_SCALARS, max_size=3))
    return LoopGraph(base.name, ops, base.edges, units, attrs)


@settings(max_examples=60, deadline=None)
@given(rich_graphs())
def test_graph_round_trip(graph):
    back = graph_from_dict(graph_to_dict(graph))
    assert back == graph
    assert graph_to_dict(back) == graph_to_dict(graph)
    assert [dict(o.attrs) for o in back.ops] == [dict(o.attrs) for o in graph.ops]
    assert dict(back.attrs) == dict(graph.attrs)
    assert back.units == graph.units
