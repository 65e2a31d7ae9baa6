"""Inject a Twill modulo schedule into stock Triton 3.6.0 (software pipelining only, no warp specialization).

Triton's pipeliner consumes a *coarse schedule* serialized in the IR: every op of the loop body carries
``loop.stage`` (iteration offset) and ``loop.cluster`` (emission order within the steady-state body), and
the loop carries ``tt.scheduled_max_stage``. We compile with the ``make_ttgir`` pass list split at the
pipeliner (:mod:`twill.integrations.triton.compile`), lower the loop body with the frontend again, and rewrite
those attributes as text from the schedule:

* graph op ``v`` with start time ``t`` at interval ``II`` (times shifted by the earliest non-load start):
  ``stage = ⌊t / II⌋``, ``cluster`` = dense rank of ``t mod II`` among all ops (Triton emits clusters in
  order, program order within a cluster);
* a streaming TMA load gets zero latency in the model, so the solver may put it in its consumer's stage;
  Triton would then not pipeline it. The ring depth of streaming loads is an outer knob (paper §5.3): a load
  is placed ``load_lead`` stages before its first consumer (default ``num_stages - 1``, the ring Triton's own
  schedule uses, so an A/B compares schedules and not buffer counts) and in a final cluster of its own.
  Triton allocates ``stage(consumer) - stage(load) + 1`` buffers for a load read by a wgmma/tcgen05;
* a folded statement (index arithmetic, views, the ``local_alloc`` that receives a load) takes the stage
  and cluster of its earliest consumer (reached through ``scf.yield``: of its consumer in the next
  iteration, never before its own producers).

Stages are shifted so that the smallest is 0. The edited text is re-parsed and compiled to a cubin.

On sm_90 Triton 3.6 cannot predicate ``warp_group_dot``, so every wgmma (and everything computed from it)
must be in the last stage: :func:`constrain_for_triton` turns that into edges and :func:`solve_for_triton`
solves the constrained graph with the ``window`` strategy of :mod:`twill.solve.strategies`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from twill.errors import TwillError, UnsupportedFeatureError
from twill.integrations.triton import lower_ttgir
from twill.integrations.triton.compile import KernelSpec, compile_with_edit
from twill.integrations.triton.lower import LoweredLoop
from twill.integrations.triton.mlir import ForLoop, add_attribute, find_loops
from twill.ir.graph import Edge, LoopGraph, frozen_attrs
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.schedule.stages import LOAD_KINDS, is_streaming_load, op_places
from twill.schedule.vocab import Status
from twill.solve.options import WINDOW_II_LIMIT, SolveOptions

_STAGE = re.compile(r"loop\.stage = -?\d+ : i32")
_CLUSTER = re.compile(r"loop\.cluster = -?\d+ : i32")
_MAX_STAGE = re.compile(r"tt\.scheduled_max_stage = -?\d+ : i32")
_RING = re.compile(r"ttg\.local_alloc\s*(?::[^\n]*?)?->\s*!ttg\.memdesc<(\d+)x(\d+)x(\d+)x(\w+),")


@dataclass(frozen=True)
class StagePlan:
    """The coarse schedule to write: (stage, cluster) for every op of the schedule's graph and for every
    statement of the loop body, and the loop's maximum stage."""

    ii: int
    op_places: Mapping[str, tuple[int, int]]
    statements: Mapping[int, tuple[int, int]]
    max_stage: int
    load_lead: int

    def to_dict(self) -> dict[str, Any]:
        return {"ii": self.ii, "max_stage": self.max_stage, "load_lead": self.load_lead,
                "ops": {n: {"stage": s, "cluster": c} for n, (s, c) in sorted(self.op_places.items())}}


@dataclass(frozen=True)
class InjectionResult:
    """A kernel compiled with an injected schedule.

    Attributes:
        kernel: Triton's ``CompiledKernel`` (``asm['ttgir']``, ``asm['cubin']``, ``metadata.shared``).
        plan: the coarse schedule that was written.
        scheduled_ttgir: the pre-pipeline TTGIR with Twill's ``loop.stage``/``loop.cluster``.
        rings: shared-memory rings of the final TTGIR: ``(depth, shape)`` per multi-buffered allocation.
    """

    kernel: Any
    plan: StagePlan
    scheduled_ttgir: str
    rings: tuple[tuple[int, tuple[int, int], str], ...] = field(default=())

    @property
    def shared_bytes(self) -> int:
        return int(self.kernel.metadata.shared)

    def summary(self, schedule: Schedule) -> dict[str, Any]:
        """The JSON summary ``twill inject`` prints: II, stages, buffers, shared memory."""
        def cycles(value: int) -> int:
            return ii_cycles(schedule, value)

        out: dict[str, Any] = {
            "kernel": self.kernel.name, "arch": schedule.arch, "loop": schedule.graph.attrs.get("loop_source"),
            "ii": schedule.ii, "ii_cycles": cycles(schedule.ii),
            "ii_lower_bound": schedule.ii_lower_bound, "ii_lower_bound_cycles": cycles(schedule.ii_lower_bound),
            "status": schedule.status, "stages": self.plan.max_stage + 1, "load_lead": self.plan.load_lead,
            "shared_memory_bytes": self.shared_bytes, "num_warps": int(self.kernel.metadata.num_warps),
            "buffers": [{"depth": d, "shape": list(s), "dtype": t} for d, s, t in self.rings],
            "ops": {n: {"stage": s, "cluster": c} for n, (s, c) in self.plan.op_places.items()},
        }
        return out


# -- the plan ----------------------------------------------------------------------------------------------
def constrain_for_triton(graph: LoopGraph, capability: int) -> LoopGraph:
    """``graph`` with the constraints Triton 3.6's pipeliner puts on an injected schedule.

    On sm_90 the pipeliner must predicate every op of a stage before the last (it runs in the epilogue
    iterations for iterations that do not exist), and it cannot predicate ``warp_group_dot``: every wgmma must
    sit in the last stage, and nothing computed from it can come later. We ask that all ops except streaming
    loads start within one II of each other: an edge ``v -> r`` (delay 1, distance 1), i.e.
    ``t_v - t_r <= II - 1``, from every op ``v`` to every root ``r`` (an op with no same-iteration
    predecessor among them) bounds every pairwise gap, since each op starts no earlier than some root. After a
    shift of all times (which keeps a modulo schedule valid) they share one stage. sm_100 (tcgen05 is
    predicable) needs nothing.

    Implied edges make the bound tight for the II search: when MMA ``u`` reaches MMA ``m`` in the same
    iteration (both on the tensor core, capacity 1), ``m`` (starting less than II after ``u``) must finish
    before ``u``'s next instance: ``t_m + cycles(m) <= t_u + II``, an edge ``m -> u`` (delay ``cycles(m)``,
    distance 1), so RecMII already includes the chain plus the wrap-around on the tensor core.
    """
    if capability // 10 != 9:
        return graph
    compute = [op.name for op in graph.ops if not is_streaming_load(graph, op.name)]
    inside = set(compute)
    roots = [n for n in compute if not any(e.distance == 0 and e.src in inside for e in graph.in_edges(n))]
    extra = [Edge(v, r, 1, 1) for v in compute for r in roots if v != r]
    below = _descendants(graph, inside)
    for u in compute:
        for m in sorted(below[u]):
            if graph.op(u).kind == graph.op(m).kind == "mma":
                extra.append(Edge(m, u, graph.op(m).cycles, 1))
    attrs = {**dict(graph.attrs), "triton_sm90_window": True}
    return replace(graph, edges=graph.edges + tuple(extra), attrs=frozen_attrs(attrs))


#: Cost-normalization budget U of the sm_90 window search: coarser than the default 300, because proving
#: an II infeasible under the window constraint is the expensive step and its cost grows with U.
WINDOW_RESOLUTION = 100


def solve_for_triton(graph: LoopGraph, machine: Machine, capability: int, options: SolveOptions | None = None,
                     *, per_ii_limit: float = WINDOW_II_LIMIT) -> Schedule:
    """A software-pipelining schedule of ``graph`` that Triton 3.6 can take (see :func:`constrain_for_triton`).

    sm_100: :func:`twill.solve.schedule` with ``ws=False``. sm_90: the window constraint makes each
    infeasible II a hard proof, so the constrained graph is solved with the ``window`` strategy
    (:func:`twill.solve.strategies.window`, at most ``per_ii_limit`` seconds per II) at cost resolution
    ``min(U, WINDOW_RESOLUTION)``. ``status`` is ``optimal`` only when every II below was proved infeasible
    and L is optimal; otherwise ``feasible`` with ``ii_lower_bound`` the smallest II not proved infeasible.
    ``stats["res_mii_cycles"]`` is the resource bound of the raw constrained graph in cycles
    (:func:`ii_cycles`); ``graph_digest`` is that of ``graph`` as given (:func:`check_schedule_fits` compares
    it with the kernel a schedule file is injected into).
    """
    from twill.ir.digest import graph_digest
    from twill.ir.validate import validate_graph
    from twill.solve import schedule as solve
    from twill.ir.bounds import res_mii

    base = replace(options or SolveOptions(ws=False), ws=False)
    if capability // 10 != 9:
        return solve(graph, machine, base)
    constrained = constrain_for_triton(graph, capability)
    result = solve(constrained, machine, replace(base, resolution=min(base.resolution, WINDOW_RESOLUTION),
                                                 strategy="window", window_ii_limit=per_ii_limit))
    raw = res_mii(constrained, validate_graph(constrained, machine.units))
    return replace(result, stats={**dict(result.stats), "res_mii_cycles": raw, "triton_sm90_window": True},
                   graph_digest=graph_digest(graph))


def check_schedule_fits(schedule: Schedule, graph: LoopGraph, spec: KernelSpec) -> None:
    """Refuse ``schedule`` (read from a file) for ``graph``, the loop of ``spec`` about to be compiled, unless
    it was solved for that loop: its ``graph_digest`` must be ``graph``'s (:func:`twill.ir.digest.graph_digest`:
    ops, costs, edges, constexprs, ``num_warps``, ``num_stages``), and the graph it carries must be ``graph``
    as the solver saw it (normalized by the schedule's own record, on sm_90 after :func:`constrain_for_triton`;
    :func:`twill.solve.provenance.derivation_problem`). A :class:`TwillError` names what differs: the
    configurations, when they differ."""
    from twill.ir.digest import configuration, configuration_text, graph_digest
    from twill.solve.provenance import derivation_problem

    names = list(spec.constexprs)
    have, want = configuration(schedule.graph.attrs, names), configuration(graph.attrs, names)
    if have != want:
        raise TwillError(f"the schedule was solved for {configuration_text(have)}; this kernel compiles with "
                         f"{configuration_text(want)}")
    if schedule.graph_digest is not None and schedule.graph_digest != graph_digest(graph):
        raise TwillError("the schedule was solved for another loop graph than this kernel's (its graph_digest "
                         "differs: ops, costs or edges)")
    constrain = (lambda g: constrain_for_triton(g, spec.capability),) if spec.capability // 10 == 9 else ()
    problem = derivation_problem(schedule, graph, transforms=constrain)
    if problem is not None:
        raise TwillError(f"the schedule is not one of this kernel's loop: {problem}")


@dataclass(frozen=True)
class Tuning:
    """The outcome of :func:`tune`: the index of the chosen spec, the loops it schedules (as ``--loop`` takes
    them) and their schedules, in program order, and one row per spec."""

    best: int
    loops: tuple[int, ...]
    schedules: tuple[Schedule, ...]
    rows: tuple[Mapping[str, Any], ...]


def ii_cycles(schedule: Schedule, value: int) -> int:
    """A normalized II (or its bound) of ``schedule`` in machine cycles: times the cycles per unit, and never
    below the resource bound of the raw graph (``stats['res_mii_cycles']``, which normalization can round
    under)."""
    from twill.schedule.report import raw_cycles

    cycles = raw_cycles(value, schedule.stats.get("normalization"))
    cycles = value if cycles is None else cycles
    return max(cycles, int(schedule.stats.get("res_mii_cycles", 0)))


def tensor_core_flop(graph: LoopGraph) -> int:
    """FLOP of the tensor-core ops of one iteration: ``2·m·n·k`` per MMA."""
    return sum(2 * int(op.attrs["m"]) * int(op.attrs["n"]) * int(op.attrs["k"])
               for op in graph.ops if op.kind == "mma" and {"m", "n", "k"} <= set(op.attrs))


def tune(specs: Mapping[int, KernelSpec], machine: Machine, options: SolveOptions | None = None, *,
         loop: int | str | None = None) -> Tuning:
    """Schedule the loops of every spec (the configs of an ``@triton.autotune`` kernel; every loop that holds
    a dot, or ``loop``) with :func:`solve_for_triton` and choose the one with the most tensor-core FLOP per
    cycle of II, over its loops together (their FLOP over their cycles: each loop counted as running as many
    iterations as the others): the model's throughput of one CTA. Occupancy (several CTAs per SM) and register
    pressure are not in the model. A config that fails to compile or schedule is a row with its ``error``; all
    failing is an error."""
    from twill.integrations.triton import lower_function_loops

    rows: list[dict[str, Any]] = []
    found: dict[int, tuple[float, tuple[int, ...], tuple[Schedule, ...]]] = {}
    for index, spec in specs.items():
        row: dict[str, Any] = {"config": index}
        try:
            loops, _ = lower_function_loops(spec, machine, loop=loop)
            schedules = tuple(solve_for_triton(lowered.graph, machine, spec.capability, options)
                              for _, lowered in loops)
        except TwillError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        cycles = sum(ii_cycles(s, s.ii) for s in schedules)
        flop = sum(tensor_core_flop(s.graph) for s in schedules)
        found[index] = (flop / cycles, tuple(i for i, _ in loops), schedules)
        status = Status.OPTIMAL if all(s.status == Status.OPTIMAL for s in schedules) else Status.FEASIBLE
        rows.append({**row, "ii_cycles": cycles, "status": status, "flop_per_iteration": flop,
                     "flop_per_cycle": round(flop / cycles, 1)})
    if not found:
        raise TwillError(f"no config could be scheduled: {rows[0]['error']}" if rows else "no config to tune")
    best = max(found, key=lambda i: (found[i][0], -i))
    return Tuning(best=best, loops=found[best][1], schedules=found[best][2], rows=tuple(rows))


def _descendants(graph: LoopGraph, among: set[str]) -> dict[str, set[str]]:
    """Ops reachable from each op of ``among`` through same-iteration (distance 0) edges inside ``among``."""
    succ: dict[str, set[str]] = {n: set() for n in among}
    for e in graph.edges:
        if e.distance == 0 and e.src in among and e.dst in among:
            succ[e.src].add(e.dst)
    out: dict[str, set[str]] = {}

    def walk(n: str) -> set[str]:
        if n not in out:
            out[n] = set()
            found: set[str] = set()
            for m in succ[n]:
                found |= {m} | walk(m)
            out[n] = found
        return out[n]

    for n in among:
        walk(n)
    return out


def check_predicable(schedule: Schedule, places: Mapping[str, tuple[int, int]], capability: int) -> None:
    """On sm_90, refuse a plan that puts a wgmma before the last stage (Triton 3.6 aborts on it)."""
    if capability // 10 != 9:
        return
    top = max(s for s, _ in places.values())
    early = sorted(n for n, (s, _) in places.items() if schedule.graph.op(n).kind == "mma" and s < top)
    if early:
        raise UnsupportedFeatureError(
            f"the schedule puts wgmma op {early[0]!r} in stage {places[early[0]][0]} < last stage {top}; Triton "
            f"3.6 cannot predicate warp_group_dot in the pipeline epilogue: solve the graph returned by "
            f"constrain_for_triton() (twill inject does), or emit Gluon for this schedule")


def plan_stages(lowered: LoweredLoop, schedule: Schedule, *, load_lead: int, capability: int = 90) -> StagePlan:
    """Stage and cluster of every body statement of ``lowered`` from ``schedule`` (op names must match)."""
    names = set(lowered.owner.values())
    scheduled = set(schedule.graph.op_names)
    if names != scheduled:
        extra = sorted(names ^ scheduled)
        raise TwillError(f"the schedule is for graph {schedule.graph.name!r}, whose ops differ from the kernel's "
                         f"loop (first mismatch: {extra[0]!r}); re-run 'twill schedule' on this kernel with the "
                         f"same signature, constexprs and num_warps")
    if load_lead < 1:
        raise TwillError(f"load lead must be >= 1 stage (a load in its consumer's stage is not pipelined), "
                         f"got {load_lead}")
    places = op_places(schedule, load_lead)
    check_predicable(schedule, places, capability)
    statements: dict[int, tuple[int, int]] = {i: places[n] for i, n in lowered.owner.items()}
    producers = _folded_producers(lowered)
    for index, consumers in lowered.folded_into.items():
        now = [places[n] for n, d in consumers if d == 0]
        if now:
            statements[index] = min(now)
            continue
        later = [places[n] for n, _ in consumers]
        after = [places[n] for n in producers.get(index, ())]
        if later:
            statements[index] = max([min(later)] + after)
        else:
            statements[index] = max(after) if after else (max(s for s, _ in places.values()),
                                                          max(c for _, c in places.values()))
    max_stage = max(s for s, _ in statements.values())
    return StagePlan(ii=schedule.ii, op_places=places, statements=statements, max_stage=max_stage,
                     load_lead=load_lead)


def _folded_producers(lowered: LoweredLoop) -> dict[int, set[str]]:
    """Graph ops whose results a folded statement reads in the same iteration (directly or through other
    folded statements)."""
    defined = {r.split("#")[0]: st.index for st in lowered.loop.body for r in st.results}
    memo: dict[int, set[str]] = {}

    def of(index: int) -> set[str]:
        if index in memo:
            return memo[index]
        memo[index] = set()
        out: set[str] = set()
        for v in lowered.loop.body[index].operands:
            src = defined.get(v.split("#")[0])
            if src is None:
                continue
            if src in lowered.owner:
                out.add(lowered.owner[src])
            else:
                out |= of(src)
        memo[index] = out
        return out

    return {i: of(i) for i in lowered.folded_into}


# -- text rewriting ----------------------------------------------------------------------------------------
def set_schedule_attrs(line: str, stage: int, cluster: int) -> str:
    """``line`` (a statement's last line) with ``loop.stage``/``loop.cluster`` set, added if missing."""
    attrs = f"loop.cluster = {cluster} : i32, loop.stage = {stage} : i32"
    if _STAGE.search(line) and _CLUSTER.search(line):
        line = _STAGE.sub(f"loop.stage = {stage} : i32", line, count=1)
        return _CLUSTER.sub(f"loop.cluster = {cluster} : i32", line, count=1)
    return add_attribute(line, attrs)


def set_loop_max_stage(line: str, max_stage: int) -> str:
    """The loop's closing line with ``tt.scheduled_max_stage`` set."""
    if _MAX_STAGE.search(line):
        return _MAX_STAGE.sub(f"tt.scheduled_max_stage = {max_stage} : i32", line, count=1)
    m = re.match(r"^(\s*\})\s*\{(.*?)\}(.*)$", line)
    if m:
        return f"{m.group(1)} {{{m.group(2)}, tt.scheduled_max_stage = {max_stage} : i32}}{m.group(3)}"
    m = re.match(r"^(\s*\})(.*)$", line)
    return f"{m.group(1)} {{tt.scheduled_max_stage = {max_stage} : i32}}{m.group(2)}"


def annotate(text: str, loop: ForLoop, plan: StagePlan) -> str:
    """The module text with ``plan`` written on ``loop``'s body and ``tt.scheduled_max_stage`` on the loop."""
    lines = text.splitlines()
    for st in loop.body:
        stage, cluster = plan.statements[st.index]
        lines[st.last_line] = set_schedule_attrs(lines[st.last_line], stage, cluster)
    lines[loop.close_line] = set_loop_max_stage(lines[loop.close_line], plan.max_stage)
    return "\n".join(lines) + "\n"


def read_schedule_attrs(text: str, loop: ForLoop) -> dict[int, tuple[int, int]]:
    """(stage, cluster) of every statement of ``loop`` as written in ``text`` (Triton's or an injected one)."""
    lines = text.splitlines()
    out = {}
    for st in loop.body:
        line = lines[st.last_line]
        s, c = re.search(r"loop\.stage = (-?\d+)", line), re.search(r"loop\.cluster = (-?\d+)", line)
        if s and c:
            out[st.index] = (int(s.group(1)), int(c.group(1)))
    return out


# -- compile -----------------------------------------------------------------------------------------------
def schedule_edit(schedule: Schedule, machine: Machine, *, load_lead: int, capability: int,
                  plans: list[StagePlan] | None = None, loop: int | str | None = None):
    """The text edit that writes ``schedule`` onto loop ``loop`` (see
    :func:`~twill.integrations.triton.select_loop`; default: the loop the schedule was solved for, its graph's
    ``loop_index``) of the pre-pipeline TTGIR (for :func:`compile_with_edit` or a JIT hook,
    :func:`make_jit_hook`). Each plan it writes is appended to ``plans``."""
    if loop is None:
        loop = schedule.graph.attrs.get("loop_index")

    def edit(text: str) -> str:
        lowered = lower_ttgir(text, machine, name=schedule.graph.name, loop=loop)
        plan = plan_stages(lowered, schedule, load_lead=load_lead, capability=capability)
        if plans is not None:
            plans.append(plan)
        return annotate(text, lowered.loop, plan)

    return edit


def default_load_lead(num_stages: int | None) -> int:
    """``num_stages - 1`` (Triton's default num_stages is 3), at least 1."""
    return max(1, (3 if num_stages is None else num_stages) - 1)


def rings(ttgir: str) -> tuple[tuple[int, tuple[int, int], str], ...]:
    """Multi-buffered shared-memory allocations of a final TTGIR: (depth, tile shape, element type)."""
    out = []
    for m in _RING.finditer(ttgir):
        out.append((int(m.group(1)), (int(m.group(2)), int(m.group(3))), m.group(4)))
    return tuple(out)


def inject(spec: KernelSpec, schedule: Schedule, machine: Machine, *, load_lead: int | None = None,
           workdir: str | None = None, loop: int | str | None = None) -> InjectionResult:
    """Compile ``spec`` with ``schedule`` on loop ``loop`` instead of Triton's own software-pipelining
    schedule."""
    return inject_loops(spec, [(loop, schedule)], machine, load_lead=load_lead, workdir=workdir)[0]


def inject_loops(spec: KernelSpec, scheduled: Sequence[tuple[int | str | None, Schedule]], machine: Machine, *,
                 load_lead: int | None = None, workdir: str | None = None) -> list[InjectionResult]:
    """Compile ``spec`` once with each ``(loop, schedule)`` of ``scheduled`` written onto its loop (``loop``
    as ``--loop`` takes it, see :func:`~twill.integrations.triton.select_loop`) instead of Triton's own
    software-pipelining schedules; one result per loop, all sharing the compiled kernel and the scheduled
    TTGIR."""
    for _, schedule in scheduled:
        if schedule.assignment:
            raise UnsupportedFeatureError("Triton injection takes a software-pipelining schedule only; schedule "
                                          "with --no-ws (SolveOptions(ws=False)) or emit Gluon for warp "
                                          "specialization")
    if spec.capability // 10 not in (9, 10):
        raise UnsupportedFeatureError(f"schedule injection supports sm_90 and sm_100, not sm_{spec.capability}")
    lead = default_load_lead(spec.num_stages) if load_lead is None else load_lead
    plans: list[StagePlan] = []
    seen: list[str] = []

    def edit(text: str) -> str:
        for loop, schedule in scheduled:
            text = schedule_edit(schedule, machine, load_lead=lead, capability=spec.capability, plans=plans,
                                 loop=loop)(text)
        seen.append(text)
        return text

    kernel, _ = compile_with_edit(spec, edit, workdir=workdir)
    return [InjectionResult(kernel=kernel, plan=plan, scheduled_ttgir=seen[0], rings=rings(kernel.asm["ttgir"]))
            for plan in plans[:len(scheduled)]]


def make_jit_hook(kernel_name: str, schedule: Schedule, machine: Machine, *, load_lead: int, workdir: str,
                  capability: int = 90):
    """An ``add_stages_inspection_hook`` for JIT launches (``kernel[grid](...)``) that compiles
    ``kernel_name`` with ``schedule``. Triton 3.6 does not key its caches on the hook: use a fresh
    ``JITFunction`` (``triton.jit(fn.fn)``) and ``knobs.compilation.always_compile``."""
    from twill.integrations.triton.compile import make_hook

    return make_hook(kernel_name, schedule_edit(schedule, machine, load_lead=load_lead, capability=capability),
                     workdir)


def write_outputs(result: InjectionResult, schedule: Schedule, directory: str | Path,
                  schedule_document: Mapping[str, Any] | None = None,
                  tuning: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``<kernel>.ttgir`` (final), ``<kernel>.scheduled.ttgir`` (pre-pipeline, Twill's attributes),
    ``<kernel>.cubin``, ``<kernel>.ptx``, ``schedule.json`` (``schedule_document``, when given) and
    ``summary.json`` (with the ``tuning`` keys, when given) into ``directory``; returns the summary."""
    return _write_files(result, directory, {**result.summary(schedule), **dict(tuning or {})}, schedule_document)


#: Keys of :meth:`InjectionResult.summary` that describe the compiled kernel, not one of its loops.
KERNEL_SUMMARY_KEYS = ("kernel", "arch", "shared_memory_bytes", "num_warps", "buffers")


def write_loop_outputs(results: Sequence[InjectionResult], schedules: Sequence[Schedule], directory: str | Path, *,
                       tuning: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`write_outputs` for a kernel compiled with a schedule on each of several loops
    (:func:`inject_loops`): ``schedule.json`` is ``{"kernel": NAME, "loops": [...]}`` with one
    ``twill-schedule/1`` document per loop, and the summary holds the kernel's keys
    (:data:`KERNEL_SUMMARY_KEYS`) and ``loops``, the rest of each loop's summary with its ``loop_index`` (the
    index ``--loop`` takes), in program order."""
    from twill.schedule.document import schedule_document

    rows = [result.summary(schedule) for result, schedule in zip(results, schedules)]
    summary = {key: rows[0][key] for key in KERNEL_SUMMARY_KEYS}
    summary["loops"] = [{"loop_index": schedule.graph.attrs.get("loop_index"),
                         **{k: v for k, v in row.items() if k not in KERNEL_SUMMARY_KEYS}}
                        for row, schedule in zip(rows, schedules)]
    summary.update(tuning or {})
    document = {"kernel": results[0].kernel.name, "loops": [schedule_document(s) for s in schedules]}
    return _write_files(results[0], directory, summary, document)


def _write_files(result: InjectionResult, directory: str | Path, summary: dict[str, Any],
                 schedule_document: Mapping[str, Any] | None) -> dict[str, Any]:
    name = result.kernel.name
    files: dict[str, bytes] = {f"{name}.ttgir": result.kernel.asm["ttgir"].encode(),
                               f"{name}.scheduled.ttgir": result.scheduled_ttgir.encode(),
                               f"{name}.ptx": result.kernel.asm["ptx"].encode(),
                               f"{name}.cubin": bytes(result.kernel.asm["cubin"])}
    if schedule_document is not None:
        files["schedule.json"] = (json.dumps(schedule_document, indent=2) + "\n").encode()
    return write_kernel_files(directory, files, summary)


def write_kernel_files(directory: str | Path, files: dict[str, bytes], summary: dict[str, Any]) -> dict[str, Any]:
    """Write ``files`` (name -> bytes) and ``summary.json`` into ``directory``, all of them or none; the summary
    gains ``files``, what the folder holds afterwards. Returns the summary."""
    from twill.files import make_output_dir, output_group, write_bytes_atomic

    out = Path(directory)
    existing = {p.name for p in out.iterdir()} if out.is_dir() else set()
    summary["files"] = sorted((existing | set(files)) - {"summary.json"}) + ["summary.json"]
    files = {**files, "summary.json": (json.dumps(summary, indent=2) + "\n").encode()}
    try:
        with output_group():            # all of them or none, staged beside their targets
            make_output_dir(out)
            for file_name, data in files.items():
                write_bytes_atomic(out / file_name, data)
    except OSError as exc:
        raise TwillError(f"cannot write into {str(out)!r}: {exc.strerror or exc}") from None
    return summary


def inject_triton(target: str, machine: Machine, directory: str, *, options: SolveOptions,
                  signature: str | None = None, constexprs: Sequence[str] = (), num_warps: int | None = None,
                  num_stages: int | None = None, config: int | str | None = None, loop: int | str | None = None,
                  schedule_file: str | None = None, load_lead: int | None = None) -> dict[str, Any]:
    """``twill inject`` of Triton kernel ``target`` (``path.py:fn``): schedule its loop ``loop`` (solved with
    ``options`` by :func:`solve_for_triton`, or read from ``schedule_file`` and checked by
    :func:`check_schedule_fits`), compile it with the schedule injected (:func:`inject`) and write the files of
    :func:`write_outputs` into ``directory``; returns the summary. ``config`` picks an ``@triton.autotune``
    config, or ``"all"``: every config is scheduled and the one :func:`tune` chooses is injected (the summary
    adds ``config`` and ``configs``). Without ``loop`` (and without ``schedule_file`` and ``config="all"``), a
    kernel with several loops that hold dots gets each solved and injected (:func:`inject_loops`,
    :func:`write_loop_outputs`)."""
    from twill.integrations.triton import lower_function_loops, spec_from_target
    from twill.schedule.document import load_schedule_documents, schedule_document
    from twill.targets import python_target

    match = python_target(target)

    def spec_of(index: int | None) -> KernelSpec:
        if not match:
            raise TwillError(f"twill inject needs a Triton kernel target path.py:fn, got {target!r}")
        return spec_from_target(match.path, match.fn, signature=signature, constexprs=list(constexprs),
                                num_warps=num_warps, num_stages=num_stages, machine=machine, config=index)

    tuning = None
    if config == "all":
        from twill.integrations.triton.compile import load_kernel

        if schedule_file:
            raise TwillError("--config all schedules every config; it cannot take --schedule")
        configs = load_kernel(match.path, match.fn).configs if match else ()
        if not configs:
            raise TwillError(f"--config all applies to @triton.autotune kernels; {target!r} has no configs")
        specs = {k: spec_of(k) for k in range(len(configs))}
        tuning = tune(specs, machine, options, loop=loop)
        spec, scheduled = specs[tuning.best], list(zip(tuning.loops, tuning.schedules))
    else:
        spec = spec_of(config)
        loops, _ = lower_function_loops(spec, machine, loop=loop)
        if schedule_file:
            schedules = schedules_for_loops(load_schedule_documents(schedule_file), loops, spec, schedule_file)
        else:
            schedules = [solve_for_triton(lowered.graph, machine, spec.capability, options) for _, lowered in loops]
        scheduled = [(index, schedule) for (index, _), schedule in zip(loops, schedules)]
    extra = {"config": tuning.best, "configs": list(tuning.rows)} if tuning else None
    if len(scheduled) > 1:
        results = inject_loops(spec, scheduled, machine, load_lead=load_lead)
        return write_loop_outputs(results, [s for _, s in scheduled], directory, tuning=extra)
    (loop, schedule), = scheduled
    result = inject(spec, schedule, machine, load_lead=load_lead, loop=loop)
    return write_outputs(result, schedule, directory, schedule_document(schedule), tuning=extra)


def schedules_for_loops(schedules: Sequence[Schedule], loops: Sequence[tuple[int, LoweredLoop]], spec: KernelSpec,
                        path: str) -> list[Schedule]:
    """The schedule of each of ``loops`` (the kernel's loops to inject, as :func:`lower_function_loops` gives
    them) among ``schedules``, read from ``path``: one loop takes a file's only schedule; otherwise each loop
    takes the schedule whose graph has its ``loop_index``. Each must fit its loop (:func:`check_schedule_fits`);
    a loop without one is refused, naming it."""
    if len(loops) == 1 and len(schedules) == 1:
        matched = [schedules[0]]
    elif len(schedules) == 1:
        raise TwillError(f"{path}: holds one loop's schedule and the kernel has {len(loops)} loops that hold dots: "
                         f"pick that loop with --loop N or --loop line:N, or give the file 'twill schedule -o' "
                         f"writes for the whole kernel")
    else:
        by_index = {s.graph.attrs.get("loop_index"): s for s in schedules}
        missing = [lowered for index, lowered in loops if index not in by_index]
        if missing:
            attrs = missing[0].graph.attrs
            raise TwillError(f"{path}: holds no schedule of loop {attrs.get('loop_index')} (at "
                             f"{attrs.get('loop_source', 'an unknown source line')}); its schedules are of loops "
                             f"{', '.join(str(i) for i in by_index)}")
        matched = [by_index[index] for index, _ in loops]
    for schedule, (_, lowered) in zip(matched, loops):
        try:
            check_schedule_fits(schedule, lowered.graph, spec)
        except TwillError as exc:
            raise TwillError(f"{path}: {exc}") from None
    return matched


def heuristic_plan(text: str, loop: int | str | None = None) -> dict[int, tuple[int, int]]:
    """Triton's own (stage, cluster) per statement of the chosen loop of a pre-pipeline TTGIR."""
    from twill.integrations.triton import select_loop
    from twill.integrations.triton.mlir import location_table

    return read_schedule_attrs(text, select_loop(find_loops(text), loop, location_table(text)))


#: Twill's schedule replaces Triton's own only when the model predicts it at least this much faster. Below,
#: the two are the same kernel to the model (a matmul's Twill order is Triton's, to the byte of PTX; co-resident
#: CTAs that share their SM's units gain nothing from a reordering inside one), and a reordering the model
#: does not price can only cost.
INJECT_MIN_GAIN = 0.01


def triton_order(lowered: LoweredLoop, text: str, loop: int | str | None = None) -> LoopGraph:
    """``lowered``'s loop graph with its compute ops chained (delay-0 edges) in the order of Triton's own
    schedule, (cluster, program order) from ``text`` (the pre-pipeline TTGIR): solved like Twill's graph
    (:func:`solve_for_triton`), it prices the kernel Triton builds without Twill. ``loop`` defaults to the
    loop ``lowered`` is (its graph's ``loop_index``)."""
    graph = lowered.graph
    plan = heuristic_plan(text, graph.attrs.get("loop_index") if loop is None else loop)
    order = sorted((i for i, n in lowered.owner.items() if graph.op(n).kind not in LOAD_KINDS and i in plan),
                   key=lambda i: (plan[i][1], i))
    names = [lowered.owner[i] for i in order]
    chain = tuple(Edge(a, b, 0, 0) for a, b in zip(names, names[1:]) if a != b)
    return replace(graph, edges=graph.edges + chain)
