"""Cost normalization (paper §5.2): replace raw cycle counts by small integers with nearly the same ratios.

Modulo scheduling is exponential in the sum of edge delays, so raw counts (≈ 1000 cycles for a 128³ GEMM)
make it intractable; multiplying every count by the same positive number gives an isomorphic problem, so
only the ratios matter. Given the distinct positive cycle quantities ``C`` of a graph, the ZLP

    minimise   F
    subject to −F ≤ C[i]·C′[j] − C[j]·C′[i] ≤ F      for all i < j     (ratio distortion)
               1 ≤ Σ_i C′[i] ≤ U                                     (resolution budget)
               C′[i] ≥ 1,  C′[i] integer                               (nothing that takes time becomes free)

picks the normalized counts ``C′``. Among the minimisers of ``F`` the coarsest (smallest ``Σ C′``) is kept,
which makes the answer unique in practice and keeps the scheduling problems small. Zero stays zero.

Normalized quantities: RRT run lengths (so op cycles), op latencies, edge delays, spill costs, warp_busy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from twill.errors import TwillError
from twill.ir.graph import Edge, LoopGraph, Op, RRTRow

#: Solver time for each of the two normalization solves (F, then Σ C′ at that F), in seconds.
NORMALIZE_TIME_LIMIT = 10.0


@dataclass(frozen=True)
class Normalization:
    """The outcome of cost normalization.

    Attributes:
        mapping: raw cycle count -> normalized count, for every distinct positive quantity of the graph.
        distortion: F, the largest ``|C[i]·C′[j] − C[j]·C′[i]|`` (0 = every ratio is exact).
        resolution: U, the bound on ``Σ C′`` that was asked for.
        cycles_per_unit: the least-squares scale ``s = Σ C² / Σ C·C′`` of ``C ≈ s·C′``: roughly how many raw
            cycles one normalized cycle stands for.
        max_relative_error: ``max |C′[i]·s − C[i]| / C[i]`` over the values ``C[i] ≥ s`` (smaller values
            cannot be represented and are listed in ``floored``).
        floored: raw values below one normalized cycle (``C[i] < s``), mapped to at least 1.
        proven: True when the solver proved F minimal.
    """

    mapping: Mapping[int, int]
    distortion: int
    resolution: int
    cycles_per_unit: float
    max_relative_error: float
    proven: bool
    floored: tuple[int, ...] = ()

    def scale(self, value: int) -> int:
        """The normalized value of a raw quantity (0 stays 0)."""
        return 0 if value == 0 else self.mapping[value]

    def to_dict(self) -> dict[str, Any]:
        """The record stored in ``Schedule.stats["normalization"]``."""
        return {"enabled": True, "map": {str(k): v for k, v in sorted(self.mapping.items())},
                "F": self.distortion, "U": self.resolution, "cycles_per_unit": round(self.cycles_per_unit, 4),
                "max_relative_error": round(self.max_relative_error, 4), "floored": list(self.floored),
                "proven": self.proven}


def rrt_runs(rrt: tuple[RRTRow, ...]) -> list[tuple[RRTRow, int]]:
    """The RRT as runs of identical consecutive rows: ``[(row, length), ...]``."""
    runs: list[tuple[RRTRow, int]] = []
    for row in rrt:
        if runs and runs[-1][0] == row:
            runs[-1] = (row, runs[-1][1] + 1)
        else:
            runs.append((row, 1))
    return runs


def cycle_quantities(graph: LoopGraph) -> list[int]:
    """Distinct positive cycle quantities of ``graph``: RRT run lengths, latencies, delays, spill costs,
    warp_busy. Sorted ascending."""
    values: set[int] = set()
    for op in graph.ops:
        values.update(length for _, length in rrt_runs(op.rrt))
        values.update(v for v in (op.latency, op.spill_cost, op.warp_busy) if v)
    values.update(e.delay for e in graph.edges if e.delay)
    return sorted(values)


def solve_normalization(costs: list[int], resolution: int, *, time_limit: float = NORMALIZE_TIME_LIMIT,
                        workers: int = 1) -> tuple[list[int], int, bool]:
    """Solve the ZLP of the module docstring with CP-SAT; return ``(C′, F, proven)``.

    Raises :class:`TwillError` when ``U`` is smaller than the number of distinct quantities (every C′ ≥ 1).
    """
    n = len(costs)
    if n == 0:
        return [], 0, True
    if n == 1:
        return [1], 0, True
    if resolution < n:
        raise TwillError(f"normalization resolution U={resolution} is below the {n} distinct cycle counts of "
                         f"the graph; raise --resolution to at least {n} or use --no-normalize")
    from twill.solve._ortools_loader import load_cp_model, new_solver, solve_model

    cp_model = load_cp_model()

    def build() -> tuple[Any, list[Any], Any]:
        model = cp_model.CpModel()
        scaled = [model.new_int_var(1, resolution - n + 1, f"c_norm[{c}]") for c in costs]
        bound = max(costs) * resolution
        distortion = model.new_int_var(0, bound, "F")
        for i in range(n):
            for j in range(i + 1, n):
                diff = costs[i] * scaled[j] - costs[j] * scaled[i]
                model.add(diff <= distortion)
                model.add(-diff <= distortion)
        model.add(sum(scaled) <= resolution)
        return model, scaled, distortion

    def run(model: Any) -> Any:
        solver = new_solver()
        solver.parameters.max_time_in_seconds = time_limit
        solver.parameters.num_workers = workers
        status = solve_model(solver, model)
        return solver, status in (cp_model.OPTIMAL, cp_model.FEASIBLE), status == cp_model.OPTIMAL

    model, scaled, distortion = build()
    model.minimize(distortion)
    solver, found, proven = run(model)
    if not found:               # the time ran out before any solution: a proportional one, unproven
        fallback = proportional(costs, resolution)
        return fallback, distortion_of(costs, fallback), False
    best_f = solver.value(distortion)
    first = [solver.value(x) for x in scaled]

    model, scaled, distortion = build()
    model.add(distortion <= best_f)
    model.minimize(sum(scaled))
    for var, value in zip(scaled, first):
        model.add_hint(var, value)
    solver, found, _ = run(model)
    return ([solver.value(x) for x in scaled] if found else first), best_f, proven


def proportional(costs: list[int], resolution: int) -> list[int]:
    """A feasible point of the ZLP, the answer when its first solve finds none in time:
    ``C′[i] = 1 + ⌊C[i]·(U − n) / Σ C⌋``, so every ``C′ ≥ 1`` and ``Σ C′ ≤ U``."""
    spare, total = resolution - len(costs), sum(costs)
    return [1 + c * spare // total for c in costs]


def distortion_of(costs: list[int], scaled: list[int]) -> int:
    """F of the module docstring for the normalized counts ``scaled``."""
    n = len(costs)
    return max((abs(costs[i] * scaled[j] - costs[j] * scaled[i]) for i in range(n) for j in range(i + 1, n)),
               default=0)


def normalization_of(costs: list[int], scaled: list[int], distortion: int, resolution: int,
                     proven: bool) -> Normalization:
    """Package a ZLP solution with its distortion statistics."""
    per_unit = sum(c * c for c in costs) / sum(c * s for c, s in zip(costs, scaled)) if scaled else 1.0
    floored = tuple(c for c in costs if c < per_unit)
    rel = max((abs(s * per_unit - c) / c for c, s in zip(costs, scaled) if c >= per_unit), default=0.0)
    return Normalization(dict(zip(costs, scaled)), distortion, resolution, per_unit, rel, proven, floored)


def scale_op(op: Op, norm: Normalization) -> Op:
    """``op`` with every cycle quantity normalized; each RRT run keeps its row and gets a scaled length."""
    rrt = tuple(dict(row) for row, length in rrt_runs(op.rrt) for _ in range(norm.scale(length)))
    return replace(op, rrt=rrt,
                   latency=None if op.latency is None else norm.scale(op.latency),
                   spill_cost=norm.scale(op.spill_cost),
                   warp_busy=None if op.warp_busy is None else norm.scale(op.warp_busy))


def scale_edge(edge: Edge, norm: Normalization) -> Edge:
    return replace(edge, delay=norm.scale(edge.delay))


def normalize_graph(graph: LoopGraph, resolution: int = 300, *, time_limit: float = NORMALIZE_TIME_LIMIT,
                    workers: int = 1) -> tuple[LoopGraph, Normalization]:
    """Normalize every cycle quantity of ``graph`` (see the module docstring); return the new graph and the
    record of the mapping."""
    costs = cycle_quantities(graph)
    scaled, distortion, proven = solve_normalization(costs, resolution, time_limit=time_limit, workers=workers)
    norm = normalization_of(costs, scaled, distortion, resolution, proven)
    new = replace(graph, ops=tuple(scale_op(op, norm) for op in graph.ops),
                  edges=tuple(scale_edge(e, norm) for e in graph.edges))
    return new, norm
