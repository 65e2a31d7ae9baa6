"""What ops and edges mean for a schedule: in-place updates, how long a consumer reads a value, the bytes of
a register value, waits and buffers (docs/model.md §3-§4).

These are properties of the loop graph, shared by both joint solver backends, the warp-specialization
verifier and the pictures; none of them depends on a solver.
"""

from __future__ import annotations

from twill.ir.graph import Edge, LoopGraph, Op

THREADS_PER_WARP = 32


def is_accumulator(op: Op) -> bool:
    """An op whose result buffer is updated in place across iterations (depth 1)."""
    return bool(op.attrs.get("accumulator", False))


def in_place(graph: LoopGraph, name: str) -> bool:
    """An accumulator updated in place: a self-edge of distance 1. Copies share one buffer, so copy i is
    live only until copy i+1 issues (docs/model.md, Liveness)."""
    return any(e.src == e.dst == name and e.distance == 1 for e in graph.edges)


def carried_consumers(graph: LoopGraph, name: str) -> list[str]:
    """The ops that read ``name``'s register value in the same iteration (out-edges of distance 0; none when
    ``name`` holds no registers). Placed in a later stage than ``name``, each makes the loop body carry the
    value from one trip into the next (:meth:`Schedule.carried <twill.schedule.result.Schedule.carried>`)."""
    if graph.op(name).regs <= 0:
        return []
    return [e.dst for e in graph.out_edges(name) if e.distance == 0 and e.dst != name]


def overwrites(consumer: Op, value: Op) -> bool:
    """``consumer`` writes its result over ``value``'s registers: an accumulator update or an in-place
    elementwise op (``attrs["accumulator"]``/``attrs["in_place"]``) whose result is no larger than the input
    (``O *= alpha``; ``P = exp2(S)`` converted fragment by fragment into S's registers)."""
    flagged = consumer.attrs.get("accumulator", False) or consumer.attrs.get("in_place", False)
    return bool(flagged) and 0 < consumer.regs <= value.regs


def read_cycles(graph: LoopGraph, value: str, consumer: str) -> int:
    """How long after its issue ``consumer`` still reads ``value``: its whole execution (``cycles``; a wgmma
    reads register operands asynchronously until it completes), or 0 when it overwrites ``value`` in place."""
    u, v = graph.op(consumer), graph.op(value)
    return 0 if overwrites(u, v) else u.cycles


def waited_groups(graph: LoopGraph) -> list[tuple[str, str]]:
    """(wait op, MMA) pairs: an ``mma_wait`` op must run on the group that issued the MMA it waits for."""
    return [(e.dst, e.src) for e in graph.edges
            if e.blocking and e.src != e.dst and graph.op(e.dst).kind == "mma_wait"]


def value_bytes(op: Op) -> int:
    """Bytes of a register value when staged in shared memory: ``attrs["out_bytes"]`` or regs·4·32·warps."""
    return int(op.attrs.get("out_bytes", op.regs * 4 * THREADS_PER_WARP * op.warps))


def can_cross(op: Op) -> bool:
    """Results in registers pay a spill to reach another group; TMA/TMEM results (regs 0) cross free."""
    return op.regs > 0


def blocking_in(graph: LoopGraph, name: str) -> bool:
    """``v`` has a blocking incoming edge (a synchronous wait for an asynchronous result)."""
    return any(e.blocking for e in graph.in_edges(name))


def buffer_edges(graph: LoopGraph, name: str) -> list[Edge]:
    """Out-edges that decide the ring depth of ``name``'s result (self-edges excluded)."""
    return [e for e in graph.out_edges(name) if e.dst != name]


def holds_memory(op: Op) -> bool:
    """The op's result occupies shared or tensor memory (a ring of buffers)."""
    return op.smem > 0 or op.tmem > 0
