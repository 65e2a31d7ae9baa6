"""A TileLang ``T.Pipelined`` loop as a Twill loop graph: one op per effectful statement of its body.

TileLang's ``stage=[...]`` / ``order=[...]`` annotate the effectful statements of the body in source order
(tile ops and ``T.Parallel`` loops; scalar binds are not counted), so each becomes one op:

* ``T.copy`` global -> shared: a streaming TMA load (``tma_load``) of the destination tile's bytes;
* ``T.gemm``: a tensor-core op (``mma``) of its M x N x K on the kernel's warps (at most 8), synchronous;
* ``T.reduce_*``: a row reduction (``reduce``);
* a ``T.Parallel`` loop: MUFU ``exp2`` when it calls ``exp``/``exp2``, else ALU (``alu``), over its elements;
* other copies and fills: ALU over the tile's elements.

Registers: a fragment (``T.alloc_fragment``) is one allocation that every writer updates in place, so its
bytes per thread count once, on its first writer in the body.

Edges come from the buffers each statement reads and writes: read-after-write (delay = the writer's latency;
0 from a streaming load, whose buffer is ready when the reader waits for it), loop-carried when the reader comes
first in the body (distance 1), and write-after-read / write-after-write ordering (delay 0) for buffers that are
not multi-versioned (everything but the shared tiles the loads fill). Costs come from :mod:`twill.machine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from twill.errors import UnsupportedFeatureError
from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.machine import costs
from twill.machine.models import Machine

#: TileLang dtype -> the machine model's dtype names.
DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3": "fp8", "float8_e5m2": "fp8",
          "int8": "i8"}
#: Annotations that mark a ``T.Pipelined`` loop.
PIPELINE_KEYS = ("num_stages", "tl_pipeline_stage", "tl_pipeline_order")


@dataclass(frozen=True)
class TileStatement:
    """One effectful statement of the loop body and the op it becomes.

    Attributes:
        op: op name (``<kind>_<buffer>``, unique).
        kind: ``tma_load``, ``mma``, ``reduce``, ``exp2`` or ``alu``.
        text: the statement, one line (for reports).
        reads, writes: buffer names.
    """

    op: str
    kind: str
    text: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


@dataclass(frozen=True)
class PipelinedLoop:
    """The ``T.Pipelined`` loop of a kernel: its annotations, statements, the kernel's threads, its graph."""

    num_stages: int
    stage: tuple[int, ...] | None
    order: tuple[int, ...] | None
    threads: int
    statements: tuple[TileStatement, ...]
    graph: LoopGraph


def find_pipelined(func: Any) -> tuple[Any, int, dict[str, int]]:
    """The one ``T.Pipelined`` loop of prim_func ``func``, the kernel's thread count and the bytes of each
    register fragment it allocates."""
    from tvm import tirx

    loops, threads, fragments = [], [], {}

    def visit(node: Any) -> None:
        if isinstance(node, tirx.For) and any(k in node.annotations for k in PIPELINE_KEYS):
            loops.append(node)
        if isinstance(node, tirx.SBlock):
            if "tl.launch_threads" in node.annotations:
                threads.append(int(node.annotations["tl.launch_threads"][0]))
            for buf in node.alloc_buffers:
                if buf.scope() == "local.fragment":
                    fragments[buf.name] = prod(int(x) for x in buf.shape) * buf.dtype.bits // 8

    tirx.stmt_functor.post_order_visit(func.body, visit)
    if len(loops) != 1:
        raise UnsupportedFeatureError(f"the kernel has {len(loops)} T.Pipelined loops; twill plans exactly one (a "
                                      f"T.Pipelined loop with num_stages=0 is a plain loop)")
    return loops[0], (threads[0] if threads else 128), fragments


def _region(arg: Any) -> tuple[Any, list[int], int]:
    """(buffer, extents, access mask) of a ``tl.region`` argument."""
    load, mask, *extents = arg.args
    return load.buffer, [int(e) for e in extents], int(mask)


def _parallel(node: Any) -> tuple[int, set[str], set[str], bool]:
    """Elements, buffers read and written, and whether a ``T.Parallel`` nest calls ``exp``/``exp2``."""
    from tvm import tirx

    extents, reads, writes, mufu = [], set(), set(), [False]

    def visit(n: Any) -> None:
        if isinstance(n, tirx.For):
            extents.append(int(n.extent))
        elif isinstance(n, tirx.BufferStore):
            writes.add(n.buffer.name)
        elif isinstance(n, tirx.BufferLoad):
            reads.add(n.buffer.name)
        elif isinstance(n, tirx.Call) and getattr(n.op, "name", "") in ("tirx.exp2", "tirx.exp", "tir.exp2",
                                                                            "tir.exp"):
            mufu[0] = True

    tirx.stmt_functor.post_order_visit(node, visit)
    return prod(extents), reads, writes, mufu[0]


def _text(stmt: Any) -> str:
    return " ".join(str(stmt).split())[:160]


def _classify(stmt: Any, index: int) -> tuple[str, dict[str, Any], set[str], set[str]] | None:
    """(kind, cost arguments, reads, writes) of one body statement; None for a scalar bind."""
    from tvm import tirx

    if type(stmt).__name__ in ("Bind", "LetStmt"):    # scalar binds: not scheduled by TileLang either
        return None
    if isinstance(stmt, tirx.For):
        elements, reads, writes, mufu = _parallel(stmt)
        return ("exp2" if mufu else "alu"), {"elements": elements}, reads, writes
    call = stmt.value if isinstance(stmt, tirx.Evaluate) else None
    name = getattr(getattr(call, "op", None), "name", "")
    if name == "tl.tileop.copy":
        (src, _, _), (dst, dst_ext, _) = _region(call.args[0]), _region(call.args[1])
        if src.scope() == "global" and dst.scope().startswith("shared"):
            return "tma_load", {"nbytes": prod(dst_ext) * src.dtype.bits // 8}, set(), {dst.name}
        return "alu", {"elements": prod(dst_ext)}, {src.name}, {dst.name}
    if name == "tl.tileop.gemm":
        (a, _, _), (b, _, _), (c, _, _) = (_region(x) for x in call.args[:3])
        m, n, k = (int(x) for x in call.args[5:8])
        return "mma", {"M": m, "N": n, "K": k, "dtype": DTYPES.get(str(a.dtype), "fp16")}, {a.name, b.name, c.name}, \
            {c.name}
    if name == "tl.tileop.reduce":
        (src, ext, _), (dst, _, _) = _region(call.args[0]), _region(call.args[1])
        rows, cols = ext[0], prod(ext[1:]) if len(ext) > 1 else 1
        return "reduce", {"rows": rows, "cols": cols}, {src.name, dst.name}, {dst.name}
    if name == "tl.tileop.fill":
        (dst, ext, _) = _region(call.args[0])
        return "alu", {"elements": prod(ext)}, set(), {dst.name}
    raise UnsupportedFeatureError(f"statement {index} of the T.Pipelined loop is not supported by the TileLang "
                                  f"frontend (copies, gemm, reductions, fills, T.Parallel loops): {_text(stmt)}")


def _add_op(b: GraphBuilder, m: Machine, name: str, kind: str, args: dict[str, Any], warps: int,
            regs: int) -> None:
    """The op of one statement with its cost from the machine model; ``regs`` per thread it allocates."""
    if kind == "tma_load":
        cost = costs.tma_load_cost(m, args["nbytes"])
        b.op(name, rrt=cost.rrt(), latency=cost.latency, kind=kind, warps=1, variable_latency=True,
             smem=args["nbytes"], warp_busy=cost.warp_busy, attrs={"role": kind})
        return
    attrs: dict[str, Any] = {"role": kind}
    if kind == "mma":
        cost = costs.mma_cost(m, args["M"], args["N"], args["K"], args["dtype"], warps)
        attrs.update(m=args["M"], n=args["N"], k=args["K"], accumulator=True)
    elif kind == "reduce":
        cost = costs.reduce_cost(m, args["rows"], args["cols"])
    else:
        cost = (costs.exp2_cost(m, args["elements"], warps) if kind == "exp2"
                else costs.alu_cost(m, args["elements"], 1.0, warps))
    b.op(name, rrt=cost.rrt(), latency=cost.latency, kind=kind, warps=warps, regs=regs, warp_busy=cost.warp_busy,
         attrs=attrs)


def _edges(b: GraphBuilder, stmts: list[TileStatement], latency: dict[str, int], versioned: set[str]) -> None:
    """Read-after-write, write-after-read and write-after-write edges between the statements (see the module
    docstring)."""
    seen: set[tuple[str, str, int]] = set()

    def add(i: int, j: int, delay: int) -> None:
        src, dst = stmts[i].op, stmts[j].op
        distance = 0 if i < j else 1
        if (src, dst, distance) not in seen:
            seen.add((src, dst, distance))
            b.edge(src, dst, delay=delay, distance=distance)

    for i, w in enumerate(stmts):
        for j, r in enumerate(stmts):
            if set(w.writes) & set(r.reads):
                add(i, j, 0 if w.kind == "tma_load" else latency[w.op])
    for i, first in enumerate(stmts):
        for j, later in enumerate(stmts):
            if i == j:
                continue
            shared = (set(first.reads) | set(first.writes)) & set(later.writes) - versioned
            if shared and (first.op, later.op, 0 if i < j else 1) not in seen:
                add(i, j, 0)


def own_plan(func: Any) -> dict[str, list[int]] | None:
    """TileLang's own plan of the loop: the ``stage``/``order`` its PipelinePlanning pass assigns (with warp
    specialization off, so that the loop reaches it; a manual ``stage``/``order`` is kept as given), run up to
    that pass on an ``sm_90a`` target without a GPU. None when the loop is not pipelined (``num_stages=0``)."""
    import tilelang
    from tvm import IRModule, tirx
    from tvm.target import Target

    target = Target({"kind": "cuda", "arch": "sm_90a"})
    with tilelang.transform.PassContext(config={"tl.disable_warp_specialized": True}), target:
        mod = tirx.transform.BindTarget(target)(IRModule({"main": func}))
        mod = tilelang.transform.MaterializeKernelLaunch(lower_thread_binding=True, default_threads=128)(mod)
        mod = tilelang.transform.PipelinePlanning()(tilelang.transform.Simplify()(mod))
    found: list[Any] = []
    tirx.stmt_functor.post_order_visit(mod["main"].body, lambda n: found.append(n.annotations) if isinstance(
        n, tirx.For) and "software_pipeline_stage" in n.annotations else None)
    if not found:
        return None
    return {"stage": [int(x) for x in found[0]["software_pipeline_stage"]],
            "order": [int(x) for x in found[0]["software_pipeline_order"]]}


def lower_pipelined(func: Any, machine: Machine, name: str) -> PipelinedLoop:
    """The :class:`PipelinedLoop` of prim_func ``func`` (graph named ``name``)."""
    from tvm import tirx

    loop, threads, fragments = find_pipelined(func)
    body = loop.body.seq if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
    warps = max(4, min(8, threads // 32))
    stmts, kinds = [], {}
    for index, stmt in enumerate(body):
        found = _classify(stmt, index)
        if found is None:
            continue
        kind, args, reads, writes = found
        base = f"{kind}_{sorted(writes)[0] if writes else index}"
        op = base if base not in kinds else f"{base}_{index}"
        kinds[op] = (kind, args)
        stmts.append(TileStatement(op, kind, _text(stmt), tuple(sorted(reads)), tuple(sorted(writes))))
    if not any(s.kind == "mma" for s in stmts):
        raise UnsupportedFeatureError("the T.Pipelined loop has no T.gemm: Twill schedules tensor-core loops")
    ann = loop.annotations
    num_stages = int(ann["num_stages"]) if "num_stages" in ann else 0
    stage = tuple(int(x) for x in ann["tl_pipeline_stage"]) if "tl_pipeline_stage" in ann else None
    order = tuple(int(x) for x in ann["tl_pipeline_order"]) if "tl_pipeline_order" in ann else None
    depth = num_stages or (max(stage) + 1 if stage else 2)
    dtype = next((kinds[s.op][1]["dtype"] for s in stmts if s.kind == "mma"), "fp16")
    b = GraphBuilder(name, attrs={"kernel": "tilelang", "source": "tilelang", "arch": machine.name,
                                  "dtype": dtype, "warps": warps, "streaming_depth": max(2, depth),
                                  "statements": [s.op for s in stmts],
                                  **({"tilelang_plan": plan} if (plan := own_plan(func)) else {})})
    written: set[str] = set()
    for s in stmts:     # a fragment's registers belong to its first writer in the body (later ones: in place)
        new = [w for w in s.writes if w in fragments and w not in written]
        written |= set(new)
        regs = -(-sum(fragments[w] for w in new) // (4 * 32 * warps))
        _add_op(b, machine, s.op, *kinds[s.op], warps, regs)
    latency = {s.op: b.build().op(s.op).issue_latency for s in stmts}
    versioned = {w for s in stmts if s.kind == "tma_load" for w in s.writes}
    _edges(b, stmts, latency, versioned)
    return PipelinedLoop(num_stages, stage, order, threads, tuple(stmts), b.build())
