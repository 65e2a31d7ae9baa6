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
  bound") from REGISTER FILE, WARP COUNT, the slot count and WARP ISSUE: the ops of one width can only
  spread over as many groups of that width as the register file admits next to the other widths' groups
  (ops with registers over register-holding groups only), and each group issues its ops one after another.
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
    """``ii`` = ⌈busy / groups⌉: the ops of width ``warps`` counted in ``busy`` issue that many cycles per
    iteration and fit on at most ``groups`` warp groups (the binding term of :func:`warp_issue_bound`)."""

    ii: int
    warps: int
    groups: int
    busy: int


def _reserved(graph: LoopGraph, width: int, *, reg_limit: int, light_regs: int) -> tuple[int, int, int]:
    """(registers per thread summed over warps, warps, compute slots) that the slots of every width other
    than ``width`` take at least: W_vl at ``light_regs`` when it holds no register value, and one slot for each
    other width of a non-variable-latency op (WARP UNIQUENESS: ``w_g = warps(v)``), at ``R`` when an op of that
    width holds registers (its slot is register-holding), else at ``light_regs``."""
    latency = [op for op in graph.ops if op.variable_latency]
    w0 = max((op.warps for op in latency), default=0) if all(op.regs == 0 for op in latency) else 0
    regs, warps, slots = light_regs * w0, w0, 0
    for other in sorted({op.warps for op in graph.ops if not op.variable_latency} - {width}):
        heavy = any(op.regs > 0 for op in graph.ops if not op.variable_latency and op.warps == other)
        regs, warps, slots = regs + (reg_limit if heavy else light_regs) * other, warps + other, slots + 1
    return regs, warps, slots


def _width_bound(graph: LoopGraph, width: int, *, reg_limit: int, light_regs: int, regs_per_sm: int,
                 max_warps: int, slots: int) -> IssueBound | None:
    """The least II over every way to give width ``width`` ``h`` register-holding and ``l`` light slots that
    REGISTER FILE, WARP COUNT and the slot count admit next to :func:`_reserved`: the ops with registers
    need ``I ≥ ⌈heavy / h⌉``, all ops of the width ``I ≥ ⌈total / (h + l)⌉``. None when no split fits or
    the ops issue nothing."""
    ops = [op for op in graph.ops if not op.variable_latency and op.warps == width]
    heavy = sum(op.busy for op in ops if op.regs > 0)
    total = sum(op.busy for op in ops)
    regs, warps, used = _reserved(graph, width, reg_limit=reg_limit, light_regs=light_regs)
    best: IssueBound | None = None
    for h in range(1 if heavy else 0, slots):
        for light in range(0, slots - h):
            fits = (32 * (regs + width * (reg_limit * h + light_regs * light)) <= regs_per_sm
                    and warps + width * (h + light) <= max_warps and used + h + light <= slots - 1)
            if not fits or h + light == 0:
                continue
            terms = [IssueBound(-(-total // (h + light)), width, h + light, total)]
            if heavy:
                terms.append(IssueBound(-(-heavy // h), width, h, heavy))
            bound = max(terms, key=lambda b: b.ii)
            if best is None or bound.ii < best.ii:
                best = bound
    return best if total > 0 else None


def warp_issue_bound(graph: LoopGraph, *, reg_limit: int, light_regs: int, regs_per_sm: int, max_warps: int,
                     slots: int) -> IssueBound | None:
    """The joint problem's II lower bound from its warp families (None when it gives nothing above 1).

    Every non-variable-latency op ``v`` runs on a compute slot of width ``warps(v)`` (WARP UNIQUENESS); the
    slot's budget is ``R`` when it holds an op with ``regs > 0`` (register-holding), else ``light_regs``. For
    one width ``w``, let ``h`` and ``l`` be its numbers of register-holding and light slots. The other slots
    take at least ``ρ`` registers, ``ω`` warps and ``σ`` compute slots (:func:`_reserved`: W_vl when it holds
    no register value, and one slot of every other width present). REGISTER FILE, WARP COUNT and the
    ``slots − 1`` compute slots then require ``32·(ρ + w·(R·h + light_regs·l)) ≤ regs_per_sm``,
    ``ω + w·(h + l) ≤ max_warps`` and ``σ + h + l ≤ slots − 1``. WARP ISSUE makes the busy windows of one slot
    disjoint modulo I, so a slot's busy sum is at most I: the ops of width ``w`` with registers need
    ``I ≥ ⌈Σ busy / h⌉`` and all ops of width ``w`` (register-free ones such as a TMEM store may also sit on a
    light slot) ``I ≥ ⌈Σ busy / (h + l)⌉``. The least II over every admitted ``(h, l)`` is a bound for ``w``,
    and the largest over the widths is returned. Valid whenever REGISTER FILE, WARP COUNT and WARP ISSUE are
    all enforced (never for a relaxed problem).
    """
    best: IssueBound | None = None
    for width in sorted({op.warps for op in graph.ops if not op.variable_latency}):
        bound = _width_bound(graph, width, reg_limit=reg_limit, light_regs=light_regs, regs_per_sm=regs_per_sm,
                             max_warps=max_warps, slots=slots)
        if bound is not None and (best is None or bound.ii > best.ii):
            best = bound
    return best if best is not None and best.ii > 1 else None
