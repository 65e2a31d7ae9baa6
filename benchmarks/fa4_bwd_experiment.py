"""Experiment (not a built-in kernel): an FA4-shaped Blackwell backward graph and paper result 6.

FA4's backward (``flash_attn/cute/flash_bwd_sm100.py``) works on 128x128 tiles with two 4-warp compute
groups that split the columns of S^T/dP^T (here: sub-tiles ``_a``, ``_b`` of 64 query columns), a 4-warp
dQ reduce group (TMEM -> SMEM in 32-column chunks, TMA reduce-add), one MMA warp and one load warp; TMEM
holds S | dV | dP | dK (4 x 64 KB = all 256 KB), P over S, dS and dQ over dP; dO has one SMEM stage.
The graph below follows that layout with the built-in cost helpers. Write-after-read edges of the aliased
TMEM columns: ``dv -> qk`` (distance 1: the next S overwrites P once dV has read it), ``dk -> dp``
(distance 1: the next dP overwrites dS once dK has read it), ``dk -> dq`` (dQ is written over dS, FA4
issues dK first) and ``dq_load -> dp`` (distance 1: the next dP overwrites dQ once it is staged). It needs ``streaming_depth = 1``: with 2 slots per streaming load the 128-row tiles need 241 KB
of shared memory (K, V, 2 Q, 2 dO, dS, a dQ chunk, statistics), more than the 227 KB a block may use.

    .venv/bin/python benchmarks/fa4_bwd_experiment.py [--reg-limits 240,160,136]

Prints, per register budget, the II, ResMII, the register-holding warp groups and the UNSAT explanation
at the modulo-only II (docs/kernels.md, flash-bwd, records a run).
"""

from __future__ import annotations

import argparse
import sys
import time

from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.kernels import _common as k
from twill.machine import get_machine
from twill.machine.models import Machine

#: FA4's tile (query rows and keys) and head dimension.
TILE = 128
HEAD_DIM = 128


def build(machine: Machine) -> LoopGraph:
    """The FA4-shaped backward loop body (see the module docstring)."""
    rows = cols = TILE
    half, d, dt = TILE // 2, HEAD_DIM, "fp16"
    b = GraphBuilder("flash-bwd-fa4", attrs={
        "kernel": "flash-bwd", "arch": machine.name, "block_m": rows, "block_n": cols, "head_dim": d,
        "dtype": dt, "subtiles": 2, "reg_limit": 240, "smem_resident": 2 * cols * d * 2})
    load_q = k.tma_load(b, machine, "load_q", "load_q", rows, d, dt)
    load_do = k.tma_load(b, machine, "load_do", "load_do", rows, d, dt)
    stats = k.tma_load(b, machine, "load_stats", "load_stats", rows, 2, "fp32")
    qk = k.mma(b, machine, "qk", "qk", cols, rows, d, dt)
    dp = k.mma(b, machine, "dp", "dp", cols, rows, d, dt)
    dv = k.mma(b, machine, "dv", "dv", cols, d, rows, dt, accumulator=True)
    dk = k.mma(b, machine, "dk", "dk", cols, d, rows, dt, accumulator=True)
    dq = k.mma(b, machine, "dq", "dq", rows, d, cols, dt, owns_tmem=False)
    latency = {name: b.build().op(name).issue_latency for name in (qk, dp, dq, dv, dk)}
    for edge in ((load_q, qk), (load_do, dp), (load_do, dv), (load_q, dk)):
        b.edge(*edge, delay=0)
    b.edge(dv, dv, distance=1)
    b.edge(dk, dk, distance=1)
    for s, x in enumerate("ab"):
        s_load = k.tmem_load(b, machine, f"s_load_{x}", "s_load", cols, half, subtile=s)
        p = k.exp2(b, machine, f"exp_{x}", "exp", cols, half, "fp32", subtile=s, in_place=True)
        p_store = k.tmem_store(b, machine, f"p_store_{x}", "p_store", cols, half, dt, subtile=s)
        dp_load = k.tmem_load(b, machine, f"dp_load_{x}", "dp_load", cols, half, subtile=s, chunk_cols=32)
        ds = k.elementwise(b, machine, f"ds_{x}", "ds", cols, half, dt, subtile=s, ops_per_element=2.0)
        ds_store = k.smem_store(b, machine, f"ds_store_{x}", "ds_store", cols, half, dt, subtile=s)
        b.edge(qk, s_load, delay=latency[qk], blocking=True)
        b.edge(s_load, p)
        b.edge(stats, p, delay=0)
        b.edge(p, p_store)
        b.edge(p_store, dv, blocking=True)
        b.edge(dp, dp_load, delay=latency[dp], blocking=True)
        b.edge(dp_load, ds)
        b.edge(p, ds)
        b.edge(stats, ds, delay=0)
        b.edge(ds, ds_store)
        b.edge(ds_store, dk, blocking=True)
        b.edge(ds_store, dq, blocking=True)
    dq_load = k.tmem_load(b, machine, "dq_load", "dq_load", rows, d, chunk_cols=32)
    dq_store = k.smem_store(b, machine, "dq_store", "dq_store", rows, d, "fp32",
                            smem_bytes=k.tile_bytes(rows, 32, "fp32"))
    dq_atomic = k.tma_reduce(b, machine, "dq_atomic", "dq_atomic", rows, d, "fp32")
    b.edge(dq, dq_load, delay=latency[dq], blocking=True)
    b.edge(dq_load, dq_store)
    b.edge(dq_store, dq_atomic, blocking=True)
    b.edge(dq_load, dp, distance=1)
    b.edge(dv, qk, delay=latency[dv], distance=1)
    b.edge(dk, dp, delay=latency[dk], distance=1)
    b.edge(dk, dq)
    return b.build()


def main(argv: list[str] | None = None) -> int:
    from twill.errors import TwillError
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reg-limits", default="240,160,136")
    parser.add_argument("--time-limit", type=float, default=240.0)
    args = parser.parse_args(argv)
    machine = get_machine("b200")
    graph = build(machine)
    for limit in (int(x) for x in args.reg_limits.split(",")):
        began = time.perf_counter()
        try:
            result = schedule(graph, machine, SolveOptions(time_limit=args.time_limit, reg_limit=limit,
                                                           streaming_depth=1))
        except TwillError as exc:
            print(f"reg-limit {limit}: {exc}")
            continue
        heavy = [f"{w.num_warps}x{w.regs} {sorted(w.ops)}" for w in result.warps if w.role not in ("load", "mma")]
        print(f"reg-limit {limit}: II {result.ii} (ResMII {result.stats['res_mii']}, {result.status}), "
              f"{len(heavy)} register groups {heavy}, blocked_by {result.stats.get('blocked_by')}, "
              f"{time.perf_counter() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
