"""Hand-built schedule variants of the built-in kernels, for the benchmark suites (not the library).

Each variant is a real :class:`~twill.schedule.result.Schedule` of the kernel's loop graph
(``solver="manual"``) that places the same ops at other legal start times than the joint solver, so that
the emitted kernels differ:

* GEMM: the wgmma wait lag (``mma_wait`` one stage after ``mma`` at II = MMA cycles, or in the same stage at
  a longer II), the streaming depth (ring buffers) and the compute warp count (4 or 8 warps, block_m 64/128).
* Attention: 1, 2 or 3 compute warp groups (sub-tiles), ``S = Q K^T`` one stage ahead of the softmax or not,
  and ring depths.

Hand-built schedules are checked with :func:`twill.schedule.verify.verify` by the tests.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from twill.ir.graph import LoopGraph, Op
from twill.machine.models import Machine
from twill.schedule.result import Schedule, WarpGroup

#: Register budgets (setmaxnreg) of the hand-built schedules by sub-tiles: the producer keeps the minimum,
#: compute groups take what is left of 64 K registers (H100) for 1 producer + the compute warp groups
#: (the attention graph's ``reg_limit``: 240, or 160 for three 4-warp groups).
LOAD_REGS = 24
COMPUTE_REGS = {1: 240, 2: 240, 3: 160}


def _ops(graph: LoopGraph, role: str) -> list[str]:
    return [op.name for op in graph.ops if op.attrs.get("role") == role]


def gemm_schedule(graph: LoopGraph, machine: Machine, *, lag: int = 1, depth: int = 3,
                  warps: int = 8) -> Schedule:
    """A hand-built GEMM schedule. ``C`` = MMA cycles, ``B`` = its issue cycles (the wait may not start while
    the next MMA issues: CONCURRENCY). Loads at 0 and 1 (one TMA unit), ``mma`` at 1. ``lag >= 1``: II = C
    and ``mma_wait`` at ``1 + C + B + (lag - 1)·II`` (stage ``lag``). ``lag = 0``: II = C + B + 2 so that
    ``mma_wait`` at ``1 + C + B`` stays in stage 0 (a slower, unlagged schedule)."""
    (load_a,), (load_b,) = _ops(graph, "load_a"), _ops(graph, "load_b")
    (mma,), (wait,) = _ops(graph, "mma"), _ops(graph, "mma_wait")
    cycles, busy = graph.op(mma).cycles, graph.op(mma).busy
    ii = cycles if lag >= 1 else cycles + busy + 2
    starts = {load_a: 0, load_b: 1, mma: 1, wait: 1 + cycles + busy + max(0, lag - 1) * ii}
    warps_ = (WarpGroup(0, "compute", warps, COMPUTE_REGS[1], (mma, wait)),
              WarpGroup(1, "load", 1, LOAD_REGS, (load_a, load_b)))
    return Schedule(graph=graph, arch=machine.name, solver="manual", status="feasible", ii=ii,
                    ii_lower_bound=cycles, starts=starts,
                    assignment={mma: 0, wait: 0, load_a: 1, load_b: 1}, warps=warps_, streaming_depth=depth,
                    stats={"variant": f"lag{lag}_d{depth}_w{warps}"})


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


def flash_schedule(graph: LoopGraph, machine: Machine, *, ahead: int = 1, depth: int = 2,
                   warps: int | None = None, grouped: bool = False) -> Schedule:
    """A hand-built attention schedule: one compute warp group per sub-tile (8 warps for one 128-row tile,
    4 per 64-row sub-tile) plus the TMA producer; ``ahead = 1`` starts every softmax op at least one II
    after its ``qk`` (so ``pv`` is one stage after ``qk``), ``ahead = 0`` keeps ``qk`` and ``pv`` in one stage.
    ``grouped`` (two sub-tiles) starts sub-tile b's ``qk`` after sub-tile a's ``pv`` ends, so each group's two
    wgmmas are adjacent on the tensor core (one ping-pong turn per iteration, as in FA3). The smallest II
    (from the tensor-core bound up) at which the greedy list scheduler succeeds is used."""
    subtiles = int(graph.attrs.get("subtiles", 1))
    warps = warps or (8 if subtiles == 1 else 4)
    tc = sum(op.usage("tc") for op in graph.ops)
    group_of = {op.name: subtiles if op.variable_latency else int(op.attrs.get("subtile", 0)) for op in graph.ops}
    busy = max(sum(op.busy for op in graph.ops if group_of[op.name] == g) for g in set(group_of.values()))
    lower = max(tc, busy)
    for ii in range(lower, 4 * lower, max(1, lower // 64)):
        earliest = {}
        if ahead:
            for op in graph.ops:
                if op.attrs.get("role") in ("rowmax", "alpha", "exp", "rowsum", "rescale", "pv"):
                    earliest[op.name] = ii
        else:
            earliest = {}
        starts = list_modulo_schedule(graph, machine, ii, earliest, group_of)
        if starts is not None and grouped and subtiles == 2:
            pv_a = next(op for op in graph.ops if op.attrs.get("role") == "pv" and op.attrs.get("subtile") == 0)
            (qk_b,) = [op.name for op in graph.ops if op.attrs.get("role") == "qk" and op.attrs.get("subtile") == 1]
            earliest = {**earliest, qk_b: starts[pv_a.name] + pv_a.cycles}
            for op in graph.ops:
                if op.attrs.get("subtile") == 1 and op.name != qk_b and op.name in earliest:
                    earliest[op.name] = max(earliest[op.name], earliest[qk_b] + ahead * ii)
            starts = list_modulo_schedule(graph, machine, ii, earliest, group_of)
        if starts is None:
            continue
        stages = {n: t // ii for n, t in starts.items()}
        qk_stage = {op.attrs.get("subtile", 0): stages[op.name] for op in graph.ops if op.attrs.get("role") == "qk"}
        ok = all(stages[op.name] - qk_stage[op.attrs.get("subtile", 0)] == ahead
                 for op in graph.ops if op.attrs.get("role") == "pv")
        if ok and not _violations(graph, machine, ii, lower, starts, subtiles, warps, depth):
            break
    else:
        raise ValueError(f"no hand-built schedule for {graph.name} with ahead={ahead}")
    return _flash_result(graph, machine, ii, lower, starts, subtiles, warps, depth,
                         f"ahead{ahead}_d{depth}_sub{subtiles}{'_grouped' if grouped else ''}")


def _violations(graph: LoopGraph, machine: Machine, ii: int, lower: int, starts: dict[str, int], subtiles: int,
                warps: int, depth: int) -> list[str]:
    from twill.schedule.verify import violations

    return violations(_flash_result(graph, machine, ii, lower, starts, subtiles, warps, depth, ""), machine)


def _flash_result(graph: LoopGraph, machine: Machine, ii: int, lower: int, starts: dict[str, int], subtiles: int,
                  warps: int, depth: int, name: str) -> Schedule:
    """The hand-built attention schedule: one compute group per sub-tile, then the TMA producer group."""
    assignment, groups = {}, []
    for s in range(subtiles):
        ops = tuple(op.name for op in graph.ops
                    if not op.variable_latency and int(op.attrs.get("subtile", 0)) == s)
        groups.append(WarpGroup(s, "compute", warps, COMPUTE_REGS[subtiles], ops))
        assignment.update({n: s for n in ops})
    loads = tuple(op.name for op in graph.ops if op.variable_latency)
    groups.append(WarpGroup(subtiles, "load", 1, LOAD_REGS, loads))
    assignment.update({n: subtiles for n in loads})
    return Schedule(graph=graph, arch=machine.name, solver="manual", status="feasible", ii=ii,
                    ii_lower_bound=lower, starts=starts, assignment=assignment, warps=tuple(groups),
                    streaming_depth=depth, stats={"variant": name})


def flash_bwd_schedule(graph: LoopGraph, machine: Machine, *, depth: int = 2, dq_lag: int = 1,
                       late: tuple[str, ...] = ()) -> Schedule:
    """A hand-built Hopper attention-backward schedule: every compute op on one 8-warp group (FA3's two MMA
    warp groups), the TMA loads and the dQ reduce (``dq_atomic``) on the producer; ``depth`` ring buffers
    (streaming depth) and ``dq_atomic`` ``dq_lag`` stages after ``dq_store`` (dQ staging buffers =
    ``dq_lag + 1``). The compute ops in ``late`` start in stage 1 (at II or later, so early in the
    steady-state order, as the joint solver places P's conversion, dV and the dQ store at head dim 64), the
    others in stage 0. The smallest II (from the tensor-core bound up) at which the greedy list scheduler
    meets this is used."""
    group_of = {op.name: 1 if op.variable_latency else 0 for op in graph.ops}
    compute = [op.name for op in graph.ops if group_of[op.name] == 0]
    tc = sum(op.usage("tc") for op in graph.ops)
    busy = max(sum(op.busy for op in graph.ops if group_of[op.name] == g) for g in (0, 1))
    lower = max(tc, busy)
    (store,) = _ops(graph, "dq_store")
    (atomic,) = _ops(graph, "dq_atomic")
    for ii in range(lower, 4 * lower, max(1, lower // 64)):
        earliest = {op: ii for op in late}
        starts = list_modulo_schedule(graph, machine, ii, earliest, group_of)
        if starts is None or any(starts[n] // ii != int(n in late) for n in compute):
            continue
        stage = starts[store] // ii + dq_lag
        earliest[atomic] = max(starts[atomic], stage * ii)
        starts = list_modulo_schedule(graph, machine, ii, earliest, group_of)
        if starts is None or starts[atomic] // ii != stage or any(starts[n] // ii != int(n in late)
                                                                    for n in compute):
            continue
        groups = (WarpGroup(0, "compute", 8, COMPUTE_REGS[1], tuple(compute)),
                  WarpGroup(1, "load", 1, LOAD_REGS, tuple(n for n in group_of if group_of[n] == 1)))
        return Schedule(graph=graph, arch=machine.name, solver="manual", status="feasible", ii=ii,
                        ii_lower_bound=lower, starts=starts, assignment=group_of, warps=groups,
                        streaming_depth=depth,
                        stats={"variant": f"bwd_d{depth}_dqlag{dq_lag}{'_late' if late else ''}"})
    raise ValueError(f"no hand-built schedule for {graph.name} with dq_lag={dq_lag}, late={late}")
