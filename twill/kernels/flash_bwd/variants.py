"""Hand-built attention-backward schedules (:mod:`twill.kernels.variants`): ring depth, the dQ reduce's lag and
the compute ops placed one stage later.
"""

from __future__ import annotations

from twill.codegen.plan import ops_with_role
from twill.ir.graph import LoopGraph
from twill.kernels.variants import COMPUTE_REGS, LOAD_REGS, list_modulo_schedule
from twill.machine.models import Machine
from twill.schedule.result import Schedule, WarpGroup


def flash_bwd_schedule(graph: LoopGraph, machine: Machine, *, depth: int = 2, dq_lag: int = 1,
                       late: tuple[str, ...] = ()) -> Schedule:
    """A hand-built Hopper attention-backward schedule: every compute op on one 8-warp group (FA3's two MMA
    warp groups), the TMA loads and the dQ reduce (``dq_atomic``) on the producer; ``depth`` ring buffers
    (streaming depth) and ``dq_atomic`` ``dq_lag`` stages after ``dq_store`` (dQ staging buffers =
    ``dq_lag + 1``; the split-query backward has no ``dq_atomic``, and ``dq_lag`` does not apply). The compute
    ops in ``late`` start in stage 1 (at II or later, so early in the
    steady-state order, as the joint solver places P's conversion, dV and the dQ store at head dim 64), the
    others in stage 0. The smallest II (from the tensor-core bound up) at which the greedy list scheduler
    meets this is used."""
    group_of = {op.name: 1 if op.variable_latency else 0 for op in graph.ops}
    compute = [op.name for op in graph.ops if group_of[op.name] == 0]
    tc = sum(op.usage("tc") for op in graph.ops)
    busy = max(sum(op.busy for op in graph.ops if group_of[op.name] == g) for g in (0, 1))
    lower = max(tc, busy)
    (store,) = ops_with_role(graph, "dq_store")
    atomics = ops_with_role(graph, "dq_atomic")   # none in the split-query backward (the compute warps reduce)
    for ii in range(lower, 4 * lower, max(1, lower // 64)):
        earliest = {op: ii for op in late}
        starts = list_modulo_schedule(graph, machine, ii, earliest, group_of)
        if starts is None or any(starts[n] // ii != int(n in late) for n in compute):
            continue
        if not atomics:
            return _schedule(graph, machine, ii, lower, starts, group_of, compute, depth, dq_lag, late)
        (atomic,) = atomics
        stage = starts[store] // ii + dq_lag
        earliest[atomic] = max(starts[atomic], stage * ii)
        starts = list_modulo_schedule(graph, machine, ii, earliest, group_of)
        if starts is None or starts[atomic] // ii != stage or any(starts[n] // ii != int(n in late)
                                                                    for n in compute):
            continue
        return _schedule(graph, machine, ii, lower, starts, group_of, compute, depth, dq_lag, late)
    raise ValueError(f"no hand-built schedule for {graph.name} with dq_lag={dq_lag}, late={late}")


def _schedule(graph: LoopGraph, machine: Machine, ii: int, lower: int, starts: dict[str, int],
              group_of: dict[str, int], compute: list[str], depth: int, dq_lag: int,
              late: tuple[str, ...]) -> Schedule:
    groups = (WarpGroup(0, "compute", 8, COMPUTE_REGS[1], tuple(compute)),
              WarpGroup(1, "load", 1, LOAD_REGS, tuple(n for n in group_of if group_of[n] == 1)))
    return Schedule(graph=graph, arch=machine.name, solver="manual", status="feasible", ii=ii,
                    ii_lower_bound=lower, starts=starts, assignment=group_of, warps=groups,
                    streaming_depth=depth, stats={"variant": f"bwd_d{depth}_dqlag{dq_lag}{'_late' if late else ''}"})
