"""A small builder API for writing loop graphs by hand.

    >>> from twill.ir import GraphBuilder
    >>> b = GraphBuilder("paper-example", units={"TC": 1, "EXP": 1})
    >>> s = b.op("S", uses={"TC": 1}, cycles=1)
    >>> p = b.op("P", uses={"EXP": 1}, cycles=1)
    >>> o = b.op("O", uses={"TC": 1}, cycles=1)
    >>> b.edge(s, p); b.edge(p, o); b.edge(o, o, distance=1)
    >>> graph = b.build()
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from twill.errors import GraphError
from twill.ir.graph import Edge, LoopGraph, Op


def rrt_from_uses(uses: Mapping[str, int], cycles: int) -> tuple[dict[str, int], ...]:
    """An RRT that holds ``uses`` in every one of ``cycles`` rows (the common, fully pipelined case)."""
    if not isinstance(cycles, int) or cycles < 1:
        raise GraphError(f"cycles must be a positive integer, got {cycles!r}")
    return tuple(dict(uses) for _ in range(cycles))


class GraphBuilder:
    """Collects ops and edges, then :meth:`build` returns a frozen :class:`LoopGraph`."""

    def __init__(self, name: str, *, units: Mapping[str, int] | None = None,
                 attrs: Mapping[str, Any] | None = None):
        self.name = name
        self.units = dict(units) if units is not None else None
        self.attrs = dict(attrs or {})
        self._ops: dict[str, Op] = {}
        self._edges: list[Edge] = []

    def op(self, name: str, *, cycles: int | None = None, uses: Mapping[str, int] | None = None,
           rrt: Sequence[Mapping[str, int]] | None = None, **fields: Any) -> str:
        """Add an op; give either ``uses`` + ``cycles`` or an explicit ``rrt``. Returns the op's name."""
        if name in self._ops:
            raise GraphError(f"duplicate op name {name!r}")
        if rrt is None:
            rrt = rrt_from_uses(uses or {}, 1 if cycles is None else cycles)
        elif uses is not None or cycles is not None and cycles != len(rrt):
            raise GraphError(f"op {name!r}: give either rrt or uses/cycles, not both")
        self._ops[name] = Op(name=name, rrt=tuple(rrt), **fields)
        return name

    def edge(self, src: str, dst: str, *, delay: int | None = None, distance: int = 0,
             blocking: bool = False) -> None:
        """Add a dependence; ``delay`` defaults to the source's issue latency."""
        for end in (src, dst):
            if end not in self._ops:
                raise GraphError(f"edge {src}->{dst} refers to unknown op {end!r}")
        if delay is None:
            delay = self._ops[src].issue_latency
        self._edges.append(Edge(src, dst, delay, distance, blocking))

    def build(self) -> LoopGraph:
        return LoopGraph(self.name, tuple(self._ops.values()), tuple(self._edges), self.units, self.attrs)
