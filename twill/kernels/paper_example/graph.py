"""The paper's running example (Figure 1): ``S = gemm(Q, K[i]); P = exp(S); O += gemm(P, V[i])``.

Two units of capacity 1 (the tensor core ``TC`` and the exponential unit ``EXP``), unit costs, edges
S->P and P->O of delay 1 and the accumulator O->O carried to the next iteration. The optimal modulo
schedule has II = 2 with S hoisted one stage ahead of P and O: FA3's intra-warpgroup pipeline.
"""

from __future__ import annotations

from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine

OPTIONS: dict = {}


def build(machine: Machine) -> LoopGraph:
    b = GraphBuilder("paper-example", units={"TC": 1, "EXP": 1})
    # The GEMMs are asynchronous (wgmma): they hold their warp only to issue, negligible at this scale.
    s = b.op("S", uses={"TC": 1}, cycles=1, kind="mma", warp_busy=0, attrs={"role": "qk"})
    p = b.op("P", uses={"EXP": 1}, cycles=1, kind="exp2", attrs={"role": "exp"})
    o = b.op("O", uses={"TC": 1}, cycles=1, kind="mma", warp_busy=0, attrs={"role": "pv"})
    b.edge(s, p, delay=1)
    b.edge(p, o, delay=1)
    b.edge(o, o, delay=1, distance=1)
    return b.build()
