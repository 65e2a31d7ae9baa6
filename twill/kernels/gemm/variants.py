"""Hand-built GEMM schedules (:mod:`twill.kernels.variants`): the wgmma wait lag (``mma_wait`` one stage after
``mma`` at II = MMA cycles, or in the same stage at a longer II), the streaming depth (ring buffers) and the
compute warp count (4 or 8 warps, block_m 64/128).
"""

from __future__ import annotations

from twill.codegen.plan import ops_with_role
from twill.ir.graph import LoopGraph
from twill.kernels.variants import COMPUTE_REGS, LOAD_REGS
from twill.machine.models import Machine
from twill.schedule.result import Schedule, WarpGroup


def gemm_schedule(graph: LoopGraph, machine: Machine, *, lag: int = 1, depth: int = 3,
                  warps: int = 8) -> Schedule:
    """A hand-built GEMM schedule. ``C`` = MMA cycles, ``B`` = its issue cycles (the wait may not start while
    the next MMA issues: CONCURRENCY). Loads at 0 and 1 (one TMA unit), ``mma`` at 1. ``lag >= 1``: II = C
    and ``mma_wait`` at ``1 + C + B + (lag - 1)·II`` (stage ``lag``). ``lag = 0``: II = C + B + 2 so that
    ``mma_wait`` at ``1 + C + B`` stays in stage 0 (a slower, unlagged schedule)."""
    (load_a,), (load_b,) = ops_with_role(graph, "load_a"), ops_with_role(graph, "load_b")
    (mma,), (wait,) = ops_with_role(graph, "mma"), ops_with_role(graph, "mma_wait")
    cycles, busy = graph.op(mma).cycles, graph.op(mma).busy
    ii = cycles if lag >= 1 else cycles + busy + 2
    starts = {load_a: 0, load_b: 1, mma: 1, wait: 1 + cycles + busy + max(0, lag - 1) * ii}
    warps_ = (WarpGroup(0, "compute", warps, COMPUTE_REGS[1], (mma, wait)),
              WarpGroup(1, "load", 1, LOAD_REGS, (load_a, load_b)))
    return Schedule(graph=graph, arch=machine.name, solver="manual", status="feasible", ii=ii,
                    ii_lower_bound=cycles, starts=starts,
                    assignment={mma: 0, wait: 0, load_a: 1, load_b: 1}, warps=warps_, streaming_depth=depth,
                    stats={"variant": f"lag{lag}_d{depth}_w{warps}"})
