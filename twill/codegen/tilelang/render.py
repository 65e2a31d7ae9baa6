"""What every emitted TileLang module shares: the statements of each op, the two forms a schedule takes in
TileLang (warp-specialized ``T.WSSchedule`` or software-pipelined ``T.Pipelined(stage=..., order=...)``), the
"cannot emit" checks, the header and the module text.

TileLang 0.1.15 has no latency or II: a ``T.Pipelined`` loop takes, per effectful statement of its body, a
stage (iteration offset) and an order (emission rank in the steady-state body); a ``T.WSSchedule`` takes roles
(warp ranges with ``setmaxnreg`` budgets), ``WSPipeline`` rings (full/empty mbarriers over multi-versioned
shared buffers, ``depth`` buffers) and, per role, the op order with each pipeline's acquire/commit or
wait/release at a stage. The mapping from a Twill schedule (docs/codegen.md, "TileLang"):

* ``stage = floor(t / II)``, ``order = rank of t mod II`` (ties in dependence order);
* ring depth -> ``num_stages`` / ``WSPipeline(depth)``;
* warp groups -> ``WSRole`` warp ranges, their register budgets -> ``max_nreg``.
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.codegen.chart import render_chart
from twill.codegen.plan import KernelPlan, quoted_plan, ring_depth
from twill.errors import UnsupportedFeatureError
from twill.quote import printable
from twill.schedule.result import Schedule
from twill.schedule.stages import op_places

#: TileLang dtype of each plan dtype (torch names them alike: ``torch.float16``, ``torch.bfloat16``).
TL_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
#: Warps of the producer warpgroup: the TMA role runs on its first warp; ``setmaxnreg`` acts on whole
#: warpgroups, so the compute roles start at warp 4.
PRODUCER_WARPGROUP = 4

IMPORTS = """\
import functools

import tilelang
import tilelang.language as T
"""


def cannot_emit(what: str, why: str) -> UnsupportedFeatureError:
    """``cannot emit tilelang: <what> (<why>)``: a schedule decision TileLang 0.1.15 cannot express."""
    return UnsupportedFeatureError(f"cannot emit tilelang: {what} ({why})")


@dataclass(frozen=True)
class Statement:
    """One op of the loop body as TileLang statements.

    Attributes:
        op: the schedule's op.
        lines: source lines of the statements (unindented); the first is annotated with the op's ws id in the
            warp-specialized form.
        count: effectful statements among ``lines`` (entries of ``stage``/``order`` in the pipelined form).
    """

    op: str
    lines: tuple[str, ...]
    count: int


def residue_order(schedule: Schedule, ops: list[str]) -> dict[str, int]:
    """``order = rank of t mod II`` of each op of ``ops`` (ties in ``ops`` order, a dependence order)."""
    ranked = sorted(ops, key=lambda n: (schedule.residue(n), ops.index(n)))
    return {n: ranked.index(n) for n in ops}


def pipelined_annotation(schedule: Schedule, statements: list[Statement],
                         load_lead: int) -> tuple[list[int], list[int]]:
    """``T.Pipelined``'s ``stage=[...]`` and ``order=[...]`` for the effectful statements in source order.

    Each statement takes its op's (stage, cluster) as Twill injects them into Triton
    (:func:`twill.schedule.stages.op_places`: ``stage = floor(t / II)``, cluster = rank of ``t mod II``, a
    streaming load ``load_lead`` stages ahead of its first consumer, in a last cluster of its own); orders
    rank the statements by (cluster, source order)."""
    places = op_places(schedule, load_lead)
    keys = [(places[s.op][1], i, j) for i, s in enumerate(statements) for j in range(s.count)]
    ranked = sorted(keys)
    stages = [places[s.op][0] for s in statements for _ in range(s.count)]
    return stages, [ranked.index(k) for k in keys]


def compute_stages(schedule: Schedule) -> dict[str, int]:
    """Every op's stage after shifting all times by the earliest start of a non-load op (a translation keeps
    a modulo schedule valid; :func:`twill.schedule.stages.op_places` shifts the same way)."""
    graph = schedule.graph
    base = min((schedule.start(n) for n in graph.op_names if not graph.op(n).variable_latency), default=0)
    return {n: (schedule.start(n) - base) // schedule.ii for n in graph.op_names}


def check_one_stage(schedule: Schedule) -> None:
    """Every op but the TMA loads in one stage (after the shift of :func:`compute_stages`): TileLang's
    ``T.gemm`` is synchronous (the wgmma wait in the MMA's stage) and TileLang multi-versions shared buffers
    (ring buffers), not the fragments that carry values between the compute ops. ``twill emit tilelang`` solves
    under this constraint (:func:`twill.integrations.tilelang.planner.solve_for_tilelang`, the same window as
    Triton's sm_90 pipeliner)."""
    graph = schedule.graph
    stages = compute_stages(schedule)
    compute = [n for n in graph.op_names if not graph.op(n).variable_latency]
    late = [n for n in compute if stages[n] != stages[compute[0]]]
    if late:
        first, other = compute[0], late[0]
        raise cannot_emit(f"{other!r} in stage {stages[other]} and {first!r} in stage {stages[first]}",
                          "TileLang's T.gemm waits for its wgmma and only shared buffers are multi-versioned, "
                          "so every op but the TMA loads must share one stage; solve with 'twill emit tilelang' "
                          "(it asks for that) or give such a schedule")


def ring_lead(schedule: Schedule, loads: list[str], readers: dict[str, str]) -> tuple[int, str]:
    """Load lead of the pipelined form = the deepest ring (``ring_depth`` of each load up to its last reader),
    with its derivation. A load ``depth`` stages ahead of its reader and ordered after it in the body refills a
    buffer after it was read, so TileLang keeps ``depth`` versions of the buffer: the ring of the schedule."""
    return max((ring_depth(schedule, load, readers[load]) for load in loads), key=lambda d: d[0])


def render_header(title: str, lines: list[str], plan: KernelPlan | None) -> str:
    """The header comment: title, provenance, the caller's lines and, for a plan, the steady-state chart; every
    line through :func:`~twill.quote.printable` (the lines name ops, the graph, the solver)."""
    out = [title, "", "GENERATED by `twill emit tilelang` from a Twill schedule -- do not edit by hand.", "",
           *lines]
    if plan is not None:
        out += ["", "steady-state chart (digit = stage; cycles scaled onto [0, II)):"]
        out += ["  " + line for line in render_chart(quoted_plan(plan))]
    return "\n".join(("# " + printable(line)).rstrip() for line in out) + "\n"


def schedule_lines(schedule: Schedule, tile: dict[str, int], dtype: str) -> list[str]:
    """The schedule's identity, II, length, stages, tile and each op's start, stage and order."""
    tiles = " ".join(f"{k}={v}" for k, v in tile.items())
    ops = list(schedule.graph.op_names)
    order = residue_order(schedule, ops)
    stage = compute_stages(schedule)
    lines = [f"schedule: graph {schedule.graph.name!r}, arch {schedule.arch}, solver {schedule.solver}, "
             f"status {schedule.status}",
             f"II = {schedule.ii} (lower bound {schedule.ii_lower_bound}), length L = {schedule.length}, "
             f"stages = {schedule.num_stages}, dtype {dtype}, tile {tiles}",
             "ops (start t; stage = floor(t / II) with times shifted by the earliest non-load start; order = rank "
             "of t mod II):"]
    lines += [f"  {n:10s} t={schedule.start(n):<6d} stage {stage[n]}  order {order[n]}" for n in ops]
    return lines


def constant_lines(items: list[tuple[str, object, str]]) -> str:
    """``NAME = value  # why`` lines (``why`` through :func:`~twill.quote.printable`)."""
    width = max(len(n) for n, _, _ in items)
    return "\n".join(f"{name:<{width}s} = {value!r}  # {printable(why)}" for name, value, why in items) + "\n"


def indent(lines: list[str] | tuple[str, ...], spaces: int) -> str:
    """``lines`` joined, each indented by ``spaces``."""
    pad = " " * spaces
    return "\n".join(pad + line if line else line for line in lines)


def render_module(header: str, summary: str, constants: str, body: str) -> str:
    """The complete module: header, docstring, imports, constants, kernel factory and launcher."""
    parts = [header, f'"""{summary}"""\n', IMPORTS, constants]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n\n\n" + body.strip("\n") + "\n"
