"""The attention backward's kernel plan (Hopper, one 8-warp compute warp group, FA3's algorithm): the generic
vocabulary of :mod:`twill.codegen.plan` plus its decisions.

* **Rings.** ``q``, ``do`` and ``stats`` (LSE and D), with their depths from the schedule; K and V stay
  resident.
* **dQ staging.** ``dq_depth = stage(dq_atomic) - stage(dq_store) + 1`` fp32 buffers between the compute
  group's ``dq_store`` and the producer's ``dq_atomic``, which reduces iteration ``j - dq_lag`` in iteration
  ``j`` (``dq_lag = stage(dq_atomic) - stage(load_q)``).
* **Split queries** (64-key blocks, head dim 256: the graph's ``p_store`` and ``dq_chunk``). The warp groups
  split S^T's queries; P and dS go through shared memory, and the compute warps stage dQ ``dq_chunk``
  columns at a time in ``DQ_SLOTS`` buffers and reduce-add each chunk themselves (no ``dq_atomic``).
* **Stages.** The compute ops are issued in the schedule's steady-state order over at most two stages; see
  docs/codegen.md, "Attention backward".

The dQ staging and the variants (``causal``, ``kv_heads``, graph attributes) are the plan's
:class:`FlashBwdDecisions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.codegen.plan import (KernelPlan, Partition, Ring, Wait, check_roles, check_schedule, edge_wait,
                                make_partitions, make_plan, ops_with_role, retire_wait, ring_depth, ring_waits,
                                shared_barriers, smem_bytes, unsupported)
from twill.errors import UnsupportedFeatureError
from twill.kernels.flash_bwd import FAMILY
from twill.kernels.flash_bwd.graph import DQ_SLOTS
from twill.machine.models import get_machine
from twill.schedule.result import Schedule

ROLES = ("load_q", "load_do", "load_stats", "qk", "dp", "exp", "p_cvt", "ds", "ds_store", "dv", "dk",
         "dq", "dq_store", "dq_atomic")
#: Roles of the split-query backward (64-key blocks): P stored to shared memory, dQ reduced by the compute warps.
SPLIT_ROLES = ("load_q", "load_do", "load_stats", "qk", "dp", "exp", "p_store", "ds", "ds_store", "dv", "dk",
               "dq", "dq_store")
#: Tensor-core ops of the attention backward and the ring each reads (``None``: only resident K/V).
MMAS = {"qk": "q", "dp": "do", "dv": "do", "dk": "q", "dq": None}
#: Head dimensions of the attention backward (dK and dV are register accumulators of N = head dim).
HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True)
class FlashBwdDecisions:
    """The attention backward's own decisions (:attr:`KernelPlan.decisions
    <twill.codegen.plan.KernelPlan.decisions>`).

    Attributes:
        dq_depth: buffers of the fp32 dQ staging buffer between ``dq_store`` (compute) and ``dq_atomic``
            (producer): ``stage(dq_atomic) - stage(dq_store) + 1``.
        dq_lag: iterations between the producer's loads and its ``dq_atomic`` of the same iteration,
            ``stage(dq_atomic) - stage(load_q)`` (in iteration j it reduces iteration ``j - dq_lag``).
        causal: the causal mask (a key block meets the query blocks from its diagonal on; see docs/codegen.md,
            "Causal attention").
        kv_heads: K/V heads (0: as many as the query heads; N: grouped-query attention).
        dq_chunk: 0 when the producer reduces whole dQ tiles; else the split-query backward's dQ columns per
            chunk, which the compute warps stage (``dq_depth`` buffers) and reduce themselves (``dq_lag`` 0).
        varlen: variable-length packed sequences (FlashAttention's varlen interface): a CTA's key block and
            the query blocks it meets lie in one sequence of the packed tensors (docs/codegen.md, "Variable-length
            sequences").
    """

    dq_depth: int
    dq_lag: int
    causal: bool = False
    kv_heads: int = 0
    dq_chunk: int = 0
    varlen: bool = False

    @property
    def split(self) -> bool:
        """The split-query backward: P and dS in shared memory, dQ in chunks reduced by the compute warps."""
        return bool(self.dq_chunk)


def plan(schedule: Schedule, backend: str) -> KernelPlan:
    """Plan of the attention backward (Hopper, one compute warp group, FA3's algorithm): the rings of Q, dO
    and the row statistics (LSE, D) with their depths from the schedule, the dQ staging depth between the
    compute group's ``dq_store`` and the producer's ``dq_atomic``, and the waits. The compute ops are issued in
    the schedule's steady-state order over at most two stages; see docs/codegen.md, "Attention backward"."""
    check_schedule(schedule, backend)
    graph = schedule.graph
    split = bool(ops_with_role(graph, "p_store"))
    roles = SPLIT_ROLES if split else ROLES
    check_roles(graph, roles, backend)
    missing = [r for r in roles if len(ops_with_role(graph, r)) != 1]
    if missing:
        raise unsupported(backend, f"an attention backward graph without exactly one {missing[0]} op is")
    op = {r: ops_with_role(graph, r)[0] for r in roles}
    mmas = [op[r] for r in MMAS]
    parts = make_partitions(schedule, mmas, {n: 0 for n in graph.op_names}, backend)
    compute = parts[0]
    if len(parts) != 2 or compute.num_warps != 8:
        raise unsupported(backend, "an attention backward not on one 8-warp compute group is",
                          "FA3's two MMA warp groups cooperate on every tile")
    _check_bwd_stages(schedule, compute, backend)
    rings = []
    for load_role, name in (("load_q", "q"), ("load_do", "do"), ("load_stats", "stats")):
        load = op[load_role]
        readers = tuple(e.dst for e in graph.out_edges(load))
        release = max(readers, key=lambda n: (schedule.stage(n), compute.ops.index(n)))
        depth, why = ring_depth(schedule, load, release)
        rings.append(Ring(name, load, readers, release, depth, why, name))
    rings, barriers = shared_barriers(rings, 1)
    head_dim = int(graph.attrs.get("head_dim", 128))
    if head_dim not in HEAD_DIMS:
        raise unsupported(backend, f"head dim {head_dim}", ", ".join(map(str, HEAD_DIMS)))
    tile = {"block_m": int(graph.attrs.get("block_m", 64)), "block_n": int(graph.attrs.get("block_n", 128)),
            "head_dim": head_dim}
    if tile["block_m"] not in (64, 128) or tile["block_n"] != (64 if split else 128):
        raise unsupported(backend, f"block_m {tile['block_m']}, block_n {tile['block_n']}",
                          "block_m 64 or 128 with block_n 128; block_n 64 with P stored to shared memory")
    if split:
        dq_chunk = int(graph.attrs.get("dq_chunk", 0))
        if dq_chunk not in (32, 64, 128) or head_dim % dq_chunk or (head_dim // dq_chunk) % DQ_SLOTS:
            raise unsupported(backend, f"dq_chunk {dq_chunk} at head dim {head_dim}",
                              f"32, 64 or 128 columns, dividing the head dimension into a multiple of {DQ_SLOTS}")
        dq_depth, dq_lag = DQ_SLOTS, 0
    else:
        dq_chunk = 0
        dq_depth = schedule.stage(op["dq_atomic"]) - schedule.stage(op["dq_store"]) + 1
        dq_lag = schedule.stage(op["dq_atomic"]) - schedule.stage(op["load_q"])
        if dq_lag < 0:
            raise unsupported(backend, "dq_atomic scheduled a stage before the loads is")
    _check_bwd_smem(schedule, tile, rings, dq_depth, dq_chunk, backend)
    kv_heads = int(graph.attrs.get("kv_heads", 0))
    waits = ring_waits(graph, rings) + [retire_wait(graph, op[r]) for r in MMAS]
    if not split:
        waits += [edge_wait(graph, "ready", op["dq_store"], op["dq_atomic"]),
                  Wait("empty", op["dq_store"], op["dq_atomic"], 0, dq_depth)]
    varlen = bool(graph.attrs.get("varlen", False))
    if varlen and backend.lower() != "gluon":
        raise unsupported(backend, "variable-length sequences (varlen)", "emitted by the Gluon backend")
    decisions = FlashBwdDecisions(dq_depth, dq_lag, bool(graph.attrs.get("causal", False)), kv_heads, dq_chunk,
                                  varlen)
    return make_plan(schedule, FAMILY.name, backend, tile=tile, partitions=parts, rings=tuple(rings),
                     barriers=barriers, waits=tuple(waits), decisions=decisions)


def _check_bwd_stages(schedule: Schedule, compute: Partition, backend: str) -> None:
    """The compute ops span at most two stages, and a value carried from stage s to stage s + 1 is read (for
    iteration j - 1) before it is produced again (for iteration j) in the steady-state order, so one register
    copy holds it."""
    graph = schedule.graph
    stages = sorted({schedule.stage(n) for n in compute.ops})
    if stages[-1] - stages[0] > 1:
        raise unsupported(backend, f"attention backward compute ops over {stages[-1] - stages[0] + 1} stages are",
                          "one or two")
    for e in graph.edges:
        if e.src in compute.ops and e.dst in compute.ops and e.distance == 0 and \
                schedule.stage(e.dst) > schedule.stage(e.src) and \
                compute.ops.index(e.dst) > compute.ops.index(e.src):
            raise unsupported(backend, f"{e.src!r} of iteration j + 1 before {e.dst!r} of iteration j is",
                              "the value would need two register copies")


def _check_bwd_smem(schedule: Schedule, tile: dict[str, int], rings: list[Ring], dq_depth: int, dq_chunk: int,
                    backend: str) -> None:
    """Resident K and V, the Q/dO/stats rings, the dS tile (and the P tile of the split-query backward), the dQ
    staging buffers (whole tiles, or ``dq_chunk`` columns each) and the mbarriers must fit shared memory. Each
    buffer and the barriers are counted in whole KiB (the allocator aligns the swizzled tiles): buffers of
    exactly the 232 448 bytes of an H200 block (128-row tiles, 3-deep rings) need 233 004 with their 23
    barriers, and Triton refuses that kernel only at launch."""
    capacity = get_machine(schedule.arch).smem_per_block
    bm, bn, d = tile["block_m"], tile["block_n"], tile["head_dim"]
    buffer = {"q": bm * d * 2, "do": bm * d * 2, "stats": 2 * bm * 4}
    dq_barriers = 0 if dq_chunk else 2 * dq_depth         # dQ ready/empty (the producer's reduce)
    barriers = 1 + dq_barriers + 2 * sum(r.depth for r in rings)     # K/V, dQ, ring ready/empty
    p_tile = [bn * bm * 2] if dq_chunk else []
    need = smem_bytes([2 * bn * d * 2, *(r.depth * buffer[r.name] for r in rings), bn * bm * 2, *p_tile,
                       dq_depth * bm * (dq_chunk or d) * 4], barriers)
    if need > capacity:
        raise UnsupportedFeatureError(
            f"cannot generate: the attention backward needs {need} bytes of shared memory, more than the "
            f"{capacity} of {schedule.arch} (head dim {d}, ring depths {'/'.join(str(r.depth) for r in rings)}, "
            f"dQ staging {dq_depth}; {backend} backend); use a smaller --streaming-depth")
