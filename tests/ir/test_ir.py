"""Loop-graph IR: construction checks, builder, twill-graph/1 I/O, validation."""

from __future__ import annotations

import json

import pytest

from twill.errors import FormatError, GraphError
from twill.ir import (Edge, GraphBuilder, LoopGraph, Op, effective_units, graph_from_dict, graph_to_dict,
                      load_graph, rrt_from_uses, save_graph, validate_graph, zero_distance_cycle)
from twill.machine import H100


def small():
    b = GraphBuilder("small", units={"tc": 1, "mufu": 1}, attrs={"block_m": 128})
    b.op("load", uses={}, cycles=1, latency=0, variable_latency=True, kind="tma_load", smem=1024)
    b.op("mma", uses={"tc": 1}, cycles=4, kind="mma", warps=4, regs=64, warp_busy=1,
         attrs={"role": "qk"})
    b.op("exp", rrt=[{"mufu": 1}, {"mufu": 1}, {}], kind="exp2", spill_cost=3, tmem=512)
    b.edge("load", "mma", blocking=True)
    b.edge("mma", "exp")
    b.edge("exp", "mma", distance=1, delay=2)
    return b.build()


def test_op_properties():
    g = small()
    mma, exp = g.op("mma"), g.op("exp")
    assert mma.cycles == 4 and mma.issue_latency == 4 and mma.busy == 1 and mma.usage("tc") == 4
    assert exp.cycles == 3 and exp.usage("mufu") == 2 and exp.units() == {"mufu"} and exp.busy == 3
    assert g.op("load").issue_latency == 0


def test_builder_defaults_delay_to_issue_latency():
    g = small()
    delays = {(e.src, e.dst): e.delay for e in g.edges}
    assert delays == {("load", "mma"): 0, ("mma", "exp"): 4, ("exp", "mma"): 2}
    assert g.is_streaming("load") and not g.is_streaming("mma")
    assert [e.dst for e in g.out_edges("mma")] == ["exp"] and len(g.in_edges("mma")) == 2


@pytest.mark.parametrize("make, message", [
    (lambda: Op(name="", rrt=({},)), "non-empty string"),
    (lambda: Op(name="a", rrt=()), "empty RRT"),
    (lambda: Op(name="a", rrt=({"tc": -1},)), "must be >= 0"),
    (lambda: Op(name="a", rrt=({},), warps=3), "warps must be 1, 2, 4 or 8"),
    (lambda: Op(name="a", rrt=({},), regs=-2), "regs must be a non-negative integer"),
    (lambda: Edge("a", "b", -1), "negative delay -1"),
    (lambda: Edge("a", "b", 1, distance=-1), "distance must be a non-negative integer"),
    (lambda: rrt_from_uses({}, 0), "cycles must be a positive integer"),
    (lambda: LoopGraph("g", (Op(name="a", rrt=({},)), Op(name="a", rrt=({},))), ()), "duplicate op name 'a'"),
    (lambda: LoopGraph("g", (Op(name="a", rrt=({},)),), (Edge("a", "z", 0),)), "unknown op 'z'"),
])
def test_construction_errors(make, message):
    with pytest.raises(GraphError, match=message):
        make()


def test_round_trip_through_json(tmp_path):
    g = small()
    path = tmp_path / "g.json"
    save_graph(g, path)
    back = load_graph(path)
    assert back == g
    assert graph_to_dict(back) == graph_to_dict(g)
    assert dict(back.op("mma").attrs) == {"role": "qk"} and dict(back.attrs) == {"block_m": 128}
    data = json.loads(path.read_text())
    ops = {o["name"]: o for o in data["ops"]}
    assert ops["mma"]["uses"] == {"tc": 1} and ops["exp"]["rrt"] == [{"mufu": 1}, {"mufu": 1}, {}]
    assert ops["exp"]["footprint"] == {"tmem": 512}


@pytest.mark.parametrize("patch, message", [
    ({"format": "twill-graph/2"}, "unsupported graph format"),
    ({"extra": 1}, "unknown key 'extra'"),
    ({"ops": [{"name": "a", "cycles": 1}]}, "missing required key 'uses'"),
    ({"ops": [{"name": "a", "cycles": 2, "rrt": [{}]}]}, "'cycles' is 2 but 'rrt' has 1 rows"),
    ({"ops": [{"name": "a", "cycles": 1, "uses": {}, "footprint": {"regs": 1}}]}, "'footprint' may only hold"),
    ({"units": {"tc": "one"}}, "'units' must map unit names to integer capacities"),
])
def test_format_errors(patch, message):
    data = graph_to_dict(small())
    data.update(patch)
    if "ops" in patch:
        data["edges"] = []
    with pytest.raises(FormatError, match=message):
        graph_from_dict(data)


def test_validate_graph():
    g = small()
    assert validate_graph(g, H100.units) == {"tc": 1, "mufu": 1}
    assert effective_units(g, H100.units) == {"tc": 1, "mufu": 1}
    plain = LoopGraph("p", (Op(name="a", rrt=({"tc": 1},)),), ())
    assert effective_units(plain, H100.units) == dict(H100.units)
    with pytest.raises(GraphError, match="needs 2 x 'tc' in cycle 0 but only 1 exist"):
        validate_graph(LoopGraph("w", (Op(name="a", rrt=({"tc": 2},)),), ()), H100.units)
    with pytest.raises(GraphError, match="longer than any II up to max II 3"):
        validate_graph(g, H100.units, max_ii=3)
    with pytest.raises(GraphError, match="has no ops"):
        validate_graph(LoopGraph("e", (), ()), H100.units)


def test_zero_distance_cycle_names_the_ops():
    b = GraphBuilder("loop", units={})
    for n in "abc":
        b.op(n, uses={}, cycles=1)
    b.edge("a", "b")
    b.edge("b", "c")
    b.edge("c", "a", distance=1)
    assert zero_distance_cycle(b.build()) is None
    b.edge("c", "b")
    assert zero_distance_cycle(b.build()) == ["b", "c", "b"]


@pytest.mark.parametrize("depth", [0, -1, 1.5, True, "2"])
def test_ring_depth_must_be_a_positive_integer(depth):
    b = GraphBuilder("g", units={"tma": 1})
    b.op("load", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, attrs={"ring_depth": depth})
    with pytest.raises(GraphError, match="ring_depth must be a positive integer on a streaming load"):
        validate_graph(b.build())


def test_ring_depth_only_on_streaming_loads():
    b = GraphBuilder("g", units={"A": 1})
    b.op("x", uses={"A": 1}, cycles=1, attrs={"ring_depth": 2})
    with pytest.raises(GraphError, match="on a streaming load"):
        validate_graph(b.build())
    g = small()
    assert g.least_depth("load", 3) == 3 and g.least_depth("mma", 3) == 1
