"""A greedy modulo list scheduler: a valid modulo schedule at a given II in O(ops · II · cycles), no solver.

It seeds phase 1 (a CP-SAT hint) and stands in for it when CP-SAT finds no schedule within its share of the
time (docs/cli.md, "Time budget per phase"): ops are placed in topological order of the distance-0 edges,
each at the earliest start that its placed predecessors allow and whose reservations fit the modulo
reservation table; the result is checked against every edge (loop-carried edges to ops placed earlier may
fail, then there is no greedy schedule at this II).
"""

from __future__ import annotations

from typing import Mapping

from twill.ir.graph import LoopGraph, topological_order


def reservation(rrt: tuple, issue: tuple[str, int] | None, ii: int) -> dict[tuple[str, int], int]:
    """An op's reservations for a start at residue 0: ``(unit, (c mod ii)) -> count`` summed over its RRT
    rows ``c`` (and the first ``busy`` cycles of its ``issue`` timeline); a start at ``t`` shifts every
    residue by ``t``."""
    cells: dict[tuple[str, int], int] = {}
    for c, row in enumerate(rrt):
        for unit, count in row:
            cells[(unit, c % ii)] = cells.get((unit, c % ii), 0) + count
    if issue is not None:
        line, busy = issue
        for c in range(busy):
            cells[(line, c % ii)] = cells.get((line, c % ii), 0) + 1
    return cells


def greedy_modulo(graph: LoopGraph, units: Mapping[str, int], ii: int, *,
                  padding: Mapping[str, int] | None = None,
                  issue: Mapping[str, tuple[str, int]] | None = None) -> dict[str, int] | None:
    """Start times of a modulo schedule at ``ii``, or None when the greedy placement finds none.
    ``padding`` (op -> cycles) lengthens every out-edge of an op, e.g. by its spill cost so that any
    consumer may run on another warp group. ``issue`` (op -> (timeline, cycles)) reserves the first cycles
    of an op on an extra capacity-1 resource per timeline: ops of one timeline never overlap there."""
    pad = padding or {}
    timelines = {name: 1 for name, _ in (issue or {}).values()}
    units = {**units, **timelines}
    ops = {op.name: op for op in graph.ops}
    ins: dict[str, list] = {name: [] for name in ops}
    for e in graph.edges:
        ins[e.dst].append(e)
    used: dict[tuple[str, int], int] = {}
    starts: dict[str, int] = {}
    order = topological_order(graph)
    if len(order) != len(ops):
        return None
    for name in order:
        op = ops[name]
        earliest = max([0] + [starts[e.src] + e.delay + pad.get(e.src, 0) - ii * e.distance
                              for e in ins[name] if e.src in starts])
        reserved = reservation(op.rrt, issue.get(name) if issue else None, ii)
        for t in range(earliest, earliest + ii):
            load = {(unit, (t + r) % ii): count for (unit, r), count in reserved.items()}
            if all(used.get(key, 0) + count <= units[key[0]] for key, count in load.items()):
                for key, count in load.items():
                    used[key] = used.get(key, 0) + count
                starts[name] = t
                break
        else:
            return None
    if any(starts[e.dst] + e.distance * ii < starts[e.src] + e.delay + pad.get(e.src, 0) for e in graph.edges):
        return None
    return starts
