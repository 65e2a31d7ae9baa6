"""Algorithm 1, the one joint search driver: II upward, phase 1 (LEN(M)), the joint problem at LEN(M), the
secondary objectives, the UNSAT explanation and the :class:`~twill.schedule.result.Schedule` with its warp
groups (docs/model.md §5-6). It speaks to the solver only through the :class:`JointModel` protocol of
:mod:`twill.solve.joint.backend` (CP-SAT or Yices, ``SolveOptions.solver``)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from itertools import combinations
from typing import Any, Callable, Mapping

from twill.errors import InfeasibleScheduleError
from twill.ir.graph import LoopGraph
from twill.ir.validate import effective_units
from twill.machine.models import Machine
from twill.schedule.result import Schedule, WarpGroup
from twill.schedule.vocab import RELAXABLE, Family, Objective, Status
from twill.solve.attempt import Attempt
from twill.solve.joint.backend import SEARCH_SETTINGS, JointModel, open_model, require
from twill.solve.joint.problem import (JointOutcome, JointProblem, JointSolution, ObjectiveRecord, legal_budget,
                                       reg_limit_for, slot_count)
from twill.solve.options import LAST_RESORT_SHARE, PHASE_SHARES, SolveOptions

#: Seconds each relaxed re-solve of the UNSAT explanation may take at most.
EXPLAIN_TIME_LIMIT = 20.0

#: The joint relaxations (docs/model.md §5, "Relaxations"): the families each switches off, in the order the
#: search solves them. Each keeps a subset of the joint problem's constraints, so when it has no solution,
#: neither has the joint problem. The first leaves the modulo schedule with MEMORY CAPACITY and CROSS-WARP
#: SPILLS (whose delays and staging are constants for the values that the slot widths force across groups), a
#: small model; the second leaves everything but CONCURRENCY, the largest family (a reified residue
#: difference per pair of ops that may share a slot), and still decides what the register families decide.
RELAXATIONS = (
    frozenset({Family.REGISTER_LIMIT, Family.REGISTER_FILE, Family.WARP_COUNT, Family.CONCURRENCY,
               Family.WARP_ISSUE}),
    frozenset({Family.CONCURRENCY}),
)


def remedy_flags(graph: LoopGraph, machine: Machine, options: SolveOptions) -> dict[str, str]:
    """The options a remedy may name (option -> flag): those of ``options.flags`` (the command's) that can
    still move the way the remedy moves them: the register limit below the machine's cap, the warp pool below
    the machine's, cross-warp transfers forbidden (``--no-cross-warp`` given), a streaming depth above 1, and a
    max II given (the default already lets every iteration run alone)."""
    movable = {
        "reg_limit": reg_limit_for(graph, machine, options.reg_limit)
        < legal_budget(machine, machine.max_regs_per_thread),
        "max_warps": (options.max_warps or machine.max_warps_per_cta) < machine.max_warps_per_cta,
        "cross_warp": not options.cross_warp,
        "streaming_depth": (options.streaming_depth or 1) > 1,
        "max_ii": options.max_ii is not None,
    }
    return {option: flag for option, flag in options.flags if movable.get(option, False)}


def remedy_for(blocked: list[str], flags: Mapping[str, str]) -> str:
    """The advice for an exhausted II range: the remedies of the blocking families that name only options of
    ``flags`` (:func:`remedy_flags`), else ``raise`` the max II when ``flags`` has it; empty when none
    applies."""
    remedies = [Family(f).remedy(flags) for b in blocked for f in b.split("+")]
    remedies = [r for r in remedies if r]
    if remedies:
        return "; ".join(dict.fromkeys(remedies))
    return f"raise {flags['max_ii']}" if "max_ii" in flags else ""


def make_problem(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *,
                 ii: int, length_min: int, relaxed: frozenset[str] = frozenset()) -> JointProblem:
    """The joint problem at ``ii`` with ``n = ⌈length_min / ii⌉`` copies and ``L ∈ [length_min, n·ii]``."""
    copies = math.ceil(length_min / ii)
    return JointProblem(
        graph=graph, units=units, ii=ii, copies=copies, length_min=length_min, length_max=copies * ii,
        slots=slot_count(graph), max_warps=options.max_warps or machine.max_warps_per_cta,
        reg_limit=reg_limit_for(graph, machine, options.reg_limit),
        light_regs=legal_budget(machine, machine.setmaxnreg_min), reserved_regs=machine.reserved_regs(graph.attrs),
        regs_per_sm=machine.regs_per_sm, smem_capacity=machine.smem_per_block, tmem_capacity=machine.tmem_bytes,
        smem_resident=int(graph.attrs.get("smem_resident", 0)), streaming_depth=options.streaming_depth,
        cross_warp=options.cross_warp, relaxed=relaxed,
        excluded_carries=options.excluded_carries, excluded_orders=options.excluded_orders)


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
    fence latency, layout conversions, the ping-pong barrier hand-off) adds to the II on the GPU
    (docs/performance.md, "Run 4", before and after). Accumulators that the register work never
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


def explain_with(problem: JointProblem, feasible_without: Callable[[tuple[Family, ...], float], Status],
                 deadline: float) -> tuple[list[str], str]:
    """docs/model.md §5: relax one family at a time; the families whose removal alone makes ``problem``
    feasible block it. When no single family does, pairs are tried and reported as ``"a+b"``.

    ``feasible_without(families, seconds)`` is the backend's oracle (:meth:`JointModel.feasible_without`).
    Returns (blocking families, one readable line).
    """
    blocked: list[str] = []
    undecided: list[str] = []
    per_family = max(0.1, min(EXPLAIN_TIME_LIMIT, (deadline - time.perf_counter()) / len(RELAXABLE)))
    for family in RELAXABLE:
        left = deadline - time.perf_counter()
        answer = feasible_without((family,), min(per_family, left)) if left > 0.05 else Status.UNKNOWN
        if answer == Status.FEASIBLE:
            blocked.append(str(family))
        elif answer == Status.UNKNOWN:
            undecided.append(str(family))
    if not blocked:
        for pair in combinations([f for f in RELAXABLE if f not in undecided], 2):
            left = deadline - time.perf_counter()
            if left <= 0.05:
                undecided.append("+".join(pair))
            elif feasible_without(pair, min(per_family, left)) == Status.FEASIBLE:
                blocked.append("+".join(pair))
    # the copies and the upper end of L name the problem; the lower end of L is only the proved bound that
    # phase 1 passed on (LEN(M) or a weaker one, docs/model.md §5 "Copies"), the same problem either way
    where = f"at the modulo-only II {problem.ii} ({problem.copies} copies, L ≤ {problem.length_max})"
    if blocked:
        reasons = "; ".join(" together with ".join(Family(f).text for f in b.split("+")) for b in blocked)
        note = f"no warp specialization exists {where}: blocked by {reasons}"
    else:
        note = f"no warp specialization exists {where}: no single family or pair of families is responsible"
    if undecided:
        shown = ", ".join(undecided[:4]) + (f" and {len(undecided) - 4} more" if len(undecided) > 4 else "")
        note += f" (undecided within the time limit: {shown})"
    return blocked, note


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


def least_warps(graph: LoopGraph) -> int:
    """The fewest warps any warp assignment of ``graph`` uses, at every II: W_vl as wide as its widest
    variable-latency op beside a group as wide as the widest other op (a group is at least as wide as each of
    its ops; W_vl holds the variable-latency ops and only those)."""
    widest = [max((op.warps for op in graph.ops if op.variable_latency == vl), default=0) for vl in (True, False)]
    return sum(widest)


def kernel_warp_groups(graph: LoopGraph, machine: Machine, options: SolveOptions,
                       starts: Mapping[str, int], ii: int) -> tuple[tuple[WarpGroup, ...], dict[str, int]]:
    """The warp groups of the kernel as written, for the modulo-only ``starts``: the variable-latency ops on
    W_vl (one warp, the least register budget), every other op on one group as wide as its widest op, with
    the register limit of the joint problem; roles from :func:`derive_role` (for a Triton kernel, from the
    roles its ops carry). The warps of a kernel without warp specialization: its loads run asynchronously,
    and the same warps run everything else."""
    order = sorted(graph.op_names, key=lambda n: (starts[n] % ii, -(starts[n] // ii), graph.op_names.index(n)))
    loads = [n for n in order if graph.op(n).variable_latency]
    rest = [n for n in order if not graph.op(n).variable_latency]
    groups: list[WarpGroup] = []
    if loads:
        groups.append(WarpGroup(0, derive_role(graph, loads, True), 1,
                                legal_budget(machine, machine.setmaxnreg_min), tuple(loads)))
    if rest:
        groups.append(WarpGroup(len(groups), derive_role(graph, rest, False),
                                max(graph.op(n).warps for n in rest),
                                reg_limit_for(graph, machine, options.reg_limit), tuple(rest)))
    return tuple(groups), {n: g.id for g in groups for n in g.ops}


def kernel_warps_note(graph: LoopGraph, problem: str) -> str:
    """Why a Triton kernel's own warps fail REGISTER LIMIT, after a "; ": its tile ops are as wide as its
    ``num_warps``, and a tile spread over more warps holds fewer registers per thread; empty for other
    problems and for graphs without a ``num_warps``."""
    warps = graph.attrs.get("num_warps")
    if not warps or not problem.startswith(Family.REGISTER_LIMIT.heading):
        return ""
    return (f"; the kernel's tiles, each spread over its {warps} warps (num_warps), hold more registers per "
            f"thread than its warps have: more warps per tile (num_warps {2 * int(warps)}) hold fewer each")


def fallback_schedule(graph: LoopGraph, machine: Machine, options: SolveOptions, mod: Any,
                      lower_bound: int) -> tuple[Schedule | None, list[str]]:
    """The modulo-only schedule ``mod`` (phase 1's result at one II) with the kernel's own warp groups
    (:func:`kernel_warp_groups`), status ``feasible``, and the verifiers' messages on it: the schedule when
    there are none (``stats["fallback"]`` is set by the search), else None and the messages."""
    from twill.schedule.verify import violations

    groups, assignment = kernel_warp_groups(graph, machine, options, mod.starts, mod.ii)
    length = max(mod.starts[op.name] + op.cycles for op in graph.ops)
    stats: dict[str, Any] = {
        "search": "joint", "length": length, "copies": math.ceil(length / mod.ii), "objectives": [],
        "reg_limit": reg_limit_for(graph, machine, options.reg_limit),
        "max_warps": options.max_warps or machine.max_warps_per_cta, "mii": lower_bound,
    }
    candidate = Schedule(graph=graph, arch=machine.name, solver=options.solver, status=Status.FEASIBLE, ii=mod.ii,
                         ii_lower_bound=lower_bound, starts=dict(mod.starts), assignment=assignment, warps=groups,
                         streaming_depth=options.streaming_depth, stats=stats)
    problems = violations(candidate, machine, options)
    return (None, problems) if problems else (candidate, [])


def _secondary(model: JointModel, first: JointOutcome, deadline: float,
               length_proven: bool) -> tuple[JointSolution, list[ObjectiveRecord]]:
    """Minimise ``model.objectives`` in turn, each fixed before the next. Objectives the first solve already
    settled are recorded as it reported them; when ``length`` comes first, the first solve minimised it
    (proved minimal iff ``length_proven``); with ``unhoisted`` first in a backend that leaves it open, L is
    minimised again once ``unhoisted`` is fixed. Returns the final solution and the objective records."""
    solution = first.solution
    assert solution is not None
    order = model.objectives
    settled = {r.name: r for r in first.settled}
    records: list[ObjectiveRecord] = []
    for k, name in enumerate(order):
        if k:
            model.fix(order[k - 1], solution.objectives[order[k - 1]])
        if name in settled:
            records.append(settled[name])
            continue
        if name == Objective.LENGTH and k == len(settled):
            records.append(ObjectiveRecord(name, solution.length, length_proven))
            continue
        last = k == len(order) - 1
        # The last solve decides the remaining ties: one worker and no hint (earlier solves may return
        # different optimal solutions run to run), so its answer depends only on the model and the seed.
        model.hint({} if last else solution.starts)
        remaining = deadline - time.perf_counter()
        outcome = model.solve(name, time_limit=max(0.5, remaining / (len(order) - k)), workers=1 if last else None)
        if outcome.found:
            solution = outcome.solution
        proven = outcome.status == Status.OPTIMAL and (name != Objective.LENGTH or length_proven)
        records.append(ObjectiveRecord(name, solution.objectives[name], proven))
    return solution, records


def issue_bound(graph: LoopGraph, machine: Machine, options: SolveOptions,
                relaxed: frozenset[str] = frozenset()) -> Any:
    """:func:`twill.ir.bounds.warp_issue_bound` with the limits :func:`make_problem` uses, for the joint problem
    with the families ``relaxed`` switched off: without REGISTER FILE the register file, without WARP COUNT the
    warp pool is unbounded, and without WARP ISSUE there is no bound (None). IIs below it are proved infeasible
    without a joint solve (docs/model.md §5), and so are the UNSAT explanation's relaxed problems below the
    bound of their own families."""
    from twill.ir.bounds import warp_issue_bound

    if Family.WARP_ISSUE in relaxed:
        return None
    unbounded = sys.maxsize
    return warp_issue_bound(graph, reg_limit=reg_limit_for(graph, machine, options.reg_limit),
                            light_regs=legal_budget(machine, machine.setmaxnreg_min),
                            regs_per_sm=unbounded if Family.REGISTER_FILE in relaxed else machine.regs_per_sm,
                            max_warps=unbounded if Family.WARP_COUNT in relaxed
                            else options.max_warps or machine.max_warps_per_cta, slots=slot_count(graph))


def bound_row(issue: Any) -> dict[str, int]:
    """The ``bound`` of a ``tried`` row decided by the warp-issue bound ``issue``."""
    return {"ii": issue.ii, "warps": issue.warps, "groups": issue.groups, "busy": issue.busy}


def _by(options: SolveOptions) -> str:
    """`` by the yices backend`` in messages of a search that did not run the default solver, else empty."""
    return "" if options.solver == "cpsat" else f" by the {options.solver} backend"


def undecided_message(graph: LoopGraph, options: SolveOptions, tried: list[Attempt], note: str,
                      remedy: str = "") -> str:
    """The error of a search that ran out of time: the IIs proved infeasible and those left undecided; the
    advice is ``remedy`` (:func:`remedy_for` the families that blocked) when every II tried was proved
    infeasible, else to raise the time limit."""
    proved = [a.ii for a in tried if a.proves_infeasible]
    open_iis = [a.ii for a in tried if not a.proves_infeasible]
    parts = []
    if proved:
        parts.append(f"{len(proved)} II(s) proved infeasible ({proved[0]}..{proved[-1]})")
    if open_iis:
        parts.append(f"undecided: II {', '.join(str(ii) for ii in open_iis[:5])}"
                     + (f" and {len(open_iis) - 5} more" if len(open_iis) > 5 else ""))
    detail = f" ({'; '.join(parts)})" if parts else ""
    return (f"no joint schedule of graph {graph.name!r} found{_by(options)} within the time limit of "
            f"{options.time_limit:g} s{detail}"
            + (f"; {remedy}" if remedy and all(a.proves_infeasible for a in tried[:-1])
               else options.advice("raise {}", "time_limit"))
            + (f" ({note})" if note else ""))


def new_model(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *, ii: int,
              length_min: int) -> JointModel:
    """The solver's joint model at ``ii`` with copies from ``length_min`` (and the hoist objective if any)."""
    return open_model(make_problem(graph, machine, options, units, ii=ii, length_min=length_min),
                      solver=options.solver, hoist=hoist_pairs(graph, machine),
                      workers=options.workers, seed=options.seed, report=options.report)


def fixed_start_joint(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int],
                      ii: int, deadline: float) -> tuple[JointModel, JointOutcome] | None:
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
    model = new_model(graph, machine, options, units, ii=ii,
                      length_min=max(starts[op.name] + op.cycles for op in graph.ops))
    model.pin(starts)
    model.hint(starts)
    return model, model.solve(Objective.LENGTH, time_limit=share("joint", deadline))


def last_resort(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *,
                first: int, max_ii: int, deadline: float) -> tuple[int, JointModel, JointOutcome] | None:
    """When the search is about to run out of time with nothing found: :func:`fixed_start_joint` at
    II = first, first + 1, first + 3, first + 7, … ≤ max_ii (gaps doubling: the greedy placement and the
    assignment succeed once the II leaves room), until an assignment is found or the time is spent."""
    step, ii = 1, first
    while ii <= max_ii and deadline - time.perf_counter() > 0:
        attempt = fixed_start_joint(graph, machine, options, units, ii, deadline)
        if attempt is not None and attempt[1].found:
            return ii, *attempt
        if attempt is not None:
            attempt[0].close()
        ii, step = ii + step, step * 2
    return None


def share(phase: str, deadline: float) -> float:
    """Seconds ``phase`` may use now: its share (``PHASE_SHARES``) of the time left, at least 0.5 s, at most
    the time left."""
    left = deadline - time.perf_counter()
    return min(left, max(0.5, PHASE_SHARES[phase] * left))


def relaxation(graph: LoopGraph, machine: Machine, options: SolveOptions, units: Mapping[str, int], *, ii: int,
               length_min: int, drops: frozenset[Family], deadline: float) -> JointOutcome:
    """The joint problem at ``ii`` (copies from ``length_min``) with ``drops`` (one of :data:`RELAXATIONS`)
    switched off, within its share of the time: first for satisfiability alone with one worker
    (``infeasible`` proves the joint problem infeasible), then, when it has a schedule, L minimised from that
    schedule (docs/model.md §5, "Relaxations"). Every joint schedule at ``(ii, n)`` is a schedule of the
    relaxation, so an ``optimal`` outcome's L is a proved lower end of the joint problem's L, and its
    schedule hints the joint solve; an outcome whose L is not proved minimal is ``feasible``."""
    from twill.solve.joint.cpsat import FEASIBILITY_WORKERS

    problem = make_problem(graph, machine, options, units, ii=ii, length_min=length_min, relaxed=drops)
    model = open_model(problem, solver=options.solver, hoist=[], workers=options.workers, seed=options.seed,
                       report=options.report)
    try:
        first = model.solve(None, time_limit=share("relaxation", deadline), workers=FEASIBILITY_WORKERS)
        if not first.found:
            return first
        model.hint_solution(first.solution)
        least = model.solve(Objective.LENGTH, time_limit=share("relaxation", deadline))
        return least if least.found else replace(first, status=Status.FEASIBLE)
    finally:
        model.close()


def phase_one(graph: LoopGraph, units: Mapping[str, int], options: SolveOptions, ii: int, *, deadline: float,
              previous: Mapping[str, int] | None, prove: bool) -> tuple[Any, Attempt]:
    """Phase 1 at ``ii`` (:func:`~twill.solve.modulo.solve_modulo` minimising what the backend needs,
    :data:`~twill.solve.joint.backend.SEARCH_SETTINGS`, hinted with the greedy schedule or the previous
    II's) and its row; when CP-SAT finds nothing in time, the greedy schedule (L unproven)."""
    from twill.solve.greedy import greedy_modulo
    from twill.solve.modulo import ModuloResult, solve_modulo

    greedy = greedy_modulo(graph, units, ii)
    mod = solve_modulo(graph, units, ii, time_limit=share("modulo", deadline),
                       workers=options.modulo_workers(graph), seed=options.seed, hint=greedy or previous, prove=prove,
                       minimise=SEARCH_SETTINGS[options.solver].phase_one_minimises)
    row = Attempt(ii, modulo=mod.status)
    if "projection" in mod.stats:
        row = replace(row, by="projection", units=tuple(mod.stats["projection"]))
    if not mod.found and mod.status != Status.INFEASIBLE and greedy is not None:
        span = max(greedy[op.name] + op.cycles for op in graph.ops)
        mod = ModuloResult(Status.FEASIBLE, greedy, span, False, mod.length_bound, ii, mod.seconds)
        row = replace(row, modulo=Status.FEASIBLE, modulo_by="greedy")
    return mod, row


def solve_joint(graph: LoopGraph, machine: Machine, options: SolveOptions, *, lower_bound: int) -> Schedule:
    """Algorithm 1: for II = lower_bound, …: phase 1 gives n = ⌈LEN(M)/II⌉ (docs/model.md §5, "Copies"); past
    the modulo-only II the joint relaxation may prove the II infeasible ("Relaxation"); else the joint problem
    at (II, n) minimises L; the first feasible II wins, then the secondary objectives. Each phase runs within its
    share of the time left (``PHASE_SHARES``); when the joint solve finds nothing within its share, the
    warp assignment is solved alone for phase 1's starts. ``options`` are resolved for ``graph``
    (:meth:`SolveOptions.for_graph`). Raises :class:`InfeasibleScheduleError` when every II up to ``max_ii``
    is proved infeasible, or when the time limit runs out first (naming the IIs left undecided), and
    :class:`~twill.errors.SolverUnavailableError` when the solver is not installed."""
    from twill.solve.strategies import max_ii_of

    require(options.solver)
    least, pool = least_warps(graph), options.max_warps or machine.max_warps_per_cta
    if least > pool:
        raise InfeasibleScheduleError(
            f"graph {graph.name!r} has no joint SWP+WS schedule at any II: its warp groups need at least {least} "
            f"warps (W_vl for the variable-latency ops and a group for the widest other op), the warp pool has "
            f"{pool}" + (options.advice("raise {}", "max_warps") if pool < machine.max_warps_per_cta else "")
            + options.advice("use {} for a schedule without warp specialization", "ws"))
    started = time.perf_counter()
    deadline = started + options.time_limit
    units = effective_units(graph, machine.units)
    max_ii = max_ii_of(graph, options, lower_bound)
    search = Search(graph, machine, options, started=started, deadline=deadline, lower_bound=lower_bound)
    previous: dict[str, int] | None = None
    issue = issue_bound(graph, machine, options)
    tried = search.tried
    # Phase 1 and the joint solve share the time before the last resort's reserve, so that it always runs.
    reserved = deadline - LAST_RESORT_SHARE * options.time_limit
    for ii in range(lower_bound, max_ii + 1):
        if deadline - time.perf_counter() <= 0:
            break
        if search.modulo_ii is not None and issue is not None and ii < issue.ii:
            tried.append(Attempt(ii, joint=Status.INFEASIBLE, by="warp_issue_bound", bound=bound_row(issue)))
            continue
        if deadline - time.perf_counter() < LAST_RESORT_SHARE * options.time_limit:
            found = last_resort(graph, machine, options, units, first=ii, max_ii=max_ii, deadline=deadline)
            if found is not None:
                tried.append(Attempt(found[0], joint=Status.FEASIBLE, by="last_resort", fixed_starts="greedy"))
                return search.finish(found[1], found[2], proven_below=False, length_proven=False)
            break
        options.report(f"II {options.ii_text(ii)}: phase 1 (elapsed {time.perf_counter() - started:.1f} s)")
        mod, row = phase_one(graph, units, options, ii, deadline=reserved, previous=previous,
                             prove=search.modulo_ii is None)
        tried.append(row)
        if not mod.found:
            continue
        search.keep_fallback(mod)
        search.modulo_ii = search.modulo_ii or ii
        previous = dict(mod.starts)
        if time.perf_counter() >= reserved:
            continue                     # the last resort's reserve has begun: it starts at the next II
        # proved: the lower end of L that keeps the least n copies (LEN(M) itself when phase 1 minimised L)
        length_min = mod.length_bound if mod.status == Status.OPTIMAL else mod.length
        if ii == search.modulo_ii and issue is not None and ii < issue.ii and mod.status == Status.OPTIMAL:
            # below the bound: infeasible without a solve; the UNSAT explanation is asked of the same model
            tried[-1] = replace(row, length_min=length_min, copies=math.ceil(length_min / ii),
                                joint=Status.INFEASIBLE, by="warp_issue_bound", bound=bound_row(issue))
            options.report(f"II {options.ii_text(ii)}: joint infeasible (warp_issue_bound)")
            model = new_model(graph, machine, options, units, ii=ii, length_min=length_min)
            search.explain(model)
            model.close()
            continue
        relaxed = None
        if ii != search.modulo_ii:
            relaxed = search.relax(lambda drops: relaxation(graph, machine, options, units, ii=ii,
                                                            length_min=length_min, drops=drops, deadline=reserved))
            if relaxed is not None and relaxed[1].status == Status.INFEASIBLE:
                tried[-1] = replace(row, length_min=length_min, copies=math.ceil(length_min / ii),
                                    joint=Status.INFEASIBLE, by="relaxation", relaxed=tuple(sorted(relaxed[0])))
                options.report(f"II {options.ii_text(ii)}: joint infeasible (relaxation)")
                more = search.more_copies(ii, math.ceil(length_min / ii), reserved)
                if more is not None:
                    return search.finish(*more, proven_below=all(a.proves_infeasible for a in tried[:-1]),
                                         length_proven=more[1].status == Status.OPTIMAL)
                continue
        least = relaxed[1] if relaxed is not None and relaxed[1].found else None
        # the relaxation's least L is a proved lower end of the joint L at the same copies (docs/model.md §5)
        model = new_model(graph, machine, options, units, ii=ii, length_min=max(
            length_min, least.solution.length if least is not None and least.status == Status.OPTIMAL else 0))
        if least is not None:
            model.hint_solution(least.solution)
        else:
            model.hint(mod.starts)
        outcome = model.solve(Objective.LENGTH, time_limit=share("joint", reserved))
        row = tried[-1] = replace(row, length_min=length_min, copies=model.problem.copies,
                                  joint=outcome.status, seconds=outcome.seconds)
        options.report(f"II {options.ii_text(ii)}: joint {outcome.status} ({outcome.seconds:.2f} s)")
        length_proven = mod.status == Status.OPTIMAL and outcome.status == Status.OPTIMAL
        if outcome.status == Status.UNKNOWN:
            attempt = fixed_start_joint(graph, machine, options, units, ii, reserved)
            row = tried[-1] = replace(row, fixed_starts="no greedy placement" if attempt is None
                                      else str(attempt[1].status))
            options.report(f"II {options.ii_text(ii)}: warp assignment for greedy starts: {row.fixed_starts}")
            if attempt is not None and attempt[1].found:
                model.close()
                model, outcome = attempt
            elif attempt is not None:
                attempt[0].close()
        if outcome.found:
            proven_below = all(a.proves_infeasible for a in tried[:-1])
            return search.finish(model, outcome, proven_below=proven_below, length_proven=length_proven)
        if ii == search.modulo_ii and row.proves_infeasible:
            search.explain(model)
        model.close()
        if outcome.status == Status.INFEASIBLE:
            more = search.more_copies(ii, row.copies, reserved)
            if more is not None:
                return search.finish(*more, proven_below=all(a.proves_infeasible for a in tried[:-1]),
                                     length_proven=more[1].status == Status.OPTIMAL)
    remedy = remedy_for(search.blocked or [], remedy_flags(graph, machine, options))
    if tried and tried[-1].ii == max_ii and all(a.proves_infeasible for a in tried):
        message = (f"graph {graph.name!r} has no joint SWP+WS schedule with II <= {options.ii_text(max_ii)} (II "
                   f"{lower_bound}..{max_ii} proved infeasible{_by(options)})" + (f"; {remedy}" if remedy else "")
                   + (f" ({search.note})" if search.note else ""))
    else:
        message = undecided_message(graph, options, tried, search.note, remedy if search.blocked else "")
    if search.fallback is not None:
        return search.fall_back(message)
    if search.fallback_problem:
        message += (f"; nor does the modulo-only schedule with the kernel's warp groups verify "
                    f"({search.fallback_problem}){kernel_warps_note(graph, search.fallback_problem)}"
                    + options.advice("use {} for a schedule without warp specialization", "ws"))
    raise InfeasibleScheduleError(message)


class Search:
    """What Algorithm 1 carries from II to II: the rows tried, the modulo-only II, the UNSAT explanation;
    and the :class:`Schedule` it builds from the winning model."""

    def __init__(self, graph: LoopGraph, machine: Machine, options: SolveOptions, *, started: float,
                 deadline: float, lower_bound: int):
        self.graph, self.machine, self.options = graph, machine, options
        self.started, self.deadline, self.lower_bound = started, deadline, lower_bound
        self.tried: list[Attempt] = []
        self.modulo_ii: int | None = None
        self.blocked: list[str] | None = None
        self.note = ""
        #: The joint relaxations still to solve, the current one first: where the backend runs them, each until
        #: it first has a solution (at larger IIs it seldom stops having one, and every such solve is time spent
        #: for nothing; a heuristic: it decides only what is tried, never what is proved).
        self.relaxations = list(RELAXATIONS) if SEARCH_SETTINGS[options.solver].relaxation else []
        #: The fallback (:func:`fallback_schedule`): the first modulo-only schedule, in II order, that verifies
        #: with the kernel's warp groups; else the first verifier message of the one at the modulo-only II.
        self.fallback: Schedule | None = None
        self.fallback_problem = ""

    def keep_fallback(self, mod: Any) -> None:
        """Keep the modulo-only schedule ``mod`` with the kernel's warp groups as the fallback when it verifies
        and none is kept yet (a check, no solve)."""
        if self.fallback is not None:
            return
        found, problems = fallback_schedule(self.graph, self.machine, self.options, mod, self.lower_bound)
        self.fallback = found
        if problems and not self.fallback_problem:
            self.fallback_problem = problems[0]

    def fall_back(self, reason: str) -> Schedule:
        """The fallback schedule, status ``feasible``, its ``stats["fallback"]`` the ``reason`` the joint search
        found no schedule of its own (the error it would have raised), reported as it is returned."""
        assert self.fallback is not None
        fallback = self.fallback
        stats = {**dict(fallback.stats), "tried": [a.to_dict() for a in self.tried], "modulo_ii": self.modulo_ii,
                 "fallback": reason}
        if self.blocked is not None:
            stats["blocked_by"] = self.blocked
            stats["blocked_by_note"] = self.note
        self.options.report(f"II {self.options.ii_text(fallback.ii)}: the modulo-only schedule with the kernel's "
                            f"warp groups ({reason})")
        return replace(fallback, stats=stats, solve_seconds=time.perf_counter() - self.started)

    def relax(self, solve: Callable[[frozenset[Family]], JointOutcome]
              ) -> tuple[frozenset[Family], JointOutcome] | None:
        """Solve the current relaxation at one II (``solve(drops)``): its drops and the outcome (``infeasible``:
        the joint problem at that II is infeasible too), or None when no relaxation is left. One that has a
        solution hands over to the next from the next II on (solving the next at once would cost the II where
        the first relaxation turns feasible, often the answer, a second solve); one that runs out of time
        stays."""
        if not self.relaxations:
            return None
        drops = self.relaxations[0]
        outcome = solve(drops)
        if outcome.status in (Status.FEASIBLE, Status.OPTIMAL):
            self.relaxations.pop(0)
        return drops, outcome

    def explain(self, model: JointModel) -> None:
        """The UNSAT explanation at the modulo-only II (docs/model.md §5), reported as it is found. A relaxed
        problem whose II lies below the warp-issue bound of its own families (:func:`issue_bound`) is infeasible
        without a solve. Where the backend runs the joint relaxations, the current one is solved first
        (:meth:`relax`): when it has no solution, neither has the problem without any one or two of the families
        it drops, so those answers need no solve either."""
        deadline = time.perf_counter() + share("explain", self.deadline)
        ii = model.problem.ii

        def decide(families: tuple[Family, ...], seconds: float) -> Status:
            bound = issue_bound(self.graph, self.machine, self.options, frozenset(families))
            if bound is not None and ii < bound.ii:
                return Status.INFEASIBLE
            return model.feasible_without(families, seconds)

        answer = self.relax(lambda drops: JointOutcome(decide(tuple(drops), share("relaxation", deadline)), None, 0.0))
        proved = answer[0] if answer is not None and answer[1].status == Status.INFEASIBLE else None

        def oracle(families: tuple[Family, ...], seconds: float) -> Status:
            if proved is not None and set(families) <= proved:
                return Status.INFEASIBLE
            return decide(families, seconds)

        self.blocked, self.note = explain_with(model.problem, oracle, deadline)
        self.options.report(self.note)

    def more_copies(self, ii: int, copies: int, deadline: float) -> tuple[JointModel, JointOutcome] | None:
        """The joint problem at ``ii`` with 1 … ``options.extra_copies`` copies more than the ``copies`` just
        proved infeasible (``L`` past ``copies·ii``), each solved for the least ``L``; the first with a
        schedule, else None. Each solve adds a ``tried`` row (``by``: ``extra_copies``)."""
        for n in range(copies + 1, copies + 1 + self.options.extra_copies):
            if deadline - time.perf_counter() <= 0:
                return None
            model, outcome = self.solve_copies(ii, n, deadline)
            if outcome.found:
                return model, outcome
            model.close()
        return None

    def solve_copies(self, ii: int, copies: int, deadline: float,
                     unhoisted_below: int | None = None) -> tuple[JointModel, JointOutcome]:
        """The joint problem at ``ii`` with exactly ``copies`` copies (``L`` in ``((copies − 1)·ii, copies·ii]``),
        with ``unhoisted < unhoisted_below`` when given, solved for the least ``L`` within the joint share of
        the time to ``deadline``; adds its ``tried`` row (``by``: ``extra_copies``) and reports it."""
        graph, options = self.graph, self.options
        length_min = (copies - 1) * ii + 1
        model = new_model(graph, self.machine, options, effective_units(graph, self.machine.units), ii=ii,
                          length_min=length_min)
        if unhoisted_below is not None:
            model.bound(Objective.UNHOISTED, unhoisted_below - 1)
        outcome = model.solve(Objective.LENGTH, time_limit=share("joint", deadline))
        self.tried.append(Attempt(ii, joint=outcome.status, by="extra_copies", length_min=length_min, copies=copies,
                                  unhoisted_below=unhoisted_below, seconds=outcome.seconds))
        fewer = "" if unhoisted_below is None else f" and fewer than {unhoisted_below} unhoisted pairs"
        options.report(f"II {options.ii_text(ii)}: joint with {copies} copies{fewer} {outcome.status}")
        return model, outcome

    def hoist_with_more_copies(self, problem: JointProblem, records: list[ObjectiveRecord]
                               ) -> tuple[JointModel, JointSolution, list[ObjectiveRecord]] | None:
        """At the II the search stops at, the extra copies (``options.extra_copies``) also serve ``unhoisted``:
        when the schedule found with ``problem.copies`` copies (its objective ``records``) leaves pairs
        unhoisted, the joint problem with
        1 … ``extra_copies`` copies more is solved under ``unhoisted ≤ best − 1``, each answer lowering the
        bound for the next. The model, solution and records of the schedule with the fewest unhoisted pairs
        (its records after the secondary objectives; ``unhoisted`` proved least over all the copies tried
        when every solve was decided), or None when none has fewer. Each solve adds a ``tried`` row (``by``:
        ``extra_copies``, ``unhoisted_below``: the bound + 1)."""
        options = self.options
        record = next((r for r in records if r.name == Objective.UNHOISTED), None)
        if not options.extra_copies or record is None or record.value == 0:
            return None
        best: tuple[JointModel, JointSolution, list[ObjectiveRecord]] | None = None
        value, decided = record.value, record.proven
        for n in range(problem.copies + 1, problem.copies + 1 + options.extra_copies):
            if value == 0:
                break
            if self.deadline - time.perf_counter() <= 0:
                decided = False
                break
            model, outcome = self.solve_copies(problem.ii, n, self.deadline, unhoisted_below=value)
            decided = decided and outcome.status in (Status.OPTIMAL, Status.FEASIBLE, Status.INFEASIBLE)
            if not outcome.found:
                model.close()
                continue
            found, found_records = _secondary(model, outcome, self.deadline, outcome.status == Status.OPTIMAL)
            if best is not None:
                best[0].close()
            best = model, found, found_records
            value = found.objectives[Objective.UNHOISTED]
        if best is None:
            return None
        model, found, found_records = best
        # unhoisted is proved least over the copies tried only when every bounded solve was decided
        return model, found, [replace(r, proven=r.proven and decided) if r.name == Objective.UNHOISTED else r
                              for r in found_records]

    def finish(self, model: JointModel, outcome: JointOutcome, *, proven_below: bool,
               length_proven: bool) -> Schedule:
        """The :class:`Schedule` of the joint solution ``outcome`` after the secondary objectives; ``stats``
        records the length and copies of its start times (the verifier recomputes both)."""
        solution, records = _secondary(model, outcome, self.deadline, length_proven)
        fewer = self.hoist_with_more_copies(model.problem, records)
        if fewer is not None:
            model.close()
            model, solution, records = fewer
        graph, problem = self.graph, model.problem
        size = model.size()
        model.close()
        length = max(solution.starts[op.name] + op.cycles for op in graph.ops)
        groups, assignment = warp_groups(graph, problem.ii, solution)
        stats: dict[str, Any] = {
            "search": "joint", "tried": [a.to_dict() for a in self.tried],
            "modulo_ii": self.modulo_ii,
            "length": length, "copies": math.ceil(length / problem.ii),
            "objectives": [r.to_dict() for r in records], "tie_break": model.tie_break,
            "variables": size.variables, "constraints": size.constraints, **size.extra,
            "families": dict(size.families), "reg_limit": problem.reg_limit, "max_warps": problem.max_warps,
            "smem_bytes": solution.objectives.get(Objective.SMEM, 0), "mii": self.lower_bound,
        }
        if self.blocked is not None:
            stats["blocked_by"] = self.blocked
            stats["blocked_by_note"] = self.note
        proven = proven_below and all(r.proven for r in records)
        return Schedule(graph=graph, arch=self.machine.name, solver=self.options.solver,
                        status=Status.OPTIMAL if proven else Status.FEASIBLE, ii=problem.ii,
                        ii_lower_bound=problem.ii if proven_below else self.lower_bound,
                        starts=dict(solution.starts), assignment=assignment, warps=groups,
                        solve_seconds=time.perf_counter() - self.started,
                        streaming_depth=self.options.streaming_depth, stats=stats)
