"""Hand-built loop graphs shared by more than one test file."""

from __future__ import annotations

from twill.ir import GraphBuilder


def with_register_free_op(busy: int = 3):
    """Three 4-warp register ops and one register-free 4-warp op (a TMEM store), a 1-warp MMA and a load."""
    b = GraphBuilder("issue_free", units={"alu": 4, "tma": 1, "tc": 1})
    for k in range(3):
        b.op(f"v{k}", uses={"alu": 1}, cycles=busy, regs=64, warps=4)
    b.op("store", uses={"alu": 1}, cycles=busy, warps=4)
    b.op("mma", uses={"tc": 1}, cycles=2, warps=1, warp_busy=1)
    b.op("load", uses={"tma": 1}, cycles=1, warps=1, variable_latency=True)
    return b.build()
