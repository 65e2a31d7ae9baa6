"""Hand-built loop graphs shared by more than one test file."""

from __future__ import annotations

from twill.ir import GraphBuilder
from twill.schedule.result import Schedule, WarpGroup


def with_register_free_op(busy: int = 3):
    """Three 4-warp register ops and one register-free 4-warp op (a TMEM store), a 1-warp MMA and a load."""
    b = GraphBuilder("issue_free", units={"alu": 4, "tma": 1, "tc": 1})
    for k in range(3):
        b.op(f"v{k}", uses={"alu": 1}, cycles=busy, regs=64, warps=4)
    b.op("store", uses={"alu": 1}, cycles=busy, warps=4)
    b.op("mma", uses={"tc": 1}, cycles=2, warps=1, warp_busy=1)
    b.op("load", uses={"tma": 1}, cycles=1, warps=1, variable_latency=True)
    return b.build()


def ping_pong_attention(head_dim: int = 64) -> Schedule:
    """Two 4-warp compute groups, each S = Q Kᵀ (latency 300) -> softmax op -> O += P V, a 1-warp loader."""
    b = GraphBuilder("pp", attrs={"kernel": "flash-fwd", "block_m": 128, "block_n": 128, "head_dim": head_dim})
    b.op("load_k", cycles=1, uses={"tma": 1}, variable_latency=True)
    for x in "ab":
        b.op(f"qk_{x}", cycles=250, uses={"tc": 1}, kind="mma", warps=4, latency=300)
        b.op(f"exp_{x}", cycles=400, uses={"mufu": 1}, kind="exp2", warps=4)
        b.op(f"pv_{x}", cycles=250, uses={"tc": 1}, kind="mma", warps=4)
        b.edge("load_k", f"qk_{x}", delay=0)
        b.edge(f"qk_{x}", f"exp_{x}", delay=300)
        b.edge(f"exp_{x}", f"pv_{x}", delay=400)
    starts = {"load_k": 0, "qk_a": 0, "qk_b": 250, "exp_a": 300, "exp_b": 550, "pv_a": 700, "pv_b": 950}
    groups = [WarpGroup(0, "load", 1, 24, ("load_k",)), WarpGroup(1, "compute", 4, 240, ("qk_a", "exp_a", "pv_a")),
              WarpGroup(2, "compute", 4, 240, ("qk_b", "exp_b", "pv_b"))]
    assignment = {"load_k": 0, **{f"{op}_a": 1 for op in ("qk", "exp", "pv")},
                  **{f"{op}_b": 2 for op in ("qk", "exp", "pv")}}
    return Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=1000, ii_lower_bound=1000,
                    starts=starts, assignment=assignment, warps=groups,
                    stats={"res_mii": 1000, "normalization": {"enabled": False}})
