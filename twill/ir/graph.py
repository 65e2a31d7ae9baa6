"""The loop graph: tile-level operations and dependence edges (Twill paper §1.2-1.4).

A :class:`LoopGraph` is the body of one singly nested loop. Each :class:`Op` is a tile operation that uses
resources of the whole SM; its *resource reservation table* (RRT) says, for each cycle of its execution,
how many instances of each functional unit it occupies. Each :class:`Edge` ``(src, dst, delay d,
distance δ, blocking)`` says that the instance of ``dst`` in iteration ``i`` issues at least ``d`` cycles
after the instance of ``src`` in iteration ``i - δ``.

All objects are frozen; transformations (cost normalization, sub-tiling) return new graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from twill.errors import GraphError

#: One RRT row: ``((unit, count), ...)`` sorted by unit name, counts > 0.
RRTRow = tuple[tuple[str, int], ...]


def _freeze_row(row: Mapping[str, int] | Iterable[tuple[str, int]]) -> RRTRow:
    items = row.items() if isinstance(row, Mapping) else row
    out: dict[str, int] = {}
    for unit, count in items:
        if not isinstance(count, int) or isinstance(count, bool):
            raise GraphError(f"RRT count for unit {unit!r} must be an integer, got {count!r}")
        if count < 0:
            raise GraphError(f"RRT count for unit {unit!r} must be >= 0, got {count}")
        if count:
            out[str(unit)] = out.get(str(unit), 0) + count
    return tuple(sorted(out.items()))


def frozen_attrs(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of a metadata mapping (values must be JSON-compatible)."""
    return MappingProxyType(dict(attrs or {}))


@dataclass(frozen=True, kw_only=True)
class Op:
    """A tile-level operation of the loop body.

    Attributes:
        name: unique name within the graph (``qk``, ``exp_a``...).
        rrt: resource reservation table, one row per cycle of execution; ``cycles = len(rrt)``. A row maps a
            functional unit to the number of its instances busy in that cycle. Rows may be empty (the op
            runs but holds no unit, e.g. waiting for memory).
        latency: cycles from issue until the result can be used; the default delay of its outgoing edges
            when a graph is built with :class:`~twill.ir.builder.GraphBuilder`. Defaults to ``cycles``.
        kind: what the op is (``mma``, ``exp2``, ``tma_load``, ``reduce``, ``alu``, ``tmem_load``...). The
            solver ignores it; code generators and pictures use it.
        regs: registers per thread that the op's result occupies while live (0 for results in memory).
        warps: warps the op needs: 1 for a warp op, 4 for a warp-group op such as wgmma.
        variable_latency: the latency varies at run time (TMA transfers); all such ops share the dedicated
            warp ``W_vl``.
        spill_cost: extra delay, in cycles, when the result crosses to another warp group through shared
            memory (paper: ``spillcost(u)``).
        smem: shared-memory bytes of the result (per live copy).
        tmem: tensor-memory bytes of the result (Blackwell; per live copy).
        warp_busy: cycles the op keeps its issuing warp busy. ``None`` means ``cycles`` for synchronous ops;
            asynchronous ops (wgmma, tcgen05, TMA) hold their warp only while issuing and set a small value.
        attrs: free-form metadata for frontends and code generators (tile shape, dtype, source location).
    """

    name: str
    rrt: tuple[RRTRow, ...]
    latency: int | None = None
    kind: str = "op"
    regs: int = 0
    warps: int = 1
    variable_latency: bool = False
    spill_cost: int = 0
    smem: int = 0
    tmem: int = 0
    warp_busy: int | None = None
    attrs: Mapping[str, Any] = field(default_factory=lambda: frozen_attrs(None), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise GraphError(f"op name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "rrt", tuple(_freeze_row(r) for r in self.rrt))
        object.__setattr__(self, "attrs", frozen_attrs(self.attrs))
        if not self.rrt:
            raise GraphError(f"op {self.name!r} has an empty RRT: it must last at least one cycle")
        for fname in ("regs", "spill_cost", "smem", "tmem"):
            value = getattr(self, fname)
            if not isinstance(value, int) or value < 0:
                raise GraphError(f"op {self.name!r}: {fname} must be a non-negative integer, got {value!r}")
        if self.warps not in (1, 2, 4, 8):
            raise GraphError(f"op {self.name!r}: warps must be 1, 2, 4 or 8, got {self.warps!r}")
        if self.latency is not None and (not isinstance(self.latency, int) or self.latency < 0):
            raise GraphError(f"op {self.name!r}: latency must be a non-negative integer, got {self.latency!r}")
        if self.warp_busy is not None and (not isinstance(self.warp_busy, int) or self.warp_busy < 0):
            raise GraphError(f"op {self.name!r}: warp_busy must be a non-negative integer, got {self.warp_busy!r}")

    @property
    def cycles(self) -> int:
        """Number of RRT rows: how long the op executes."""
        return len(self.rrt)

    @property
    def issue_latency(self) -> int:
        """Cycles from issue until the result is available (``latency``, else ``cycles``)."""
        return self.cycles if self.latency is None else self.latency

    @property
    def busy(self) -> int:
        """Cycles the op keeps its warp busy (``warp_busy``, else ``cycles``)."""
        return self.cycles if self.warp_busy is None else self.warp_busy

    def usage(self, unit: str) -> int:
        """Total unit-cycles of ``unit`` over the whole RRT."""
        return sum(count for row in self.rrt for u, count in row if u == unit)

    def units(self) -> set[str]:
        return {u for row in self.rrt for u, _ in row}


@dataclass(frozen=True)
class Edge:
    """A dependence ``src -> dst``: ``dst`` of iteration ``i`` issues ``>= delay`` cycles after ``src`` of
    iteration ``i - distance``. ``blocking`` marks edges where ``dst`` must wait synchronously for the
    result (tensor-core results, TMEM loads, cross-warp transfers)."""

    src: str
    dst: str
    delay: int
    distance: int = 0
    blocking: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.delay, int) or isinstance(self.delay, bool):
            raise GraphError(f"edge {self.src}->{self.dst}: delay must be an integer, got {self.delay!r}")
        if self.delay < 0:
            raise GraphError(f"edge {self.src}->{self.dst}: negative delay {self.delay}")
        if not isinstance(self.distance, int) or isinstance(self.distance, bool) or self.distance < 0:
            raise GraphError(f"edge {self.src}->{self.dst}: distance must be a non-negative integer, "
                             f"got {self.distance!r}")

    @property
    def loop_carried(self) -> bool:
        return self.distance > 0


@dataclass(frozen=True)
class LoopGraph:
    """A loop body: ops, edges, optional unit capacities that override the machine, and metadata.

    Construct with :class:`~twill.ir.builder.GraphBuilder` or :func:`~twill.ir.io.load_graph`; check
    against a machine with :func:`~twill.ir.validate.validate_graph`.
    """

    name: str
    ops: tuple[Op, ...]
    edges: tuple[Edge, ...]
    units: Mapping[str, int] | None = None
    attrs: Mapping[str, Any] = field(default_factory=lambda: frozen_attrs(None), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "edges", tuple(self.edges))
        if self.units is not None:
            object.__setattr__(self, "units", MappingProxyType(dict(self.units)))
        object.__setattr__(self, "attrs", frozen_attrs(self.attrs))
        seen: set[str] = set()
        for op in self.ops:
            if op.name in seen:
                raise GraphError(f"duplicate op name {op.name!r}")
            seen.add(op.name)
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in seen:
                    raise GraphError(f"edge {e.src}->{e.dst} refers to unknown op {end!r}")

    # -- lookups ---------------------------------------------------------------------------------------
    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise GraphError(f"graph {self.name!r} has no op {name!r}")

    @property
    def op_names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)

    def in_edges(self, name: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.dst == name)

    def out_edges(self, name: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.src == name)

    def is_streaming(self, name: str) -> bool:
        """Variable-latency op with no incoming dependence (paper §5.3): zero latency, own pipeline depth."""
        return self.op(name).variable_latency and not self.in_edges(name)

    def least_depth(self, name: str, streaming_depth: int) -> int:
        """Fewest buffers ``name``'s result may have: for a streaming load its own ``attrs["ring_depth"]``
        when the kernel pins one (FA4's single dO stage), else ``streaming_depth``; 1 for every other op."""
        if not self.is_streaming(name):
            return 1
        return int(self.op(name).attrs.get("ring_depth", streaming_depth))

    def with_ops(self, ops: Iterable[Op]) -> "LoopGraph":
        return replace(self, ops=tuple(ops))

    def with_edges(self, edges: Iterable[Edge]) -> "LoopGraph":
        return replace(self, edges=tuple(edges))


def topological_order(graph: LoopGraph) -> list[str]:
    """Ops in an order where every distance-0 edge goes forward (Kahn's algorithm, ties by graph order); ops
    left on a zero-distance cycle (a graph that fails validation) come last, in graph order."""
    names = graph.op_names
    indegree = {name: 0 for name in names}
    succ: dict[str, list[str]] = {name: [] for name in names}
    for e in graph.edges:
        if e.distance == 0 and e.src != e.dst:
            indegree[e.dst] += 1
            succ[e.src].append(e.dst)
    ready = [name for name in names if indegree[name] == 0]
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for nxt in succ[name]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    placed = set(order)
    return order + [name for name in names if name not in placed]
