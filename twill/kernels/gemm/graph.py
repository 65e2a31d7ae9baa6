"""Tiled GEMM main loop: ``acc += A[:, k] @ B[k, :]`` over K blocks.

Ops (roles): ``load_a``, ``load_b`` (streaming TMA loads into the shared-memory ring), ``mma`` (wgmma on
Hopper, a 4- or 8-warp op accumulating in registers; tcgen05.mma on Blackwell, a 1-warp op accumulating in
TMEM) and ``mma_wait`` (waits for the MMA to complete and releases its ring buffers; its stage relative to ``mma``
is the wgmma wait lag).

Edges: ``load_a -> mma``, ``load_b -> mma`` (delay 0: streaming loads have zero latency),
``mma -> mma`` (distance 1: the accumulator chain), ``mma -> mma_wait`` (blocking, delay = MMA cycles),
``mma_wait -> mma`` (distance 2: at most one MMA left in flight when the next is issued, as in
``wgmma.wait_group(1)``).

Hopper consumer width (``warps``): the fp32 accumulator ``block_m x block_n`` is spread over the wgmma warps,
``block_m*block_n / (32*warps)`` registers per thread. ``warps=0`` (default) takes 4 warps while that is at
most :data:`ACC_REGS_PER_THREAD` (128) and 8 warps otherwise, so the default 128x256 tile is one 8-warp
consumer group with 128 accumulator registers per thread, as in the fastest Hopper GEMMs (CUTLASS's
128x256x64 warp-specialized cooperative kernel, Triton's Gluon Hopper matmul example); on 4 warps it would
need 256 registers per thread, above the 240 a warp group may hold.
"""

from __future__ import annotations

from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.kernels import KernelOption
from twill.kernels import _common as k
from twill.machine.models import Machine

OPTIONS = {
    "block_m": KernelOption(int, 128, "rows of the output tile", (64, 128, 256)),
    "block_n": KernelOption(int, 256, "columns of the output tile", (64, 128, 256)),
    "block_k": KernelOption(int, 64, "K extent of one loop iteration", (32, 64, 128)),
    "dtype": KernelOption(str, "fp16", "operand dtype", ("fp16", "bf16", "fp8e4m3", "fp8e5m2")),
    "warps": KernelOption(int, 0, "Hopper wgmma warps (0 = 4, or 8 when the accumulator needs more than 128 "
                                  "registers per thread on 4)", (0, 4, 8)),
}

#: Accumulator registers per thread above which the default Hopper consumer takes 8 warps instead of 4.
ACC_REGS_PER_THREAD = 128

#: Iterations between an MMA and the MMA that must wait for it (``wgmma.wait_group(1)`` keeps one in flight).
MMA_WAIT_DISTANCE = 2


def mma_warps(machine: Machine, block_m: int, block_n: int, warps: int = 0) -> int:
    """Warps of the wgmma consumer: ``warps`` if given, else 4 when ``block_m*block_n/(32*4)`` fp32
    accumulator registers per thread are at most :data:`ACC_REGS_PER_THREAD`, else 8 (1 on Blackwell)."""
    if machine.mma_accumulates_in == "tmem":
        return 1
    if warps:
        return warps
    return 4 if k.tile_regs(block_m, block_n, "fp32", 4) <= ACC_REGS_PER_THREAD else 8


#: Default ring depth of the A/B loads: 3 buffers of 128x64 + 64x256 fp16 tiles (144 KB) keep the TMA two tiles
#: ahead of the wgmma; the solver's kernel with it runs level with the hand-built Gluon matmul with a 3-4-deep
#: ring (docs/performance.md, "Run 4").
STREAMING_DEPTH = 3


def build(machine: Machine, *, block_m: int = 128, block_n: int = 256, block_k: int = 64,
          dtype: str = "fp16", warps: int = 0) -> LoopGraph:
    """The GEMM K-loop body for ``machine`` (see the module docstring for ops and edges)."""
    w = mma_warps(machine, block_m, block_n, warps)
    b = GraphBuilder("gemm", attrs={"kernel": "gemm", "arch": machine.name, "block_m": block_m,
                                    "block_n": block_n, "block_k": block_k, "dtype": dtype, "subtiles": 1,
                                    "warps": w, "streaming_depth": STREAMING_DEPTH})
    load_a = k.tma_load(b, machine, "load_a", "load_a", block_m, block_k, dtype)
    load_b = k.tma_load(b, machine, "load_b", "load_b", block_k, block_n, dtype)
    acc = k.mma(b, machine, "mma", "mma", block_m, block_n, block_k, dtype, accumulator=True, warps=w)
    wait = k.mma_wait(b, machine, "mma_wait", warps=w)
    mma_cycles = b.build().op(acc).issue_latency
    b.edge(load_a, acc, delay=0)
    b.edge(load_b, acc, delay=0)
    b.edge(acc, acc, delay=mma_cycles, distance=1)
    b.edge(acc, wait, delay=mma_cycles, blocking=True)
    b.edge(wait, acc, delay=0, distance=MMA_WAIT_DISTANCE)
    return b.build()
