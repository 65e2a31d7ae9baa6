"""Twill as TileLang's pipeline planner: a schedule of a TileLang kernel's ``T.Pipelined`` loop (the graph of
:mod:`twill.frontends.tilelang`) -> the ``num_stages``, ``stage=[...]`` and ``order=[...]`` TileLang takes,
the warp roles of a warp-specialized schedule, and the report lines that show them.

Mapping (as for the emitted kernels, :func:`~twill.codegen.tilelang.render.pipelined_annotation`): every
statement takes its op's stage and the rank of its ``t mod II``; a streaming load runs ``num_stages`` stages
ahead of its reader and after it in the body, so TileLang keeps ``num_stages`` versions of its buffer
(``num_stages`` = the ring depth: the loop's own ``num_stages`` unless the schedule needs more). The rewritten
loop gives ``stage`` and ``order`` without ``num_stages``: given ``num_stages``, TileLang 0.1.15's automatic
producer/consumer warp specialization takes the loop on Hopper and lowers it exactly as its own plan, stage
and order ignored (verified: identical CUDA), while without it TileLang runs the planned software pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twill.codegen.tilelang.render import Statement, check_one_stage, pipelined_annotation, ring_lead
from twill.schedule.result import Schedule


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


def format_plan(plan: PipelinePlan, schedule: Schedule) -> str:
    """The report section: the annotation, then one row per statement (op, kind, stage, order, warp group)."""
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
        lines += ["", "  warp roles (a T.WSSchedule would take them; T.Pipelined keeps TileLang's own):"]
        lines += [f"  {g} {role:8s} {w} warps, {regs} regs: {', '.join(ops)}" for g, role, w, regs, ops in plan.roles]
    return "\n".join(lines)


def rewritten_kernel(path: str, fn: str, plan: PipelinePlan, schedule: Schedule) -> str:
    """The source of ``path`` with ``fn``'s ``T.Pipelined`` taking Twill's plan, a comment naming the schedule."""
    from twill.frontends.tilelang import rewrite_source

    note = (f"stage/order: Twill schedule ({schedule.solver}, {schedule.status}, II {schedule.ii}) of ops\n"
            f"{', '.join(plan.ops)};\nloads {plan.num_stages} stages ahead of their reader and after it: "
            f"{plan.num_stages} buffer versions (no num_stages:\nwith it TileLang's automatic warp specialization "
            f"ignores stage and order)")
    return rewrite_source(path, fn, list(plan.stage), list(plan.order), note)


def inject_tilelang(path: str, fn: str, args: list[str], schedule: Schedule, machine: Any,
                    directory: str, schedule_doc: dict[str, Any]) -> dict[str, Any]:
    """Rewrite kernel ``path:fn`` with the plan of ``schedule``, lower the rewritten kernel to CUDA (no GPU),
    check that its loop carries the plan, and write ``<file>_twill.py``, ``<file>_twill.cu``,
    ``schedule.json`` and ``summary.json`` into ``directory`` (all or none). Returns the summary."""
    import json
    import tempfile
    from pathlib import Path

    from twill.codegen.tilelang.lower import lower_cuda
    from twill.commands.common import write_all, write_text_output
    from twill.errors import TwillError
    from twill.frontends.tilelang import load_loop

    plan = pipeline_plan(schedule)
    source = rewritten_kernel(path, fn, plan, schedule)
    stem = Path(path).stem + "_twill"
    with tempfile.TemporaryDirectory() as tmp:
        staged = str(Path(tmp) / f"{stem}.py")
        Path(staged).write_text(source, encoding="utf-8")
        func, loop = load_loop(staged, fn, args, machine)
        cuda = lower_cuda(func, {}, machine.name)
    if (loop.stage, loop.order) != (plan.stage, plan.order):
        raise TwillError(f"the rewritten kernel's loop carries stage {loop.stage}, order {loop.order}, not the plan")
    summary = {"kernel": f"{path}:{fn}", "args": args, "ii": schedule.ii, "status": schedule.status,
               "tilelang": plan.to_dict(), "files": sorted([f"{stem}.py", f"{stem}.cu", "schedule.json",
                                                            "summary.json"])}
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TwillError(f"cannot create output directory {str(out)!r}: {exc.strerror}") from None
    texts = {f"{stem}.py": source, f"{stem}.cu": cuda, "schedule.json": json.dumps(schedule_doc, indent=2) + "\n",
             "summary.json": json.dumps(summary, indent=2) + "\n"}
    write_all([lambda name=name, text=text: write_text_output(str(out / name), text) for name, text in texts.items()])
    return summary
