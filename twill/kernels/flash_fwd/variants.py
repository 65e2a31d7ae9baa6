"""Hand-built attention-forward schedules (:mod:`twill.kernels.variants`): 1, 2 or 3 compute warp groups
(sub-tiles), ``S = Q K^T`` one stage ahead of the softmax or not, and ring depths.
"""

from __future__ import annotations

from twill.ir.graph import LoopGraph
from twill.kernels.variants import COMPUTE_REGS, LOAD_REGS, list_modulo_schedule
from twill.machine.models import Machine
from twill.schedule.result import Schedule, WarpGroup


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
