"""Geometry of the pictures, computed without matplotlib.

* :func:`timeline` — the ops of ``K`` consecutive iterations of the pipelined loop as bars, one lane per
  warp group and one per functional unit, with the prologue, steady state and epilogue;
* :func:`reservation_table` — the modulo reservation table: which op holds which unit instance at each
  cycle ``t mod II`` of the steady state;
* :func:`pressure` — registers per warp group and shared/tensor memory of the CTA, live at each cycle of
  the steady state.

The dependence graph's layout is in :mod:`twill.viz.graphlayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from twill.ir.graph import LoopGraph, Op
from twill.ir.semantics import in_place, read_cycles
from twill.ir.validate import effective_units
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.schedule.verify_ws import staging_bytes
from twill.viz.palette import op_colors, unit_color, unit_rank, warp_group_colors, warp_group_label


# -- timeline ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lane:
    """A horizontal lane: a warp group (``kind == "warp"``) or a functional unit (``kind == "unit"``).
    ``rows`` is the number of sub-rows needed so that bars in the lane never overlap."""

    key: str
    label: str
    kind: str
    color: str
    rows: int


@dataclass(frozen=True)
class Bar:
    """One op instance in a lane, over cycles ``[start, end)``. In a warp lane ``[start, issue_end)`` is
    the time the op keeps its warp busy; the rest is asynchronous work in flight (wgmma, TMA)."""

    lane: str
    row: int
    op: str
    iteration: int
    start: int
    end: int
    issue_end: int
    color: str

    @property
    def label(self) -> str:
        return f"{self.op}[{self.iteration}]"


@dataclass(frozen=True)
class Phases:
    """Prologue ``[0, steady_start)``, steady state ``[steady_start, epilogue_start)`` and epilogue
    ``[epilogue_start, end)`` of ``iterations`` iterations; with ``n = copies``:
    steady_start = (n - 1)·II, epilogue_start = K·II, end = (K - 1)·II + L."""

    ii: int
    iterations: int
    steady_start: int
    epilogue_start: int
    end: int


@dataclass(frozen=True)
class Timeline:
    """Lanes and bars of the timeline; ``run_ahead`` says streaming loads are drawn running ahead."""

    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    phases: Phases
    run_ahead: bool = False


def default_iterations(schedule: Schedule) -> int:
    """Iterations the timeline shows: the ``copies`` that fill the pipeline plus two, so that the steady
    state repeats three times."""
    return schedule.copies + 2


def phases(schedule: Schedule, iterations: int) -> Phases:
    """The :class:`Phases` of ``iterations`` iterations (at least ``copies``)."""
    ii, n = schedule.ii, schedule.copies
    k = max(iterations, n)
    return Phases(ii=ii, iterations=k, steady_start=(n - 1) * ii, epilogue_start=k * ii,
                  end=(k - 1) * ii + schedule.length)


def unit_runs(op: Op, unit: str) -> list[tuple[int, int, int]]:
    """Maximal runs ``(first_row, end_row, count)`` of consecutive RRT rows in which ``op`` holds the same
    number of instances of ``unit``."""
    runs: list[tuple[int, int, int]] = []
    for row_index, row in enumerate(op.rrt):
        count = dict(row).get(unit, 0)
        if count and runs and runs[-1][1] == row_index and runs[-1][2] == count:
            runs[-1] = (runs[-1][0], row_index + 1, count)
        elif count:
            runs.append((row_index, row_index + 1, count))
    return runs


def used_units(graph: LoopGraph) -> list[str]:
    """Units some op of ``graph`` holds, in lane order."""
    units = {u for op in graph.ops for u in op.units()}
    return sorted(units, key=lambda u: (unit_rank(u), u))


def _pack(intervals: list[tuple[int, int, int]]) -> dict[int, int]:
    """Greedy interval partitioning: interval index -> row, so that no two intervals of a row overlap.
    ``intervals`` holds ``(start, end, index)``; processed by start, each takes the lowest free row."""
    row_end: list[int] = []
    rows: dict[int, int] = {}
    for start, end, index in sorted(intervals):
        for r, busy_until in enumerate(row_end):
            if busy_until <= start:
                row_end[r] = end
                rows[index] = r
                break
        else:
            rows[index] = len(row_end)
            row_end.append(end)
    return rows


def run_ahead_starts(schedule: Schedule, iterations: int) -> dict[tuple[str, int], int]:
    """Issue times of the streaming ops (variable-latency ops without inputs, paper §5.3) when their warp
    runs ahead of the compute pipeline, as a TMA producer does at run time.

    With ``D = streaming_depth`` buffers, the copy of iteration ``k`` may issue once the buffer used by
    iteration ``k - D`` is released, i.e. when its last consumer ``c`` (edge distance δ) completes:
    ``release = max_c starts[c] + cycles(c) + (k - D + δ)·II``. The warp issues in order (iteration, then
    schedule start), each op busy for ``busy`` cycles: ``t = max(previous t + busy, release, 0)``, and
    never later than the modulo schedule's ``starts[load] + k·II``.
    """
    graph, ii, depth = schedule.graph, schedule.ii, schedule.streaming_depth
    streaming = [n for n in graph.op_names if graph.is_streaming(n)]
    by_warp: dict[int | None, list[str]] = {}
    for name in streaming:
        by_warp.setdefault(schedule.assignment.get(name), []).append(name)
    out: dict[tuple[str, int], int] = {}
    for names in by_warp.values():
        cursor = 0
        order = sorted(((k, schedule.starts[n], n) for n in names for k in range(iterations)))
        for k, _, name in order:
            release = max((schedule.starts[e.dst] + graph.op(e.dst).cycles + (k - depth + e.distance) * ii
                           for e in graph.out_edges(name)), default=0)
            t = min(max(cursor, release, 0), schedule.starts[name] + k * ii)
            out[(name, k)] = t
            cursor = t + max(graph.op(name).busy, 1)
    return out


def timeline(schedule: Schedule, machine: Machine, iterations: int | None = None, *,
             run_ahead: bool = True) -> Timeline:
    """Bars of ``iterations`` consecutive iterations (iteration ``k`` issues op ``v`` at
    ``starts[v] + k·II``): warp lanes first (ops of the group, ``[t, t + cycles)``, issue part
    ``[t, t + busy)``), then one lane per unit holding the op's RRT runs. With ``run_ahead`` and warp
    specialization, streaming loads are drawn at their :func:`run_ahead_starts` (their own warp runs
    ahead) instead of their modulo residues."""
    k_iters = default_iterations(schedule) if iterations is None else iterations
    ph = phases(schedule, k_iters)
    graph, ii = schedule.graph, schedule.ii
    colors = op_colors(schedule)
    group_colors = warp_group_colors(schedule.warps)
    ahead = run_ahead_starts(schedule, ph.iterations) if run_ahead and schedule.warps else {}
    lanes: list[Lane] = []
    bars: list[Bar] = []

    def issue(name: str, it: int) -> int:
        return ahead.get((name, it), schedule.starts[name] + it * ii)

    def add_lane(key: str, label: str, kind: str, color: str, items: list[tuple[int, int, int, str, int]]) -> None:
        rows = _pack([(s, e, i) for i, (s, e, _, _, _) in enumerate(items)])
        for i, (s, e, issue_end, name, it) in enumerate(items):
            bars.append(Bar(key, rows[i], name, it, s, e, issue_end, colors[name]))
        lanes.append(Lane(key, label, kind, color, max(rows.values(), default=0) + 1))

    for wg in schedule.warps:
        items = []
        for name in wg.ops:
            op = graph.op(name)
            for it in range(ph.iterations):
                t = issue(name, it)
                items.append((t, t + op.cycles, t + min(op.busy, op.cycles), name, it))
        add_lane(f"wg{wg.id}", warp_group_label(wg), "warp", group_colors[wg.id], items)
    capacities = effective_units(graph, machine.units)
    for unit in used_units(graph):
        items = []
        for op in graph.ops:
            for first, end, _count in unit_runs(op, unit):
                for it in range(ph.iterations):
                    t = issue(op.name, it)
                    items.append((t + first, t + end, t + end, op.name, it))
        label = f"{unit} (x{capacities.get(unit, 1)})" if capacities.get(unit, 1) > 1 else unit
        add_lane(f"unit:{unit}", label, "unit", unit_color(unit), items)
    return Timeline(tuple(lanes), tuple(bars), ph, bool(ahead))


# -- modulo reservation table ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """Op ``op`` (of stage ``stage``) holds instance ``row`` of ``unit`` over residues ``[start, end)`` of
    the steady state (``0 <= start < end <= II``)."""

    unit: str
    row: int
    start: int
    end: int
    op: str
    stage: int
    color: str


@dataclass(frozen=True)
class ReservationTable:
    """The cells of the modulo reservation table; ``units`` lists ``(unit, rows shown)`` in lane order with
    rows = max(capacity, instances used) — a row past the capacity means an over-subscribed unit."""

    ii: int
    units: tuple[tuple[str, int], ...]
    cells: tuple[Cell, ...]
    capacity: Mapping[str, int]


def _modulo_pieces(start: int, end: int, ii: int) -> list[tuple[int, int]]:
    """Split cycles ``[start, end)`` into contiguous residue ranges of ``[0, II)`` (wrapping at II)."""
    pieces: list[tuple[int, int]] = []
    t = start
    while t < end:
        residue = t % ii
        length = min(end - t, ii - residue)
        pieces.append((residue, residue + length))
        t += length
    return pieces


def reservation_table(schedule: Schedule, machine: Machine) -> ReservationTable:
    """The modulo reservation table MRT[unit][t mod II]: each RRT run of each op, at ``starts[op] + row``,
    folded modulo II and placed on the lowest unit instance free over all its residues."""
    graph, ii = schedule.graph, schedule.ii
    colors = op_colors(schedule)
    capacity = effective_units(graph, machine.units)
    cells: list[Cell] = []
    units: list[tuple[str, int]] = []
    for unit in used_units(graph):
        occupied: list[set[int]] = []
        for op in graph.ops:
            for first, end, count in unit_runs(op, unit):
                pieces = _modulo_pieces(schedule.starts[op.name] + first, schedule.starts[op.name] + end, ii)
                covered = {s for a, b in pieces for s in range(a, b)}
                for _ in range(count):
                    row = next((r for r, used in enumerate(occupied) if not used & covered), len(occupied))
                    if row == len(occupied):
                        occupied.append(set())
                    occupied[row] |= covered
                    cells.extend(Cell(unit, row, a, b, op.name, schedule.stage(op.name), colors[op.name])
                                 for a, b in pieces)
        units.append((unit, max(capacity.get(unit, 1), len(occupied))))
    return ReservationTable(ii, tuple(units), tuple(cells), dict(capacity))


# -- memory pressure ---------------------------------------------------------------------------------------
def live_interval(schedule: Schedule, name: str) -> tuple[int, int]:
    """Cycles ``[start, end)`` during which the result of iteration 0's ``name`` is live, as the solver and
    verifier count it (docs/model.md, Liveness, in the steady state): an accumulator updated in place lives
    until its next copy issues, ``[t, t + II)``; any other value until its last reader is done,
    ``end = max(t + 1, max over edges (name -> u, δ) of t_u + δ·II + read(name, u))`` with ``read`` the
    reader's cycles, or 0 when it overwrites the value in place."""
    graph, ii = schedule.graph, schedule.ii
    start = schedule.starts[name]
    if in_place(graph, name):
        return start, start + ii
    ends = [schedule.starts[e.dst] + e.distance * ii + read_cycles(graph, name, e.dst) for e in graph.out_edges(name)]
    return start, max([start + 1, *ends])


def live_copies(start: int, end: int, residue: int, ii: int) -> int:
    """Number of iterations ``k`` whose copy of an interval ``[start, end)`` covers cycle ``residue + k·II``:
    ⌈(end - residue)/II⌉ - ⌈(start - residue)/II⌉."""
    return -((residue - end) // ii) + ((residue - start) // ii)


@dataclass(frozen=True)
class PressureSeries:
    """Usage of one resource over the steady state: ``by_owner`` maps a warp-group label (or ``all``) to
    its usage at each residue ``0..II-1``; ``limit`` is the capacity; ``allocated`` is, for memories, the
    static allocation that the solver checks against the limit (ring buffers, staging, resident tiles),
    else None."""

    title: str
    unit: str
    by_owner: Mapping[str, tuple[int, ...]]
    colors: Mapping[str, str]
    limit: int
    allocated: int | None = None

    @property
    def total(self) -> tuple[int, ...]:
        series = list(self.by_owner.values())
        return tuple(sum(values) for values in zip(*series)) if series else ()

    @property
    def peak(self) -> int:
        return max(self.total, default=0)


def _live_usage(schedule: Schedule, names: list[str], amount: Mapping[str, int]) -> tuple[int, ...]:
    ii = schedule.ii
    usage = [0] * ii
    for name in names:
        if not amount[name]:
            continue
        start, end = live_interval(schedule, name)
        for residue in range(ii):
            usage[residue] += amount[name] * live_copies(start, end, residue, ii)
    return tuple(usage)


def _owners(schedule: Schedule) -> list[tuple[str, str, list[str], int]]:
    """(key, label, op names, register limit) per warp group; one ``all`` group (limit 0 = the machine's
    per-thread cap) for a schedule without warps."""
    if not schedule.warps:
        return [("all", "all ops (no warp specialization)", list(schedule.graph.op_names), 0)]
    return [(f"wg{wg.id}", warp_group_label(wg), list(wg.ops), wg.regs) for wg in schedule.warps]


def pressure(schedule: Schedule, machine: Machine) -> list[PressureSeries]:
    """Registers per thread live in each warp group (limit: its ``setmaxnreg`` budget; the per-thread
    cap without warp specialization), then shared memory and tensor memory of the CTA, stacked by the
    producing warp group, with their static allocation (``Schedule.result_depth`` buffers per value, plus
    :func:`staging_bytes` and ``graph.attrs["smem_resident"]`` for shared memory; limits
    ``smem_per_block``, ``tmem_bytes``). A value is charged to the warp group of the op that produces it,
    for its :func:`live_interval`."""
    graph = schedule.graph
    group_colors = warp_group_colors(schedule.warps)
    color_of = {f"wg{wg.id}": group_colors[wg.id] for wg in schedule.warps}
    color_of["all"] = "#7f7f7f"
    owners = _owners(schedule)
    regs = {op.name: op.regs for op in graph.ops}
    out: list[PressureSeries] = []
    for key, label, names, limit in owners:
        out.append(PressureSeries(f"registers: {label}", "regs/thread",
                                  {key: _live_usage(schedule, names, regs)}, {key: color_of[key]},
                                  limit or machine.max_regs_per_thread))
    for field, title, limit in (("smem", "shared memory (CTA)", machine.smem_per_block),
                                ("tmem", "tensor memory (CTA)", machine.tmem_bytes)):
        amount = {op.name: getattr(op, field) for op in graph.ops}
        staging = staging_bytes(schedule) if field == "smem" else 0
        if not any(amount.values()) and not staging:
            continue
        by_owner = {key: _live_usage(schedule, names, amount) for key, _, names, _ in owners}
        by_owner = {k: v for k, v in by_owner.items() if any(v)} or {owners[0][0]: by_owner[owners[0][0]]}
        allocated = sum(amount[n] * schedule.result_depth(n) for n in graph.op_names) + staging
        if field == "smem":
            allocated += int(graph.attrs.get("smem_resident", 0))
        out.append(PressureSeries(title, "bytes", by_owner, {k: color_of[k] for k in by_owner}, limit,
                                  allocated))
    return out
