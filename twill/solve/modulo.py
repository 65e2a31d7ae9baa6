"""Optimal modulo scheduling at a fixed II (paper §5, phase 1) with a compact CP-SAT encoding.

Variables: an integer start ``t_v = k_v·II + s_v`` per op (iteration 0) with its stage ``k_v`` and residue
``s_v ∈ [0, II)`` as variables of their own (CP-SAT propagates this linear split much better than
``s_v = t_v mod II``; docs/model.md §5), and the length ``L``. Constraints:

* DEPENDENCE — ``t_dst − t_src ≥ d − II·δ`` for every edge ``(src, dst, d, δ)``;
* COMPLETION — ``L ≥ t_v + cycles(v)``;
* MODULO CAPACITY — for every unit ``f`` and residue ``r ∈ [0, II)``:
  ``Σ_v Σ_{c : (t_v + c) mod II = r} RRT[v][c][f] ≤ cap(f)``.

The modulo capacity uses no time-indexed Booleans: each run of identical RRT rows becomes chunks of at most
II cycles; a chunk at offset ``o`` of op ``v`` is the interval ``[s, s + len)`` with ``s = (t_v + o) mod II``
plus its copy ``[s + II, s + II + len)``. Two chunks overlap modulo II exactly when one of these four
intervals meets another, so ``NoOverlap`` (capacity 1, unit demands) or ``Cumulative`` (otherwise) over
originals and copies is exact.

Infeasibility proofs (``prove=True``): before the full model, the *projection* of the problem onto a few
units is tried (:func:`projection_infeasible`): only the ops that use those units, their capacities, and
``t_v − t_u ≥ W(u, v)`` for the longest dependence path between every pair (through any op). Every schedule
of the full problem projects onto a schedule of this relaxation, so a projection without one proves the II
infeasible — in a model of a handful of ops instead of all of them (B200 flash-bwd: the tensor core and the
MUFU alone rule out II 195-201).

Objective: minimise ``L``. The start domain is safe: with the residues of any feasible schedule fixed, the
stages ``k_v`` satisfy difference constraints whose least solution has ``k_v ≤ Σ_e max(0, ⌈(d_e + II − 1)/II⌉
− δ_e)``, so ``t_v < II·(k_max + 1)`` loses no schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from twill.ir.graph import LoopGraph
from twill.schedule.vocab import Status
from twill.ir.bounds import asap_starts, dependence_closure, length_lower_bound
from twill.solve.normalize import rrt_runs


#: Seconds one projection solve (:func:`projection_infeasible`) may take at most; past it the projection
#: proves nothing and the full model decides.
PROJECTION_TIME_LIMIT = 10.0


@dataclass(frozen=True)
class ModuloResult:
    """The answer of one modulo-scheduling solve at a fixed II.

    Attributes:
        status: ``optimal`` (the objective, L or the copies ``⌈L/II⌉``, proved minimal), ``feasible`` (a
            schedule, objective not proved minimal), ``infeasible`` (proved: no schedule at this II within
            ``length_bounds``), ``unknown`` (time out).
        starts: op -> start cycle; empty unless a schedule was found.
        length: L of the schedule (0 when none).
        proven: the solver's answer is a proof (``optimal`` or ``infeasible``).
        length_bound: proved lower bound on L at this II (equal to ``length`` when L is proved minimal).
        ii: the initiation interval solved for.
        seconds: solver wall time.
    """

    status: Status
    starts: Mapping[str, int]
    length: int
    proven: bool
    length_bound: int = 0
    ii: int = 0
    seconds: float = 0.0
    stats: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in tuple(Status):
            raise ValueError(f"unknown modulo status {self.status!r}")
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "starts", MappingProxyType(dict(self.starts)))
        object.__setattr__(self, "stats", MappingProxyType(dict(self.stats)))

    @property
    def found(self) -> bool:
        return bool(self.starts)


@dataclass(frozen=True)
class Chunk:
    """A piece of an op's reservation of one unit: ``count`` instances for ``length ≤ II`` cycles starting
    ``offset`` cycles after the op starts."""

    op: str
    unit: str
    offset: int
    length: int
    count: int


def unit_chunks(graph: LoopGraph, ii: int) -> dict[str, list[Chunk]]:
    """Per unit, the chunks of all ops (runs of identical RRT rows split into pieces of at most ``ii``)."""
    chunks: dict[str, list[Chunk]] = {}
    for op in graph.ops:
        offset = 0
        for row, length in rrt_runs(op.rrt):
            for unit, count in row:
                for piece in range(0, length, ii):
                    chunks.setdefault(unit, []).append(
                        Chunk(op.name, unit, offset + piece, min(ii, length - piece), count))
            offset += length
    return chunks


def stage_limit(graph: LoopGraph, ii: int) -> int:
    """``k_max = Σ_e max(0, ⌈(d_e + II − 1)/II⌉ − δ_e)``: no stage beyond it is ever needed."""
    return sum(max(0, -(-(e.delay + ii - 1) // ii) - e.distance) for e in graph.edges)


def start_horizon(graph: LoopGraph, ii: int) -> int:
    """Largest start time the model allows: ``II·(k_max + 1) − 1``."""
    return ii * (stage_limit(graph, ii) + 1) - 1


def add_dependence(model: Any, graph: LoopGraph, ii: int, t: Mapping[str, Any]) -> None:
    """DEPENDENCE: ``t_dst − t_src ≥ d − II·δ``."""
    for e in graph.edges:
        model.add(t[e.dst] - t[e.src] >= e.delay - ii * e.distance)


def add_completion(model: Any, graph: LoopGraph, t: Mapping[str, Any], length: Any) -> None:
    """COMPLETION: ``L ≥ t_v + cycles(v)``."""
    for op in graph.ops:
        model.add(length >= t[op.name] + op.cycles)


def add_modulo_capacity(model: Any, graph: LoopGraph, units: Mapping[str, int], ii: int,
                        t: Mapping[str, Any], residues: Mapping[str, Any] | None = None) -> int:
    """MODULO CAPACITY: per unit, NoOverlap/Cumulative over chunk intervals and their II-shifted copies.
    Units absent from ``units`` and ops absent from ``t`` are left out (a projection); ``residues`` gives
    variables already equal to ``t_v mod II``. Returns the number of chunk intervals added."""
    given: dict[tuple[str, int], Any] = {(name, 0): s for name, s in (residues or {}).items()}
    added = 0
    for unit, every in sorted(unit_chunks(graph, ii).items()):
        chunks = [ch for ch in every if ch.op in t]
        if unit not in units or not chunks:
            continue
        starts, sizes, demands = [], [], []
        for ch in chunks:
            key = (ch.op, ch.offset % ii)
            if key not in given:
                s = model.new_int_var(0, ii - 1, f"s[{ch.op},+{key[1]}]")
                model.add_modulo_equality(s, t[ch.op] + key[1], ii)
                given[key] = s
            s = given[key]
            for shift in (0, ii):
                starts.append(s + shift)
                sizes.append(ch.length)
                demands.append(ch.count)
        cap = units[unit]
        intervals = [model.new_fixed_size_interval_var(st, size, f"itv[{unit}#{k}]")
                     for k, (st, size) in enumerate(zip(starts, sizes))]
        if cap == 1 and all(d == 1 for d in demands):
            model.add_no_overlap(intervals)
        else:
            model.add_cumulative(intervals, demands, cap)
        added += len(intervals)
    return added


def unit_load(graph: LoopGraph, units: Mapping[str, int]) -> list[tuple[str, float]]:
    """Units with work, most loaded first: ``(unit, Σ_v usage(v) / cap)``."""
    load = [(unit, sum(op.usage(unit) for op in graph.ops) / cap) for unit, cap in units.items()]
    return sorted([(unit, x) for unit, x in load if x > 0], key=lambda item: (-item[1], item[0]))


def projections(graph: LoopGraph, units: Mapping[str, int]) -> list[tuple[str, ...]]:
    """The unit sets :func:`projection_infeasible` tries: the most loaded unit together with each other
    loaded unit, in decreasing load (the most loaded unit alone when it is the only one)."""
    loaded = [unit for unit, _ in unit_load(graph, units)]
    if len(loaded) <= 1:
        return [tuple(loaded)] if loaded else []
    return [(loaded[0], other) for other in loaded[1:]]


def projection_feasible(graph: LoopGraph, units: Mapping[str, int], ii: int, kept: tuple[str, ...],
                        closure: Mapping[tuple[str, str], int], *, time_limit: float, seed: int = 0) -> str:
    """Solve the projection onto the units ``kept`` (module docstring): ``"sat"``, ``"unsat"`` or
    ``"unknown"``. Starts are ``t_v = k_v·II + s_v`` with ``s_v ∈ [0, II)`` and ``k_v ∈ [0, k_max]``, a
    superset of the full model's start domain (:func:`start_horizon`), so the relaxation loses no schedule."""
    from twill.solve._ortools_loader import load_cp_model, new_solver, solve_model

    cp_model = load_cp_model()
    ops = [op.name for op in graph.ops if any(op.usage(unit) for unit in kept)]
    model = cp_model.CpModel()
    top = stage_limit(graph, ii)
    t, residues = {}, {}
    for name in ops:
        k = model.new_int_var(0, top, f"k[{name}]")
        residues[name] = model.new_int_var(0, ii - 1, f"s[{name}]")
        t[name] = k * ii + residues[name]
    for u in ops:
        for v in ops:
            if u != v and (u, v) in closure:
                model.add(t[v] - t[u] >= closure[(u, v)])
    add_modulo_capacity(model, graph, {unit: units[unit] for unit in kept}, ii, t, residues)
    solver = new_solver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    # No LP relaxation: the refutations are found by propagation and search, and the LP only slows them
    # (docs/model.md §5, "Projections").
    solver.parameters.linearization_level = 0
    code = solve_model(solver, model)
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "sat"
    return "unsat" if code == cp_model.INFEASIBLE else "unknown"


def projection_infeasible(graph: LoopGraph, units: Mapping[str, int], ii: int, *,
                          time_limit: float, seed: int = 0) -> tuple[str, ...] | None:
    """The first unit set of :func:`projections` whose projection has no schedule at ``ii`` (a proof that
    ``ii`` is infeasible), or ``None``. Each projection gets at most :data:`PROJECTION_TIME_LIMIT` seconds."""
    import time

    closure = dependence_closure(graph, ii)
    if closure is None:
        return None
    deadline = time.perf_counter() + time_limit
    for kept in projections(graph, units):
        left = min(PROJECTION_TIME_LIMIT, deadline - time.perf_counter())
        if left <= 0:
            return None
        if projection_feasible(graph, units, ii, kept, closure, time_limit=left, seed=seed) == "unsat":
            return kept
    return None


def fits_copies(solver: Any, model: Any, length: Any, most: int, *, time_limit: float, workers: int,
                seed: int) -> Any:
    """Solve a copy of the phase-1 ``model`` with ``L ≤ most`` for satisfiability alone with ``solver``;
    returns CP-SAT's status code (the schedule, if any, is read from ``solver`` with ``model``'s variables).

    With ``most`` = ``⌈lo/II⌉·II``, ``lo`` the proved lower end of L, a schedule proves the least copies at once
    (no schedule has fewer): a satisfiability search, where minimising the copies over their whole range lets
    CP-SAT wander among schedules with more (docs/model.md §5, "Copies"). ``infeasible`` proves one copy more;
    ``unknown`` proves nothing and the minimisation decides as before."""
    from twill.solve._ortools_loader import solve_model

    check = model.clone()
    check.add(check.get_int_var_from_proto_index(length.index) <= most)
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    return solve_model(solver, check)


def solve_modulo(graph: LoopGraph, units: Mapping[str, int], ii: int, *, time_limit: float, workers: int = 2,
                 seed: int = 0, length_bounds: tuple[int | None, int | None] | None = None,
                 hint: Mapping[str, int] | None = None, prove: bool = False,
                 minimise: str = "length") -> ModuloResult:
    """Minimise L (``minimise="length"``) or the copies ``n = ⌈L/II⌉`` (``minimise="copies"``) at initiation
    interval ``ii``; always returns a :class:`ModuloResult` (see its statuses).

    ``length_bounds = (lo, hi)`` restricts L (either end may be None); ``hint`` seeds the search with start
    times (for instance a schedule found at another II); ``prove`` first tries the projections of
    :func:`projection_infeasible` (worth it where the II is likely infeasible: below the first feasible II).

    ``copies`` is all the joint search needs of phase 1 (docs/model.md §5, "Copies"): its status is
    ``optimal`` when ``n`` is proved minimal, ``length`` is the L of the schedule found (not minimised) and
    ``length_bound`` the proved lower end ``max(lo, (n − 1)·II + 1)`` of L, which keeps ``n`` copies. Proving
    the least ``n`` is a handful of propagations (is there a schedule with ``L ≤ (n − 1)·II``?) where proving
    the least L is a search.
    """
    if minimise not in ("length", "copies"):
        raise ValueError(f"minimise must be 'length' or 'copies', got {minimise!r}")
    import time

    from twill.solve._ortools_loader import load_cp_model, new_solver, solve_model

    cp_model = load_cp_model()
    began = time.perf_counter()
    asap = asap_starts(graph, ii)
    if asap is None:
        return ModuloResult(Status.INFEASIBLE, {}, 0, True, 0, ii, 0.0, {"reason": "II below RecMII"})
    horizon = start_horizon(graph, ii)
    max_len = horizon + max(op.cycles for op in graph.ops)
    lo, hi = length_lower_bound(graph, ii), max_len
    if length_bounds is not None:
        lo = max(lo, length_bounds[0] or 0)
        hi = min(hi, max_len if length_bounds[1] is None else length_bounds[1])
    if lo > hi:
        return ModuloResult(Status.INFEASIBLE, {}, 0, True, lo, ii, 0.0, {"reason": "length bounds exclude every L"})
    if prove:
        kept = projection_infeasible(graph, units, ii, time_limit=time_limit / 2, seed=seed)
        if kept is not None:
            return ModuloResult(Status.INFEASIBLE, {}, 0, True, lo, ii, time.perf_counter() - began,
                                {"reason": f"projection onto {', '.join(kept)}", "projection": kept})
        time_limit = max(0.01, time_limit - (time.perf_counter() - began))

    model = cp_model.CpModel()
    t, residues = {}, {}
    for op in graph.ops:
        t[op.name] = model.new_int_var(asap[op.name], horizon, f"t[{op.name}]")
        residues[op.name] = model.new_int_var(0, ii - 1, f"s[{op.name}]")
        model.add(t[op.name] == model.new_int_var(0, horizon // ii, f"k[{op.name}]") * ii + residues[op.name])
    length = model.new_int_var(lo, hi, "L")
    add_dependence(model, graph, ii, t)
    add_completion(model, graph, t, length)
    intervals = add_modulo_capacity(model, graph, units, ii, t, residues)
    for name, value in (hint or {}).items():
        if name in t:
            model.add_hint(t[name], value)
    least = -(-lo // ii)
    if minimise == "copies":
        solver = new_solver()
        code = fits_copies(solver, model, length, least * ii, time_limit=time_limit / 2, workers=workers, seed=seed)
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            stats = {"intervals": intervals, "horizon": horizon, "branches": solver.num_branches}
            return ModuloResult(Status.OPTIMAL, {name: solver.value(var) for name, var in t.items()},
                                solver.value(length), True, lo, ii, time.perf_counter() - began, stats)
        if code == cp_model.INFEASIBLE:
            model.add(length >= least * ii + 1)
            least += 1
        time_limit = max(0.01, time_limit - (time.perf_counter() - began))
        copies = model.new_int_var(least, max(least, -(-hi // ii)), "n")
        model.add(length <= copies * ii)
        model.minimize(copies)
    else:
        model.minimize(length)

    solver = new_solver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    code = solve_model(solver, model)
    seconds = time.perf_counter() - began
    stats = {"intervals": intervals, "horizon": horizon, "branches": solver.num_branches}
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = {name: solver.value(var) for name, var in t.items()}
        value = solver.value(length)
        optimal = code == cp_model.OPTIMAL
        if minimise == "copies":
            bound = max(lo, (int(solver.best_objective_bound) - 1) * ii + 1)
        else:
            bound = value if optimal else max(lo, int(solver.best_objective_bound))
        return ModuloResult(Status.OPTIMAL if optimal else Status.FEASIBLE, starts, value, optimal, bound, ii, seconds,
                            stats)
    if code == cp_model.INFEASIBLE:
        return ModuloResult(Status.INFEASIBLE, {}, 0, True, lo, ii, seconds, stats)
    return ModuloResult(Status.UNKNOWN, {}, 0, False, lo, ii, seconds, stats)


def modulo_schedule(graph: LoopGraph, units: Mapping[str, int], ii: int, *, time_limit: float,
                    workers: int = 2, seed: int = 0,
                    length_bounds: tuple[int | None, int | None] | None = None,
                    hint: Mapping[str, int] | None = None) -> ModuloResult | None:
    """A modulo schedule of minimal L at ``ii``, or ``None`` when none was found (proved infeasible or time
    out; call :func:`solve_modulo` to tell the two apart). ``status`` is ``optimal`` or ``feasible``."""
    result = solve_modulo(graph, units, ii, time_limit=time_limit, workers=workers, seed=seed,
                          length_bounds=length_bounds, hint=hint)
    return result if result.found else None
