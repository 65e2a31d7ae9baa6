"""The attention forward's kernel plan: the generic vocabulary of :mod:`twill.codegen.plan` plus its decisions.

* **Partitions.** One compute partition per sub-tile (its ``qk``, softmax and ``pv``), then the producer.
* **Rings.** ``k`` and ``v``, each released by its last tensor-core reader; one barrier pair each.
* **Stages.** ``qk_ahead = stage(pv) - stage(qk)`` per partition (0 or 1): with 1, ``S = Q K^T`` of iteration
  ``j + 1`` is issued together with ``O += P V`` of iteration ``j`` and the softmax of ``j + 1`` overlaps that
  PV (FA3's intra-warp-group pipeline).
* **Tensor-core order.** Within a turn a partition issues ``qk`` before ``pv`` (:data:`PROGRAM_ORDER`); the
  cyclic order starts where each partition's ``qk`` turn comes before its ``pv`` turn. A partition with
  ``qk_ahead`` 1 issues both at one program point, so it takes one turn, at its ``qk``'s place in that order
  (:func:`one_turn_when_ahead`).
* **fp8** (Gluon only): the graph's dtype ``fp8e4m3``/``fp8e5m2`` with V transposed by a pre-pass (the
  in-kernel transpose, ``v_transpose`` op, is refused); the renderer reads V^T tiles, converts P to fp8 and
  stores a bf16 O.
* **Variants.** ``causal`` and ``kv_heads`` (graph attributes) do not change the loop body or the schedule;
  they are carried to the renderer, which bounds each query block's trip count at its diagonal and masks the
  diagonal iterations, and maps query heads onto K/V heads. The Q tile and the K/V rings must fit the
  machine's shared memory per block.
* **Persistence** (Gluon, ``persistent``): the kernel walks query blocks in launch order; the loop is one
  query block's key loop either way, the K/V rings run on across blocks and the Q buffer is handed back to
  the producer once a block's last ``qk`` has completed, so no buffer is added.

``qk_ahead``, ``causal`` and ``kv_heads`` are the plan's :class:`FlashDecisions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.codegen.plan import (DTYPES, Barrier, KernelPlan, Partition, Ring, Turn, check_roles, check_schedule, cut_turns,
                                in_program_order, make_partitions, make_plan, merge_runs, ops_with_role, retire_wait,
                                ring_depth, ring_waits, smem_bytes, unsupported, waits_for_turns, with_turn_points)
from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.kernels.flash_fwd import FAMILY, ROLES
from twill.kernels.flash_fwd.graph import FP8_DTYPES
from twill.machine.costs import DTYPE_BYTES
from twill.machine.models import get_machine
from twill.schedule.result import Schedule

#: Order in which an attention compute partition issues its tensor-core ops within one loop body.
PROGRAM_ORDER = ("qk", "pv")
#: Most attention sub-tiles (compute partitions) the renderers support: three 64-row groups, FA3's BLOCK_M = 192.
MAX_SUBTILES = 3
#: Attention head dimensions the renderers support (the O accumulator is one wgmma of N = head dim <= 256).
HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True)
class FlashDecisions:
    """The attention forward's own decisions (:attr:`KernelPlan.decisions
    <twill.codegen.plan.KernelPlan.decisions>`).

    Attributes:
        qk_ahead: per compute partition, ``stage(pv) - stage(qk)`` (0 or 1).
        causal: the causal mask (the K/V loop of a query block stops at its diagonal, where the scores are
            masked; see docs/codegen.md, "Causal attention").
        kv_heads: K/V heads (0: as many as the query heads; N: grouped-query attention).
        varlen: variable-length packed sequences (FlashAttention's varlen interface): each CTA reads its
            sequence's start and length from ``cu_seqlens_q`` / ``cu_seqlens_k`` (docs/codegen.md,
            "Variable-length sequences").
    """

    qk_ahead: tuple[int, ...]
    causal: bool = False
    kv_heads: int = 0
    varlen: bool = False


def one_turn_when_ahead(graph: LoopGraph, turns: tuple[Turn, ...], qk_ahead: tuple[int, ...]) -> tuple[Turn, ...]:
    """A partition that issues ``S`` ahead (its ``qk_ahead`` 1) issues ``S(j+1)`` and ``O += P(j) V(j)`` at one
    point of its program, so it takes one turn per iteration: its ops join the turn of its ``qk``, where the
    schedule's order puts the issue. Split into two turns, it would stop between the two issues until every
    partition in between had issued, and its softmax of ``j + 1`` (after both issues) would wait for theirs:
    the groups' softmaxes, which the schedule runs side by side, would chain (docs/codegen.md)."""
    ahead = {i for i, a in enumerate(qk_ahead) if a == 1}
    home: dict[int, int] = {}
    for k, t in enumerate(turns):
        if t.partition in ahead and any(graph.op(op).attrs.get("role") == "qk" for op in t.ops):
            home[t.partition] = k
    gathered = {i: tuple(op for t in turns if t.partition == i for op in t.ops) for i in home}
    kept = [Turn(t.partition, gathered[t.partition]) if t.partition in home else t
            for k, t in enumerate(turns) if home.get(t.partition, k) == k]
    return merge_runs(kept)


def _subtile(graph: LoopGraph, name: str) -> int:
    return int(graph.op(name).attrs.get("subtile", 0))


def _qk_ahead(schedule: Schedule, compute: tuple[Partition, ...], qks: list[str], pvs: list[str],
              backend: str) -> tuple[int, ...]:
    """Check that each sub-tile stays in its partition; each partition's ``qk_ahead``."""
    graph = schedule.graph
    out = []
    for p in compute:
        mine = [n for n in graph.op_names if _subtile(graph, n) == p.subtile and not graph.op(n).variable_latency]
        strays = [n for n in mine if schedule.assignment[n] != p.group]
        if strays:
            raise UnsupportedFeatureError(f"cannot generate: op {strays[0]!r} runs in another warp group than its "
                                          f"sub-tile's wgmma (a register transfer through shared memory is not "
                                          f"supported by the {backend} backend)")
        (qk,) = [n for n in qks if _subtile(graph, n) == p.subtile]
        (pv,) = [n for n in pvs if _subtile(graph, n) == p.subtile]
        ahead = schedule.stage(pv) - schedule.stage(qk)
        if ahead not in (0, 1):
            raise unsupported(backend, f"{qk!r} issued {ahead} stages before {pv!r}", "0 or 1")
        out.append(ahead)
    return tuple(out)


def plan(schedule: Schedule, backend: str, persistent: bool = False) -> KernelPlan:
    """Plan of the attention forward kernel (``persistent``: one CTA per SM walking query blocks); see the
    module docstring for each decision."""
    check_schedule(schedule, backend)
    graph = schedule.graph
    if ops_with_role(graph, "v_transpose"):
        raise unsupported(backend, "the in-kernel V transpose of the fp8 forward (--v-transpose kernel)",
                          "emitted: --v-transpose prepass")
    check_roles(graph, ROLES, backend)
    missing = [r for r in ("load_k", "load_v", "qk", "exp", "pv") if not ops_with_role(graph, r)]
    if missing:
        raise unsupported(backend, f"graph {graph.name!r} without a {missing[0]} op",
                          "attention needs TMA loads of K and V")
    qks, pvs = ops_with_role(graph, "qk"), ops_with_role(graph, "pv")
    if not qks or len(qks) != len(pvs) or len(qks) > MAX_SUBTILES:
        raise UnsupportedFeatureError(f"cannot generate: attention graph needs one qk and one pv per sub-tile "
                                      f"(1 to {MAX_SUBTILES} sub-tiles) for the {backend} backend")
    tc_ops = qks + pvs
    parts = make_partitions(schedule, tc_ops, {n: _subtile(graph, n) for n in graph.op_names}, backend)
    compute = parts[:-1]
    if len(compute) != len(qks):
        raise unsupported(backend, f"{len(qks)} sub-tiles on {len(compute)} compute warp groups",
                          "one group per sub-tile")
    if any(p.num_warps != compute[0].num_warps for p in compute):
        raise unsupported(backend, "compute warp groups of different sizes")
    qk_ahead = _qk_ahead(schedule, compute, qks, pvs, backend)
    turns = one_turn_when_ahead(graph, cut_turns(schedule, compute, tc_ops), qk_ahead)
    turns = in_program_order(graph, turns, PROGRAM_ORDER, backend)
    if turns:
        compute = tuple(with_turn_points(graph, p, turns, i, PROGRAM_ORDER) for i, p in enumerate(compute))
    rings = []
    for load_role, name, readers in (("load_k", "k", qks), ("load_v", "v", pvs)):
        (load,) = ops_with_role(graph, load_role)
        release = max(readers, key=schedule.stage)
        depth, why = ring_depth(schedule, load, release)
        rings.append(Ring(name, load, tuple(readers), release, depth, why, name))
    barriers = tuple(Barrier(r.name, (r.name,), r.depth, len(compute)) for r in rings)
    head_dim = int(graph.attrs.get("head_dim", 128))
    if head_dim not in HEAD_DIMS:
        raise unsupported(backend, f"head dim {head_dim}", ", ".join(map(str, HEAD_DIMS)))
    qk_attrs = graph.op(qks[0]).attrs
    sub_m = int(qk_attrs.get("m", 16 * compute[0].num_warps))
    tile = {"block_m": sub_m * len(compute), "sub_m": sub_m,
            "block_n": int(graph.attrs.get("block_n", qk_attrs.get("n", 128))), "head_dim": head_dim}
    _check_flash_smem(schedule, tile, rings, backend)
    kv_heads = int(graph.attrs.get("kv_heads", 0))
    if kv_heads < 0:
        raise UnsupportedFeatureError(f"cannot generate: kv_heads {kv_heads} (0 or a positive head count)")
    varlen = bool(graph.attrs.get("varlen", False))
    if varlen and backend.lower() != "gluon":
        raise unsupported(backend, "variable-length sequences (varlen)", "emitted by the Gluon backend")
    causal = bool(graph.attrs.get("causal", False))
    if (causal or kv_heads) and backend.lower() != "gluon":      # its body writes neither, so it must not ignore them
        raise unsupported(backend, "the causal mask" if causal else "grouped K/V heads", "emitted by the Gluon "
                          "backend; this one writes the non-causal forward with one K/V head per query head")
    if varlen and persistent:
        raise unsupported(backend, "a persistent varlen forward", "varlen runs one CTA per query block")
    if varlen and str(graph.attrs.get("dtype", "fp16")) in FP8_DTYPES:
        raise unsupported(backend, "an fp8 varlen forward", "varlen takes fp16 and bf16")
    waits = ring_waits(graph, rings) + [retire_wait(graph, p.roles[r]) for p in compute for r in ("qk", "pv")]
    waits += waits_for_turns(graph, turns, PROGRAM_ORDER)
    dtypes = DTYPES + FP8_DTYPES if backend.lower() == "gluon" else DTYPES
    return make_plan(schedule, FAMILY.name, backend, dtypes, tile=tile, partitions=compute + (parts[-1],),
                     rings=tuple(rings), barriers=barriers, waits=tuple(waits), turns=turns, persistent=persistent,
                     decisions=FlashDecisions(qk_ahead, causal, kv_heads, varlen))


def _check_flash_smem(schedule: Schedule, tile: dict[str, int], rings: list[Ring], backend: str) -> None:
    """The Q tile, the K/V rings and their barriers (Q, ring ready/empty, a tensor-core turn per compute
    partition) must fit the machine's shared memory per block (head dim 256 needs ``--block-n 64``)."""
    capacity = get_machine(schedule.arch).smem_per_block
    esize = DTYPE_BYTES.get(str(schedule.graph.attrs.get("dtype", "fp16")), 2)   # 1 for fp8, 2 for fp16 / bf16
    barriers = 1 + 2 * sum(r.depth for r in rings) + tile["block_m"] // 64     # Q, ring ready/empty, turns
    need = smem_bytes([tile["block_m"] * tile["head_dim"] * esize,
                       *(r.depth * tile["block_n"] * tile["head_dim"] * esize for r in rings)], barriers)
    if need > capacity:
        raise UnsupportedFeatureError(
            f"cannot generate: the Q tile, the K/V rings and their barriers need {need} bytes of shared memory, "
            f"more than the {capacity} of {schedule.arch} (block_m {tile['block_m']}, block_n {tile['block_n']}, "
            f"head dim {tile['head_dim']}, ring depths {'/'.join(str(r.depth) for r in rings)}; {backend} "
            f"backend); use a smaller --block-n or --streaming-depth")
