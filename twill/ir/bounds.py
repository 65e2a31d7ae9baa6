"""Lower bounds on the initiation interval and the schedule length: properties of the loop graph (no solver
needed), shared by the solvers and the verifier.

* ``ResMII = max_f ⌈Σ_v usage_f(v) / cap(f)⌉``: every unit-cycle an iteration needs must fit in II cycles.
* ``RecMII = max over dependence cycles C of ⌈Σ_{e∈C} d_e / Σ_{e∈C} δ_e⌉``: an iteration-carried cycle of
  delay D and distance Δ needs ``Δ·II ≥ D``. Computed exactly as the smallest integer II for which the
  graph with edge weights ``d − II·δ`` has no positive cycle (binary search, Bellman-Ford).
* ``asap_starts(graph, ii)``: earliest starts under the dependences alone, so
  ``L ≥ max_v asap(v) + cycles(v)`` at that II.
* ``dependence_closure(graph, ii)``: the longest-path weight ``W(u, v)`` of every dependence path, so
  ``t_v − t_u ≥ W(u, v)`` in every schedule at that II (used by the projections of docs/model.md §5).
* ``warp_issue_bound``: a lower bound on the II of the *joint* problem (docs/model.md §5, "Warp-issue
  bound") from REGISTER FILE, WARP COUNT, the slot count and WARP ISSUE: ops with registers of one width
  can only spread over as many register-holding groups of that width as the register file admits, and each
  group issues its ops one after another.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def dependence_closure(graph: LoopGraph, ii: int) -> dict[tuple[str, str], int] | None:
    """``W(u, v)`` = the largest ``Σ (d − ii·δ)`` over dependence paths from ``u`` to ``v`` (pairs without a
    path are absent): every schedule at ``ii`` has ``t_v − t_u ≥ W(u, v)``. ``None`` when a cycle has
    positive weight (``ii`` is below RecMII). Floyd-Warshall, O(|V|³)."""
    names = graph.op_names
    weight: dict[tuple[str, str], int] = {}
    for e in graph.edges:
        w = e.delay - ii * e.distance
        weight[(e.src, e.dst)] = max(w, weight.get((e.src, e.dst), w))
    for k in names:
        into = [(u, weight[(u, k)]) for u in names if (u, k) in weight]
        out = [(v, weight[(k, v)]) for v in names if (k, v) in weight]
        for u, a in into:
            for v, b in out:
                if (u, v) not in weight or a + b > weight[(u, v)]:
                    weight[(u, v)] = a + b
    if any(weight.get((v, v), 0) > 0 for v in names):
        return None
    return weight


def length_lower_bound(graph: LoopGraph, ii: int) -> int:
    """``max_v asap(v) + cycles(v)``: no schedule at ``ii`` is shorter. Raises ValueError below RecMII."""
    asap = asap_starts(graph, ii)
    if asap is None:
        raise ValueError(f"II {ii} is below RecMII of graph {graph.name!r}")
    return max(asap[op.name] + op.cycles for op in graph.ops)


@dataclass(frozen=True)
class IssueBound:
    """``ii`` = ⌈busy / groups⌉: the ops with registers of width ``warps`` issue ``busy`` cycles per
    iteration and fit on at most ``groups`` register-holding warp groups."""

    ii: int
    warps: int
    groups: int
    busy: int


def warp_issue_bound(graph: LoopGraph, *, reg_limit: int, light_regs: int, regs_per_sm: int, max_warps: int,
                     slots: int) -> IssueBound | None:
    """The joint problem's II lower bound from its warp families (None when it gives nothing above 1).

    A non-variable-latency op ``v`` with ``regs(v) > 0`` runs on a compute slot whose width is ``warps(v)``
    and whose budget is ``R`` (it is register-holding). Let ``w₀`` be the width of W_vl when it holds no
    register value (``light_regs`` each). REGISTER FILE (``Σ_g 32·w_g·budget_g ≤ regs_per_sm``), WARP COUNT
    (``Σ_g w_g ≤ max_warps``) and the ``slots − 1`` compute slots allow at most
    ``k_w = min(⌊(regs_per_sm/32 − light_regs·w₀) / (R·w)⌋, ⌊(max_warps − w₀) / w⌋, slots − 1)`` such
    slots of width ``w``. WARP ISSUE makes the busy windows of one slot disjoint modulo I, so the slot's
    busy sum is at most I, and the slot with the most work has at least ``1/k_w`` of it:
    ``I ≥ ⌈Σ_{v: warps(v)=w, regs(v)>0} busy(v) / k_w⌉`` for every width ``w`` with ``k_w ≥ 1``.
    Valid whenever REGISTER FILE, WARP COUNT and WARP ISSUE are all enforced (never for a relaxed problem).
    """
    latency = [op for op in graph.ops if op.variable_latency]
    base = max((op.warps for op in latency), default=0) if all(op.regs == 0 for op in latency) else 0
    best: IssueBound | None = None
    for width in sorted({op.warps for op in graph.ops if op.regs > 0 and not op.variable_latency}):
        busy = sum(op.busy for op in graph.ops if op.regs > 0 and not op.variable_latency and op.warps == width)
        groups = min((regs_per_sm // 32 - light_regs * base) // (reg_limit * width),
                     (max_warps - base) // width, slots - 1)
        if groups < 1 or busy <= 0:
            continue
        bound = IssueBound(-(-busy // groups), width, groups, busy)
        if best is None or bound.ii > best.ii:
            best = bound
    return best if best is not None and best.ii > 1 else None
