"""Attention forward as a TileLang 0.1.15 module: one CTA per (query block, head, batch), an online-softmax
loop over the key blocks.

Warp-specialized form (through the shared :class:`~twill.codegen.plan.KernelPlan`): ``T.WSSchedule`` with a
TMA ``load`` role streaming K and V into one ``WSPipeline`` each, and one ``compute0`` role running
``S = Q K^T``, the softmax and ``O += P V`` with synchronous ``T.gemm``. Pipelined form (no warp assignment):
``T.Pipelined(num_stages, stage, order)``. Either way every op of the compute warps runs in one stage: TileLang
multi-versions the K/V buffers, not the S/P/m/l fragments. ``launch(q, k, v, sm_scale=None, out=None)`` takes
``[B, H, S, D]`` tensors (non-causal, S a multiple of the blocks), as the Gluon module does.
"""

from __future__ import annotations

from twill.codegen.plan import KernelPlan, ops_with_role
from twill.codegen.tilelang.render import (TL_DTYPES, Statement, cannot_emit, check_one_stage,
                                           constant_lines, indent, pipelined_annotation, render_header,
                                           render_module, ring_lead, schedule_lines)
from twill.codegen.tilelang.ws import LOOP_ID, ws_design, ws_schedule_source
from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.quote import literal
from twill.schedule.result import Schedule

#: Statements of each role of the attention graph, in the order the loop body lists them.
ROLE_LINES = {
    "load_k": ("T.copy(K[bz, by, k * BLOCK_N:(k + 1) * BLOCK_N, :], K_s)",),
    "qk": ("T.clear(S_l)", "T.gemm(Q_s, K_s, S_l, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)"),
    "rowmax": ("T.copy(m_l, m_prev)", "T.reduce_max(S_l, m_l, dim=1, clear=False)"),
    "alpha": ("for i in T.Parallel(BLOCK_M):", "    alpha_l[i] = T.exp2((m_prev[i] - m_l[i]) * qk_scale)"),
    "exp": ("for i, j in T.Parallel(BLOCK_M, BLOCK_N):",
            "    S_l[i, j] = T.exp2(S_l[i, j] * qk_scale - m_l[i] * qk_scale)", "T.copy(S_l, P_l)"),
    "rowsum": ("T.reduce_sum(S_l, sum_l, dim=1)", "for i in T.Parallel(BLOCK_M):",
               "    l_l[i] = l_l[i] * alpha_l[i] + sum_l[i]"),
    "rescale": ("for i, j in T.Parallel(BLOCK_M, HEAD_DIM):", "    O_l[i, j] *= alpha_l[i]"),
    "load_v": ("T.copy(V[bz, by, k * BLOCK_N:(k + 1) * BLOCK_N, :], V_s)",),
    "pv": ("T.gemm(P_l, V_s, O_l, policy=T.GemmWarpPolicy.FullRow)",),
}
#: Effectful statements of each role (a ``T.Parallel`` loop is one).
ROLE_COUNTS = {"load_k": 1, "qk": 2, "rowmax": 2, "alpha": 1, "exp": 2, "rowsum": 2, "rescale": 1, "load_v": 1,
               "pv": 1}

ALLOC = ("Q_s = T.alloc_shared((BLOCK_M, HEAD_DIM), DTYPE)",
         "K_s = T.alloc_shared((BLOCK_N, HEAD_DIM), DTYPE)",
         "V_s = T.alloc_shared((BLOCK_N, HEAD_DIM), DTYPE)",
         'S_l = T.alloc_fragment((BLOCK_M, BLOCK_N), "float32")',
         "P_l = T.alloc_fragment((BLOCK_M, BLOCK_N), DTYPE)",
         'O_l = T.alloc_fragment((BLOCK_M, HEAD_DIM), "float32")',
         *(f'{name} = T.alloc_fragment((BLOCK_M,), "float32")'
           for name in ("m_l", "m_prev", "alpha_l", "sum_l", "l_l")))
LOAD_Q = ("T.copy(Q[bz, by, bx * BLOCK_M:(bx + 1) * BLOCK_M, :], Q_s)",)
INIT = ("T.fill(O_l, 0)", "T.fill(l_l, 0)", "T.fill(m_l, -T.infinity(\"float32\"))")
EPILOGUE = ("for i, j in T.Parallel(BLOCK_M, HEAD_DIM):", "    O_l[i, j] /= l_l[i]",
            "T.copy(O_l, Out[bz, by, bx * BLOCK_M:(bx + 1) * BLOCK_M, :])")

FACTORY = '''
def make_kernel(batch, heads, seq_len, sm_scale):
    """The TileLang kernel for q, k, v, out [batch, heads, seq_len, HEAD_DIM] (seq_len whole blocks)."""
    shape = (batch, heads, seq_len, HEAD_DIM)
    qk_scale = sm_scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the softmax runs in base 2

    @T.prim_func
    def attention(Q: T.Tensor(shape, DTYPE), K: T.Tensor(shape, DTYPE), V: T.Tensor(shape, DTYPE),
                  Out: T.Tensor(shape, DTYPE)):
        with T.Kernel(T.ceildiv(seq_len, BLOCK_M), heads, batch, threads=COMPUTE_WARPS * 32) as (bx, by, bz):
{body}

    return attention


@functools.lru_cache(maxsize=None)
def compiled(batch, heads, seq_len, sm_scale):
    """The kernel for one shape and scale, compiled by TileLang for the current GPU."""
    return tilelang.compile(make_kernel(batch, heads, seq_len, sm_scale), target="cuda",
                            pass_configs=PASS_CONFIGS)


def launch(q, k, v, sm_scale=None, out=None):
    """softmax(q k^T * sm_scale) v for q, k, v [B, H, S, D] ({dtype}, CUDA, non-causal); sm_scale defaults to
    1/sqrt(D); S must be a multiple of BLOCK_M and BLOCK_N. Returns out."""
    import math

    import torch

    B, H, S, D = q.shape
    if D != HEAD_DIM or q.dtype != torch.{torch_dtype} or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of shape [B, H, S, {{HEAD_DIM}}] and dtype {torch_dtype}, got "
                         f"{{tuple(q.shape)}} {{q.dtype}}")
    if S % BLOCK_M or S % BLOCK_N:
        raise ValueError(f"sequence length {{S}} is not a multiple of BLOCK_M={{BLOCK_M}} and BLOCK_N={{BLOCK_N}}")
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    if out is None:
        out = torch.empty_like(q)
    compiled(B, H, S, sm_scale)(q.contiguous(), k.contiguous(), v.contiguous(), out)
    return out
'''


def _statements(schedule: Schedule) -> list[Statement]:
    graph = schedule.graph
    out = []
    for role in ROLE_LINES:
        ops = ops_with_role(graph, role)
        if len(ops) != 1:
            raise cannot_emit(f"attention graph with {len(ops)} {role} ops", "one sub-tile per CTA: a "
                              "WSSchedule has no barrier between consumer roles for the tensor-core turns")
        out.append(Statement(ops[0], ROLE_LINES[role], ROLE_COUNTS[role]))
    return out


def _tile(schedule: Schedule) -> dict[str, int]:
    attrs = schedule.graph.attrs
    return {"block_m": int(attrs.get("block_m", 128)), "block_n": int(attrs.get("block_n", 128)),
            "head_dim": int(attrs.get("head_dim", 128))}


def _constants(tile: dict[str, int], dtype: str, warps: int, warps_why: str) -> list[tuple[str, object, str]]:
    return [("DTYPE", TL_DTYPES[dtype], "Q/K/V dtype"), ("BLOCK_M", tile["block_m"], "query rows per CTA"),
            ("BLOCK_N", tile["block_n"], "keys per iteration"), ("HEAD_DIM", tile["head_dim"], "head dimension"),
            ("COMPUTE_WARPS", warps, warps_why)]


def refuse(graph: LoopGraph) -> None:
    """Refuse the attention variants this body does not write: it writes the non-causal forward pass with one
    K/V head per query head."""
    if graph.attrs.get("causal") or graph.attrs.get("kv_heads") or graph.attrs.get("varlen"):
        raise UnsupportedFeatureError("cannot emit tilelang: causal, grouped-K/V or varlen attention (the TileLang "
                                      "renderer writes the non-causal, one-K/V-head-per-head forward pass)")


def emit_ws(plan: KernelPlan, schedule: Schedule) -> str:
    """The warp-specialized attention module for ``plan`` (of ``schedule``)."""
    statements = _statements(schedule)
    check_one_stage(schedule)
    design = ws_design(plan, schedule, {s.op: s for s in statements}, {"k": "K_s", "v": "V_s"}, {})
    ws = ws_schedule_source(design, {"load": [LOOP_ID], "compute0": ["load_q", "init", LOOP_ID, "epilogue"]})
    loop = [f"for k in T.serial(T.ceildiv(seq_len, BLOCK_N), annotations={{T.WSID: {literal(LOOP_ID)}}}):"]
    for s in statements:
        loop += [f"    with T.ws_op({literal(s.op)}):", *("        " + line for line in s.lines)]
    body = [*ALLOC, *ws, 'with T.ws_op("load_q"):', *("    " + x for x in LOAD_Q), 'with T.ws_op("init"):',
            *("    " + x for x in INIT), *loop, 'with T.ws_op("epilogue"):', *("    " + x for x in EPILOGUE)]
    comp = plan.compute[0]
    constants = constant_lines(_constants(plan.tile, plan.dtype, comp.num_warps,
                                          f"warps of compute partition {comp.name} (the T.Kernel threads; the "
                                          f"WSSchedule adds the producer warpgroup)") +
                               [("PASS_CONFIGS", {}, "TileLang's defaults: the WSSchedule replaces its automatic "
                                                     "warp specialization")])
    decisions = ["decisions (schedule fact -> TileLang):",
                 *(f"  role {name}: warps [{lo}, {hi}), max_nreg {regs} <- {why}"
                   for name, lo, hi, regs, why in design.roles),
                 *(f"  WSPipeline {name} over {', '.join(bufs)}: depth {depth} <- {why}"
                   for name, bufs, depth, why in design.pipelines),
                 "  compute ops in one stage: stage(pv) - stage(qk) = 0, synchronous T.gemm; the loop body lists "
                 "them in steady-state order"]
    header = render_header("Warp-specialized attention forward for Hopper, TileLang 0.1.15 (T.WSSchedule).",
                           schedule_lines(schedule, plan.tile, plan.dtype) + [""] + decisions, plan)
    return _module(header, constants, body, plan.dtype)


def _module(header: str, constants: str, body: list[str], dtype: str) -> str:
    factory = FACTORY.format(body=indent(body, 12), dtype=dtype, torch_dtype=TL_DTYPES[dtype])
    return render_module(header, "Generated TileLang attention forward; see the header comment. "
                                 "launch(q, k, v) -> softmax(q k^T / sqrt(D)) v.", constants, factory)


def emit_pipelined(schedule: Schedule, dtype: str) -> str:
    """The software-pipelined attention module (``T.Pipelined`` with the schedule's stage and order)."""
    check_one_stage(schedule)
    statements = _statements(schedule)
    graph = schedule.graph
    by_role = {graph.op(s.op).attrs["role"]: s.op for s in statements}
    loads = [by_role["load_k"], by_role["load_v"]]
    lead, why = ring_lead(schedule, loads, {by_role["load_k"]: by_role["qk"], by_role["load_v"]: by_role["pv"]})
    stage, order = pipelined_annotation(schedule, statements, lead)
    tile = _tile(schedule)
    warps = max(op.warps for op in graph.ops if op.kind == "mma")
    loop = ["for k in T.Pipelined(T.ceildiv(seq_len, BLOCK_N), num_stages=NUM_STAGES, stage=STAGE, order=ORDER):"]
    loop += ["    " + line for s in statements for line in s.lines]
    body = [*ALLOC, *LOAD_Q, *INIT, *loop, *EPILOGUE]
    ops = ", ".join(f"{s.op} x{s.count}" if s.count > 1 else s.op for s in statements)
    constants = constant_lines(_constants(tile, dtype, warps, "wgmma warps of the kernel graph (no warp "
                                                              "specialization)") + [
        ("NUM_STAGES", lead, f"K/V versions in flight = ring depth: {why}"),
        ("STAGE", stage, f"stage = floor(t / II) of {ops}; loads NUM_STAGES ahead of their reader"),
        ("ORDER", order, "order = rank of t mod II (loads after their reader)"),
        ("PASS_CONFIGS", {"tl.disable_warp_specialized": True},
         "the schedule has no warp assignment: no automatic producer/consumer split")])
    decisions = ["decisions (schedule fact -> TileLang): modulo schedule without warp assignment -> "
                 "T.Pipelined(num_stages, stage, order), warp specialization off; compute ops in one stage"]
    header = render_header("Software-pipelined attention forward for Hopper, TileLang 0.1.15 (T.Pipelined).",
                           schedule_lines(schedule, tile, dtype) + [""] + decisions, None)
    return _module(header, constants, body, dtype)
