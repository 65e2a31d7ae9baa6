"""Independent re-check of the warp-specialization families of docs/model.md (no solver code; what an op means
for liveness and staging comes from :mod:`twill.ir.semantics`).

``ws_violations(schedule, machine, options)`` returns one message per violated constraint, each starting
with the family name: WARP UNIQUENESS, VARIABLE LATENCY, WARP COUNT, REGISTER FILE, REGISTER LIMIT,
CROSS-WARP SPILLS, CONCURRENCY, WARP ISSUE, MEMORY CAPACITY. Formulas are re-derived here from the
schedule's start times and warp groups; nothing is read back from the solver: the length ``L`` of Q is the
span of the start times and the number of copies ``n = ⌈L/I⌉``.
"""

from __future__ import annotations

import math
from typing import Any

from twill.ir.semantics import THREADS_PER_WARP, in_place, read_cycles, value_bytes
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.schedule.vocab import Family

def _option(options: Any, name: str, default: Any) -> Any:
    value = getattr(options, name, None) if options is not None else None
    return default if value is None else value


def _crosses(schedule: Schedule, src: str, dst: str) -> bool:
    """A register value (regs > 0) consumed on another warp group."""
    op = schedule.graph.op(src)
    return src != dst and op.regs > 0 and schedule.assignment[src] != schedule.assignment[dst]


def q_shape(schedule: Schedule) -> tuple[int, int, int]:
    """(n copies, L, T = (n−1)·I + L) of the straight-line program Q."""
    length = schedule.length
    copies = math.ceil(length / schedule.ii)
    return copies, length, (copies - 1) * schedule.ii + length


def uniqueness_violations(schedule: Schedule) -> list[str]:
    """WARP UNIQUENESS: group ids are their positions; every op on exactly one group whose width equals the
    op's warps; group op lists match the assignment; an ``mma_wait`` sits with the MMA it waits for."""
    out = []
    graph, groups = schedule.graph, schedule.warps
    out += [f"{Family.WARP_UNIQUENESS.heading}: warp group {g.id} is listed at position {k}"
            for k, g in enumerate(groups) if g.id != k]
    for op in graph.ops:
        gid = schedule.assignment.get(op.name)
        if gid is None or not 0 <= gid < len(groups):
            out.append(f"{Family.WARP_UNIQUENESS.heading}: op {op.name!r} has no valid warp group ({gid!r})")
            continue
        listed = [g.id for g in groups if op.name in g.ops]
        if listed != [gid]:
            out.append(f"{Family.WARP_UNIQUENESS.heading}: op {op.name!r} is listed in groups {listed},"
                       f" assigned to {gid}")
        if groups[gid].num_warps != op.warps and (op.warps < 4 or groups[gid].num_warps % op.warps):
            out.append(f"{Family.WARP_UNIQUENESS.heading}: op {op.name!r} needs {op.warps} warps but group {gid} has "
                       f"{groups[gid].num_warps}")
    for e in graph.edges:
        if e.blocking and e.src != e.dst and graph.op(e.dst).kind == "mma_wait" \
                and schedule.assignment.get(e.src) != schedule.assignment.get(e.dst):
            out.append(f"{Family.WARP_UNIQUENESS.heading}: wait {e.dst!r} is not on the group of the MMA"
                       f" {e.src!r} it waits for")
    return out


def variable_latency_violations(schedule: Schedule) -> list[str]:
    """VARIABLE LATENCY: all variable-latency ops share one group W_vl, which holds nothing else."""
    graph = schedule.graph
    vl_groups = {schedule.assignment[op.name] for op in graph.ops if op.variable_latency}
    out = []
    if len(vl_groups) > 1:
        out.append(f"{Family.VARIABLE_LATENCY.heading}: variable-latency ops are spread over groups"
                   f" {sorted(vl_groups)}")
    for op in graph.ops:
        if not op.variable_latency and schedule.assignment[op.name] in vl_groups:
            out.append(f"{Family.VARIABLE_LATENCY.heading}: op {op.name!r} has fixed latency but runs on W_vl "
                       f"(group {schedule.assignment[op.name]})")
    return out


def warp_count_violations(schedule: Schedule, machine: Machine, options: Any) -> list[str]:
    """WARP COUNT: every group has at least one warp, and ``Σ_g num_warps ≤ max_warps``."""
    out = [f"{Family.WARP_COUNT.heading}: warp group {g.id} has {g.num_warps} warps; a group has at least 1"
           for g in schedule.warps if g.num_warps < 1]
    limit = _option(options, "max_warps", machine.max_warps_per_cta)
    total = sum(g.num_warps for g in schedule.warps)
    if total > limit:
        out.append(f"{Family.WARP_COUNT.heading}: {total} warps exceed max warps {limit}")
    return out


def register_file_violations(schedule: Schedule, machine: Machine, options: Any) -> list[str]:
    """REGISTER FILE: legal setmaxnreg budgets, ``Σ_g 32·num_warps·regs ≤ regs_per_sm``; register-holding
    groups within ``reg_limit`` when one is given."""
    out = []
    limit = _option(options, "reg_limit", None)
    for g in schedule.warps:
        if g.regs % machine.setmaxnreg_step or not machine.setmaxnreg_min <= g.regs <= machine.setmaxnreg_max:
            out.append(f"{Family.REGISTER_FILE.heading}: group {g.id} budget {g.regs} is not a legal setmaxnreg value")
        holds = any(schedule.graph.op(n).regs > 0 for n in g.ops)
        if holds and limit is not None and g.regs > limit:
            out.append(f"{Family.REGISTER_FILE.heading}: group {g.id} budget {g.regs} exceeds the register"
                       f" limit {limit}")
    total = sum(THREADS_PER_WARP * g.num_warps * g.regs for g in schedule.warps)
    if total > machine.regs_per_sm:
        out.append(f"{Family.REGISTER_FILE.heading}: groups need {total} registers, the SM has {machine.regs_per_sm}")
    return out


def live_intervals(schedule: Schedule) -> list[tuple[str, int, int, int]]:
    """(op, copy, start, end) of every register value of Q: copy i of v is live on ``[t_v + i·I, E)`` with
    ``E = max(start + 1, end of each consumer copy)``; a consumer copy j ≤ n−1 ends its read at ``t_u + j·I
    + cycles(u)`` (at ``t_u + j·I`` when it overwrites v in place), beyond Q at T; an in-place accumulator
    ends at its next copy's issue, and its copy 0 starts at 0 (the initial value, held from loop entry)."""
    graph, ii = schedule.graph, schedule.ii
    copies, _, horizon = q_shape(schedule)
    out = []
    for op in graph.ops:
        if op.regs <= 0:
            continue
        t = schedule.starts[op.name]
        carried = in_place(graph, op.name)
        for i in range(copies):
            start = 0 if carried and i == 0 else t + i * ii
            ends = [start + 1]
            if carried:
                ends.append(t + (i + 1) * ii if i + 1 <= copies - 1 else horizon)
            else:
                for e in graph.out_edges(op.name):
                    j = i + e.distance
                    if j > copies - 1:
                        ends.append(horizon)
                        continue
                    ends.append(schedule.starts[e.dst] + j * ii + read_cycles(graph, op.name, e.dst))
            out.append((op.name, i, start, max(ends)))
    return out


def register_limit_violations(schedule: Schedule, machine: Machine) -> list[str]:
    """REGISTER LIMIT: per group, at every time, ``Σ regs of live values produced on it ≤ group.regs −
    reserved_regs`` (the bookkeeping registers every warp keeps: :meth:`Machine.reserved_regs
    <twill.machine.models.Machine.reserved_regs>`)."""
    out = []
    reserved = machine.reserved_regs(schedule.graph.attrs)
    graph = schedule.graph
    by_group: dict[int, list[tuple[int, int, int]]] = {}
    for name, _, start, end in live_intervals(schedule):
        gid, op = schedule.assignment[name], graph.op(name)
        # a cooperative group (8 warps running a 4-warp wgmma op) splits the tile: fewer regs per thread
        per_thread = op.regs * op.warps // max(op.warps, schedule.warps[gid].num_warps)
        by_group.setdefault(gid, []).append((start, end, per_thread))
    for gid, items in sorted(by_group.items()):
        events = sorted([(s, r) for s, _, r in items] + [(e, -r) for _, e, r in items],
                        key=lambda x: (x[0], x[1]))
        load = 0
        for when, delta in events:
            load += delta
            if load > schedule.warps[gid].regs - reserved:
                out.append(f"{Family.REGISTER_LIMIT.heading}: group {gid} holds {load} registers per thread at"
                           f" t={when}, budget {schedule.warps[gid].regs} minus {reserved} reserved")
                break
    return out


def cross_warp_violations(schedule: Schedule, options: Any) -> list[str]:
    """CROSS-WARP SPILLS: a crossing register value adds ``spill(u)``: ``t_v + δ·I ≥ t_u + d + spill(u)``;
    with ``cross_warp=False`` none may cross."""
    out = []
    allowed = _option(options, "cross_warp", True)
    for e in schedule.graph.edges:
        if not _crosses(schedule, e.src, e.dst):
            continue
        if not allowed:
            out.append(f"{Family.CROSS_WARP_SPILLS.heading}: register value {e.src!r} crosses to {e.dst!r} but"
                       f" cross-warp transfers are forbidden")
        spill = schedule.graph.op(e.src).spill_cost
        if schedule.starts[e.dst] + e.distance * schedule.ii < schedule.starts[e.src] + e.delay + spill:
            out.append(f"{Family.CROSS_WARP_SPILLS.heading}: {e.src}->{e.dst} crosses warp groups but leaves"
                       f" less than delay {e.delay} + spill {spill}")
    return out


def _waits(schedule: Schedule, name: str) -> bool:
    edges = schedule.graph.in_edges(name)
    return any(e.blocking for e in edges) or any(_crosses(schedule, e.src, name) for e in edges)


def concurrency_violations(schedule: Schedule) -> list[str]:
    """CONCURRENCY: a waiting op v (blocking in-edge or cross-warp receive) issues when no other op of its
    group is in flight: ``(t_v − t_o) mod I ≥ busy(o)``."""
    out = []
    graph, ii = schedule.graph, schedule.ii
    for v in graph.op_names:
        if not _waits(schedule, v):
            continue
        for o in graph.ops:
            if o.name == v or o.busy <= 0 or schedule.assignment[o.name] != schedule.assignment[v]:
                continue
            if (schedule.starts[v] - schedule.starts[o.name]) % ii < o.busy:
                out.append(f"{Family.CONCURRENCY.heading}: {v!r} waits while {o.name!r} is in flight on group "
                           f"{schedule.assignment[v]}")
    return out


def warp_issue_violations(schedule: Schedule) -> list[str]:
    """WARP ISSUE: ops of one group run one at a time: busy windows disjoint modulo I, each ``busy ≤ I``."""
    out = []
    graph, ii = schedule.graph, schedule.ii
    ops = [op for op in graph.ops if op.busy > 0]
    for k, a in enumerate(ops):
        if a.busy > ii:
            out.append(f"{Family.WARP_ISSUE.heading}: {a.name!r} keeps its warp busy {a.busy} cycles, longer"
                       f" than II {ii}")
        for b in ops[k + 1:]:
            if schedule.assignment[a.name] != schedule.assignment[b.name]:
                continue
            gap = (schedule.starts[b.name] - schedule.starts[a.name]) % ii
            if gap < a.busy or ii - gap < b.busy:
                out.append(f"{Family.WARP_ISSUE.heading}: {a.name!r} and {b.name!r} overlap on group"
                           f" {schedule.assignment[a.name]}")
    return out


def staging_bytes(schedule: Schedule) -> int:
    """Shared memory that register values crossing warp groups are staged in (docs/model.md §4):
    Σ over edges u -> v with regs(u) > 0 on different groups of bytes(u)·(k_v + δ − k_u + 1), bytes(u) =
    ``attrs["out_bytes"]`` else regs·4·32·warps. Ops without a warp group stage nothing."""
    graph, total = schedule.graph, 0
    for e in graph.edges:
        if e.src in schedule.assignment and e.dst in schedule.assignment and _crosses(schedule, e.src, e.dst):
            total += value_bytes(graph.op(e.src)) * (schedule.stage(e.dst) + e.distance - schedule.stage(e.src) + 1)
    return total


def memory_violations(schedule: Schedule, machine: Machine, options: Any) -> list[str]:
    """MEMORY CAPACITY: resident + Σ smem(v)·depth(v) + cross-warp staging ≤ smem_per_block;
    Σ tmem(v)·depth(v) ≤ tmem_bytes; depth(v) = ``Schedule.result_depth`` (1 for accumulators)."""
    graph = schedule.graph
    streaming_depth = _option(options, "streaming_depth", schedule.streaming_depth)
    smem, tmem = int(graph.attrs.get("smem_resident", 0)), 0
    for op in graph.ops:
        if not (op.smem or op.tmem):
            continue
        depth = schedule.result_depth(op.name, streaming_depth)
        smem += op.smem * depth
        tmem += op.tmem * depth
    smem += staging_bytes(schedule)
    out = []
    if smem > machine.smem_per_block:
        out.append(f"{Family.MEMORY_CAPACITY.heading}: {smem} bytes of shared memory exceed {machine.smem_per_block}")
    if machine.tmem_bytes and tmem > machine.tmem_bytes:
        out.append(f"{Family.MEMORY_CAPACITY.heading}: {tmem} bytes of tensor memory exceed {machine.tmem_bytes}")
    return out


def ws_violations(schedule: Schedule, machine: Machine, options: Any = None) -> list[str]:
    """Every warp-specialization violation of ``schedule`` (empty list = valid)."""
    out = uniqueness_violations(schedule)
    if out:
        return out
    out += variable_latency_violations(schedule)
    out += warp_count_violations(schedule, machine, options)
    out += register_file_violations(schedule, machine, options)
    out += register_limit_violations(schedule, machine)
    out += cross_warp_violations(schedule, options)
    out += concurrency_violations(schedule)
    out += warp_issue_violations(schedule)
    out += memory_violations(schedule, machine, options)
    return out
