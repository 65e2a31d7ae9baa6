"""Seeded random loop graphs shaped like tile kernels, for the solver tests and the interrupt tests.

A graph of ``n`` ops is a chain of stages: TMA loads (variable latency, own warp) feed tensor-core MMAs
(4 warps, register results), whose results feed register ops on the MUFU / ALU units; every edge goes
forward (distance 0) except accumulator self-edges and a few edges back to earlier ops (distance 1), so no
zero-distance cycle exists. At most :data:`MAX_ACCUMULATORS` MMAs accumulate in place (self-edge). Costs are in
raw cycles, like the built-in kernels.
"""

from __future__ import annotations

import random

from twill.ir.graph import Edge, LoopGraph, Op

#: (kind, unit, cycle range, warps, regs, variable latency, warp_busy); MMAs are drawn half of the time.
KINDS = (
    ("tma_load", "tma", (20, 80), 1, 0, True, 1),
    ("mma", "tc", (40, 160), 4, 16, False, 2),
    ("mma", "tc", (40, 160), 4, 16, False, 2),
    ("exp2", "mufu", (10, 40), 4, 8, False, None),
    ("alu", "alu", (5, 20), 4, 4, False, None),
)


#: In-place accumulators hold their registers for the whole loop; tile kernels have a few (FA: O, l, m).
MAX_ACCUMULATORS = 3


def random_graph(n: int, seed: int) -> LoopGraph:
    """A random ``n``-op loop graph (deterministic in ``seed``)."""
    rng = random.Random(seed)
    ops: list[Op] = []
    for k in range(n):
        kind, unit, (lo, hi), warps, regs, vl, busy = KINDS[0] if k % 6 == 0 else rng.choice(KINDS[1:])
        cycles = rng.randint(lo, hi)
        accumulate = kind == "mma" and rng.random() < 0.3 and sum(op.attrs.get("accumulator", False)
                                                                    for op in ops) < MAX_ACCUMULATORS
        attrs = {"accumulator": True} if accumulate else {}
        ops.append(Op(name=f"{kind}{k}", rrt=({unit: 1},) * cycles, kind=kind, warps=warps, regs=regs,
                      variable_latency=vl, spill_cost=rng.randint(5, 20) if regs else 0,
                      smem=2048 if vl else 0, warp_busy=busy, attrs=attrs))
    edges: list[Edge] = []
    for k in range(1, n):
        dst = ops[k]
        if dst.variable_latency:
            continue
        for src_index in rng.sample(range(max(0, k - 6), k), min(k - max(0, k - 6), rng.randint(1, 2))):
            src = ops[src_index]
            edges.append(Edge(src.name, dst.name, src.cycles, 0, src.kind == "mma" and dst.kind != "mma"))
    for op in ops:
        if op.attrs.get("accumulator"):
            edges.append(Edge(op.name, op.name, op.cycles, 1, False))
    for _ in range(max(1, n // 20)):
        a, b = sorted(rng.sample(range(n), 2))
        if not ops[a].variable_latency:
            edges.append(Edge(ops[b].name, ops[a].name, ops[b].cycles, 1, False))
    return LoopGraph(f"random{n}s{seed}", tuple(ops), tuple(edges), None, {})
