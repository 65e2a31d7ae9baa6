"""The coarse schedule of a modulo schedule: (stage, cluster) of every op, the form a host compiler's software
pipeliner takes (Triton's ``loop.stage``/``loop.cluster``, TileLang's ``T.Pipelined`` ``stage``/``order``).
"""

from __future__ import annotations

from twill.ir.graph import LoopGraph
from twill.schedule.result import Schedule

#: Op kinds of a load that a pipeliner places ahead of its consumers.
LOAD_KINDS = ("tma_load", "load")


def is_streaming_load(graph: LoopGraph, name: str) -> bool:
    """Whether op ``name`` is a load with no incoming dependence (:meth:`~twill.ir.graph.LoopGraph.is_streaming`)."""
    return graph.op(name).kind in LOAD_KINDS and graph.is_streaming(name)


def op_places(schedule: Schedule, load_lead: int) -> dict[str, tuple[int, int]]:
    """(stage, cluster) of every graph op.

    Times are first shifted by the earliest start of a non-load op (a translation keeps a modulo schedule
    valid). Then ``stage = ⌊t / II⌋`` and ``cluster`` = dense rank of ``t mod II``; streaming loads go
    ``load_lead`` stages ahead of their first consumer and into a final cluster of their own (they are
    zero-latency in the model, so where they sit within II is free; emitting them after the MMAs that read
    older ring places saves Triton a buffer). Stages are shifted so the smallest is 0.
    """
    g, ii = schedule.graph, schedule.ii
    loads = [n for n in g.op_names if is_streaming_load(g, n)]
    compute = [n for n in g.op_names if n not in loads]
    base = min((schedule.starts[n] for n in compute), default=0)
    stage = {n: (schedule.starts[n] - base) // ii for n in g.op_names}
    residue = {n: (schedule.starts[n] - base) % ii for n in compute}
    for n in loads:
        uses = [stage[e.dst] + e.distance for e in g.out_edges(n)]
        if uses:
            stage[n] = min(stage[n], min(uses) - load_lead)
    low = min(stage.values())
    rank = {s: k for k, s in enumerate(sorted(set(residue.values())))}
    last = len(rank)
    return {n: (stage[n] - low, rank[residue[n]] if n in residue else last) for n in g.op_names}
