"""From a schedule to a kernel plan: the decisions the Gluon emitter renders, each traced to the schedule.

A :class:`KernelPlan` is frozen data derived from a :class:`~twill.schedule.result.Schedule` (with a warp
assignment) and its loop graph. The emitter (``render_*``) never looks at the schedule again.

Policy (documented in ``docs/codegen.md``):

* **Partitions.** One ``gl.warp_specialize`` partition per warp group of the schedule. The group holding the
  variable-latency TMA loads (role ``load``) becomes ``load_partition`` (a worker). Compute groups hold
  the tensor-core ops; the first compute group is the *default* partition (it runs with the kernel's
  ``num_warps``), the others are workers with ``worker_num_regs`` = the schedule's register budget.
* **Rings.** Every edge from a TMA load (load group) into a compute group becomes a shared-memory ring with
  ``ready``/``empty`` mbarriers. A slot is held from the load until its last reader releases it, so
  ``depth = max(stage(release) - stage(load) + 1, streaming_depth)``; the releasing op is the ``mma_wait``
  (GEMM) or the tensor-core op itself (attention, where the wait is implicit in the next wgmma wait).
* **Waits.** The wgmma wait lag of a GEMM is ``stage(mma_wait) - stage(mma)``: ``warpgroup_mma_wait(lag)``
  keeps ``lag`` wgmma groups in flight and releases the slots of iteration ``i - lag``.
  In attention ``qk_ahead = stage(pv) - stage(qk)`` (0 or 1): with 1, ``S = Q K^T`` of iteration
  ``j + 1`` is issued together with ``O += P V`` of iteration ``j`` and the softmax of ``j + 1`` overlaps
  that PV (FA3's intra-warp-group pipeline). Whether the softmax sits in the stage of ``qk`` or of ``pv``
  only rotates the same instruction stream; the emitter always rotates the loop so that no wgmma is in
  flight across the back-edge (ptxas serializes every wgmma otherwise, warning C7514).
* **Tensor-core order.** With several compute groups, the steady-state order of their tensor-core ops
  (by ``t mod II``) is cut into *turns*: maximal runs of one group's ops. Each turn is guarded by a
  ``turn`` mbarrier the previous group arrives on (ping-pong).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.schedule.result import Schedule, WarpGroup

GEMM_ROLES = ("load_a", "load_b", "mma", "mma_wait")
FLASH_ROLES = ("load_k", "load_v", "qk", "rowmax", "exp", "rowsum", "alpha", "rescale", "pv")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
#: Register budget of the TMA producer partition when the schedule gives none below it (setmaxnreg minimum).
LOAD_REGS_MIN = 24


@dataclass(frozen=True)
class Partition:
    """One ``gl.warp_specialize`` partition.

    Attributes:
        name: emitted function name (``load_partition``, ``compute0_partition``).
        role: ``load`` or ``compute``.
        group: id of the schedule's warp group.
        num_warps: warps of the partition (the schedule's ``WarpGroup.num_warps``).
        regs: per-thread register budget (``setmaxnreg``); ignored for the default partition, whose budget
            Triton derives from the workers'.
        ops: the schedule's ops run by this partition, in steady-state order.
        subtile: the sub-tile a compute partition owns (0 without sub-tiling).
        qk_ahead: attention compute partitions: ``stage(pv) - stage(qk)`` of its sub-tile (0 or 1).
    """

    name: str
    role: str
    group: int
    num_warps: int
    regs: int
    ops: tuple[str, ...]
    subtile: int = 0
    qk_ahead: int = 0


@dataclass(frozen=True)
class Ring:
    """A shared-memory ring for one cross-warp-group edge ``producer -> consumers``.

    Attributes:
        name: short name (``a``, ``b``, ``k``, ``v``).
        producer: the TMA load op.
        consumers: the tensor-core ops that read a slot.
        release: the op after which a slot is released (``empty`` arrive).
        depth: slots; see the module docstring for the formula.
        arrivals: compute partitions that arrive on ``empty`` per slot use (the barrier's count).
        why: the derivation of ``depth`` (rendered as a comment).
    """

    name: str
    producer: str
    consumers: tuple[str, ...]
    release: str
    depth: int
    arrivals: int
    why: str


@dataclass(frozen=True)
class Turn:
    """A run of one compute partition's tensor-core ops in the steady-state tensor-core order."""

    partition: int
    ops: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class KernelPlan:
    """Everything the Gluon emitter needs, derived from one schedule.

    Attributes:
        kernel: ``gemm`` or ``flash-fwd``.
        schedule: the schedule (kept for the header chart only).
        dtype: operand dtype (``fp16``/``bf16``).
        tile: tile sizes (``block_m``, ``block_n``, ``block_k`` or ``head_dim``, ``sub_m``).
        partitions: compute partitions first (the first is the default partition), then the load partition.
        rings: one per TMA-load edge, in graph order.
        mma_lag: GEMM wgmma wait lag (``stage(mma_wait) - stage(mma)``).
        qk_ahead: attention: the largest ``stage(pv) - stage(qk)`` over the compute partitions.
        turns: tensor-core turns between compute partitions (empty with one compute partition).
    """

    kernel: str
    schedule: Schedule
    dtype: str
    tile: dict[str, int]
    partitions: tuple[Partition, ...]
    rings: tuple[Ring, ...]
    mma_lag: int = 0
    qk_ahead: int = 0
    turns: tuple[Turn, ...] = ()

    @property
    def compute(self) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.role == "compute")

    @property
    def load(self) -> Partition:
        return next(p for p in self.partitions if p.role == "load")

    def ring(self, name: str) -> Ring:
        return next(r for r in self.rings if r.name == name)


def role(graph: LoopGraph, name: str) -> str:
    return str(graph.op(name).attrs.get("role", ""))


def ops_with_role(graph: LoopGraph, wanted: str) -> list[str]:
    return [op.name for op in graph.ops if op.attrs.get("role") == wanted]


def _check_roles(graph: LoopGraph, known: tuple[str, ...]) -> None:
    for op in graph.ops:
        r = op.attrs.get("role")
        if r not in known:
            raise UnsupportedFeatureError(f"cannot generate: {r or op.kind} (op {op.name!r}) not supported by the "
                                          f"Gluon backend")


def _check_schedule(schedule: Schedule) -> None:
    if schedule.arch not in ("h100", "h200"):
        raise UnsupportedFeatureError(f"cannot generate: arch {schedule.arch!r} not supported by the Gluon "
                                      f"backend (Hopper only: h100, h200)")
    if not schedule.assignment or not schedule.warps:
        raise UnsupportedFeatureError("cannot generate: a schedule without warp assignment is not supported by the "
                                      "Gluon backend (solve with warp specialization)")


def _dtype(graph: LoopGraph) -> str:
    dtype = str(graph.attrs.get("dtype", "fp16"))
    if dtype not in DTYPES:
        raise UnsupportedFeatureError(f"cannot generate: dtype {dtype} not supported by the Gluon backend "
                                      f"(supported: {', '.join(DTYPES)})")
    return dtype


def _group_of(schedule: Schedule, op: str) -> WarpGroup:
    group = schedule.warp_of(op)
    if group is None:
        raise UnsupportedFeatureError(f"cannot generate: op {op!r} has no warp group in the schedule")
    return group


def _partitions(schedule: Schedule, tc_ops: list[str], subtile_of: dict[str, int]) -> tuple[Partition, ...]:
    """Compute partitions (groups holding tensor-core ops, ordered by sub-tile) then the load partition."""
    graph = schedule.graph
    loads = [op.name for op in graph.ops if op.variable_latency]
    load_groups = {schedule.assignment[n] for n in loads}
    if len(load_groups) != 1:
        raise UnsupportedFeatureError("cannot generate: TMA loads spread over several warp groups are not "
                                      "supported by the Gluon backend (one W_vl producer warp group expected)")
    compute_ids = sorted({schedule.assignment[n] for n in tc_ops}, key=lambda g: min(
        subtile_of[n] for n in tc_ops if schedule.assignment[n] == g))
    load_id = load_groups.pop()
    if load_id in compute_ids:
        raise UnsupportedFeatureError("cannot generate: TMA loads and wgmma in one warp group are not supported "
                                      "by the Gluon backend (warp specialization needs a producer group)")
    order = schedule.steady_state_order()
    parts = []
    for index, gid in enumerate(compute_ids):
        group = schedule.warps[gid]
        if group.num_warps not in (4, 8):
            raise UnsupportedFeatureError(f"cannot generate: compute warp group {gid} with {group.num_warps} "
                                          f"warps (wgmma needs 4 or 8) not supported by the Gluon backend")
        ops = tuple(n for n in order if schedule.assignment.get(n) == gid)
        subtiles = {subtile_of[n] for n in ops if n in subtile_of}
        parts.append(Partition(f"compute{index}_partition", "compute", gid, group.num_warps, group.regs, ops,
                               min(subtiles) if subtiles else 0))
    group = schedule.warps[load_id]
    ops = tuple(n for n in order if schedule.assignment.get(n) == load_id)
    others = set(ops) - set(loads)
    if others:
        raise UnsupportedFeatureError(f"cannot generate: op {sorted(others)[0]!r} in the TMA producer warp group "
                                      f"not supported by the Gluon backend")
    parts.append(Partition("load_partition", "load", load_id, 1, max(LOAD_REGS_MIN, group.regs), ops))
    return tuple(parts)


def ring_depth(schedule: Schedule, load: str, release: str) -> tuple[int, str]:
    """``depth = max(stage(release) - stage(load) + 1, least_depth(load))`` (the load's pinned ring depth, else
    the streaming depth), with its text."""
    lifetime = schedule.stage(release) - schedule.stage(load) + 1
    least = schedule.graph.least_depth(load, schedule.streaming_depth)
    depth = max(lifetime, least)
    why = (f"max(stage({release})={schedule.stage(release)} - stage({load})={schedule.stage(load)} + 1, "
           f"streaming depth {least}) = {depth}")
    return depth, why


def _turns(schedule: Schedule, compute: tuple[Partition, ...], tc_ops: list[str]) -> tuple[Turn, ...]:
    """Cut the steady-state tensor-core order into maximal runs of one partition (cyclically merged)."""
    if len(compute) < 2:
        return ()
    index = {p.group: i for i, p in enumerate(compute)}
    runs: list[list[Any]] = []
    for name in schedule.steady_state_order():
        if name not in tc_ops:
            continue
        part = index[schedule.assignment[name]]
        if runs and runs[-1][0] == part:
            runs[-1][1].append(name)
        else:
            runs.append([part, [name]])
    if len(runs) > 1 and runs[0][0] == runs[-1][0]:
        runs[0][1] = runs[-1][1] + runs[0][1]
        runs.pop()
    return tuple(Turn(p, tuple(ops)) for p, ops in runs)


def gemm_plan(schedule: Schedule) -> KernelPlan:
    """Plan of the GEMM kernel; see the module docstring for each decision."""
    _check_schedule(schedule)
    graph = schedule.graph
    _check_roles(graph, GEMM_ROLES)
    mmas, waits = ops_with_role(graph, "mma"), ops_with_role(graph, "mma_wait")
    if len(mmas) != 1 or len(waits) != 1:
        raise UnsupportedFeatureError("cannot generate: a sub-tiled GEMM (several mma ops) is not supported by "
                                      "the Gluon backend")
    mma, wait = mmas[0], waits[0]
    lag = schedule.stage(wait) - schedule.stage(mma)
    if lag < 0:
        raise UnsupportedFeatureError(f"cannot generate: mma_wait scheduled a stage before its mma ({lag})")
    if schedule.assignment[wait] != schedule.assignment[mma]:
        raise UnsupportedFeatureError("cannot generate: mma_wait in another warp group than its mma not "
                                      "supported by the Gluon backend")
    parts = _partitions(schedule, [mma], {mma: 0})
    rings = []
    for load_role, name in (("load_a", "a"), ("load_b", "b")):
        (load,) = ops_with_role(graph, load_role)
        depth, why = ring_depth(schedule, load, wait)
        if depth < lag + 1:
            raise UnsupportedFeatureError(f"cannot generate: ring {name} depth {depth} < wgmma wait lag + 1")
        rings.append(Ring(name, load, (mma,), wait, depth, 1, why))
    attrs = graph.op(mma).attrs
    tile = {"block_m": int(graph.attrs.get("block_m", attrs.get("m", 128))),
            "block_n": int(graph.attrs.get("block_n", attrs.get("n", 128))),
            "block_k": int(graph.attrs.get("block_k", attrs.get("k", 64)))}
    if tile["block_m"] != 64 * (parts[0].num_warps // 4) and tile["block_m"] % (16 * parts[0].num_warps):
        raise UnsupportedFeatureError(f"cannot generate: block_m {tile['block_m']} not divisible over "
                                      f"{parts[0].num_warps} wgmma warps")
    return KernelPlan(kernel="gemm", schedule=schedule, dtype=_dtype(graph), tile=tile, partitions=parts,
                      rings=tuple(rings), mma_lag=lag)


def _subtile(graph: LoopGraph, name: str) -> int:
    return int(graph.op(name).attrs.get("subtile", 0))


def flash_plan(schedule: Schedule) -> KernelPlan:
    """Plan of the attention forward kernel; see the module docstring for each decision."""
    _check_schedule(schedule)
    graph = schedule.graph
    _check_roles(graph, FLASH_ROLES)
    missing = [r for r in ("load_k", "load_v", "qk", "exp", "pv") if not ops_with_role(graph, r)]
    if missing:
        raise UnsupportedFeatureError(f"cannot generate: graph {graph.name!r} without a {missing[0]} op not "
                                      f"supported by the Gluon backend (attention needs TMA loads of K and V)")
    if graph.attrs.get("causal"):
        raise UnsupportedFeatureError("cannot generate: causal masking not supported by the Gluon backend")
    qks, pvs = ops_with_role(graph, "qk"), ops_with_role(graph, "pv")
    if not qks or len(qks) != len(pvs) or len(qks) > 2:
        raise UnsupportedFeatureError("cannot generate: attention graph needs one qk and one pv per sub-tile "
                                      "(1 or 2 sub-tiles) for the Gluon backend")
    subtile_of = {n: _subtile(graph, n) for n in graph.op_names}
    tc_ops = qks + pvs
    parts = _partitions(schedule, tc_ops, subtile_of)
    compute = tuple(p for p in parts if p.role == "compute")
    if len(compute) != len(qks):
        raise UnsupportedFeatureError(f"cannot generate: {len(qks)} sub-tiles on {len(compute)} compute warp "
                                      f"groups not supported by the Gluon backend (one group per sub-tile)")
    with_ahead = []
    for p in compute:
        mine = [n for n in graph.op_names if subtile_of[n] == p.subtile and not graph.op(n).variable_latency]
        strays = [n for n in mine if schedule.assignment[n] != p.group]
        if strays:
            raise UnsupportedFeatureError(f"cannot generate: op {strays[0]!r} runs in another warp group than "
                                          f"its sub-tile's wgmma (a register transfer through shared memory is "
                                          f"not supported by the Gluon backend)")
        (qk,) = [n for n in qks if subtile_of[n] == p.subtile]
        (pv,) = [n for n in pvs if subtile_of[n] == p.subtile]
        ahead = schedule.stage(pv) - schedule.stage(qk)
        if ahead not in (0, 1):
            raise UnsupportedFeatureError(f"cannot generate: {qk!r} issued {ahead} stages before {pv!r} not "
                                          f"supported by the Gluon backend (0 or 1)")
        with_ahead.append(replace(p, qk_ahead=ahead))
    compute = tuple(with_ahead)
    parts = compute + (parts[-1],)
    rings = []
    for load_role, name, readers in (("load_k", "k", qks), ("load_v", "v", pvs)):
        (load,) = ops_with_role(graph, load_role)
        release = max(readers, key=schedule.stage)
        depth, why = ring_depth(schedule, load, release)
        rings.append(Ring(name, load, tuple(readers), release, depth, len(compute), why))
    head_dim = int(graph.attrs.get("head_dim", 128))
    if head_dim not in (64, 128):
        raise UnsupportedFeatureError(f"cannot generate: head dim {head_dim} not supported by the Gluon backend "
                                      f"(64, 128)")
    qk_attrs = graph.op(qks[0]).attrs
    block_n = int(graph.attrs.get("block_n", qk_attrs.get("n", 128)))
    sub_m = int(qk_attrs.get("m", 16 * compute[0].num_warps))
    if any(p.num_warps != compute[0].num_warps for p in compute):
        raise UnsupportedFeatureError("cannot generate: compute warp groups of different sizes not supported by "
                                      "the Gluon backend")
    tile = {"block_m": sub_m * len(compute), "sub_m": sub_m, "block_n": block_n, "head_dim": head_dim}
    return KernelPlan(kernel="flash-fwd", schedule=schedule, dtype=_dtype(graph), tile=tile, partitions=parts,
                      rings=tuple(rings), qk_ahead=max(p.qk_ahead for p in compute),
                      turns=_turns(schedule, compute, tc_ops))


def kernel_plan(schedule: Schedule) -> KernelPlan:
    """Dispatch on the graph's ``kernel`` attribute (or, failing that, its roles)."""
    graph = schedule.graph
    kind = graph.attrs.get("kernel") or graph.name
    roles = {role(graph, n) for n in graph.op_names}
    if kind == "gemm" or roles <= set(GEMM_ROLES) and "mma" in roles:
        return gemm_plan(schedule)
    if kind in ("flash-fwd", "flash_fwd") or "qk" in roles and "pv" in roles:
        return flash_plan(schedule)
    raise UnsupportedFeatureError(f"cannot generate: kernel {kind!r} not supported by the Gluon backend "
                                  f"(gemm, flash-fwd)")
