"""Algorithm 1 with the CP-SAT backend: II upward, joint problem at LEN(M), secondary objectives, UNSAT
explanation, and the :class:`~twill.schedule.result.Schedule` with its warp groups (docs/model.md §5-6)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from itertools import combinations
from typing import Any, Callable, Mapping

from twill.errors import InfeasibleScheduleError
from twill.ir.graph import LoopGraph
from twill.ir.validate import effective_units
from twill.machine.models import Machine
from twill.schedule.result import Schedule, WarpGroup
from twill.solve.joint.problem import (RELAXABLE, JointOutcome, JointProblem, JointSolution, legal_budget,
                                       reg_limit_for, slot_count)
from twill.solve.options import LAST_RESORT_SHARE, PHASE_SHARES, SolveOptions

#: Secondary objectives after L, in order (docs/model.md §5).
SECONDARY = ("stages", "warps", "smem", "prologue")

#: Objective minimised before L when the graph has hoistable tensor-core pairs (:func:`hoist_pairs`).
HOIST = "unhoisted"

#: Seconds each relaxed re-solve of the UNSAT explanation may take at most.
EXPLAIN_TIME_LIMIT = 20.0

#: Readable names of the relaxable families for the one-line explanation.
FAMILY_TEXT = {
    "register_limit": "register limit (live values exceed a group's per-thread budget)",
    "register_file": "register file (too few register-holding warps fit in 64K registers)",
    "warp_count": "warp count (not enough warps for the groups the schedule needs)",
    "cross_warp_spills": "cross-warp transfers (a value must cross warp groups)",
    "concurrency": "concurrency (a blocking wait would stall work in flight on its warp)",
    "warp_issue": "warp issue (a warp group's tile ops, run one at a time, exceed the II)",
    "memory_capacity": "memory capacity (shared memory / TMEM buffers)",
}

#: What the user can change when a family blocks every II: a larger II does not lift these limits.
FAMILY_REMEDY = {
    "register_limit": "raise --reg-limit or use smaller tiles",
    "register_file": "use smaller tiles or fewer register-holding warps",
    "warp_count": "raise --max-warps",
    "cross_warp_spills": "drop --no-cross-warp",
    "concurrency": "raise --max-warps",
    "warp_issue": "raise --max-warps or --max-ii",
    "memory_capacity": "use smaller tiles or a lower --streaming-depth",
}


def remedy_for(blocked: list[str]) -> str:
    """The advice for an exhausted II range: the remedies of the blocking families, else ``raise --max-ii``."""
    remedies = [FAMILY_REMEDY[f] for b in blocked for f in b.split("+")]
    return "; ".join(dict.fromkeys(remedies)) if remedies else "raise --max-ii"


def make_problem(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *,
                 ii: int, length_min: int, relaxed: frozenset[str] = frozenset()) -> JointProblem:
    """The joint problem at ``ii`` with ``n = ⌈length_min / ii⌉`` copies and ``L ∈ [length_min, n·ii]``."""
    copies = math.ceil(length_min / ii)
    return JointProblem(
        graph=graph, units=units, ii=ii, copies=copies, length_min=length_min, length_max=copies * ii,
        slots=slot_count(graph), max_warps=options.max_warps or machine.max_warps_per_cta,
        reg_limit=reg_limit_for(graph, machine, options.reg_limit),
        light_regs=legal_budget(machine, machine.setmaxnreg_min), regs_per_sm=machine.regs_per_sm,
        smem_capacity=machine.smem_per_block, tmem_capacity=machine.tmem_bytes,
        smem_resident=int(graph.attrs.get("smem_resident", 0)), streaming_depth=options.for_graph(graph).streaming_depth,
        cross_warp=options.cross_warp, relaxed=relaxed)


def hoist_pairs(graph: LoopGraph, machine: Machine) -> list[tuple[str, str]]:
    """Tensor-core pairs ``(u, v)`` that a register-accumulating (Hopper, wgmma) warp group should
    software-pipeline: ``v`` is an MMA reached from the MMA ``u`` through a path of distance-0 edges whose
    inner ops are not MMAs, and the register work waits for ``v`` of the previous iteration (a blocking
    loop-carried edge from ``v`` to a non-MMA op): ``S = Q K^T -> softmax -> O += P V`` with ``O *= alpha``
    reading O in the next iteration. Empty on Blackwell, where a single MMA warp issues both and the register
    work runs in other warp groups.

    Why (docs/model.md §5, "unhoisted"): on Hopper the warp group that issues ``u`` and ``v`` also runs the
    register ops between them and waits for ``v`` before the next iteration's register work. With ``u`` and
    ``v`` in one stage its iteration is ``u -> wait -> register ops -> v -> wait`` in series; with ``u`` of
    iteration ``i + 1`` issued together with ``v`` of iteration ``i`` (``stage(v) > stage(u)``, FA3's
    intra-warp-group pipelining, Shah et al. 2024, §3.2) the register work of ``i + 1`` runs while ``v`` of
    ``i`` is on the tensor core. The cost model sees no difference (an asynchronous MMA costs its group only
    the issue cycles and a wait costs nothing), so every unmodelled cycle of the serial chain (wgmma wait and
    fence latency, layout conversions, the ping-pong barrier hand-off) adds to the II on the GPU (H100:
    0.87-0.90x against 1.00-1.03x cuDNN, docs/performance.md). Accumulators that the register work never
    reads inside the loop (flash-bwd's dV, dK) need no such wait and are not paired."""
    if machine.mma_accumulates_in != "registers":
        return []
    mmas = [op.name for op in graph.ops if op.kind == "mma"]
    waited = {e.src for e in graph.edges if e.blocking and e.distance >= 1 and graph.op(e.src).kind == "mma"
              and graph.op(e.dst).kind != "mma"}
    pairs = []
    for u in mmas:
        seen, frontier = {u}, [u]
        while frontier:
            nxt = []
            for name in frontier:
                for e in graph.out_edges(name):
                    if e.distance != 0 or e.dst in seen:
                        continue
                    seen.add(e.dst)
                    if graph.op(e.dst).kind == "mma":
                        if e.dst in waited:
                            pairs.append((u, e.dst))
                    else:
                        nxt.append(e.dst)
            frontier = nxt
    return sorted(set(pairs))


def add_hoist_objective(joint: Any, pairs: list[tuple[str, str]]) -> None:
    """CP-SAT term ``unhoisted = Σ_(u,v) [stage(v) = stage(u)]`` over :func:`hoist_pairs` (a literal
    ``h_uv ⇒ k_v ≥ k_u + 1``; ``unhoisted = |pairs| − Σ h_uv``)."""
    b = joint.builder
    m, stage = b.model, b.v.stage
    hoisted = []
    for u, v in pairs:
        h = m.new_bool_var(f"hoisted[{u},{v}]")
        m.add(stage[v] >= stage[u] + 1).only_enforce_if(h)
        hoisted.append(h)
    b.v.objective[HOIST] = len(pairs) - sum(hoisted)


def explain_with(problem: JointProblem, feasible_without: Callable[[tuple[str, ...], float], str],
                 deadline: float) -> tuple[list[str], str]:
    """docs/model.md §5: relax one family at a time; the families whose removal alone makes ``problem``
    feasible block it. When no single family does, pairs are tried and reported as ``"a+b"``.

    ``feasible_without(families, seconds)`` is the backend's oracle: ``"sat"``, ``"unsat"`` or
    ``"unknown"`` for the problem with ``families`` dropped. Returns (blocking families, one readable line).
    """
    blocked: list[str] = []
    undecided: list[str] = []
    per_family = max(0.1, min(EXPLAIN_TIME_LIMIT, (deadline - time.perf_counter()) / len(RELAXABLE)))
    for family in RELAXABLE:
        left = deadline - time.perf_counter()
        answer = feasible_without((family,), min(per_family, left)) if left > 0.05 else "unknown"
        if answer == "sat":
            blocked.append(family)
        elif answer == "unknown":
            undecided.append(family)
    if not blocked:
        for pair in combinations([f for f in RELAXABLE if f not in undecided], 2):
            left = deadline - time.perf_counter()
            if left <= 0.05:
                undecided.append("+".join(pair))
            elif feasible_without(pair, min(per_family, left)) == "sat":
                blocked.append("+".join(pair))
    where = f"at the modulo-only II {problem.ii} (L {problem.length_min}..{problem.length_max})"
    if blocked:
        reasons = "; ".join(" together with ".join(FAMILY_TEXT[f] for f in b.split("+")) for b in blocked)
        note = f"no warp specialization exists {where}: blocked by {reasons}"
    else:
        note = f"no warp specialization exists {where}: no single family or pair of families is responsible"
    if undecided:
        shown = ", ".join(undecided[:4]) + (f" and {len(undecided) - 4} more" if len(undecided) > 4 else "")
        note += f" (undecided within the time limit: {shown})"
    return blocked, note


def explain_infeasible(problem: JointProblem, options: SolveOptions, time_limit: float) -> tuple[list[str], str]:
    """:func:`explain_with` on the CP-SAT model, one solve per relaxation."""
    from twill.solve.joint.cpsat import CpsatJoint

    def feasible_without(families: tuple[str, ...], seconds: float) -> str:
        relaxed = replace(problem, relaxed=problem.relaxed | set(families))
        outcome = CpsatJoint(relaxed, workers=options.workers, seed=options.seed).solve(None, time_limit=seconds)
        return "sat" if outcome.found else ("unknown" if outcome.status == "unknown" else "unsat")

    return explain_with(problem, feasible_without, time.perf_counter() + time_limit)


def derive_role(graph: LoopGraph, ops: list[str], variable_latency: bool) -> str:
    """``load`` (W_vl), ``mma`` (only MMAs and their waits), ``compute`` (MMAs mixed with other work),
    ``softmax`` (holds an ``exp``), ``correction`` (``rescale``/``o_load``/``o_store`` without ``exp``),
    else ``compute``."""
    if variable_latency:
        return "load"
    kinds = {graph.op(n).kind for n in ops}
    roles = {graph.op(n).attrs.get("role") for n in ops}
    if kinds <= {"mma", "mma_wait"}:
        return "mma"
    if "mma" in kinds:
        return "compute"
    if "exp" in roles:
        return "softmax"
    if roles & {"rescale", "o_load", "o_store"}:
        return "correction"
    return "compute"


def warp_groups(graph: LoopGraph, ii: int,
                solution: JointSolution) -> tuple[tuple[WarpGroup, ...], dict[str, int]]:
    """Non-empty slots renumbered in slot order (W_vl first), ops in steady-state order."""
    order = sorted(graph.op_names, key=lambda n: (solution.starts[n] % ii, -(solution.starts[n] // ii),
                                                  graph.op_names.index(n)))
    groups: list[WarpGroup] = []
    assignment: dict[str, int] = {}
    for slot in sorted(set(solution.group.values())):
        ops = [n for n in order if solution.group[n] == slot]
        gid = len(groups)
        groups.append(WarpGroup(gid, derive_role(graph, ops, slot == 0), solution.widths[slot],
                                solution.budgets[slot], tuple(ops)))
        for n in ops:
            assignment[n] = gid
    return tuple(groups), assignment


def objective_order(joint: Any) -> tuple[str, ...]:
    """Lexicographic objectives after II: ``unhoisted`` (when the model has it), ``length``, then
    :data:`SECONDARY`."""
    lead = (HOIST,) if HOIST in joint.builder.v.objective else ()
    return (*lead, "length", *SECONDARY)


def _secondary(joint: Any, first: JointOutcome, options: SolveOptions, deadline: float,
               length_proven: bool) -> tuple[JointSolution, list[dict[str, Any]], bool]:
    """Minimise the objectives of :func:`objective_order` in turn, each fixed before the next (the first
    solve already minimised L, proved minimal iff ``length_proven``; with ``unhoisted`` first, L is minimised
    again once it is fixed). Returns the final solution, the objective records and whether every objective
    was proved optimal."""
    solution = first.solution
    assert solution is not None
    order = objective_order(joint)
    records: list[dict[str, Any]] = []
    for k, name in enumerate(order):
        if k:
            joint.fix(order[k - 1], solution.objectives[order[k - 1]])
        if k == 0 and name == "length":
            records.append({"name": name, "value": solution.length, "proven": length_proven})
            continue
        last = k == len(order) - 1
        # The last solve decides the remaining ties: one worker and no hint (earlier solves may return
        # different optimal solutions run to run), so its answer depends only on the model and the seed.
        joint.hint({} if last else solution.starts)
        remaining = deadline - time.perf_counter()
        outcome = joint.solve(name, time_limit=max(0.5, remaining / (len(order) - k)),
                              workers=1 if last else None)
        if outcome.found:
            solution = outcome.solution
        proven = outcome.status == "optimal" and (name != "length" or length_proven)
        records.append({"name": name, "value": solution.objectives[name], "proven": proven})
    return solution, records, all(r["proven"] for r in records)


def issue_bound(graph: LoopGraph, machine: Machine, options: SolveOptions) -> Any:
    """:func:`twill.solve.bounds.warp_issue_bound` with the limits :func:`make_problem` uses. IIs below it
    (after the modulo-only II, whose joint solve and UNSAT explanation still run) are recorded as proved
    infeasible without a solve (docs/model.md §5)."""
    from twill.solve.bounds import warp_issue_bound

    return warp_issue_bound(graph, reg_limit=reg_limit_for(graph, machine, options.reg_limit),
                            light_regs=legal_budget(machine, machine.setmaxnreg_min),
                            regs_per_sm=machine.regs_per_sm,
                            max_warps=options.max_warps or machine.max_warps_per_cta, slots=slot_count(graph))


def undecided_message(graph: LoopGraph, options: SolveOptions, tried: list[dict[str, Any]], note: str) -> str:
    """The error of a search that ran out of time: the IIs proved infeasible and those left undecided."""
    proved = [row["ii"] for row in tried if row_proven_infeasible(row)]
    open_iis = [row["ii"] for row in tried if not row_proven_infeasible(row)]
    parts = []
    if proved:
        parts.append(f"{len(proved)} II(s) proved infeasible ({proved[0]}..{proved[-1]})")
    if open_iis:
        parts.append(f"undecided: II {', '.join(str(ii) for ii in open_iis[:5])}"
                     + (f" and {len(open_iis) - 5} more" if len(open_iis) > 5 else ""))
    detail = f" ({'; '.join(parts)})" if parts else ""
    return (f"no joint schedule of graph {graph.name!r} found within the time limit of {options.time_limit:g} s"
            f"{detail}; raise --time-limit" + (f" ({note})" if note else ""))


def row_proven_infeasible(row: Mapping[str, Any]) -> bool:
    """Whether a ``tried`` row of the joint search proves its II infeasible: phase 1 infeasible, or the
    joint problem infeasible at the proven LEN(M) (phase 1 ``optimal``), or the warp-issue bound."""
    if row.get("modulo") == "infeasible" or row.get("by") == "warp_issue_bound":
        return True
    return row.get("joint") == "infeasible" and row.get("modulo") == "optimal"


def new_joint(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *, ii: int,
              length_min: int) -> Any:
    """The CP-SAT joint model at ``ii`` with copies from ``length_min`` (and the hoist objective if any)."""
    from twill.solve.joint.cpsat import CpsatJoint

    joint = CpsatJoint(make_problem(graph, machine, options, units, ii=ii, length_min=length_min),
                       workers=options.workers, seed=options.seed)
    pairs = hoist_pairs(graph, machine)
    if pairs:
        add_hoist_objective(joint, pairs)
    return joint


def fixed_start_joint(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int],
                      ii: int, deadline: float) -> tuple[Any, JointOutcome] | None:
    """The warp assignment solved alone for greedy start times (:func:`~twill.solve.greedy.greedy_modulo`)
    whose edges leave room for every spill (each op's spill cost as padding) and whose busy windows never
    overlap (one issue timeline for W_vl, one for the other ops: WARP ISSUE and CONCURRENCY then hold on any
    assignment), pinned in a joint model of their own length. A small problem that yields a joint schedule
    when the full joint solve found none within its share; None when the greedy placement fails at ``ii``."""
    from twill.solve.greedy import greedy_modulo

    issue = {op.name: ("vl" if op.variable_latency else "issue", max(1, op.busy)) for op in graph.ops}
    starts = greedy_modulo(graph, units, ii, padding={op.name: op.spill_cost for op in graph.ops}, issue=issue)
    if starts is None:
        return None
    joint = new_joint(graph, machine, options, units, ii=ii,
                      length_min=max(starts[op.name] + op.cycles for op in graph.ops))
    b = joint.builder
    for name, value in starts.items():
        b.model.add(b.v.t[name] == value)
    joint.hint(starts)
    return joint, joint.solve("length", time_limit=share("joint", deadline))


def last_resort(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *,
                first: int, max_ii: int, deadline: float) -> tuple[int, Any, JointOutcome] | None:
    """When the search is about to run out of time with nothing found: :func:`fixed_start_joint` at
    II = first, first + 1, first + 3, first + 7, … ≤ max_ii (gaps doubling: the greedy placement and the
    assignment succeed once the II leaves room), until an assignment is found or the time is spent."""
    step, ii = 1, first
    while ii <= max_ii and deadline - time.perf_counter() > 0:
        attempt = fixed_start_joint(graph, machine, options, units, ii, deadline)
        if attempt is not None and attempt[1].found:
            return ii, *attempt
        ii, step = ii + step, step * 2
    return None


def share(phase: str, deadline: float) -> float:
    """Seconds ``phase`` may use now: its share (``PHASE_SHARES``) of the time left, at least 0.5 s, at most
    the time left."""
    left = deadline - time.perf_counter()
    return min(left, max(0.5, PHASE_SHARES[phase] * left))


def solve_joint(graph: LoopGraph, machine: Machine, options: SolveOptions, *, lower_bound: int,
                res_mii: int | None = None, rec_mii: int | None = None) -> Schedule:
    """Algorithm 1: for II = lower_bound, …: phase 1 gives LEN(M); the joint problem at (II, ⌈LEN/II⌉)
    minimises L; the first feasible II wins, then the secondary objectives. Each phase runs within its
    share of the time left (``PHASE_SHARES``); when the joint solve finds nothing within its share, the
    warp assignment is solved alone for phase 1's starts. Raises :class:`InfeasibleScheduleError` when
    every II up to ``max_ii`` is proved infeasible, or when the time limit runs out first (naming the IIs
    left undecided)."""
    options = options.for_graph(graph)
    if options.backend == "yices":
        from twill.solve.joint import yices

        return yices.solve_joint(graph, machine, options, lower_bound=lower_bound, res_mii=res_mii,
                                 rec_mii=rec_mii)
    from twill.solve import default_max_ii
    from twill.solve.greedy import greedy_modulo
    from twill.solve.modulo import ModuloResult, solve_modulo

    started = time.perf_counter()
    deadline = started + options.time_limit
    units = effective_units(graph, machine.units)
    max_ii = options.max_ii if options.max_ii is not None else max(lower_bound, default_max_ii(graph))
    tried: list[dict[str, Any]] = []
    modulo_ii: int | None = None
    blocked: list[str] | None = None
    note = ""
    previous: dict[str, int] | None = None
    issue = issue_bound(graph, machine, options)
    # Phase 1 and the joint solve share the time before the last resort's reserve, so that it always runs.
    reserved = deadline - LAST_RESORT_SHARE * options.time_limit
    for ii in range(lower_bound, max_ii + 1):
        if deadline - time.perf_counter() <= 0:
            break
        if modulo_ii is not None and issue is not None and ii < issue.ii:
            tried.append({"ii": ii, "joint": "infeasible", "by": "warp_issue_bound",
                          "bound": {"ii": issue.ii, "warps": issue.warps, "groups": issue.groups,
                                    "busy": issue.busy}})
            continue
        if deadline - time.perf_counter() < LAST_RESORT_SHARE * options.time_limit:
            found = last_resort(graph, machine, options, units, first=ii, max_ii=max_ii, deadline=deadline)
            if found is not None:
                tried.append({"ii": found[0], "joint": "feasible", "by": "last_resort", "fixed_starts": "greedy"})
                return _finish(graph, machine, options, found[1], found[2], started=started, deadline=deadline,
                               lower_bound=lower_bound, proven_below=False, length_proven=False, tried=tried,
                               modulo_ii=modulo_ii, blocked=blocked, note=note)
            break
        options.report(f"II {options.ii_text(ii)}: phase 1 (elapsed {time.perf_counter() - started:.1f} s)")
        greedy = greedy_modulo(graph, units, ii)
        mod = solve_modulo(graph, units, ii, time_limit=share("modulo", reserved),
                           workers=options.modulo_workers(graph), seed=options.seed, hint=greedy or previous,
                           prove=modulo_ii is None)
        row: dict[str, Any] = {"ii": ii, "modulo": mod.status}
        if "projection" in mod.stats:
            row.update({"by": "projection", "units": list(mod.stats["projection"])})
        tried.append(row)
        if not mod.found and mod.status != "infeasible" and greedy is not None:
            span = max(greedy[op.name] + op.cycles for op in graph.ops)
            mod = ModuloResult("feasible", greedy, span, False, mod.length_bound, ii, mod.seconds)
            row.update({"modulo": "feasible", "modulo_by": "greedy"})
        if not mod.found:
            continue
        modulo_ii = modulo_ii or ii
        previous = dict(mod.starts)
        if time.perf_counter() >= reserved:
            continue                     # the last resort's reserve has begun: it starts at the next II
        joint = new_joint(graph, machine, options, units, ii=ii, length_min=mod.length)
        joint.hint(mod.starts)
        outcome = joint.solve("length", time_limit=share("joint", reserved))
        row.update({"length_min": mod.length, "copies": joint.problem.copies, "joint": outcome.status,
                    "seconds": round(outcome.seconds, 3)})
        options.report(f"II {options.ii_text(ii)}: joint {outcome.status} ({outcome.seconds:.2f} s)")
        if outcome.status == "unknown":
            attempt = fixed_start_joint(graph, machine, options, units, ii, reserved)
            row["fixed_starts"] = "no greedy placement" if attempt is None else attempt[1].status
            options.report(f"II {options.ii_text(ii)}: warp assignment for greedy starts: "
                           f"{row['fixed_starts']}")
            if attempt is not None and attempt[1].found:
                joint, outcome = attempt
        if outcome.found:
            proven_below = all(row_proven_infeasible(r) for r in tried[:-1])
            length_proven = mod.status == "optimal" and row["joint"] == "optimal"
            return _finish(graph, machine, options, joint, outcome, started=started, deadline=deadline,
                           lower_bound=lower_bound, proven_below=proven_below, length_proven=length_proven,
                           tried=tried, modulo_ii=modulo_ii, blocked=blocked, note=note)
        if ii == modulo_ii and row_proven_infeasible(row):
            blocked, note = explain_infeasible(joint.problem, options, share("explain", deadline))
            options.report(note)
    if tried and tried[-1]["ii"] == max_ii and all(row_proven_infeasible(r) for r in tried):
        raise InfeasibleScheduleError(
            f"graph {graph.name!r} has no joint SWP+WS schedule with II <= {options.ii_text(max_ii)} (II {lower_bound}..{max_ii} "
            f"proved infeasible); {remedy_for(blocked or [])}" + (f" ({note})" if note else ""))
    raise InfeasibleScheduleError(undecided_message(graph, options, tried, note))


def _finish(graph: LoopGraph, machine: Machine, options: SolveOptions, joint: Any, outcome: JointOutcome, *,
            started: float, deadline: float, lower_bound: int, proven_below: bool, length_proven: bool,
            tried: list[dict[str, Any]], modulo_ii: int | None, blocked: list[str] | None, note: str) -> Schedule:
    """The :class:`Schedule` of the joint solution ``outcome`` after the secondary objectives; ``stats``
    records the length and copies of its start times (the verifier recomputes both)."""
    problem: JointProblem = joint.problem
    solution, records, proven = _secondary(joint, outcome, options, deadline, length_proven)
    length = max(solution.starts[op.name] + op.cycles for op in graph.ops)
    groups, assignment = warp_groups(graph, problem.ii, solution)
    variables, constraints = joint.size
    stats: dict[str, Any] = {
        "search": "joint", "backend": "cpsat", "tried": tried, "modulo_ii": modulo_ii,
        "length": length, "copies": math.ceil(length / problem.ii), "objectives": records,
        "tie_break": "first optimal solution of the last objective, 1 CP-SAT worker, seed "
                     f"{options.seed}", "variables": variables, "constraints": constraints,
        "families": dict(joint.builder.counts), "reg_limit": problem.reg_limit, "max_warps": problem.max_warps,
        "smem_bytes": solution.objectives.get("smem", 0),
    }
    stats["mii"] = lower_bound
    if blocked is not None:
        stats["blocked_by"] = blocked
        stats["blocked_by_note"] = note
    status = "optimal" if proven_below and proven else "feasible"
    return Schedule(graph=graph, arch=machine.name, solver="cpsat", status=status, ii=problem.ii,
                    ii_lower_bound=problem.ii if proven_below else lower_bound, starts=dict(solution.starts),
                    assignment=assignment, warps=groups, solve_seconds=time.perf_counter() - started,
                    streaming_depth=options.streaming_depth, stats=stats)
