"""Whether a schedule was solved for a given loop graph.

The verifier (:mod:`twill.schedule.verify`) checks a schedule against the graph it carries (``loop_graph``,
the graph the solver saw: normalized cycle counts, and for Triton on sm_90 the window constraint). A
schedule that comes back from a file or a cache must also be the schedule *of the loop at hand*:
:func:`derivation_problem` rebuilds the graph the solver saw from the raw graph, with the schedule's own
normalization record (``stats["normalization"]``: its map must cover exactly the raw graph's cycle counts
and meet the normalization's constraints, every count at least 1 and their sum at most ``U``), and compares
it with the graph the schedule carries. A schedule that passes both checks is valid for the raw graph.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Iterable

from twill.ir.graph import LoopGraph
from twill.schedule.result import Schedule


def _plain(graph: LoopGraph, skip: Iterable[str] = ()) -> dict[str, Any]:
    """``graph`` as ``twill-graph/1`` JSON data (tuples as lists) without the graph attributes ``skip``, for
    comparing."""
    from twill.ir.io import graph_to_dict

    data = json.loads(json.dumps(graph_to_dict(graph), default=str))
    attrs = {k: v for k, v in data.pop("attrs", {}).items() if k not in set(skip)}
    if attrs:
        data["attrs"] = attrs
    return data


def normalized_by_record(graph: LoopGraph, record: Any) -> LoopGraph | str:
    """``graph`` with its cycle counts mapped by the normalization ``record`` of a schedule
    (``stats["normalization"]``; absent or ``enabled: false``: unchanged), or why the record cannot be the
    normalization of ``graph``."""
    from twill.solve.normalize import Normalization, cycle_quantities, distortion_of, scale_edge, scale_op

    if record is None or (isinstance(record, dict) and record.get("enabled") is False):
        return graph
    if not isinstance(record, dict) or not isinstance(record.get("map"), dict):
        return "its normalization record has no map"
    try:
        mapping = {int(k): v for k, v in record["map"].items()}
    except ValueError:
        return "its normalization map has a key that is not a cycle count"
    costs = cycle_quantities(graph)
    if sorted(mapping) != costs:
        return "its normalization map is not of this graph's cycle counts"
    scaled = [mapping[c] for c in costs]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in scaled):
        return "its normalization map has a count below 1 or not an integer"
    budget = record.get("U")
    if isinstance(budget, bool) or not isinstance(budget, int) or sum(scaled) > budget:
        return f"its normalized counts sum to {sum(scaled)}, above the resolution U={budget!r}"
    if "F" in record and record["F"] != distortion_of(costs, scaled):
        return f"its normalization record's distortion F={record['F']!r} is not that of its map"
    norm = Normalization(mapping, distortion_of(costs, scaled), budget, 1.0, 0.0, False)
    return replace(graph, ops=tuple(scale_op(op, norm) for op in graph.ops),
                   edges=tuple(scale_edge(e, norm) for e in graph.edges))


def _first_difference(want: dict[str, Any], have: dict[str, Any]) -> str:
    """The first place where the graph data ``have`` (the schedule's) differs from ``want``."""
    if want.get("name") != have.get("name"):
        return f"it is of graph {have.get('name')!r}, not {want.get('name')!r}"
    ops_want = {op["name"]: op for op in want.get("ops", [])}
    ops_have = {op["name"]: op for op in have.get("ops", [])}
    if list(ops_want) != list(ops_have):
        return "its ops are not this graph's ops"
    for name, op in ops_want.items():
        if op != ops_have[name]:
            key = next((k for k in sorted(set(op) | set(ops_have[name])) if op.get(k) != ops_have[name].get(k)),
                       "op")
            return f"op {name!r} differs ({key})"
    if want.get("edges") != have.get("edges"):
        return "its edges are not this graph's edges"
    if want.get("units") != have.get("units"):
        return "its units are not this graph's units"
    attrs_want, attrs_have = want.get("attrs", {}), have.get("attrs", {})
    key = next((k for k in sorted(set(attrs_want) | set(attrs_have)) if attrs_want.get(k) != attrs_have.get(k)),
               "attrs")
    return f"graph attribute {key!r} differs ({attrs_have.get(key)!r}, this graph has {attrs_want.get(key)!r})"


def derivation_problem(schedule: Schedule, raw: LoopGraph,
                       transforms: Iterable[Callable[[LoopGraph], LoopGraph]] = (),
                       allowed_attrs: Iterable[str] = ()) -> str | None:
    """Why ``schedule.graph`` is not ``raw`` (or one of ``transforms`` of it) normalized by the schedule's
    own normalization record, or None when it is. Graph attributes in ``allowed_attrs`` may differ (a solve
    that set them itself, which the caller checks)."""
    allowed = tuple(allowed_attrs)
    have = _plain(schedule.graph, allowed)
    first = None
    for base in (raw, *(t(raw) for t in transforms)):
        expected = normalized_by_record(base, dict(schedule.stats).get("normalization"))
        if isinstance(expected, str):
            first = first or expected
            continue
        want = _plain(expected, allowed)
        if want == have:
            return None
        first = first or _first_difference(want, have)
    return first
