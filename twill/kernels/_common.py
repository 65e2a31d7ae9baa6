"""Helpers shared by the built-in kernel graphs: one function per kind of tile op, costed by
:mod:`twill.machine.costs`.

Every helper adds one op to a :class:`~twill.ir.builder.GraphBuilder` with ``attrs["role"]`` (the name code
generators and pictures match on) and, for sub-tiled kernels, ``attrs["subtile"]``. Register footprints are
per thread: a ``rows x cols`` fp32 tile held by a 4-warp group takes ``rows*cols*4 / 4 B / 128 threads``.

Conventions (see docs/kernels.md):
  * Hopper (``mma_accumulates_in == "registers"``): wgmma is a warp-group op (4 warps) whose accumulator lives
    in the registers of the issuing group.
  * Blackwell (``"tmem"``): tcgen05.mma is issued by a single thread of one warp (``warps=1``) and
    accumulates into tensor memory; TMEM <-> register moves are explicit ``tmem_load``/``tmem_store`` ops.
  * TMA loads of input tiles are variable-latency *streaming* ops (no incoming edge): zero latency, one
    issue cycle on the ``tma`` unit, result in shared memory.
"""

from __future__ import annotations

from typing import Any

from twill.ir.builder import GraphBuilder
from twill.machine import costs
from twill.machine.models import Machine

#: Threads of a warp group (4 warps x 32 lanes).
GROUP_THREADS = 128


def tile_regs(rows: int, cols: int, dtype: str, warps: int = 4) -> int:
    """Registers per thread of a ``rows x cols`` tile of ``dtype`` spread over ``warps`` warps."""
    return costs.regs_per_thread(rows, cols, dtype, warps)


def tile_bytes(rows: int, cols: int, dtype: str) -> int:
    return rows * cols * costs.DTYPE_BYTES[dtype]


def _attrs(role: str, subtile: int | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role}
    if subtile is not None:
        out["subtile"] = subtile
    out.update(extra or {})
    return out


def _register_op(b: GraphBuilder, m: Machine, name: str, cost: costs.OpCost, *, kind: str, role: str,
                 subtile: int | None, regs: int, out_bytes: int, warps: int,
                 attrs: dict[str, Any] | None = None) -> str:
    """A synchronous op whose result of ``out_bytes`` lives in registers (``regs`` per thread); crossing to
    another warp group costs :func:`~twill.machine.costs.spill_cost` and a shared-memory staging buffer."""
    return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind=kind, regs=regs, warps=warps,
                spill_cost=costs.spill_cost(m, out_bytes) if regs else 0, warp_busy=cost.warp_busy,
                attrs=_attrs(role, subtile, {"out_bytes": out_bytes, **(attrs or {})}))


def tma_load(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, dtype: str, *,
             ring_depth: int | None = None) -> str:
    """A streaming TMA load of a ``rows x cols`` input tile into a shared-memory ring buffer. ``ring_depth``
    pins the ring's least depth (``LoopGraph.least_depth``); without it the solve's streaming depth applies."""
    nbytes = tile_bytes(rows, cols, dtype)
    cost = costs.tma_load_cost(m, nbytes)
    extra = {"rows": rows, "cols": cols, "dtype": dtype, **({"ring_depth": ring_depth} if ring_depth else {})}
    return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="tma_load", warps=1, variable_latency=True,
                smem=nbytes, warp_busy=cost.warp_busy, attrs=_attrs(role, None, extra))


def mma(b: GraphBuilder, m: Machine, name: str, role: str, M: int, N: int, K: int, dtype: str, *,
        subtile: int | None = None, accumulator: bool = False, warps: int = 4, owns_tmem: bool = True,
        chunk_cols: int | None = None) -> str:
    """A tensor-core GEMM ``[M,K] x [K,N]`` with an fp32 ``[M,N]`` result.

    Hopper: a 4-warp wgmma; the result occupies ``tile_regs(M, N)`` registers per thread, or with
    ``chunk_cols`` ``tile_regs(M, chunk_cols)``: the GEMM runs as ``N / chunk_cols`` wgmmas, each chunk consumed
    before the next is issued. Blackwell: a
    1-warp tcgen05.mma; the result occupies ``M*N*4`` bytes of TMEM (0 with ``owns_tmem=False``: it reuses
    columns counted for another op) and no registers. ``accumulator`` marks results updated in place across
    iterations (one buffer, however many stages it spans).
    """
    cost = costs.mma_cost(m, M, N, K, dtype, warps)
    extra = {"m": M, "n": N, "k": K, "dtype": dtype, "accumulator": accumulator}
    if m.mma_accumulates_in == "tmem":
        return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="mma", warps=1,
                    tmem=tile_bytes(M, N, "fp32") if owns_tmem else 0, warp_busy=cost.warp_busy,
                    attrs=_attrs(role, subtile, extra))
    out_bytes = tile_bytes(M, chunk_cols or N, "fp32")
    if chunk_cols:
        extra["chunk_cols"] = chunk_cols
    return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="mma", warps=warps,
                regs=tile_regs(M, chunk_cols or N, "fp32", warps), spill_cost=costs.spill_cost(m, out_bytes),
                warp_busy=cost.warp_busy, attrs=_attrs(role, subtile, {**extra, "out_bytes": out_bytes}))


def mma_wait(b: GraphBuilder, m: Machine, name: str, role: str = "mma_wait", *,
             subtile: int | None = None, warps: int = 4) -> str:
    """A zero-unit op that blocks until a tensor-core op completes (``wgmma.wait_group`` / tcgen05 commit
    + mbarrier wait). It holds no unit; it must sit with the MMA that it waits for."""
    warps = 1 if m.mma_accumulates_in == "tmem" else warps
    return b.op(name, rrt=({},), latency=0, kind="mma_wait", warps=warps, warp_busy=0,
                attrs=_attrs(role, subtile))


def exp2(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, out_dtype: str, *,
         subtile: int | None = None, in_place: bool = False, warps: int = 4) -> str:
    """``exp2`` over a ``rows x cols`` tile on MUFU; the result (``out_dtype``) stays in registers.
    ``in_place``: the result is written fragment by fragment over its (larger) input's registers."""
    cost = costs.exp2_cost(m, rows * cols, warps)
    return _register_op(b, m, name, cost, kind="exp2", role=role, subtile=subtile, warps=warps,
                        regs=tile_regs(rows, cols, out_dtype, warps), out_bytes=tile_bytes(rows, cols, out_dtype),
                        attrs={"in_place": in_place})


def row_reduce(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, *,
               subtile: int | None = None, warps: int = 4) -> str:
    """A row max / row sum of a ``rows x cols`` tile; the result is one fp32 per row."""
    cost = costs.reduce_cost(m, rows, cols)
    return _register_op(b, m, name, cost, kind="reduce", role=role, subtile=subtile, warps=warps,
                        regs=tile_regs(rows, 1, "fp32", warps), out_bytes=tile_bytes(rows, 1, "fp32"))


def elementwise(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, out_dtype: str, *,
                subtile: int | None = None, ops_per_element: float = 1.0, in_place: bool = False,
                chunk_cols: int | None = None, warps: int = 4) -> str:
    """FP32 elementwise arithmetic over a ``rows x cols`` tile on the ALU; result in registers.
    ``in_place``: the result overwrites its same-sized register input (``O *= alpha``). With ``chunk_cols``
    the op works through the tile ``chunk_cols`` columns at a time behind a chunked producer
    (:func:`tmem_load`), so only one chunk of its result is live."""
    cost = costs.alu_cost(m, rows * cols, ops_per_element, warps)
    live_cols = chunk_cols or cols
    return _register_op(b, m, name, cost, kind="alu", role=role, subtile=subtile, warps=warps,
                        regs=tile_regs(rows, live_cols, out_dtype, warps),
                        out_bytes=tile_bytes(rows, live_cols, out_dtype),
                        attrs={"in_place": in_place, **({"chunk_cols": chunk_cols} if chunk_cols else {})})


def tmem_load(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, *,
              subtile: int | None = None, chunk_cols: int | None = None, warps: int = 4) -> str:
    """tcgen05.ld of an fp32 ``rows x cols`` TMEM tile into registers. With ``chunk_cols`` the consumer
    works through the tile ``chunk_cols`` columns at a time (FA4's correction warps), so only one chunk is
    live in registers."""
    cost = costs.tmem_cost(m, tile_bytes(rows, cols, "fp32"))
    live_cols = chunk_cols or cols
    return _register_op(b, m, name, cost, kind="tmem_load", role=role, subtile=subtile, warps=warps,
                        regs=tile_regs(rows, live_cols, "fp32", warps), out_bytes=tile_bytes(rows, live_cols, "fp32"),
                        attrs={"chunk_cols": live_cols})


def tmem_store(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, dtype: str, *,
               subtile: int | None = None, tmem_bytes: int = 0, warps: int = 4) -> str:
    """tcgen05.st of a ``rows x cols`` register tile into TMEM (result in TMEM: crosses warps for free).
    ``tmem_bytes`` is the new TMEM footprint it creates (0 when it overwrites a buffer counted elsewhere)."""
    cost = costs.tmem_cost(m, tile_bytes(rows, cols, dtype))
    return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="tmem_store", warps=warps, tmem=tmem_bytes,
                warp_busy=cost.warp_busy, attrs=_attrs(role, subtile, {"dtype": dtype}))


def smem_store(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, dtype: str, *,
               subtile: int | None = None, warps: int = 4, smem_bytes: int | None = None) -> str:
    """A register -> shared-memory store of a tile (operand staging for an MMA or a TMA store);
    ``smem_bytes`` overrides the buffer it creates (0 when it reuses one counted elsewhere)."""
    nbytes = tile_bytes(rows, cols, dtype)
    cost = costs.smem_cost(m, nbytes)
    return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="smem_store", warps=warps,
                smem=nbytes if smem_bytes is None else smem_bytes,
                warp_busy=cost.warp_busy, attrs=_attrs(role, subtile, {"dtype": dtype}))


def smem_transpose(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, dtype: str, *,
                   source: str, warps: int = 4) -> str:
    """A ``rows x cols`` shared-memory tile rewritten transposed into a new shared-memory buffer (a transposed
    ``ldmatrix`` read and an ``stmatrix`` write: twice the tile's bytes on the ``smem`` pipe), after the op
    ``source`` that loaded it (FA3's fp8 V transpose). The result is in shared memory: it crosses warp groups
    without a spill."""
    nbytes = tile_bytes(rows, cols, dtype)
    cost = costs.smem_cost(m, 2 * nbytes)
    op = b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="smem_transpose", warps=warps, smem=nbytes,
              warp_busy=cost.warp_busy, attrs=_attrs(role, None, {"rows": rows, "cols": cols, "dtype": dtype}))
    b.edge(source, op, delay=0)
    return op


def tma_reduce(b: GraphBuilder, m: Machine, name: str, role: str, rows: int, cols: int, dtype: str) -> str:
    """A TMA reduce-add of a shared-memory tile to global memory (the dQ atomic add). Variable latency,
    but not streaming: it depends on the tile being staged."""
    cost = costs.tma_reduce_cost(m, tile_bytes(rows, cols, dtype))
    return b.op(name, rrt=cost.rrt(), latency=cost.latency, kind="tma_store", warps=1, variable_latency=True,
                warp_busy=cost.warp_busy, attrs=_attrs(role, None, {"dtype": dtype}))


def group_warps(m: Machine, rows: int) -> int:
    """Warps that cooperate on a ``rows``-row tile: a 4-warp group covers 64 rows on Hopper (wgmma M=64)
    and 128 rows on Blackwell (32 TMEM lanes per warp); at least one group."""
    per_group = 128 if m.mma_accumulates_in == "tmem" else 64
    return max(4, 4 * rows // per_group)


def suffix(subtiles: int, s: int) -> str:
    """Name suffix of sub-tile ``s``: ``""`` without sub-tiling, else ``_a``, ``_b``, ``_c``."""
    return "" if subtiles == 1 else "_" + "abc"[s]
