"""The warp-specialized form: a :class:`~twill.codegen.plan.KernelPlan` as a TileLang ``T.WSSchedule``
(``MaterializeWSSchedule``, level 3 of TileLang's warp specialization).

* the load partition -> role ``load`` on the first warp(s) of warpgroup 0, ``max_nreg`` = its budget;
* the compute partition -> role ``compute0`` on the warps from 4 on, ``max_nreg`` = its budget;
* each ready/empty barrier pair of the plan -> one ``WSPipeline`` over its rings' shared buffers, ``depth`` =
  the ring depth; the producer acquires and commits around its loads, the consumer waits before the first
  reader of a buffer and releases after the op that releases it;
* consumer sync stages = the schedule's stages (relative within the role; TileLang runs an op at the stage of
  the spans that cover it, else at the role's first stage, so every op's stage is checked against that rule);
  the producer's at 0 (it runs ahead by up to the ring depth).
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.codegen.plan import Barrier, KernelPlan
from twill.codegen.tilelang.render import PRODUCER_WARPGROUP, Statement, cannot_emit, compute_stages
from twill.quote import identifier, literal, printable
from twill.schedule.result import Schedule

#: ws id of the pipelined loop.
LOOP_ID = "k_loop"


@dataclass(frozen=True)
class WSDesign:
    """The ``T.WSSchedule`` of a plan.

    Attributes:
        num_warps: warps of the kernel (the producer warpgroup plus the compute warps).
        roles: ``(name, warps_lo, warps_hi, max_nreg, why)``.
        pipelines: ``(name, buffers, depth, why)``.
        loop_bodies: role -> entries of the loop scope: op ids (written as string literals) and :class:`Sync`
            entries.
    """

    num_warps: int
    roles: tuple[tuple[str, int, int, int, str], ...]
    pipelines: tuple[tuple[str, tuple[str, ...], int, str], ...]
    loop_bodies: dict[str, tuple[str | Sync, ...]]


@dataclass(frozen=True)
class Sync:
    """A ``T.WSSync.<kind>("<pipeline>", stage=<stage>)`` entry of a role's op list (``kind``:
    ``producer_acquire``, ``producer_commit``, ``consumer_wait`` or ``consumer_release``)."""

    kind: str
    pipeline: str
    stage: int

    @property
    def source(self) -> str:
        """The entry as TileLang source (the pipeline's name a string literal)."""
        return f"T.WSSync.{self.kind}({literal(self.pipeline)}, stage={self.stage})"


def _sync(kind: str, pipeline: str, stage: int) -> Sync:
    return Sync(kind, pipeline, stage)


def _barrier_stage(stage_of: dict[str, int], ops: list[str], what: str) -> int:
    stages = {stage_of[n] for n in ops}
    if len(stages) != 1:
        raise cannot_emit(f"{what} {', '.join(ops)} in stages {sorted(stages)}",
                          "a WSPipeline's acquire/commit and wait/release pair up at one stage")
    return stages.pop()


def _load_body(plan: KernelPlan, barriers: list[Barrier]) -> tuple[str, ...]:
    """Each barrier's loads between its acquire and commit, all at stage 0: the producer runs ahead of the
    consumer by up to the ring depth, which (not the loads' stages) is what the schedule fixes for them."""
    ring = {r.name: r for r in plan.rings}
    body: list[str] = []
    for b in barriers:
        loads = [ring[name].producer for name in b.rings]
        body += [_sync("producer_acquire", b.name, 0), *loads, _sync("producer_commit", b.name, 0)]
    return tuple(body)


def _compute_body(plan: KernelPlan, statements: dict[str, Statement], retired_by: dict[str, str],
                  stage_of: dict[str, int]) -> tuple[str, ...]:
    """Compute ops in steady-state order with each barrier's wait before its first reader and its release
    after its release op (an op without statements, e.g. ``mma_wait`` of a synchronous ``T.gemm``, releases
    after the op it waits for: ``retired_by``)."""
    ring = {r.name: r for r in plan.rings}
    ops = [n for n in plan.compute[0].ops if n in statements]
    body: list[str | Sync] = []
    waits: dict[str, list[Sync]] = {}
    releases: dict[str, list[Sync]] = {}
    for b in plan.barriers:
        readers = [c for name in b.rings for c in ring[name].consumers]
        first = min(readers, key=ops.index)
        release = retired_by.get(ring[b.rings[0]].release, ring[b.rings[0]].release)
        stage = _barrier_stage(stage_of, sorted({first, release}), f"readers of ring {b.name}")
        waits.setdefault(first, []).append(_sync("consumer_wait", b.name, stage))
        releases.setdefault(release, []).append(_sync("consumer_release", b.name, stage))
    for n in ops:
        body += waits.get(n, []) + [n] + releases.get(n, [])
    _check_op_stages(body, stage_of)
    return tuple(body)


def _check_op_stages(body: list[str | Sync], stage_of: dict[str, int]) -> None:
    """TileLang runs an op at the stage of the open spans that cover it, else at the role's first sync stage;
    that must be the schedule's stage of the op."""
    first = min(e.stage for e in body if isinstance(e, Sync))
    open_spans: dict[str, int] = {}
    for entry in body:
        if isinstance(entry, Sync):
            if entry.kind == "consumer_wait":
                open_spans[entry.pipeline] = entry.stage
            else:
                open_spans.pop(entry.pipeline, None)
            continue
        runs_at = next(iter(open_spans.values()), first)
        if runs_at != stage_of[entry]:
            raise cannot_emit(f"op {entry!r} in stage {stage_of[entry]} outside a pipeline span of that stage",
                              f"TileLang would run it at stage {runs_at}")


def _role_stages(stages: dict[str, int], ops: tuple[str, ...]) -> dict[str, int]:
    """Stages of a role's ops counted from the role's first (TileLang's stages are relative within a role)."""
    low = min(stages[n] for n in ops)
    return {n: stages[n] - low for n in ops}


def ws_design(plan: KernelPlan, schedule: Schedule, statements: dict[str, Statement], buffers: dict[str, str],
              retired_by: dict[str, str]) -> WSDesign:
    """The ``T.WSSchedule`` of ``plan`` (of ``schedule``); ``buffers`` maps each ring to its shared buffer,
    ``retired_by`` an op without statements to the op whose statement retires it."""
    comp, load = plan.compute[0], plan.load
    if load.num_warps > PRODUCER_WARPGROUP:
        raise cannot_emit(f"a {load.num_warps}-warp load partition", "the producer role lives in warpgroup 0")
    roles = (("load", 0, load.num_warps, load.regs,
              f"load partition (warp group {load.group}, {load.num_warps} warp): TMA producer, budget "
              f"{load.regs}"),
             ("compute0", PRODUCER_WARPGROUP, PRODUCER_WARPGROUP + comp.num_warps, comp.regs,
              f"compute partition (warp group {comp.group}, {comp.num_warps} warps), budget {comp.regs}"))
    ring = {r.name: r for r in plan.rings}
    pipelines = tuple((b.name, tuple(buffers[r] for r in b.rings), b.depth,
                       f"ring(s) {', '.join(b.rings)}: depth = {ring[b.rings[0]].why}") for b in plan.barriers)
    order = {n: i for i, n in enumerate(load.ops)}
    barriers = sorted(plan.barriers, key=lambda b: min(order[ring[r].producer] for r in b.rings))
    stages = compute_stages(schedule)
    bodies = {"load": _load_body(plan, barriers),
              "compute0": _compute_body(plan, statements, retired_by, _role_stages(stages, comp.ops))}
    return WSDesign(PRODUCER_WARPGROUP + comp.num_warps, roles, pipelines, bodies)


def ws_schedule_source(design: WSDesign, root: dict[str, list[str]]) -> list[str]:
    """``T.annotate_ws_schedule(T.WSSchedule(...))`` lines; ``root`` gives each role's root-scope entries
    (``LOOP_ID`` for the loop). Names are string literals (:func:`~twill.quote.literal`), buffers
    identifiers (:func:`~twill.quote.identifier`), the reasons comments."""
    lines = ["T.annotate_ws_schedule(T.WSSchedule(",
             f"    num_warps={design.num_warps},  # producer warpgroup + compute warps",
             "    roles=["]
    for name, lo, hi, regs, why in design.roles:
        lines.append(f"        T.WSRole({literal(name)}, warps_lo={lo}, warps_hi={hi}, max_nreg={regs}),  "
                     f"# {printable(why)}")
    lines += ["    ],", "    pipelines=["]
    for name, bufs, depth, why in design.pipelines:
        buffers = ", ".join(identifier(b, "shared buffer") for b in bufs)
        lines.append(f"        T.WSPipeline({literal(name)}, [{buffers}], depth={depth}),  # {printable(why)}")
    lines += ["    ],", "    scopes=[", f"        T.WSScope({literal(LOOP_ID)}, {{"]
    for role, body in design.loop_bodies.items():
        entries = ", ".join(e.source if isinstance(e, Sync) else literal(e) for e in body)
        lines.append(f"            {literal(role)}: [{entries}],")
    lines += ["        }),", "        T.WSScope(T.WSScope.ROOT, {"]
    for role, names in root.items():
        entries = ", ".join(literal(e, quote="'") for e in names)
        lines.append(f"            {literal(role)}: [{entries}],")
    lines += ["        }),", "    ],", "))"]
    return lines
