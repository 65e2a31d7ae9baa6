"""Checks a loop graph against the units it may use and the paper's well-formedness conditions."""

from __future__ import annotations

from typing import Mapping

from twill.errors import GraphError
from twill.ir.graph import LoopGraph

#: What the model supports (docs/cli.md, "Statuses, limits and exit codes"). The built-in kernels stay far
#: below: at most 23 ops, 37 edges, 2363 cycles per op, 7315 cycles in all, distance 2.
MAX_OPS = 1000
MAX_EDGES = 20000
#: Largest cycle count of one op, delay of one edge, and sum of all op cycles (raw or normalized).
MAX_CYCLES = 100_000
MAX_TOTAL_CYCLES = 1_000_000
MAX_DISTANCE = 1000
#: Largest register count, memory footprint (bytes) and unit capacity accepted.
MAX_REGS = 4096
MAX_BYTES = 2**31
MAX_CAPACITY = 1024
#: Most buffers of one result (``streaming_depth``, ``ring_depth``).
MAX_DEPTH = 64
#: Largest tile side (``block_m``, ``block_n``, ``block_k``, ``head_dim``).
MAX_TILE = 4096
#: Graph attributes that size the kernel (tiles, sub-tiles, warps, stages, the register budget): a graph that
#: has one must give an integer in its range, the code generators size the kernel from it. Attribute ->
#: (least, most).
SIZE_ATTRS: dict[str, tuple[int, int]] = {
    "block_m": (1, MAX_TILE), "block_n": (1, MAX_TILE), "block_k": (1, MAX_TILE), "head_dim": (1, MAX_TILE),
    "subtiles": (1, 16), "warps": (1, 32), "num_warps": (1, 32), "num_stages": (1, MAX_DEPTH),
    "reg_limit": (24, 255),
}


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
    done: set[str] = set()
    for root in graph.op_names:
        if root in done:
            continue
        path, on_path = [root], {root}
        todo = [iter(succ[root])]           # depth-first search with an explicit stack (no recursion)
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                todo.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                todo.append(iter(succ[nxt]))
    return None


def limit_violation(graph: LoopGraph) -> str | None:
    """The first size or value limit (:data:`MAX_OPS`...) that ``graph`` exceeds, or None."""
    if len(graph.ops) > MAX_OPS or len(graph.edges) > MAX_EDGES:
        return (f"graph {graph.name!r} has {len(graph.ops)} ops and {len(graph.edges)} edges; Twill supports "
                f"at most {MAX_OPS} ops and {MAX_EDGES} edges")
    for key, low, limit in (("streaming_depth", 1, MAX_DEPTH), ("smem_resident", 0, MAX_BYTES),
                            ("reserved_regs", 0, MAX_REGS)):
        value = graph.attrs.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= limit:
            return f"graph {graph.name!r}: attribute {key!r} must be an integer in [{low}, {limit}], got {value!r}"
    for key, (low, limit) in SIZE_ATTRS.items():
        value = graph.attrs.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not low <= value <= limit):
            return f"graph {graph.name!r}: attribute {key!r} must be an integer in [{low}, {limit}], got {value!r}"
    for unit, cap in (graph.units or {}).items():
        if isinstance(cap, int) and cap > MAX_CAPACITY:
            return f"unit {unit!r} has capacity {cap}; Twill supports at most {MAX_CAPACITY}"
    for op in graph.ops:
        if op.cycles > MAX_CYCLES:
            return f"op {op.name!r} lasts {op.cycles} cycles; Twill supports at most {MAX_CYCLES} per op"
        for what, value, limit in (("latency", op.latency or 0, MAX_CYCLES), ("warp_busy", op.warp_busy or 0,
                                   MAX_CYCLES), ("spill_cost", op.spill_cost, MAX_CYCLES),
                                   ("regs", op.regs, MAX_REGS), ("smem", op.smem, MAX_BYTES),
                                   ("tmem", op.tmem, MAX_BYTES)):
            if value > limit:
                return f"op {op.name!r}: {what} {value} is beyond the limit {limit}"
    total = sum(op.cycles for op in graph.ops)
    if total > MAX_TOTAL_CYCLES:
        return f"graph {graph.name!r} has {total} op cycles in all; Twill supports at most {MAX_TOTAL_CYCLES}"
    for e in graph.edges:
        if e.delay > MAX_CYCLES or e.distance > MAX_DISTANCE:
            return (f"edge {e.src}->{e.dst}: delay {e.delay} / distance {e.distance} beyond the limits "
                    f"{MAX_CYCLES} / {MAX_DISTANCE}")
    return None


def validate_graph(graph: LoopGraph, machine_units: Mapping[str, int] | None = None, *,
                   max_ii: int | None = None) -> dict[str, int]:
    """Raise :class:`GraphError` naming the first problem; return the unit capacities in force.

    Checks: the size and value limits (:func:`limit_violation`); every RRT unit exists with capacity >= 1;
    no RRT row needs more instances of a unit than exist (impossible at any II); no op occupies a unit for more cycles than ``max_ii`` allows; no dependence
    cycle has total distance 0. Duplicate names, unknown edge ends and negative delays are rejected when
    the graph is constructed.
    """
    units = effective_units(graph, machine_units)
    if not graph.ops:
        raise GraphError(f"graph {graph.name!r} has no ops")
    beyond = limit_violation(graph)
    if beyond:
        raise GraphError(beyond)
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
                                       or not 1 <= ring_depth <= MAX_DEPTH or not graph.is_streaming(op.name)):
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
