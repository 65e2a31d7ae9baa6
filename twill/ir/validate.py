"""Checks a loop graph against the units it may use and the paper's well-formedness conditions."""

from __future__ import annotations

from typing import Mapping

from twill.errors import GraphError
from twill.ir.graph import LoopGraph


def effective_units(graph: LoopGraph, machine_units: Mapping[str, int] | None) -> dict[str, int]:
    """Unit capacities in force: the graph's own ``units`` override the machine's."""
    if graph.units is not None:
        return dict(graph.units)
    return dict(machine_units or {})


def zero_distance_cycle(graph: LoopGraph) -> list[str] | None:
    """Ops on a dependence cycle whose total distance is 0 (such a loop can never be scheduled), or None."""
    succ: dict[str, list[str]] = {n: [] for n in graph.op_names}
    for e in graph.edges:
        if e.distance == 0:
            succ[e.src].append(e.dst)
    state: dict[str, int] = {}          # 0 = on stack, 1 = done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 0
        stack.append(n)
        for m in succ[n]:
            if state.get(m) == 0:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 1
        return None

    for n in graph.op_names:
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def validate_graph(graph: LoopGraph, machine_units: Mapping[str, int] | None = None, *,
                   max_ii: int | None = None) -> dict[str, int]:
    """Raise :class:`GraphError` naming the first problem; return the unit capacities in force.

    Checks: every RRT unit exists with capacity >= 1; no RRT row needs more instances of a unit than exist
    (impossible at any II); no op occupies a unit for more cycles than ``max_ii`` allows; no dependence
    cycle has total distance 0. Duplicate names, unknown edge ends and negative delays are rejected when
    the graph is constructed.
    """
    units = effective_units(graph, machine_units)
    if not graph.ops:
        raise GraphError(f"graph {graph.name!r} has no ops")
    for unit, cap in units.items():
        if not isinstance(cap, int) or cap < 1:
            raise GraphError(f"unit {unit!r} must have a positive integer capacity, got {cap!r}")
    for op in graph.ops:
        for cycle, row in enumerate(op.rrt):
            for unit, count in row:
                if unit not in units:
                    known = ", ".join(sorted(units)) or "none"
                    raise GraphError(f"op {op.name!r} uses unknown unit {unit!r} (known units: {known})")
                if count > units[unit]:
                    raise GraphError(f"op {op.name!r} needs {count} x {unit!r} in cycle {cycle} but only "
                                     f"{units[unit]} exist")
        ring_depth = op.attrs.get("ring_depth")
        if ring_depth is not None and (isinstance(ring_depth, bool) or not isinstance(ring_depth, int)
                                       or ring_depth < 1 or not graph.is_streaming(op.name)):
            raise GraphError(f"op {op.name!r}: ring_depth must be a positive integer on a streaming load, "
                             f"got {ring_depth!r}")
        if max_ii is not None:
            for unit in op.units():
                need = -(-op.usage(unit) // units[unit])
                if need > max_ii:
                    raise GraphError(f"op {op.name!r} occupies {unit!r} for {op.usage(unit)} unit-cycles, "
                                     f"longer than any II up to max II {max_ii}")
    cycle = zero_distance_cycle(graph)
    if cycle:
        raise GraphError("dependence cycle with total distance 0: " + " -> ".join(cycle))
    return units
