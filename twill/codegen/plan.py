"""From a schedule to a kernel plan: every decision a kernel renderer needs, each traced to the schedule.

A :class:`KernelPlan` is frozen data derived from a :class:`~twill.schedule.result.Schedule` (with a warp
assignment) and its loop graph. Renderers (``twill.codegen.gluon`` today) consume only the plan: they never
look at the schedule or the graph, so another backend renders the same decisions.

Policy (documented in ``docs/codegen.md``):

* **Partitions.** One partition per warp group of the schedule. The group holding the variable-latency TMA
  loads becomes the ``load`` partition (a worker). Compute groups hold the tensor-core ops, one per sub-tile
  (partition index = sub-tile); the first is the *default* partition (it runs with the kernel's
  ``num_warps``), the others are workers with the schedule's register budget. Each compute partition maps
  the kernel's roles to its ops (``roles``).
* **Rings and barriers.** Every edge from a TMA load into a compute group becomes a shared-memory ring with
  ``ready``/``empty`` barriers. A buffer is held from the load until its last reader releases it, so
  ``depth = max(stage(release) - stage(load) + 1, least depth)``; the releasing op is the ``mma_wait``
  (GEMM) or the tensor-core op itself (attention). Rings of equal depth and release point share one
  barrier pair (one wait and one ``expect`` of both tiles' bytes).
* **Waits.** Each wait the kernel performs is a :class:`Wait` naming the dependence that forces it: the
  edge (source, latency, distance) of a ring's ``ready`` and of an asynchronous MMA's retirement
  (``wgmma``), the buffer reuse ``depth`` iterations later for ``empty``, the tensor-core order for ``turn``.
* **Stages.** GEMM: ``mma_lag = stage(mma_wait) - stage(mma)`` MMA groups stay in flight. Attention:
  ``qk_ahead = stage(pv) - stage(qk)`` per partition (0 or 1): with 1, ``S = Q K^T`` of iteration ``j + 1``
  is issued together with ``O += P V`` of iteration ``j`` and the softmax of ``j + 1`` overlaps that PV
  (FA3's intra-warp-group pipeline).
* **Tensor-core order.** With several compute partitions, the steady-state order of their tensor-core ops
  (by ``t mod II``) is cut into *turns*: maximal runs of one partition's ops (cyclically merged). A
  partition waits for its turn before the first op of each of its turns and, after the last, passes the
  tensor core to the owner of the next turn (a round robin over two or three partitions, in the order the
  schedule chose); within a turn it issues its ops in program order (``qk`` before ``pv``). Every
  partition takes its turns in program order: the cyclic order starts where each partition's ``qk`` turn
  comes before its ``pv`` turn. A partition with ``qk_ahead`` 1 issues both at one program point, so it
  takes one turn, at its ``qk``'s place in that order.
* **Attention variants.** ``causal`` and ``kv_heads`` (graph attributes) do not change the loop body or the
  schedule; they are carried to the renderer, which bounds each query block's trip count at its diagonal
  and masks the diagonal iterations, and maps query heads onto K/V heads. The Q tile and the K/V rings must
  fit the machine's shared memory per block.
* **Persistence** (GEMM, a code-generator choice, ``persistent``): the schedule is the steady state of one
  output tile's K loop either way; a persistent kernel launches at most one CTA per SM and walks its tiles
  in the same grouped order, with one ring running over (tile, k). The rings and the C staging buffer are
  then live together and must fit the machine's shared memory per block; when the whole tile does not, it
  is staged in two column halves (``epilogue_split`` 2), and when that does not fit either, refused. The
  attention forward's persistent kernel (Gluon) walks query blocks the same way: the loop is one query
  block's key loop either way, the K/V rings run on across blocks and the Q buffer is handed back to the
  producer once a block's last ``qk`` has completed, so no buffer is added.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.machine.models import get_machine
from twill.quote import text
from twill.schedule.result import Schedule, WarpGroup

GEMM_ROLES = ("load_a", "load_b", "mma", "mma_wait")
FLASH_ROLES = ("load_k", "load_v", "qk", "rowmax", "exp", "rowsum", "alpha", "rescale", "pv")
#: Order in which an attention compute partition issues its tensor-core ops within one loop body.
FLASH_PROGRAM_ORDER = ("qk", "pv")
FLASH_BWD_ROLES = ("load_q", "load_do", "load_stats", "qk", "dp", "exp", "p_cvt", "ds", "ds_store", "dv", "dk",
                   "dq", "dq_store", "dq_atomic")
#: Tensor-core ops of the attention backward and the ring each reads (``None``: only resident K/V).
FLASH_BWD_MMAS = {"qk": "q", "dp": "do", "dv": "do", "dk": "q", "dq": None}
#: Head dimensions of the attention backward (dK and dV are register accumulators of N = head dim).
FLASH_BWD_HEAD_DIMS = (64, 128)
DTYPES = ("fp16", "bf16")
#: Most attention sub-tiles (compute partitions) the renderers support: three 64-row groups, FA3's BLOCK_M = 192.
FLASH_MAX_SUBTILES = 3
#: Attention head dimensions the renderers support (the O accumulator is one wgmma of N = head dim <= 256).
FLASH_HEAD_DIMS = (64, 128, 256)
ARCHS = ("h100", "h200")
#: Register budget of the TMA producer partition when the schedule gives none below it (setmaxnreg minimum).
LOAD_REGS_MIN = 24


@dataclass(frozen=True)
class Placement:
    """One op as the schedule placed it (for headers, charts and comments).

    Attributes:
        name, role: the op and its ``attrs["role"]``.
        start, stage, residue: start cycle, ``start // II`` and ``start % II``.
        cycles: its latency in cycles.
        group: its warp group (``None`` without one).
    """

    name: str
    role: str
    start: int
    stage: int
    residue: int
    cycles: int
    group: int | None


@dataclass(frozen=True)
class Wait:
    """One wait of the kernel and the dependence that forces it.

    Attributes:
        kind: ``ready`` (a ring buffer was filled), ``empty`` (a ring buffer was released), ``wgmma`` (an
            asynchronous MMA retired) or ``turn`` (the other partition handed over the tensor core).
        op: the op that waits.
        source: the op waited for.
        latency: cycles the schedule keeps between them (the edge's delay; for a turn, the tensor-core
            cycles of the source).
        distance: iterations from ``source`` to ``op`` (for ``empty``, the ring depth).
    """

    kind: str
    op: str
    source: str
    latency: int
    distance: int

    @property
    def why(self) -> str:
        """``source -> op, latency N[, distance D]``."""
        tail = f", distance {self.distance}" if self.distance else ""
        return f"{self.source} -> {self.op}, latency {self.latency}{tail}"


@dataclass(frozen=True)
class Partition:
    """One warp-specialized partition.

    Attributes:
        name: ``compute0``, ``compute1`` or ``load``.
        role: ``load`` or ``compute``.
        group: id of the schedule's warp group, and ``group_role`` its role there.
        num_warps: warps of the partition (the schedule's ``WarpGroup.num_warps``).
        regs: per-thread register budget (``setmaxnreg``); ignored for the default partition, whose budget
            the compiler derives from the workers'.
        ops: the schedule's ops run by this partition, in steady-state order.
        roles: role -> op for the ops of a compute partition (``{"qk": "qk_a", ...}``).
        subtile: the sub-tile a compute partition owns (= its index among the compute partitions).
        qk_ahead: attention: ``stage(pv) - stage(qk)`` (0 or 1).
        turn_waits: op -> index of the turn (among this partition's turns) it waits for before issuing.
        turn_passes: op -> the compute partition it passes the tensor core to after issuing it (the owner of
            the next turn in the steady-state tensor-core order).
    """

    name: str
    role: str
    group: int
    group_role: str
    num_warps: int
    regs: int
    ops: tuple[str, ...]
    roles: dict[str, str] = field(default_factory=dict)
    subtile: int = 0
    qk_ahead: int = 0
    turn_waits: dict[str, int] = field(default_factory=dict)
    turn_passes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Ring:
    """A shared-memory ring for one cross-warp-group edge ``producer -> consumers``.

    Attributes:
        name: short name (``a``, ``b``, ``k``, ``v``).
        producer: the TMA load op.
        consumers: the tensor-core ops that read a buffer.
        release: the op after which a buffer is released.
        depth: buffers; see the module docstring for the formula, and ``why`` for its derivation.
        barrier: name of the ready/empty barrier pair the ring uses.
    """

    name: str
    producer: str
    consumers: tuple[str, ...]
    release: str
    depth: int
    why: str
    barrier: str


@dataclass(frozen=True)
class Barrier:
    """A ready/empty barrier pair shared by one or more rings of equal depth and release point.

    Attributes:
        name: ``a``, ``ab``, ``k``...
        rings: the rings it guards, in producer order (the producer waits and expects at the first).
        depth: buffers (= the rings' depth).
        arrivals: compute partitions that release each buffer (the ``empty`` barrier's count).
    """

    name: str
    rings: tuple[str, ...]
    depth: int
    arrivals: int


@dataclass(frozen=True)
class Turn:
    """A run of one compute partition's tensor-core ops in the steady-state tensor-core order."""

    partition: int
    ops: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class KernelPlan:
    """Everything a renderer needs, derived from one schedule.

    Attributes:
        kernel: ``gemm`` or ``flash-fwd``.
        graph, arch, solver, status: the schedule's graph name, target, solver and status.
        ii, ii_lower_bound, length, num_stages: the schedule's II, its lower bound, L and stages.
        placements: every op as scheduled, in graph order.
        dtype: operand dtype (``fp16``/``bf16``).
        tile: tile sizes (``block_m``, ``block_n``, ``block_k`` or ``head_dim``, ``sub_m``).
        partitions: compute partitions first (the first is the default partition), then the load partition.
        rings: one per TMA-load edge, in graph order; ``barriers`` the ready/empty pairs they use.
        waits: every wait of the kernel with the dependence that forces it.
        mma_lag: GEMM MMA wait lag (``stage(mma_wait) - stage(mma)``).
        turns: tensor-core turns between compute partitions (empty with one compute partition).
        causal: attention: the causal mask (the K/V loop of a query block stops at its diagonal, where the
            scores are masked; see docs/codegen.md, "Causal attention").
        kv_heads: attention: K/V heads (0: as many as the query heads; N: grouped-query attention).
        dq_depth: attention backward: buffers of the fp32 dQ staging buffer between ``dq_store`` (compute) and
            ``dq_atomic`` (producer): ``stage(dq_atomic) - stage(dq_store) + 1``.
        dq_lag: attention backward: iterations between the producer's loads and its ``dq_atomic`` of the
            same iteration, ``stage(dq_atomic) - stage(load_q)`` (in iteration j it reduces iteration
            ``j - dq_lag``).
        persistent: one CTA per SM at most, each walking output tiles (GEMM) or query blocks (attention
            forward, Gluon); a code-generator choice, not read from the schedule (docs/codegen.md,
            "Persistent GEMM", "Persistent attention forward").
        epilogue_split: persistent GEMM: column slices the C tile is stored in through one staging buffer of
            ``block_n / epilogue_split`` columns (1, or 2 when rings + the whole tile overflow shared memory).
    """

    kernel: str
    graph: str
    arch: str
    solver: str
    status: str
    ii: int
    ii_lower_bound: int
    length: int
    num_stages: int
    placements: tuple[Placement, ...]
    dtype: str
    tile: dict[str, int]
    partitions: tuple[Partition, ...]
    rings: tuple[Ring, ...]
    barriers: tuple[Barrier, ...]
    waits: tuple[Wait, ...]
    mma_lag: int = 0
    turns: tuple[Turn, ...] = ()
    causal: bool = False
    kv_heads: int = 0
    dq_depth: int = 0
    dq_lag: int = 0
    persistent: bool = False
    epilogue_split: int = 1

    @property
    def compute(self) -> tuple[Partition, ...]:
        """The compute partitions (the first is the default partition)."""
        return tuple(p for p in self.partitions if p.role == "compute")

    @property
    def load(self) -> Partition:
        """The TMA producer partition."""
        return next(p for p in self.partitions if p.role == "load")

    @property
    def qk_ahead(self) -> int:
        """Attention: the largest ``stage(pv) - stage(qk)`` over the compute partitions."""
        return max(p.qk_ahead for p in self.compute)

    @property
    def turn_counts(self) -> tuple[int, ...]:
        """Tensor-core turns each compute partition takes per loop iteration (zeros without ping-pong)."""
        return tuple(sum(t.partition == i for t in self.turns) for i in range(len(self.compute)))

    def barrier(self, name: str) -> Barrier:
        """The barrier pair called ``name``."""
        return next(b for b in self.barriers if b.name == name)

    def placement(self, op: str) -> Placement:
        """Where the schedule placed ``op``."""
        return next(p for p in self.placements if p.name == op)

    def wait(self, kind: str, op: str) -> Wait:
        """The ``kind`` wait of ``op``."""
        return next(w for w in self.waits if w.kind == kind and w.op == op)

    def retire(self, mma: str) -> Wait:
        """The wait for the asynchronous ``mma`` to retire."""
        return next(w for w in self.waits if w.kind == "wgmma" and w.source == mma)


def quoted_plan(plan: KernelPlan) -> KernelPlan:
    """``plan`` with every string that came from the graph or schedule file (graph and op names, solver,
    status, arch, roles, and the ``why`` texts that name ops) passed through :func:`twill.quote.text`:
    the plan a renderer writes from, so an input name can only be text inside a comment, docstring or string
    literal of the emitted module. :func:`~twill.quote.text` is one-to-one and leaves plain names as
    they are, so lookups by name within the plan still work and the built-in kernels render unchanged."""
    q = text

    def names(ops: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(q(n) for n in ops)

    return replace(
        plan, kernel=q(plan.kernel), graph=q(plan.graph), arch=q(plan.arch), solver=q(plan.solver),
        status=q(plan.status), dtype=q(plan.dtype),
        placements=tuple(replace(p, name=q(p.name), role=q(p.role)) for p in plan.placements),
        partitions=tuple(replace(p, name=q(p.name), role=q(p.role), group_role=q(p.group_role), ops=names(p.ops),
                                 roles={q(r): q(n) for r, n in p.roles.items()},
                                 turn_waits={q(n): k for n, k in p.turn_waits.items()},
                                 turn_passes={q(n): k for n, k in p.turn_passes.items()})
                         for p in plan.partitions),
        rings=tuple(replace(r, name=q(r.name), producer=q(r.producer), consumers=names(r.consumers),
                            release=q(r.release), why=q(r.why), barrier=q(r.barrier)) for r in plan.rings),
        barriers=tuple(replace(b, name=q(b.name), rings=names(b.rings)) for b in plan.barriers),
        waits=tuple(replace(w, kind=q(w.kind), op=q(w.op), source=q(w.source)) for w in plan.waits),
        turns=tuple(replace(t, ops=names(t.ops)) for t in plan.turns))


def ops_with_role(graph: LoopGraph, wanted: str) -> list[str]:
    """Names of the ops whose ``attrs["role"]`` is ``wanted``, in graph order."""
    return [op.name for op in graph.ops if op.attrs.get("role") == wanted]


def _unsupported(backend: str, what: str, hint: str = "") -> UnsupportedFeatureError:
    """``cannot generate: <what> not supported by the <backend> backend[ (<hint>)]``."""
    tail = f" ({hint})" if hint else ""
    return UnsupportedFeatureError(f"cannot generate: {what} not supported by the {backend} backend{tail}")


def _check_roles(graph: LoopGraph, known: tuple[str, ...], backend: str) -> None:
    for op in graph.ops:
        r = op.attrs.get("role")
        if r not in known:
            raise _unsupported(backend, f"{r or op.kind} (op {op.name!r})")


def _check_schedule(schedule: Schedule, backend: str) -> None:
    if schedule.arch not in ARCHS:
        raise UnsupportedFeatureError(f"cannot generate: arch {schedule.arch!r} not supported by the {backend} "
                                      f"backend (Hopper only: {', '.join(ARCHS)})")
    if not schedule.assignment or not schedule.warps:
        raise UnsupportedFeatureError(f"cannot generate: a schedule without warp assignment is not supported by "
                                      f"the {backend} backend (solve with warp specialization)")


def _dtype(graph: LoopGraph, backend: str) -> str:
    dtype = str(graph.attrs.get("dtype", "fp16"))
    if dtype not in DTYPES:
        raise UnsupportedFeatureError(f"cannot generate: dtype {dtype} not supported by the {backend} backend "
                                      f"(supported: {', '.join(DTYPES)})")
    return dtype


def _placements(schedule: Schedule) -> tuple[Placement, ...]:
    graph = schedule.graph
    return tuple(Placement(op.name, str(op.attrs.get("role", "")), schedule.start(op.name),
                           schedule.stage(op.name), schedule.residue(op.name), op.cycles,
                           schedule.assignment.get(op.name)) for op in graph.ops)


def _partitions(schedule: Schedule, tc_ops: list[str], subtile_of: dict[str, int],
                backend: str) -> tuple[Partition, ...]:
    """Compute partitions (groups holding tensor-core ops, ordered by sub-tile) then the load partition."""
    graph = schedule.graph
    loads = [op.name for op in graph.ops if op.variable_latency]
    load_groups = {schedule.assignment[n] for n in loads}
    if len(load_groups) != 1:
        raise _unsupported(backend, "TMA loads spread over several warp groups are",
                           "one W_vl producer warp group expected")
    compute_ids = sorted({schedule.assignment[n] for n in tc_ops}, key=lambda g: min(
        subtile_of[n] for n in tc_ops if schedule.assignment[n] == g))
    load_id = load_groups.pop()
    if load_id in compute_ids:
        raise _unsupported(backend, "TMA loads and wgmma in one warp group are",
                           "warp specialization needs a producer group")
    order = schedule.steady_state_order()
    parts = []
    for index, gid in enumerate(compute_ids):
        group: WarpGroup = schedule.warps[gid]
        if group.num_warps not in (4, 8):
            raise _unsupported(backend, f"compute warp group {gid} with {group.num_warps} warps (wgmma needs 4 "
                                        f"or 8)")
        ops = tuple(n for n in order if schedule.assignment.get(n) == gid)
        subtiles = {subtile_of[n] for n in ops if n in subtile_of}
        subtile = min(subtiles) if subtiles else 0
        if subtile != index:
            mixed = sorted(n for n in ops if subtile_of.get(n, index) != index)
            raise _unsupported(backend, f"sub-tile {subtile} on compute partition {index} (warp group {gid} runs "
                                        f"{', '.join(mixed[:4])}{' ...' if len(mixed) > 4 else ''})",
                               "each compute warp group must run the ops of one sub-tile, in sub-tile order; "
                               "the solver's warp assignment split them: try another --subtiles, --reg-limit "
                               "or --extra-copies")
        roles = {str(graph.op(n).attrs.get("role")): n for n in ops}
        parts.append(Partition(f"compute{index}", "compute", gid, group.role, group.num_warps, group.regs, ops,
                               roles, subtile))
    group = schedule.warps[load_id]
    ops = _producer_order(schedule, [n for n in order if schedule.assignment.get(n) == load_id], loads)
    others = set(ops) - set(loads)
    if others:
        raise _unsupported(backend, f"op {sorted(others)[0]!r} in the TMA producer warp group")
    parts.append(Partition("load", "load", load_id, group.role, 1, max(LOAD_REGS_MIN, group.regs), ops))
    return tuple(parts)


def _producer_order(schedule: Schedule, ops: list[str], loads: list[str]) -> tuple[str, ...]:
    """The producer's ops in steady-state order, its TMA loads among them by start time. Each iteration of the
    producer's loop fills every ring for the same tile, so its loads go in the order the schedule starts them
    for one iteration; the steady-state order would put a load of a later stage (smaller residue) first, and
    the producer, one sequential program, would hold the earlier load back behind that load's wait for a free
    buffer (measured on the H200: a D = 256 schedule with ``load_v`` a stage after ``load_k`` ran at 0.68–0.76×
    cuDNN with V loaded first, docs/performance.md)."""
    mine = sorted((n for n in ops if n in loads), key=lambda n: (schedule.start(n), ops.index(n)))
    slots = iter(mine)
    return tuple(next(slots) if n in loads else n for n in ops)


def ring_depth(schedule: Schedule, load: str, release: str) -> tuple[int, str]:
    """``depth = max(stage(release) - stage(load) + 1, least_depth(load))`` (the load's pinned ring depth, else
    the streaming depth), with its text."""
    lifetime = schedule.stage(release) - schedule.stage(load) + 1
    least = schedule.graph.least_depth(load, schedule.streaming_depth)
    depth = max(lifetime, least)
    why = (f"max(stage({release})={schedule.stage(release)} - stage({load})={schedule.stage(load)} + 1, "
           f"streaming depth {least}) = {depth}")
    return depth, why


def _barriers(rings: list[Ring], arrivals: int) -> tuple[list[Ring], tuple[Barrier, ...]]:
    """Rings of equal depth and release point share one barrier pair (named by their joined names)."""
    groups: dict[tuple[int, str], list[Ring]] = {}
    for r in rings:
        groups.setdefault((r.depth, r.release), []).append(r)
    named = {r.name: "".join(s.name for s in same) for same in groups.values() for r in same}
    barriers = tuple(Barrier(named[same[0].name], tuple(r.name for r in same), same[0].depth, arrivals)
                     for same in groups.values())
    return [replace(r, barrier=named[r.name]) for r in rings], barriers


def _edge_wait(graph: LoopGraph, kind: str, src: str, dst: str) -> Wait:
    """The wait ``kind`` of ``dst`` for ``src``, from their edge."""
    (edge,) = [e for e in graph.in_edges(dst) if e.src == src]
    return Wait(kind, dst, src, edge.delay, edge.distance)


def _retire_wait(graph: LoopGraph, mma: str) -> Wait:
    """The wait for the asynchronous ``mma`` to retire: its first blocking reader (the first reader, or the
    next ``mma`` itself, when none blocks)."""
    out = [e for e in graph.out_edges(mma) if e.dst != mma]
    blocking = [e for e in out if e.blocking] or out
    if not blocking:
        return Wait("wgmma", mma, mma, graph.op(mma).cycles, 1)
    return _edge_wait(graph, "wgmma", mma, blocking[0].dst)


def _ring_waits(graph: LoopGraph, rings: list[Ring]) -> list[Wait]:
    """``ready``: each consumer waits for its load; ``empty``: the load waits for the release ``depth``
    iterations earlier."""
    waits = [_edge_wait(graph, "ready", r.producer, c) for r in rings for c in r.consumers]
    waits += [Wait("empty", r.producer, r.release, 0, r.depth) for r in rings]
    return waits


def _turns(schedule: Schedule, compute: tuple[Partition, ...], tc_ops: list[str]) -> tuple[Turn, ...]:
    """Cut the steady-state tensor-core order into maximal runs of one partition (cyclically merged)."""
    if len(compute) < 2:
        return ()
    index = {p.group: i for i, p in enumerate(compute)}
    return _merge_runs([Turn(index[schedule.assignment[name]], (name,))
                        for name in schedule.steady_state_order() if name in tc_ops])


def _merge_runs(turns: list[Turn]) -> tuple[Turn, ...]:
    """Adjacent turns of one partition as one turn (cyclically: the last merges into the first)."""
    out: list[Turn] = []
    for t in turns:
        if out and out[-1].partition == t.partition:
            out[-1] = Turn(t.partition, out[-1].ops + t.ops)
        else:
            out.append(t)
    if len(out) > 1 and out[0].partition == out[-1].partition:
        out[0] = Turn(out[0].partition, out[-1].ops + out[0].ops)
        out.pop()
    return tuple(out)


def _one_turn_when_ahead(graph: LoopGraph, turns: tuple[Turn, ...],
                         compute: tuple[Partition, ...]) -> tuple[Turn, ...]:
    """A partition that issues ``S`` ahead (``qk_ahead`` 1) issues ``S(j+1)`` and ``O += P(j) V(j)`` at one
    point of its program, so it takes one turn per iteration: its ops join the turn of its ``qk``, where the
    schedule's order puts the issue. Split into two turns, it would stop between the two issues until every
    partition in between had issued, and its softmax of ``j + 1`` (after both issues) would wait for theirs:
    the groups' softmaxes, which the schedule runs side by side, would chain (docs/codegen.md)."""
    ahead = {i for i, p in enumerate(compute) if p.qk_ahead == 1}
    home: dict[int, int] = {}
    for k, t in enumerate(turns):
        if t.partition in ahead and any(graph.op(op).attrs.get("role") == "qk" for op in t.ops):
            home[t.partition] = k
    gathered = {i: tuple(op for t in turns if t.partition == i for op in t.ops) for i in home}
    kept = [Turn(t.partition, gathered[t.partition]) if t.partition in home else t
            for k, t in enumerate(turns) if home.get(t.partition, k) == k]
    return _merge_runs(kept)


def _in_program_order(graph: LoopGraph, turns: tuple[Turn, ...], backend: str) -> tuple[Turn, ...]:
    """The cyclic turn order started where every partition takes its turns in program order (``qk``'s turn
    before ``pv``'s): the first rotation that does, so a partition's k-th turn wait is the k-th arrival on
    its barrier and one token circulates."""
    def ordered(rotation: tuple[Turn, ...]) -> bool:
        keys: dict[int, list[int]] = {}
        for t in rotation:
            keys.setdefault(t.partition, []).extend(
                FLASH_PROGRAM_ORDER.index(str(graph.op(op).attrs.get("role"))) for op in _program_order(graph, t.ops))
        return all(k == sorted(k) for k in keys.values())

    for start in range(len(turns)):
        rotation = turns[start:] + turns[:start]
        if ordered(rotation):
            return rotation
    if not turns:
        return turns
    raise _unsupported(backend, "a tensor-core turn order that no partition program can follow",
                       " -> ".join("/".join(t.ops) for t in turns))


def _program_order(graph: LoopGraph, ops: tuple[str, ...]) -> tuple[str, ...]:
    """``ops`` in the order a compute partition issues them (:data:`FLASH_PROGRAM_ORDER`)."""
    return tuple(sorted(ops, key=lambda op: FLASH_PROGRAM_ORDER.index(str(graph.op(op).attrs.get("role")))))


def _with_turn_points(graph: LoopGraph, part: Partition, turns: tuple[Turn, ...], index: int) -> Partition:
    """Where ``part`` waits for its turn (the first op of each of its turns, in program order) and passes the
    tensor core on (the last op) to the owner of the next turn."""
    mine = [(_program_order(graph, t.ops), turns[(k + 1) % len(turns)].partition)
            for k, t in enumerate(turns) if t.partition == index]
    return replace(part, turn_waits={ops[0]: k for k, (ops, _) in enumerate(mine)},
                   turn_passes={ops[-1]: nxt for ops, nxt in mine})


def _turn_waits(graph: LoopGraph, turns: tuple[Turn, ...]) -> list[Wait]:
    """Each turn waits for the last op of the turn before it (cyclically) to leave the tensor core."""
    waits = []
    for k, t in enumerate(turns):
        prev = _program_order(graph, turns[k - 1].ops)[-1]
        waits.append(Wait("turn", _program_order(graph, t.ops)[0], prev, graph.op(prev).cycles, int(k == 0)))
    return waits


def _plan(schedule: Schedule, kernel: str, backend: str, **decisions: Any) -> KernelPlan:
    return KernelPlan(kernel=kernel, graph=schedule.graph.name, arch=schedule.arch, solver=schedule.solver,
                      status=schedule.status, ii=schedule.ii, ii_lower_bound=schedule.ii_lower_bound,
                      length=schedule.length, num_stages=schedule.num_stages, placements=_placements(schedule),
                      dtype=_dtype(schedule.graph, backend), **decisions)


def gemm_plan(schedule: Schedule, backend: str, persistent: bool = False) -> KernelPlan:
    """Plan of the GEMM kernel (``persistent``: one CTA per SM walking output tiles); see the module docstring
    for each decision."""
    _check_schedule(schedule, backend)
    graph = schedule.graph
    _check_roles(graph, GEMM_ROLES, backend)
    mmas, waits = ops_with_role(graph, "mma"), ops_with_role(graph, "mma_wait")
    if len(mmas) != 1 or len(waits) != 1:
        raise _unsupported(backend, "a sub-tiled GEMM (several mma ops) is")
    mma, wait = mmas[0], waits[0]
    lag = schedule.stage(wait) - schedule.stage(mma)
    if lag < 0:
        raise UnsupportedFeatureError(f"cannot generate: mma_wait scheduled a stage before its mma ({lag})")
    if schedule.assignment[wait] != schedule.assignment[mma]:
        raise _unsupported(backend, "mma_wait in another warp group than its mma")
    parts = _partitions(schedule, [mma], {mma: 0}, backend)
    rings = []
    for load_role, name in (("load_a", "a"), ("load_b", "b")):
        (load,) = ops_with_role(graph, load_role)
        depth, why = ring_depth(schedule, load, wait)
        if depth < lag + 1:
            raise UnsupportedFeatureError(f"cannot generate: ring {name} depth {depth} < wgmma wait lag + 1")
        rings.append(Ring(name, load, (mma,), wait, depth, why, name))
    rings, barriers = _barriers(rings, 1)
    attrs = graph.op(mma).attrs
    tile = {"block_m": int(graph.attrs.get("block_m", attrs.get("m", 128))),
            "block_n": int(graph.attrs.get("block_n", attrs.get("n", 128))),
            "block_k": int(graph.attrs.get("block_k", attrs.get("k", 64)))}
    if tile["block_m"] != 64 * (parts[0].num_warps // 4) and tile["block_m"] % (16 * parts[0].num_warps):
        raise UnsupportedFeatureError(f"cannot generate: block_m {tile['block_m']} not divisible over "
                                      f"{parts[0].num_warps} wgmma warps")
    split = _epilogue_split(schedule, tile, rings, backend) if persistent else 1
    all_waits = _ring_waits(graph, rings) + [_retire_wait(graph, mma)]
    return _plan(schedule, "gemm", backend, tile=tile, partitions=parts, rings=tuple(rings), barriers=barriers,
                 waits=tuple(all_waits), mma_lag=lag, persistent=persistent, epilogue_split=split)


#: Column slices a persistent GEMM may store its C tile in, tried in order (the first that fits is used).
EPILOGUE_SPLITS = (1, 2)


def persistent_smem(tile: dict[str, int], depths: list[int], split: int) -> int:
    """Shared-memory bytes of a persistent GEMM: the A and B rings (``depths``) and the C staging buffer of
    ``block_n / split`` columns, live together (the compute partition stores tile t while the producer fills
    the rings for tile t + 1), plus the ready/empty barriers (8 bytes each)."""
    esize = 2  # fp16 / bf16 bytes
    bm, bn, bk = tile["block_m"], tile["block_n"], tile["block_k"]
    rings = depths[0] * bm * bk * esize + depths[1] * bk * bn * esize
    return rings + bm * (bn // split) * esize + 2 * 8 * max(depths)


def _epilogue_split(schedule: Schedule, tile: dict[str, int], rings: list[Ring], backend: str) -> int:
    """The first of :data:`EPILOGUE_SPLITS` whose staging buffer fits beside the rings in the machine's shared
    memory per block; a one-line refusal when none does."""
    capacity = get_machine(schedule.arch).smem_per_block
    depths = [r.depth for r in rings]
    for split in EPILOGUE_SPLITS:
        need = persistent_smem(tile, depths, split)
        if need <= capacity:
            return split
    raise UnsupportedFeatureError(
        f"cannot generate: a persistent GEMM keeps its A/B rings and a C staging buffer (at least 1/"
        f"{EPILOGUE_SPLITS[-1]} of the tile) in shared memory together, {need} bytes, more than the {capacity} "
        f"of {schedule.arch} (tile {tile['block_m']}x{tile['block_n']}x{tile['block_k']}, ring depths "
        f"{'/'.join(map(str, depths))}; {backend} backend); use a smaller --streaming-depth or tile, or the "
        f"non-persistent kernel")


def _subtile(graph: LoopGraph, name: str) -> int:
    return int(graph.op(name).attrs.get("subtile", 0))


def _flash_compute(schedule: Schedule, compute: tuple[Partition, ...], qks: list[str], pvs: list[str],
                   backend: str) -> tuple[Partition, ...]:
    """Check that each sub-tile stays in its partition and set each partition's ``qk_ahead``."""
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
            raise _unsupported(backend, f"{qk!r} issued {ahead} stages before {pv!r}", "0 or 1")
        out.append(replace(p, qk_ahead=ahead))
    return tuple(out)


def flash_plan(schedule: Schedule, backend: str, persistent: bool = False) -> KernelPlan:
    """Plan of the attention forward kernel (``persistent``: one CTA per SM walking query blocks); see the
    module docstring for each decision."""
    _check_schedule(schedule, backend)
    graph = schedule.graph
    _check_roles(graph, FLASH_ROLES, backend)
    missing = [r for r in ("load_k", "load_v", "qk", "exp", "pv") if not ops_with_role(graph, r)]
    if missing:
        raise _unsupported(backend, f"graph {graph.name!r} without a {missing[0]} op",
                           "attention needs TMA loads of K and V")
    qks, pvs = ops_with_role(graph, "qk"), ops_with_role(graph, "pv")
    if not qks or len(qks) != len(pvs) or len(qks) > FLASH_MAX_SUBTILES:
        raise UnsupportedFeatureError(f"cannot generate: attention graph needs one qk and one pv per sub-tile "
                                      f"(1 to {FLASH_MAX_SUBTILES} sub-tiles) for the {backend} backend")
    tc_ops = qks + pvs
    parts = _partitions(schedule, tc_ops, {n: _subtile(graph, n) for n in graph.op_names}, backend)
    compute = parts[:-1]
    if len(compute) != len(qks):
        raise _unsupported(backend, f"{len(qks)} sub-tiles on {len(compute)} compute warp groups",
                           "one group per sub-tile")
    if any(p.num_warps != compute[0].num_warps for p in compute):
        raise _unsupported(backend, "compute warp groups of different sizes")
    compute = _flash_compute(schedule, compute, qks, pvs, backend)
    turns = _one_turn_when_ahead(graph, _turns(schedule, compute, tc_ops), compute)
    turns = _in_program_order(graph, turns, backend)
    compute = tuple(_with_turn_points(graph, p, turns, i) for i, p in enumerate(compute)) if turns else compute
    rings = []
    for load_role, name, readers in (("load_k", "k", qks), ("load_v", "v", pvs)):
        (load,) = ops_with_role(graph, load_role)
        release = max(readers, key=schedule.stage)
        depth, why = ring_depth(schedule, load, release)
        rings.append(Ring(name, load, tuple(readers), release, depth, why, name))
    barriers = tuple(Barrier(r.name, (r.name,), r.depth, len(compute)) for r in rings)
    head_dim = int(graph.attrs.get("head_dim", 128))
    if head_dim not in FLASH_HEAD_DIMS:
        raise _unsupported(backend, f"head dim {head_dim}", ", ".join(map(str, FLASH_HEAD_DIMS)))
    qk_attrs = graph.op(qks[0]).attrs
    sub_m = int(qk_attrs.get("m", 16 * compute[0].num_warps))
    tile = {"block_m": sub_m * len(compute), "sub_m": sub_m,
            "block_n": int(graph.attrs.get("block_n", qk_attrs.get("n", 128))), "head_dim": head_dim}
    _check_flash_smem(schedule, tile, rings, backend)
    kv_heads = int(graph.attrs.get("kv_heads", 0))
    if kv_heads < 0:
        raise UnsupportedFeatureError(f"cannot generate: kv_heads {kv_heads} (0 or a positive head count)")
    waits = _ring_waits(graph, rings) + [_retire_wait(graph, p.roles[r]) for p in compute for r in ("qk", "pv")]
    waits += _turn_waits(graph, turns)
    return _plan(schedule, "flash-fwd", backend, tile=tile, partitions=compute + (parts[-1],), rings=tuple(rings),
                 barriers=barriers, waits=tuple(waits), turns=turns, causal=bool(graph.attrs.get("causal", False)),
                 kv_heads=kv_heads, persistent=persistent)


def smem_bytes(buffers: list[int], barriers: int) -> int:
    """Shared memory of a kernel's buffers and ``barriers`` mbarriers (8 bytes each), each buffer and the
    barriers counted in whole KiB: the allocator aligns the swizzled tiles, so buffers that add up to exactly a
    block's capacity do not fit beside their barriers (Triton then refuses the kernel only at launch)."""
    return sum(-(-size // 1024) * 1024 for size in (*buffers, 8 * barriers))


def _check_flash_smem(schedule: Schedule, tile: dict[str, int], rings: list[Ring], backend: str) -> None:
    """The Q tile, the K/V rings and their barriers (Q, ring ready/empty, a tensor-core turn per compute
    partition) must fit the machine's shared memory per block (head dim 256 needs ``--block-n 64``)."""
    capacity = get_machine(schedule.arch).smem_per_block
    esize = 2  # fp16 / bf16 bytes
    barriers = 1 + 2 * sum(r.depth for r in rings) + tile["block_m"] // 64     # Q, ring ready/empty, turns
    need = smem_bytes([tile["block_m"] * tile["head_dim"] * esize,
                       *(r.depth * tile["block_n"] * tile["head_dim"] * esize for r in rings)], barriers)
    if need > capacity:
        raise UnsupportedFeatureError(
            f"cannot generate: the Q tile, the K/V rings and their barriers need {need} bytes of shared memory, "
            f"more than the {capacity} of {schedule.arch} (block_m {tile['block_m']}, block_n {tile['block_n']}, "
            f"head dim {tile['head_dim']}, ring depths {'/'.join(str(r.depth) for r in rings)}; {backend} "
            f"backend); use a smaller --block-n or --streaming-depth")


def flash_bwd_plan(schedule: Schedule, backend: str) -> KernelPlan:
    """Plan of the attention backward (Hopper, one compute warp group, FA3's algorithm): the rings of Q, dO
    and the row statistics (LSE, D) with their depths from the schedule, the dQ staging depth between the
    compute group's ``dq_store`` and the producer's ``dq_atomic``, and the waits. The compute ops are issued in
    the schedule's steady-state order over at most two stages; see docs/codegen.md, "Attention backward"."""
    _check_schedule(schedule, backend)
    graph = schedule.graph
    _check_roles(graph, FLASH_BWD_ROLES, backend)
    missing = [r for r in FLASH_BWD_ROLES if len(ops_with_role(graph, r)) != 1]
    if missing:
        raise _unsupported(backend, f"an attention backward graph without exactly one {missing[0]} op is")
    op = {r: ops_with_role(graph, r)[0] for r in FLASH_BWD_ROLES}
    mmas = [op[r] for r in FLASH_BWD_MMAS]
    parts = _partitions(schedule, mmas, {n: 0 for n in graph.op_names}, backend)
    compute = parts[0]
    if len(parts) != 2 or compute.num_warps != 8:
        raise _unsupported(backend, "an attention backward not on one 8-warp compute group is",
                           "FA3's two MMA warp groups cooperate on every tile")
    _check_bwd_stages(schedule, compute, backend)
    rings = []
    for load_role, name in (("load_q", "q"), ("load_do", "do"), ("load_stats", "stats")):
        load = op[load_role]
        readers = tuple(e.dst for e in graph.out_edges(load))
        release = max(readers, key=lambda n: (schedule.stage(n), compute.ops.index(n)))
        depth, why = ring_depth(schedule, load, release)
        rings.append(Ring(name, load, readers, release, depth, why, name))
    rings, barriers = _barriers(rings, 1)
    dq_depth = schedule.stage(op["dq_atomic"]) - schedule.stage(op["dq_store"]) + 1
    dq_lag = schedule.stage(op["dq_atomic"]) - schedule.stage(op["load_q"])
    if dq_lag < 0:
        raise _unsupported(backend, "dq_atomic scheduled a stage before the loads is")
    head_dim = int(graph.attrs.get("head_dim", 128))
    if head_dim not in FLASH_BWD_HEAD_DIMS:
        raise _unsupported(backend, f"head dim {head_dim}", ", ".join(map(str, FLASH_BWD_HEAD_DIMS)))
    tile = {"block_m": int(graph.attrs.get("block_m", 64)), "block_n": int(graph.attrs.get("block_n", 128)),
            "head_dim": head_dim}
    if tile["block_m"] not in (64, 128) or tile["block_n"] != 128:
        raise _unsupported(backend, f"block_m {tile['block_m']}, block_n {tile['block_n']}",
                           "block_m 64 or 128, block_n 128")
    _check_bwd_smem(schedule, tile, rings, dq_depth, backend)
    kv_heads = int(graph.attrs.get("kv_heads", 0))
    waits = _ring_waits(graph, rings) + [_retire_wait(graph, op[r]) for r in FLASH_BWD_MMAS]
    waits += [_edge_wait(graph, "ready", op["dq_store"], op["dq_atomic"]),
              Wait("empty", op["dq_store"], op["dq_atomic"], 0, dq_depth)]
    return _plan(schedule, "flash-bwd", backend, tile=tile, partitions=parts, rings=tuple(rings),
                 barriers=barriers, waits=tuple(waits), causal=bool(graph.attrs.get("causal", False)),
                 kv_heads=kv_heads, dq_depth=dq_depth, dq_lag=dq_lag)


def _check_bwd_stages(schedule: Schedule, compute: Partition, backend: str) -> None:
    """The compute ops span at most two stages, and a value carried from stage s to stage s + 1 is read (for
    iteration j - 1) before it is produced again (for iteration j) in the steady-state order, so one register
    copy holds it."""
    graph = schedule.graph
    stages = sorted({schedule.stage(n) for n in compute.ops})
    if stages[-1] - stages[0] > 1:
        raise _unsupported(backend, f"attention backward compute ops over {stages[-1] - stages[0] + 1} stages are",
                           "one or two")
    for e in graph.edges:
        if e.src in compute.ops and e.dst in compute.ops and e.distance == 0 and \
                schedule.stage(e.dst) > schedule.stage(e.src) and \
                compute.ops.index(e.dst) > compute.ops.index(e.src):
            raise _unsupported(backend, f"{e.src!r} of iteration j + 1 before {e.dst!r} of iteration j is",
                               "the value would need two register copies")


def _check_bwd_smem(schedule: Schedule, tile: dict[str, int], rings: list[Ring], dq_depth: int,
                    backend: str) -> None:
    """Resident K and V, the Q/dO/stats rings, the dS tile, the dQ staging buffers and the mbarriers must fit
    shared memory. Each buffer and the barriers are counted in whole KiB (the allocator aligns the swizzled
    tiles): buffers of exactly the 232 448 bytes of an H200 block (128-row tiles, 3-deep rings) need 233 004
    with their 23 barriers, and Triton refuses that kernel only at launch."""
    capacity = get_machine(schedule.arch).smem_per_block
    bm, bn, d = tile["block_m"], tile["block_n"], tile["head_dim"]
    buffer = {"q": bm * d * 2, "do": bm * d * 2, "stats": 2 * bm * 4}
    barriers = 1 + 2 * dq_depth + 2 * sum(r.depth for r in rings)     # K/V, dQ ready/empty, ring ready/empty
    need = smem_bytes([2 * bn * d * 2, *(r.depth * buffer[r.name] for r in rings), bn * bm * 2,
                       dq_depth * bm * d * 4], barriers)
    if need > capacity:
        raise UnsupportedFeatureError(
            f"cannot generate: the attention backward needs {need} bytes of shared memory, more than the "
            f"{capacity} of {schedule.arch} (head dim {d}, ring depths {'/'.join(str(r.depth) for r in rings)}, "
            f"dQ staging {dq_depth}; {backend} backend); use a smaller --streaming-depth")


def kernel_plan(schedule: Schedule, backend: str, persistent: bool = False) -> KernelPlan:
    """The plan of ``schedule`` for ``backend`` (named in errors), by the graph's ``kernel`` attribute (or,
    failing that, its roles); ``persistent`` asks for a persistent kernel (GEMM only)."""
    graph = schedule.graph
    kind = graph.attrs.get("kernel") or graph.name
    roles = {str(graph.op(n).attrs.get("role", "")) for n in graph.op_names}
    if kind == "gemm" or kind != "flash-bwd" and roles <= set(GEMM_ROLES) and "mma" in roles:
        return gemm_plan(schedule, backend, persistent)
    forward = kind in ("flash-fwd", "flash_fwd") or kind != "flash-bwd" and "qk" in roles and "pv" in roles
    if persistent and not forward:
        raise _unsupported(backend, f"a persistent {kind!r} kernel is", "persistent: gemm, flash-fwd")
    if kind == "flash-bwd":
        return flash_bwd_plan(schedule, backend)
    if forward:
        return flash_plan(schedule, backend, persistent)
    raise _unsupported(backend, f"kernel {kind!r}", "gemm, flash-fwd, flash-bwd")
