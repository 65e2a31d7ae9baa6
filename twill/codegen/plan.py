"""From a schedule to a kernel plan: every decision a kernel renderer needs, each traced to the schedule.

A :class:`KernelPlan` is frozen data derived from a :class:`~twill.schedule.result.Schedule` (with a warp
assignment) and its loop graph. Renderers (``twill.codegen.gluon``, ``pallas``, ``tilelang``) consume only the
plan: they never look at the schedule or the graph, so every backend renders the same decisions.

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
* **Tensor-core order.** With several compute partitions, the steady-state order of their tensor-core ops
  (by ``t mod II``) is cut into *turns*: maximal runs of one partition's ops (cyclically merged). A
  partition waits for its turn before the first op of each of its turns and, after the last, passes the
  tensor core to the owner of the next turn (a round robin over two or three partitions, in the order the
  schedule chose); within a turn it issues its ops in program order (the family's order of roles). Every
  partition takes its turns in program order: the cyclic order starts where each partition's turns come in
  that order.
* **Families.** :func:`kernel_plan` hands the schedule to its kernel family's plan
  (``twill/kernels/<family>/plan.py``, found through :mod:`twill.kernels`), which checks the family's roles,
  builds its partitions, rings, waits and turns with the helpers here, and adds its own decisions (stages,
  variants, buffer splits) as :attr:`KernelPlan.decisions`, a frozen dataclass its plan module defines and
  documents; only the family's bodies read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.quote import text
from twill.schedule.result import Schedule, WarpGroup

DTYPES = ("fp16", "bf16")
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
        roles: role -> op for the ops of a compute partition (``{role: op name, ...}``).
        subtile: the sub-tile a compute partition owns (= its index among the compute partitions).
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
        kernel: the kernel family's name (:mod:`twill.kernels`).
        graph, arch, solver, status: the schedule's graph name, target, solver and status.
        ii, ii_lower_bound, length, num_stages: the schedule's II, its lower bound, L and stages.
        placements: every op as scheduled, in graph order.
        dtype: operand dtype (``fp16``/``bf16``; the Gluon attention forward also ``fp8e4m3``/``fp8e5m2``).
        tile: tile sizes (``block_m``, ``block_n``, ``block_k`` or ``head_dim``, ``sub_m``).
        partitions: compute partitions first (the first is the default partition), then the load partition.
        rings: one per TMA-load edge, in graph order; ``barriers`` the ready/empty pairs they use.
        waits: every wait of the kernel with the dependence that forces it.
        turns: tensor-core turns between compute partitions (empty with one compute partition).
        persistent: one CTA per SM at most, each walking the family's work items (output tiles, query blocks);
            a code-generator choice, not read from the schedule, that :func:`kernel_plan` takes for any family
            with :attr:`~twill.kernels.Family.persistent` (docs/codegen.md, "Persistent GEMM", "Persistent
            attention forward"). Generic because the request is: the registry, the tuner's axis and every
            ``--persistent`` option name it without knowing the family.
        decisions: the family's own decisions, a frozen dataclass its plan module defines
            (``twill/kernels/<family>/plan.py``): what only that family's bodies read (lags, variants, buffer
            splits). Numbers and flags only, so :func:`quoted_plan` passes it through as it is.
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
    turns: tuple[Turn, ...] = ()
    persistent: bool = False
    decisions: Any = None

    @property
    def compute(self) -> tuple[Partition, ...]:
        """The compute partitions (the first is the default partition)."""
        return tuple(p for p in self.partitions if p.role == "compute")

    @property
    def load(self) -> Partition:
        """The TMA producer partition."""
        return next(p for p in self.partitions if p.role == "load")

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


def unsupported(backend: str, what: str, hint: str = "") -> UnsupportedFeatureError:
    """``cannot generate: <what> not supported by the <backend> backend[ (<hint>)]``."""
    tail = f" ({hint})" if hint else ""
    return UnsupportedFeatureError(f"cannot generate: {what} not supported by the {backend} backend{tail}")


def check_roles(graph: LoopGraph, known: tuple[str, ...], backend: str) -> None:
    for op in graph.ops:
        r = op.attrs.get("role")
        if r not in known:
            raise unsupported(backend, f"{r or op.kind} (op {op.name!r})")


def check_schedule(schedule: Schedule, backend: str) -> None:
    if schedule.arch not in ARCHS:
        raise UnsupportedFeatureError(f"cannot generate: arch {schedule.arch!r} not supported by the {backend} "
                                      f"backend (Hopper only: {', '.join(ARCHS)})")
    if not schedule.assignment or not schedule.warps:
        raise UnsupportedFeatureError(f"cannot generate: a schedule without warp assignment is not supported by "
                                      f"the {backend} backend (solve with warp specialization)")


def _dtype(graph: LoopGraph, backend: str, dtypes: tuple[str, ...] = DTYPES) -> str:
    dtype = str(graph.attrs.get("dtype", "fp16"))
    if dtype not in dtypes:
        raise UnsupportedFeatureError(f"cannot generate: dtype {dtype} not supported by the {backend} backend "
                                      f"(supported: {', '.join(dtypes)})")
    return dtype


def _placements(schedule: Schedule) -> tuple[Placement, ...]:
    graph = schedule.graph
    return tuple(Placement(op.name, str(op.attrs.get("role", "")), schedule.start(op.name),
                           schedule.stage(op.name), schedule.residue(op.name), op.cycles,
                           schedule.assignment.get(op.name)) for op in graph.ops)


def make_partitions(schedule: Schedule, tc_ops: list[str], subtile_of: dict[str, int],
                    backend: str) -> tuple[Partition, ...]:
    """Compute partitions (groups holding tensor-core ops, ordered by sub-tile) then the load partition."""
    graph = schedule.graph
    loads = [op.name for op in graph.ops if op.variable_latency]
    load_groups = {schedule.assignment[n] for n in loads}
    if len(load_groups) != 1:
        raise unsupported(backend, "TMA loads spread over several warp groups are",
                          "one W_vl producer warp group expected")
    compute_ids = sorted({schedule.assignment[n] for n in tc_ops}, key=lambda g: min(
        subtile_of[n] for n in tc_ops if schedule.assignment[n] == g))
    load_id = load_groups.pop()
    if load_id in compute_ids:
        raise unsupported(backend, "TMA loads and wgmma in one warp group are",
                          "warp specialization needs a producer group")
    order = schedule.steady_state_order()
    parts = []
    for index, gid in enumerate(compute_ids):
        group: WarpGroup = schedule.warps[gid]
        if group.num_warps not in (4, 8):
            raise unsupported(backend, f"compute warp group {gid} with {group.num_warps} warps (wgmma needs 4 "
                                       f"or 8)")
        ops = tuple(n for n in order if schedule.assignment.get(n) == gid)
        subtiles = {subtile_of[n] for n in ops if n in subtile_of}
        subtile = min(subtiles) if subtiles else 0
        if subtile != index:
            mixed = sorted(n for n in ops if subtile_of.get(n, index) != index)
            raise unsupported(backend, f"sub-tile {subtile} on compute partition {index} (warp group {gid} runs "
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
        raise unsupported(backend, f"op {sorted(others)[0]!r} in the TMA producer warp group")
    parts.append(Partition("load", "load", load_id, group.role, 1, max(LOAD_REGS_MIN, group.regs), ops))
    return tuple(parts)


def _producer_order(schedule: Schedule, ops: list[str], loads: list[str]) -> tuple[str, ...]:
    """The producer's ops in steady-state order, its TMA loads among them by start time. Each iteration of the
    producer's loop fills every ring for the same tile, so its loads go in the order the schedule starts them
    for one iteration; the steady-state order would put a load of a later stage (smaller residue) first, and
    the producer, one sequential program, would hold the earlier load back behind that load's wait for a free
    buffer (docs/performance.md, "The op's D = 256 forward: two copies, and the producer's order")."""
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


def shared_barriers(rings: list[Ring], arrivals: int) -> tuple[list[Ring], tuple[Barrier, ...]]:
    """Rings of equal depth and release point share one barrier pair (named by their joined names)."""
    groups: dict[tuple[int, str], list[Ring]] = {}
    for r in rings:
        groups.setdefault((r.depth, r.release), []).append(r)
    named = {r.name: "".join(s.name for s in same) for same in groups.values() for r in same}
    barriers = tuple(Barrier(named[same[0].name], tuple(r.name for r in same), same[0].depth, arrivals)
                     for same in groups.values())
    return [replace(r, barrier=named[r.name]) for r in rings], barriers


def edge_wait(graph: LoopGraph, kind: str, src: str, dst: str) -> Wait:
    """The wait ``kind`` of ``dst`` for ``src``, from their edge."""
    (edge,) = [e for e in graph.in_edges(dst) if e.src == src]
    return Wait(kind, dst, src, edge.delay, edge.distance)


def retire_wait(graph: LoopGraph, mma: str) -> Wait:
    """The wait for the asynchronous ``mma`` to retire: its first blocking reader (the first reader, or the
    next ``mma`` itself, when none blocks)."""
    out = [e for e in graph.out_edges(mma) if e.dst != mma]
    blocking = [e for e in out if e.blocking] or out
    if not blocking:
        return Wait("wgmma", mma, mma, graph.op(mma).cycles, 1)
    return edge_wait(graph, "wgmma", mma, blocking[0].dst)


def ring_waits(graph: LoopGraph, rings: list[Ring]) -> list[Wait]:
    """``ready``: each consumer waits for its load; ``empty``: the load waits for the release ``depth``
    iterations earlier."""
    waits = [edge_wait(graph, "ready", r.producer, c) for r in rings for c in r.consumers]
    waits += [Wait("empty", r.producer, r.release, 0, r.depth) for r in rings]
    return waits


def cut_turns(schedule: Schedule, compute: tuple[Partition, ...], tc_ops: list[str]) -> tuple[Turn, ...]:
    """Cut the steady-state tensor-core order into maximal runs of one partition (cyclically merged)."""
    if len(compute) < 2:
        return ()
    index = {p.group: i for i, p in enumerate(compute)}
    return merge_runs([Turn(index[schedule.assignment[name]], (name,))
                       for name in schedule.steady_state_order() if name in tc_ops])


def merge_runs(turns: list[Turn]) -> tuple[Turn, ...]:
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

def in_program_order(graph: LoopGraph, turns: tuple[Turn, ...], order: tuple[str, ...],
                     backend: str) -> tuple[Turn, ...]:
    """The cyclic turn order started where every partition takes its turns in program order (``order``, the
    roles of a partition's tensor-core ops in the order it issues them): the first rotation that does, so a
    partition's k-th turn wait is the k-th arrival on its barrier and one token circulates."""
    def ordered(rotation: tuple[Turn, ...]) -> bool:
        keys: dict[int, list[int]] = {}
        for t in rotation:
            keys.setdefault(t.partition, []).extend(
                order.index(str(graph.op(op).attrs.get("role"))) for op in program_order(graph, t.ops, order))
        return all(k == sorted(k) for k in keys.values())

    for start in range(len(turns)):
        rotation = turns[start:] + turns[:start]
        if ordered(rotation):
            return rotation
    if not turns:
        return turns
    raise unsupported(backend, "a tensor-core turn order that no partition program can follow",
                      " -> ".join("/".join(t.ops) for t in turns))


def program_order(graph: LoopGraph, ops: tuple[str, ...], order: tuple[str, ...]) -> tuple[str, ...]:
    """``ops`` in the order a compute partition issues them: by their roles' places in ``order``."""
    return tuple(sorted(ops, key=lambda op: order.index(str(graph.op(op).attrs.get("role")))))


def with_turn_points(graph: LoopGraph, part: Partition, turns: tuple[Turn, ...], index: int,
                     order: tuple[str, ...]) -> Partition:
    """Where ``part`` waits for its turn (the first op of each of its turns, in program order ``order``) and
    passes the tensor core on (the last op) to the owner of the next turn."""
    mine = [(program_order(graph, t.ops, order), turns[(k + 1) % len(turns)].partition)
            for k, t in enumerate(turns) if t.partition == index]
    return replace(part, turn_waits={ops[0]: k for k, (ops, _) in enumerate(mine)},
                   turn_passes={ops[-1]: nxt for ops, nxt in mine})


def waits_for_turns(graph: LoopGraph, turns: tuple[Turn, ...], order: tuple[str, ...]) -> list[Wait]:
    """Each turn waits for the last op of the turn before it (cyclically, in program order ``order``) to leave
    the tensor core."""
    waits = []
    for k, t in enumerate(turns):
        prev = program_order(graph, turns[k - 1].ops, order)[-1]
        waits.append(Wait("turn", program_order(graph, t.ops, order)[0], prev, graph.op(prev).cycles, int(k == 0)))
    return waits


def make_plan(schedule: Schedule, kernel: str, backend: str, dtypes: tuple[str, ...] = DTYPES,
              **fields: Any) -> KernelPlan:
    """The plan of ``schedule``; its graph's dtype must be one of ``dtypes`` (a family that emits more passes
    its own)."""
    return KernelPlan(kernel=kernel, graph=schedule.graph.name, arch=schedule.arch, solver=schedule.solver,
                      status=schedule.status, ii=schedule.ii, ii_lower_bound=schedule.ii_lower_bound,
                      length=schedule.length, num_stages=schedule.num_stages, placements=_placements(schedule),
                      dtype=_dtype(schedule.graph, backend, dtypes), **fields)

def smem_bytes(buffers: list[int], barriers: int) -> int:
    """Shared memory of a kernel's buffers and ``barriers`` mbarriers (8 bytes each), each buffer and the
    barriers counted in whole KiB: the allocator aligns the swizzled tiles, so buffers that add up to exactly a
    block's capacity do not fit beside their barriers (Triton then refuses the kernel only at launch)."""
    return sum(-(-size // 1024) * 1024 for size in (*buffers, 8 * barriers))

def kernel_plan(schedule: Schedule, backend: str, persistent: bool = False) -> KernelPlan:
    """The plan of ``schedule`` for ``backend`` (named in errors), made by the plan of the kernel family
    (:mod:`twill.kernels`) the graph's ``kernel`` attribute (or name) names or, failing that, whose roles its
    ops have; ``persistent`` asks for a persistent kernel (families with ``persistent`` only)."""
    from twill.kernels import families, planned_family

    graph = schedule.graph
    kind = graph.attrs.get("kernel") or graph.name
    planned = [f for f in families() if f.planned]
    family = planned_family(graph)
    if persistent and (family is None or not family.persistent):
        raise unsupported(backend, f"a persistent {kind!r} kernel is",
                          "persistent: " + ", ".join(f.name for f in planned if f.persistent))
    if family is None:
        raise unsupported(backend, f"kernel {kind!r}", ", ".join(f.name for f in planned))
    plan = family.module("plan").plan
    return plan(schedule, backend, persistent) if family.persistent else plan(schedule, backend)
