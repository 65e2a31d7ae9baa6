"""Lower bounds on the initiation interval and the schedule length (no solver needed).

* ``ResMII = max_f ⌈Σ_v usage_f(v) / cap(f)⌉``: every unit-cycle an iteration needs must fit in II cycles.
* ``RecMII = max over dependence cycles C of ⌈Σ_{e∈C} d_e / Σ_{e∈C} δ_e⌉``: an iteration-carried cycle of
  delay D and distance Δ needs ``Δ·II ≥ D``. Computed exactly as the smallest integer II for which the
  graph with edge weights ``d − II·δ`` has no positive cycle (binary search, Bellman-Ford).
* ``asap_starts(graph, ii)``: earliest starts under the dependences alone, so
  ``L ≥ max_v asap(v) + cycles(v)`` at that II.
"""

from __future__ import annotations

from typing import Mapping

from twill.ir.graph import LoopGraph


def res_mii(graph: LoopGraph, units: Mapping[str, int]) -> int:
    """ResMII = max over units f of ⌈Σ_v usage_f(v) / cap(f)⌉ (at least 1)."""
    best = 1
    for unit, cap in units.items():
        total = sum(op.usage(unit) for op in graph.ops)
        best = max(best, -(-total // cap))
    return best


def longest_paths(graph: LoopGraph, ii: int) -> dict[str, int] | None:
    """Longest-path potentials from a virtual source (edge 0 to every op) with weights ``d − ii·δ``;
    ``None`` when a positive cycle exists (``ii`` is below RecMII). Bellman-Ford, O(|V|·|E|)."""
    dist = {name: 0 for name in graph.op_names}
    weighted = [(e.src, e.dst, e.delay - ii * e.distance) for e in graph.edges]
    for _ in range(len(dist)):
        changed = False
        for src, dst, w in weighted:
            if dist[src] + w > dist[dst]:
                dist[dst] = dist[src] + w
                changed = True
        if not changed:
            return dist
    return None


def rec_mii(graph: LoopGraph) -> int:
    """RecMII = max over dependence cycles of ⌈Σd / Σδ⌉ (1 when the graph has no recurrence).

    Exact: the smallest ``ii ≥ 1`` with no positive cycle under weights ``d − ii·δ``. Any cycle has
    ``Σδ ≥ 1`` (zero-distance cycles are rejected by validation; with one present this returns the
    search's upper end, Σd + 1), so the answer lies in ``[1, Σd]``.
    """
    lo, hi = 1, max(1, sum(e.delay for e in graph.edges))
    if longest_paths(graph, hi) is None:
        return hi + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if longest_paths(graph, mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


def asap_starts(graph: LoopGraph, ii: int) -> dict[str, int] | None:
    """Earliest start of every op under the dependences at ``ii`` (starts ≥ 0); ``None`` if ``ii`` < RecMII."""
    return longest_paths(graph, ii)


def length_lower_bound(graph: LoopGraph, ii: int) -> int:
    """``max_v asap(v) + cycles(v)``: no schedule at ``ii`` is shorter. Raises ValueError below RecMII."""
    asap = asap_starts(graph, ii)
    if asap is None:
        raise ValueError(f"II {ii} is below RecMII of graph {graph.name!r}")
    return max(asap[op.name] + op.cycles for op in graph.ops)
