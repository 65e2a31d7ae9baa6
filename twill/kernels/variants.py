"""Hand-built schedules of the built-in kernels: what each family's ``variants.py`` shares.

A family's ``variants.py`` (:mod:`twill.kernels.gemm.variants`, :mod:`twill.kernels.flash_fwd.variants`,
:mod:`twill.kernels.flash_bwd.variants`) builds real :class:`~twill.schedule.result.Schedule` s of the family's
loop graph by hand (``solver="manual"``, no solver) that place the same ops at other legal start times than the
joint solver, so that the emitted kernels differ: the tests' fixed schedules (golden kernels) and the
benchmarks' hand-built variants. Here: the register budgets of their warp groups and the greedy modulo list
scheduler (:func:`list_modulo_schedule`) the attention variants place their ops with. Hand-built schedules are
checked with :func:`twill.schedule.verify.verify` by the tests.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from twill.ir.graph import LoopGraph, Op
from twill.machine.models import Machine

#: Register budgets (setmaxnreg) of the hand-built schedules by sub-tiles: the producer keeps the minimum,
#: compute groups take what is left of 64 K registers (H100) for 1 producer + the compute warp groups
#: (the attention graph's ``reg_limit``: 240, or 160 for three 4-warp groups).
LOAD_REGS = 24
COMPUTE_REGS = {1: 240, 2: 240, 3: 160}


def _units(graph: LoopGraph, machine: Machine) -> dict[str, int]:
    return dict(graph.units) if graph.units is not None else dict(machine.units)


def list_modulo_schedule(graph: LoopGraph, machine: Machine, ii: int,
                         earliest: dict[str, int] | None = None,
                         group_of: dict[str, int] | None = None) -> dict[str, int] | None:
    """Greedy modulo list scheduling at ``ii``: ops in graph order (a topological order of the
    distance-0 edges for the built-in kernels), each at the first cycle ``>= max(pred + delay - δ·II,
    earliest[op])`` whose modulo reservation table has room. Returns the starts, or None if a
    loop-carried edge is violated (try a larger II). With ``group_of``, each warp group is a unit of capacity
    1 that an op holds for its ``busy`` cycles (WARP ISSUE), and an op with ``busy = 0`` needs its issue
    cycle free (CONCURRENCY)."""
    caps = _units(graph, machine)
    step = max(1, ii // 256)          # probe start cycles on a coarse grid: hand-built, not optimal
    usage: dict[str, np.ndarray] = {}  # unit or warp group -> how many are in use at each cycle modulo ii
    starts: dict[str, int] = {}
    for op in graph.ops:
        lo = (earliest or {}).get(op.name, 0)
        for e in graph.in_edges(op.name):
            if e.src in starts:
                lo = max(lo, starts[e.src] + e.delay - e.distance * ii)
        need = dict(_runs(op))
        warp = f"warp group {group_of[op.name]}" if group_of else None
        if warp:
            need[(warp, 0)] = ((0, max(1, op.busy)),)      # free (0 in use, capacity 0) from the start on
        t = _first_free(usage, need, {**caps, **({warp: 0} if warp else {})}, lo, step, ii)
        if t is None:
            return None
        for (u, n), spans in _runs(op).items():
            for a, b in spans:
                np.add.at(usage.setdefault(u, np.zeros(ii, dtype=np.int64)), (t + np.arange(a, b)) % ii, n)
        if warp:
            usage.setdefault(warp, np.zeros(ii, dtype=np.int64))[(t + np.arange(op.busy)) % ii] = 1
        starts[op.name] = t
    for e in graph.edges:
        if starts[e.dst] + e.distance * ii < starts[e.src] + e.delay:
            return None
    return starts


@lru_cache(maxsize=None)
def _runs(op: Op) -> dict[tuple[str, int], tuple[tuple[int, int], ...]]:
    """The op's reservation table as runs: (unit, count) -> the spans ``[a, b)`` of cycles from its start in
    which it holds ``count`` of the unit."""
    runs: dict[tuple[str, int], list[list[int]]] = {}
    for c, row in enumerate(op.rrt):
        for u, n in row:
            spans = runs.setdefault((u, n), [])
            if spans and spans[-1][1] == c:
                spans[-1][1] = c + 1
            else:
                spans.append([c, c + 1])
    return {key: tuple((a, b) for a, b in spans) for key, spans in runs.items()}


def _first_free(usage: dict[str, np.ndarray], need: dict[tuple[str, int], tuple[tuple[int, int], ...]],
                caps: dict[str, int], lo: int, step: int, ii: int) -> int | None:
    """The first start ``lo + k·step <= lo + ii`` at which every span of ``need`` fits beside ``usage``
    within ``caps`` (a unit missing from ``caps`` has none), or None. A span clashes when a cycle of its
    window (modulo ii) is already too full: a prefix count over the repeated cycles answers that for every
    start at once."""
    starts = lo + step * np.arange(ii // step + 1)
    residues = starts % ii
    clash = np.zeros(len(starts), dtype=bool)
    for (u, n), spans in need.items():
        full = usage.get(u, np.zeros(ii, dtype=np.int64)) + n > caps.get(u, 0)
        if not full.any():
            continue
        repeats = -(-max(b for _, b in spans) // ii) + 1
        before = np.concatenate(([0], np.cumsum(np.tile(full, repeats))))
        for a, b in spans:
            clash |= before[residues + b] > before[residues + a]
    free = np.flatnonzero(~clash)
    return int(starts[free[0]]) if len(free) else None
