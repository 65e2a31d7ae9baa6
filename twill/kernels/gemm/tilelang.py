"""The GEMM as a TileLang 0.1.15 module: ``C = A @ B`` over K blocks, one CTA per output tile.

Warp-specialized form (a schedule with a warp assignment, through the shared
:class:`~twill.codegen.plan.KernelPlan`): ``T.WSSchedule`` with a TMA ``load`` role and one ``compute0`` role
issuing a synchronous ``T.gemm`` (wgmma, waited before it returns) per K block, one ``WSPipeline`` per barrier
pair of the plan. Pipelined form (a schedule without one, ``--no-ws``): ``T.Pipelined(num_stages, stage,
order)``, which TileLang lowers to its non-warp-specialized cp.async pipeline. ``launch(a, b, c=None)``
zero-pads ragged M, N, K to whole tiles, as the Gluon and Pallas modules take them.
"""

from __future__ import annotations

from twill.codegen.plan import KernelPlan, ops_with_role
from twill.codegen.tilelang.render import (TL_DTYPES, Statement, cannot_emit, check_one_stage, compute_stages,
                                           constant_lines, indent, pipelined_annotation, ring_lead,
                                           render_header, render_module, schedule_lines)
from twill.codegen.tilelang.ws import LOOP_ID, ws_design, ws_schedule_source
from twill.ir.graph import LoopGraph
from twill.quote import literal
from twill.schedule.result import Schedule

ALLOC = ("A_s = T.alloc_shared((BLOCK_M, BLOCK_K), DTYPE)",
         "B_s = T.alloc_shared((BLOCK_K, BLOCK_N), DTYPE)",
         'C_l = T.alloc_fragment((BLOCK_M, BLOCK_N), "float32")')

FACTORY = '''
def make_kernel(M, N, K):
    """The TileLang kernel for an [M, K] x [K, N] product (M, N, K whole tiles)."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), DTYPE), B: T.Tensor((K, N), DTYPE), C: T.Tensor((M, N), DTYPE)):
        with T.Kernel(T.ceildiv(N, BLOCK_N), T.ceildiv(M, BLOCK_M), threads=COMPUTE_WARPS * 32) as (bx, by):
{body}

    return gemm


@functools.lru_cache(maxsize=None)
def compiled(M, N, K):
    """The kernel for one shape, compiled by TileLang for the current GPU."""
    return tilelang.compile(make_kernel(M, N, K), target="cuda", pass_configs=PASS_CONFIGS)


def launch(a, b, c=None):
    """c = a @ b for a [M, K], b [K, N] ({dtype}, CUDA); returns c. Ragged M, N, K are zero-padded."""
    import torch

    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: a is {{tuple(a.shape)}}, b is {{tuple(b.shape)}}")
    if a.dtype != torch.{torch_dtype} or b.dtype != torch.{torch_dtype}:
        raise ValueError(f"expected {torch_dtype} operands, got {{a.dtype}} and {{b.dtype}}")
    mp, np_, kp = (-(-x // t) * t for x, t in ((M, BLOCK_M), (N, BLOCK_N), (K, BLOCK_K)))
    a_p = torch.nn.functional.pad(a, (0, kp - K, 0, mp - M)).contiguous()
    b_p = torch.nn.functional.pad(b, (0, np_ - N, 0, kp - K)).contiguous()
    c_p = torch.empty(mp, np_, dtype=a.dtype, device=a.device)
    compiled(mp, np_, kp)(a_p, b_p, c_p)
    if c is None:
        return c_p[:M, :N] if (mp, np_) != (M, N) else c_p
    c.copy_(c_p[:M, :N])
    return c
'''


def _statements(schedule: Schedule, ws: bool) -> list[Statement]:
    """The loop body: one copy per load, one ``T.gemm`` for the ``mma`` (``mma_wait`` has no statement:
    ``T.gemm`` waits for its wgmma)."""
    graph = schedule.graph
    (load_a,), (load_b,), (mma,) = (ops_with_role(graph, r) for r in ("load_a", "load_b", "mma"))

    def ann(op: str) -> str:
        return f", annotations={{T.WSID: {literal(op)}}}" if ws else ""

    return [Statement(load_a, (f"T.copy(A[by * BLOCK_M, k * BLOCK_K], A_s{ann(load_a)})",), 1),
            Statement(load_b, (f"T.copy(B[k * BLOCK_K, bx * BLOCK_N], B_s{ann(load_b)})",), 1),
            Statement(mma, (f"T.gemm(A_s, B_s, C_l{ann(mma)})",), 1)]


def check_wait_lag(schedule: Schedule) -> None:
    """A wgmma left in flight (``mma_wait`` a stage after ``mma``, stages counted from the earliest non-load
    start as in :func:`~twill.codegen.tilelang.render.compute_stages`) is refused with TileLang's reason:
    ``T.wgmma_gemm`` + ``T.wait_wgmma(lag)`` keep it in flight, but its A/B buffer may only be released after the
    wait that retires it, ``lag`` iterations after the buffer's ``consumer_wait``, and a ``WSPipeline``'s wait and
    release must share one stage (MaterializeWSSchedule: "pairs must share one stage"); a release in the wait's
    stage would hand the buffer back to the TMA producer while the wgmma still reads it."""
    (mma,), (wait,) = (ops_with_role(schedule.graph, r) for r in ("mma", "mma_wait"))
    stages = compute_stages(schedule)
    lag = stages[wait] - stages[mma]
    if lag > 0:
        raise cannot_emit(f"wgmma wait lag {lag} (stage(mma_wait) - stage(mma))",
                          "T.wgmma_gemm + T.wait_wgmma would keep the wgmma in flight, but its ring buffer must be "
                          "released after the wait that retires it, a stage after the buffer's consumer_wait, and "
                          "TileLang's WSPipeline wait and release must share one stage")


def _tile(schedule: Schedule) -> dict[str, int]:
    attrs = schedule.graph.attrs
    return {"block_m": int(attrs.get("block_m", 128)), "block_n": int(attrs.get("block_n", 256)),
            "block_k": int(attrs.get("block_k", 64))}


def _tile_constants(tile: dict[str, int], dtype: str) -> list[tuple[str, object, str]]:
    return [("DTYPE", TL_DTYPES[dtype], "operand dtype"), ("BLOCK_M", tile["block_m"], "output tile rows"),
            ("BLOCK_N", tile["block_n"], "output tile columns"),
            ("BLOCK_K", tile["block_k"], "K extent of one pipelined iteration")]


def refuse(graph: LoopGraph) -> None:
    """Every GEMM graph is written (nothing to refuse before the schedule's own checks)."""


def emit_ws(plan: KernelPlan, schedule: Schedule) -> str:
    """The warp-specialized GEMM module for ``plan`` (of ``schedule``)."""
    check_wait_lag(schedule)
    check_one_stage(schedule)
    statements = _statements(schedule, ws=True)
    comp = plan.compute[0]
    mma, wait = comp.roles["mma"], comp.roles["mma_wait"]
    design = ws_design(plan, schedule, {s.op: s for s in statements}, {"a": "A_s", "b": "B_s"}, {wait: mma})
    ws = ws_schedule_source(design, {"load": [LOOP_ID], "compute0": ["clear", LOOP_ID, "store"]})
    loop = [f"for k in T.serial(T.ceildiv(K, BLOCK_K), annotations={{T.WSID: {literal(LOOP_ID)}}}):"]
    loop += ["    " + line for s in statements for line in s.lines]
    body = [*ALLOC, *ws, 'with T.ws_op("clear"):', "    T.clear(C_l)", *loop, 'with T.ws_op("store"):',
            "    T.copy(C_l, C[by * BLOCK_M, bx * BLOCK_N])"]
    constants = constant_lines(_tile_constants(plan.tile, plan.dtype) + [
        ("COMPUTE_WARPS", comp.num_warps, f"warps of compute partition {comp.name} (the T.Kernel threads; the "
                                          f"WSSchedule adds the producer warpgroup)"),
        ("PASS_CONFIGS", {}, "TileLang's defaults: the WSSchedule replaces its automatic warp specialization")])
    decisions = ["decisions (schedule fact -> TileLang):",
                 *(f"  role {name}: warps [{lo}, {hi}), max_nreg {regs} <- {why}"
                   for name, lo, hi, regs, why in design.roles),
                 *(f"  WSPipeline {name} over {', '.join(bufs)}: depth {depth} <- {why}"
                   for name, bufs, depth, why in design.pipelines),
                 f"  {wait} in the stage of {mma} -> synchronous T.gemm; the buffer is released after it"]
    header = render_header("Warp-specialized GEMM for Hopper, TileLang 0.1.15 (T.WSSchedule).",
                           schedule_lines(schedule, plan.tile, plan.dtype) + [""] + decisions, plan)
    factory = FACTORY.format(body=indent(body, 12), dtype=plan.dtype, torch_dtype=TL_DTYPES[plan.dtype])
    return render_module(header, "Generated TileLang GEMM; see the header comment. launch(a, b) -> a @ b.",
                         constants, factory)


def emit_pipelined(schedule: Schedule, dtype: str) -> str:
    """The software-pipelined GEMM module (``T.Pipelined`` with the schedule's stage and order)."""
    check_one_stage(schedule)
    statements = _statements(schedule, ws=False)
    mma = statements[2].op
    lead, why = ring_lead(schedule, [statements[0].op, statements[1].op],
                          {statements[0].op: mma, statements[1].op: mma})
    stage, order = pipelined_annotation(schedule, statements, lead)
    tile = _tile(schedule)
    warps = int(schedule.graph.attrs.get("warps", 4))
    loop = ["for k in T.Pipelined(T.ceildiv(K, BLOCK_K), num_stages=NUM_STAGES, stage=STAGE, order=ORDER):"]
    loop += ["    " + line for s in statements for line in s.lines]
    body = [*ALLOC, "T.clear(C_l)", *loop, "T.copy(C_l, C[by * BLOCK_M, bx * BLOCK_N])"]
    ops = ", ".join(s.op for s in statements)
    constants = constant_lines(_tile_constants(tile, dtype) + [
        ("COMPUTE_WARPS", warps, "wgmma warps of the kernel graph (no warp specialization)"),
        ("NUM_STAGES", lead, f"shared-memory versions in flight = ring depth: {why}"),
        ("STAGE", stage, f"stage = floor(t / II) of {ops}, loads NUM_STAGES ahead of their reader, after it in ORDER"),
        ("ORDER", order, f"order = rank of t mod II of {ops}"),
        ("PASS_CONFIGS", {"tl.disable_warp_specialized": True},
         "the schedule has no warp assignment: no automatic producer/consumer split")])
    decisions = ["decisions (schedule fact -> TileLang): modulo schedule without warp assignment -> "
                 "T.Pipelined(num_stages, stage, order), warp specialization off; synchronous T.gemm (wait lag 0)"]
    header = render_header("Software-pipelined GEMM for Hopper, TileLang 0.1.15 (T.Pipelined).",
                           schedule_lines(schedule, tile, dtype) + [""] + decisions, None)
    factory = FACTORY.format(body=indent(body, 12), dtype=dtype, torch_dtype=TL_DTYPES[dtype])
    return render_module(header, "Generated TileLang GEMM; see the header comment. launch(a, b) -> a @ b.",
                         constants, factory)
