"""Twill as TileLang's pipeline planner: a schedule of a TileLang kernel's ``T.Pipelined`` loop (the graph of
:mod:`twill.integrations.tilelang`), solved under the constraint TileLang puts on it (:func:`solve_for_tilelang`)
-> the ``num_stages``, ``stage=[...]`` and ``order=[...]`` TileLang takes, the warp roles of a warp-specialized
schedule, and the report lines that show them.

Mapping (as for the emitted kernels, :func:`~twill.codegen.tilelang.render.pipelined_annotation`): every
statement takes its op's stage and the rank of its ``t mod II``; a streaming load runs ``num_stages`` stages
ahead of its reader and after it in the body, so TileLang keeps ``num_stages`` versions of its buffer
(``num_stages`` = the ring depth: the loop's own ``num_stages`` unless the schedule needs more). The rewritten
loop gives ``stage`` and ``order`` without ``num_stages``: given ``num_stages``, TileLang 0.1.15's automatic
producer/consumer warp specialization takes the loop on Hopper and lowers it exactly as its own plan, stage
and order ignored (verified: identical CUDA), while without it TileLang runs the planned software pipeline.

A warp-specialized schedule also gives a second rewrite that keeps Twill's warp assignment
(:func:`ws_loop_design`): the loop becomes a ``T.serial`` loop under a ``T.WSSchedule`` whose ``load`` role
issues the TMA copies, whose ``compute0`` role runs the other statements in order of start time,
one ``WSPipeline`` per ring (loads of equal depth and readers share one) of the ring's depth, and whose roles
carry the warp groups' register budgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twill.codegen.plan import ring_depth
from twill.codegen.tilelang.render import (PRODUCER_WARPGROUP, Statement, cannot_emit, check_one_stage,
                                           pipelined_annotation, ring_lead)
from twill.codegen.tilelang.ws import LOOP_ID, Sync, WSDesign, ws_schedule_source
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine
from twill.quote import printable
from twill.schedule.result import Schedule
from twill.solve.options import SolveOptions


@dataclass(frozen=True)
class PipelinePlan:
    """What Twill hands TileLang for one ``T.Pipelined`` loop.

    Attributes:
        ops: the statements' ops in source order.
        num_stages, stage, order: the loop's annotation.
        depth_why: how ``num_stages`` follows from the schedule.
        roles: ``(warp group, role, warps, registers, ops)`` of a warp-specialized schedule (empty without).
    """

    ops: tuple[str, ...]
    num_stages: int
    stage: tuple[int, ...]
    order: tuple[int, ...]
    depth_why: str
    roles: tuple[tuple[int, str, int, int, tuple[str, ...]], ...]

    @property
    def annotation(self) -> str:
        """``num_stages=N, stage=[...], order=[...]``."""
        return f"num_stages={self.num_stages}, stage={list(self.stage)}, order={list(self.order)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``tilelang`` of the schedule document and the inject summary)."""
        return {"ops": list(self.ops), "num_stages": self.num_stages, "stage": list(self.stage),
                "order": list(self.order), "num_stages_why": self.depth_why,
                "roles": [{"group": g, "role": r, "warps": w, "regs": regs, "ops": list(ops)}
                          for g, r, w, regs, ops in self.roles]}


def solve_for_tilelang(graph: LoopGraph, machine: Machine, options: SolveOptions) -> Schedule:
    """A schedule TileLang can express: every op but the TMA loads in one stage (its ``T.gemm`` is synchronous
    and its fragments single-versioned), the window Triton's sm_90 pipeliner also needs
    (:func:`twill.integrations.triton.inject.constrain_for_triton`). With ``options.ws`` the joint solver runs on the
    constrained graph; without, :func:`twill.integrations.triton.inject.solve_for_triton` searches II under it."""
    from twill.integrations.triton.inject import constrain_for_triton, solve_for_triton

    if not options.ws:
        return solve_for_triton(graph, machine, 90, options)
    from twill.solve import schedule

    return schedule(constrain_for_triton(graph, 90), machine, options)


def pipeline_plan(schedule: Schedule) -> PipelinePlan:
    """The :class:`PipelinePlan` of a schedule of a TileLang loop graph (``attrs["statements"]``)."""
    check_one_stage(schedule)
    graph = schedule.graph
    ops = [str(n) for n in graph.attrs["statements"]]
    statements = [Statement(n, (), 1) for n in ops]
    loads = [n for n in ops if graph.op(n).variable_latency]
    readers = {n: max((e.dst for e in graph.out_edges(n) if e.distance == 0), key=schedule.stage) for n in loads}
    lead, why = ring_lead(schedule, loads, readers)
    stage, order = pipelined_annotation(schedule, statements, lead)
    roles = tuple((w.id, w.role, w.num_warps, w.regs, tuple(n for n in ops if schedule.assignment.get(n) == w.id))
                  for w in schedule.warps)
    return PipelinePlan(tuple(ops), lead, tuple(stage), tuple(order), why, roles)


def _sync(kind: str, pipeline: str) -> Sync:
    return Sync(kind, pipeline, 0)


def ws_loop_design(schedule: Schedule, buffers: dict[str, str], threads: int) -> WSDesign:
    """The ``T.WSSchedule`` of a warp-specialized schedule of a TileLang loop: role ``load`` (the warp group of
    the TMA loads) on warps ``[0, warps)``, role ``compute0`` (the other group, the kernel's ``threads``) from
    warp 4, each with the group's register budget, running its statements in order of start time (one
    iteration's order: TileLang runs a role's list per iteration, every sync at stage 0 as every op but the
    loads shares one stage); one ``WSPipeline`` per ring over its shared buffers (``buffers``: load -> buffer),
    depth = the ring depth, loads of equal depth and readers sharing one (one full/empty barrier pair, as in
    the emitted kernels); the consumer waits before a ring's first reader and releases after its last."""
    graph = schedule.graph
    loads = [w for w in schedule.warps if w.ops and all(graph.op(n).variable_latency for n in w.ops)]
    compute = [w for w in schedule.warps if w.ops and w not in loads]
    if len(loads) != 1 or len(compute) != 1:
        raise cannot_emit(f"warp groups {', '.join(f'{w.role} ({len(w.ops)} ops)' for w in schedule.warps)}",
                          "the warp-specialized rewrite takes one TMA group and one compute group")
    load, comp = loads[0], compute[0]
    if load.num_warps > PRODUCER_WARPGROUP:
        raise cannot_emit(f"a {load.num_warps}-warp load group", "the producer role lives in warpgroup 0")
    if comp.num_warps * 32 != threads:
        raise cannot_emit(f"a {comp.num_warps}-warp compute group", f"the kernel launches {threads} threads for "
                                                                    f"its tile statements")
    roles = (("load", 0, load.num_warps, load.regs,
              f"warp group {load.id} ({load.role}, {load.num_warps} warp): TMA producer, budget {load.regs}"),
             ("compute0", PRODUCER_WARPGROUP, PRODUCER_WARPGROUP + comp.num_warps, comp.regs,
              f"warp group {comp.id} ({comp.role}, {comp.num_warps} warps), budget {comp.regs}"))
    index = {n: i for i, n in enumerate(graph.attrs["statements"])}
    body = sorted(comp.ops, key=lambda n: (schedule.start(n), index[n]))    # iteration order, not t mod II
    order = {n: i for i, n in enumerate(body)}
    rings: dict[tuple[int, str, str], list[str]] = {}     # (depth, first reader, release) -> loads
    whys = {}
    for n in load.ops:
        readers = sorted({e.dst for e in graph.out_edges(n) if e.distance == 0}, key=order.__getitem__)
        depth, whys[n] = ring_depth(schedule, n, readers[-1])
        rings.setdefault((depth, readers[0], readers[-1]), []).append(n)
    pipelines, producer, waits, releases = [], [], {}, {}
    for (depth, first, release), group in rings.items():
        name = "_".join(buffers[n] for n in group)
        pipelines.append((name, tuple(buffers[n] for n in group), depth,
                          "; ".join(f"ring of {n}: depth = {whys[n]}" for n in group)))
        producer += [_sync("producer_acquire", name), *group, _sync("producer_commit", name)]
        waits.setdefault(first, []).append(_sync("consumer_wait", name))
        releases.setdefault(release, []).append(_sync("consumer_release", name))
    consumer = [e for n in body for e in (*waits.get(n, []), n, *releases.get(n, []))]
    return WSDesign(PRODUCER_WARPGROUP + comp.num_warps, roles, tuple(pipelines),
                    {"load": tuple(producer), "compute0": tuple(consumer)})


def ws_rewritten_kernel(path: str, fn: str, plan: PipelinePlan, design: WSDesign,
                        schedule: Schedule) -> str:
    """The source of ``path`` with ``fn``'s loop under the ``T.WSSchedule`` of ``design``."""
    from twill.integrations.tilelang import rewrite_ws_source, ws_root_ops

    note = (f"T.WSSchedule: Twill schedule ({schedule.solver}, {schedule.status}, II {schedule.ii}) with its warp "
            f"assignment:\n" + "\n".join(f"role {name}: warps [{lo}, {hi}), max_nreg {regs} <- {why}"
                                          for name, lo, hi, regs, why in design.roles) + "\n" +
            "\n".join(f"WSPipeline {name}: depth {depth} <- {why}" for name, _, depth, why in design.pipelines))
    root = {"load": [LOOP_ID], "compute0": ws_root_ops(path, fn, LOOP_ID)}
    return rewrite_ws_source(path, fn, plan.ops, ws_schedule_source(design, root), LOOP_ID, note)


def format_plan(plan: PipelinePlan, schedule: Schedule) -> str:
    """The report section: the annotation, then one row per statement (op, kind, stage, order, warp group);
    names through :func:`twill.quote.printable`."""
    own = schedule.graph.attrs.get("tilelang_plan")
    lines = ["TileLang T.Pipelined (Twill's plan):", f"  T.Pipelined(..., {plan.annotation})",
             f"  num_stages: {plan.depth_why}"]
    if own:
        lines.append(f"  TileLang's own plan (PipelinePlanning; on Hopper its automatic warp specialization takes "
                     f"TMA loops instead): stage={list(own['stage'])}, order={list(own['order'])}")
    lines += ["", "  #   op                      kind      stage  order  warp" + ("  TileLang stage  order" if own else "")]
    for i, op in enumerate(plan.ops):
        group = schedule.assignment.get(op, "-")
        tail = f"  {own['stage'][i]:<15d} {own['order'][i]}" if own else ""
        lines.append(f"  {i:<3d} {op:23s} {schedule.graph.op(op).kind:9s} {plan.stage[i]:<6d} {plan.order[i]:<6d} "
                     f"{group!s:4s}{tail}".rstrip())
    if plan.roles:
        lines += ["", "  warp roles (twill inject --ws writes them as a T.WSSchedule; T.Pipelined keeps "
                      "TileLang's own):"]
        lines += [f"  {g} {role:8s} {w} warps, {regs} regs: {', '.join(ops)}" for g, role, w, regs, ops in plan.roles]
    return "\n".join(printable(line) for line in lines)


def rewritten_kernel(path: str, fn: str, plan: PipelinePlan, schedule: Schedule) -> str:
    """The source of ``path`` with ``fn``'s ``T.Pipelined`` taking Twill's plan, a comment naming the schedule."""
    from twill.integrations.tilelang import rewrite_source

    note = (f"stage/order: Twill schedule ({schedule.solver}, {schedule.status}, II {schedule.ii}) of ops\n"
            f"{', '.join(plan.ops)};\nloads {plan.num_stages} stages ahead of their reader and after it: "
            f"{plan.num_stages} buffer versions (no num_stages:\nwith it TileLang's automatic warp specialization "
            f"ignores stage and order)")
    return rewrite_source(path, fn, list(plan.stage), list(plan.order), note)


def _ws_kernel(path: str, fn: str, args: list[str], plan: PipelinePlan, schedule: Schedule, machine: Any,
               tmp: str) -> tuple[str, str, WSDesign]:
    """The warp-specialized rewrite of ``path:fn``, its CUDA (lowered from a copy staged in ``tmp``, checked for
    every pipeline's ``depth`` full barriers and the roles' register budgets) and its design."""
    from pathlib import Path

    from twill.integrations.tilelang.cuda import lower_cuda
    from twill.errors import TwillError
    from twill.integrations.tilelang import load_loop, load_prim_func

    loop = load_loop(path, fn, args, machine)[1]
    buffers = {s.op: s.writes[0] for s in loop.statements if s.kind == "tma_load"}
    design = ws_loop_design(schedule, buffers, loop.threads)
    source = ws_rewritten_kernel(path, fn, plan, design, schedule)
    staged = str(Path(tmp) / "ws_kernel.py")
    Path(staged).write_text(source, encoding="utf-8")
    func = load_prim_func(staged, fn, args)
    try:
        cuda = lower_cuda(func, {}, machine.name)
    except Exception as exc:  # noqa: BLE001 - TileLang's verdict on the schedule, as one line
        reason = next((x for x in str(exc).splitlines() if "ws_schedule:" in x), str(exc).splitlines()[-1])
        raise TwillError(f"TileLang rejects the warp-specialized kernel: {reason.split('ws_schedule: ')[-1]}") \
            from None
    want = [f"{name}_full_mem[{depth}]" for name, _, depth, _ in design.pipelines]
    want += [f"warpgroup_reg_dealloc<{design.roles[0][3]}>", f"warpgroup_reg_alloc<{design.roles[1][3]}>"]
    missing = [w for w in want if w not in cuda]
    if missing:
        raise TwillError(f"the warp-specialized kernel's CUDA lacks {', '.join(missing)}")
    return source, cuda, design


def inject_tilelang(path: str, fn: str, args: list[str], machine: Machine, directory: str, *,
                    options: SolveOptions, schedule_file: str | None = None) -> dict[str, Any]:
    """``twill inject`` of TileLang kernel ``path:fn`` (factory arguments ``args``): schedule its loop (solved
    with ``options`` by :func:`solve_for_tilelang`, or read from ``schedule_file``), rewrite the kernel with the
    plan of the schedule, lower the rewritten kernel to CUDA (no GPU), check that its loop carries the plan, and
    write ``<file>_twill.py``, ``<file>_twill.cu``, ``schedule.json`` and ``summary.json`` into ``directory``
    (all or none); a schedule with a warp assignment adds ``<file>_twill_ws.py`` and ``<file>_twill_ws.cu`` (the
    loop under Twill's ``T.WSSchedule``). Returns the summary."""
    import json
    import tempfile
    from pathlib import Path

    from twill.integrations.tilelang.cuda import lower_cuda
    from twill.files import write_all, write_text_output
    from twill.errors import TwillError
    from twill.integrations.tilelang import load_loop
    from twill.files import make_output_dir
    from twill.schedule.document import load_schedule_document, schedule_document

    if schedule_file:
        schedule = load_schedule_document(schedule_file)
    else:
        schedule = solve_for_tilelang(load_loop(path, fn, args, machine)[1].graph, machine, options)
    schedule_doc = schedule_document(schedule)
    plan = pipeline_plan(schedule)
    source = rewritten_kernel(path, fn, plan, schedule)
    stem = Path(path).stem + "_twill"
    texts = {}
    with tempfile.TemporaryDirectory() as tmp:
        staged = str(Path(tmp) / f"{stem}.py")
        Path(staged).write_text(source, encoding="utf-8")
        func, loop = load_loop(staged, fn, args, machine)
        cuda = lower_cuda(func, {}, machine.name)
        if schedule.warps and schedule.assignment:
            ws_source, ws_cuda, design = _ws_kernel(path, fn, args, plan, schedule, machine, tmp)
            texts = {f"{stem}_ws.py": ws_source, f"{stem}_ws.cu": ws_cuda}
    if (loop.stage, loop.order) != (plan.stage, plan.order):
        raise TwillError(f"the rewritten kernel's loop carries stage {loop.stage}, order {loop.order}, not the plan")
    texts.update({f"{stem}.py": source, f"{stem}.cu": cuda})
    summary = {"kernel": f"{path}:{fn}", "args": args, "ii": schedule.ii, "status": schedule.status,
               "tilelang": plan.to_dict(), "files": sorted([*texts, "schedule.json", "summary.json"])}
    if f"{stem}_ws.py" in texts:
        summary["ws_schedule"] = {"roles": [{"name": n, "warps": [lo, hi], "max_nreg": r}
                                            for n, lo, hi, r, _ in design.roles],
                                  "pipelines": [{"name": n, "depth": d} for n, _, d, _ in design.pipelines]}
    out = Path(directory)

    def make_folder() -> None:
        try:
            make_output_dir(out)        # removed again if a file fails
        except OSError as exc:
            raise TwillError(f"cannot create output directory {str(out)!r}: {exc.strerror}") from None

    texts.update({"schedule.json": json.dumps(schedule_doc, indent=2) + "\n",
                  "summary.json": json.dumps(summary, indent=2) + "\n"})
    write_all([make_folder, *(lambda name=name, text=text: write_text_output(str(out / name), text)
                              for name, text in texts.items())])
    return summary
