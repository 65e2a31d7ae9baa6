"""Layout of the dependence graph: graphviz ``dot`` when it is installed, else a layered (Sugiyama-style)
layout computed here. Coordinates are in node-cell units (one node cell wide, one layer high), y upwards.

Edges that span several layers are routed through *virtual nodes*, one per crossed layer, which take part
in the crossing-reduction sweeps like ops do; the picture draws a smooth curve through them, so long edges
go around ops instead of through them.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Mapping

from twill.ir.graph import LoopGraph, topological_order

#: Seconds ``dot`` may take before the built-in layout is used instead.
DOT_TIMEOUT_S = 20

#: Inches between neighbouring node centres in ``dot``'s layout (node width + nodesep, height + ranksep):
#: dividing by it gives node-cell units.
DOT_SLOT = (1.3 + 0.4, 0.5 + 0.6)

#: Width of a virtual node (a long edge crossing a layer), in node cells.
VIRTUAL_WIDTH = 0.4


@dataclass(frozen=True)
class GraphLayout:
    """Node centres and edge routes.

    Attributes:
        positions: op name -> (x, y).
        via: edge index (in ``graph.edges``) -> points the edge passes through between its ends.
        bezier: edge index -> cubic Bézier control points of the whole edge (``dot`` only).
        engine: ``dot`` or ``layered``.
    """

    positions: Mapping[str, tuple[float, float]]
    via: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    bezier: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    engine: str = "layered"


# -- graphviz ------------------------------------------------------------------------------------------
def to_dot(graph: LoopGraph) -> str:
    """The graph in DOT, for layout only: loop-carried edges do not constrain the ranking; self-loops are
    left out (the picture draws them)."""
    lines = ["digraph G {", "  rankdir=TB; nodesep=0.4; ranksep=0.6;",
             "  node [shape=box, width=1.3, height=0.5, fixedsize=true];"]
    lines += [f"  {_dot_id(op.name)};" for op in graph.ops]
    for e in graph.edges:
        if e.src != e.dst:
            attrs = " [constraint=false]" if e.distance else ""
            lines.append(f"  {_dot_id(e.src)} -> {_dot_id(e.dst)}{attrs};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_dot_plain(text: str, graph: LoopGraph) -> GraphLayout | None:
    """A layout from ``dot -Tplain`` output: ``node NAME X Y ...`` lines give centres and
    ``edge TAIL HEAD N X1 Y1 ... XN YN ...`` lines the B-spline control points, in inches (scaled here
    to node cells). Edges between the same pair of ops are matched in order. None if an op is missing or a
    line does not split."""
    positions: dict[str, tuple[float, float]] = {}
    splines: dict[tuple[str, str], list[tuple[tuple[float, float], ...]]] = {}
    try:        # an op name with quotes, backslashes or line separators can leave a line that does not parse
        for line in text.splitlines():
            fields = shlex.split(line)
            if fields[:1] == ["node"] and len(fields) >= 4:
                positions[fields[1]] = (float(fields[2]) / DOT_SLOT[0], float(fields[3]) / DOT_SLOT[1])
            elif fields[:1] == ["edge"] and len(fields) >= 4:
                count = int(fields[3])
                coords = [float(v) for v in fields[4:4 + 2 * count]]
                points = tuple((coords[k] / DOT_SLOT[0], coords[k + 1] / DOT_SLOT[1])
                               for k in range(0, 2 * count, 2))
                splines.setdefault((fields[1], fields[2]), []).append(points)
    except (ValueError, IndexError):
        return None
    if set(positions) != set(graph.op_names):
        return None
    bezier: dict[int, tuple[tuple[float, float], ...]] = {}
    for index, e in enumerate(graph.edges):
        queue = splines.get((e.src, e.dst))
        if e.src != e.dst and queue:
            bezier[index] = queue.pop(0)
    return GraphLayout(positions, {}, bezier, "dot")


def dot_layout(graph: LoopGraph) -> GraphLayout | None:
    """The ``dot`` layout if graphviz is installed and succeeds, else None."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-Tplain"], input=to_dot(graph), capture_output=True, text=True,
                              timeout=DOT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_dot_plain(proc.stdout, graph) if proc.returncode == 0 else None


# -- built-in layered layout -----------------------------------------------------------------------------
def layers(graph: LoopGraph) -> dict[str, int]:
    """Layer of each op: the longest path to it over distance-0 edges (a DAG in any valid graph); then an
    op without distance-0 predecessors (a load, a value read only by the next iteration) moves down to
    just above its highest distance-0 successor, so it sits next to its consumer."""
    preds: dict[str, list[str]] = {n: [] for n in graph.op_names}
    succs: dict[str, list[str]] = {n: [] for n in graph.op_names}
    for e in graph.edges:
        if e.distance == 0 and e.src != e.dst:
            preds[e.dst].append(e.src)
            succs[e.src].append(e.dst)
    layer: dict[str, int] = {}
    for name in topological_order(graph):
        layer[name] = 1 + max((layer[p] for p in preds[name]), default=-1)
    for name in graph.op_names:
        if not preds[name] and succs[name]:
            layer[name] = min(layer[s] for s in succs[name]) - 1
    return layer


def _virtual_chains(graph: LoopGraph, layer: Mapping[str, int]) -> dict[int, list[tuple[str, int]]]:
    """For each edge spanning more than one layer (in either direction), its virtual nodes
    ``("~e<index>.<k>", layer)`` on the layers strictly between its ends, from source to destination."""
    chains: dict[int, list[tuple[str, int]]] = {}
    for index, e in enumerate(graph.edges):
        a, b = layer[e.src], layer[e.dst]
        if e.src == e.dst or abs(a - b) <= 1:
            continue
        step = 1 if b > a else -1
        chains[index] = [(f"~e{index}.{k}", lvl) for k, lvl in enumerate(range(a + step, b, step))]
    return chains


def _order_rows(rows: dict[int, list[str]], neighbours: Mapping[str, list[str]], sweeps: int) -> None:
    """Barycentre crossing reduction, in place: alternately downward and upward, each row is sorted by the
    mean position of its neighbours in the row above (downward) or below (upward)."""
    depth = max(rows) if rows else 0
    for sweep in range(2 * sweeps):
        downward = sweep % 2 == 0
        order = range(1, depth + 1) if downward else range(depth - 1, -1, -1)
        for lvl in order:
            ref = {n: i for i, n in enumerate(rows.get(lvl - 1 if downward else lvl + 1, []))}
            row = rows.get(lvl, [])
            here = {n: i for i, n in enumerate(row)}

            def barycentre(n: str, ref: dict[str, int] = ref, here: dict[str, int] = here) -> tuple[float, int]:
                adj = [ref[m] for m in neighbours[n] if m in ref]
                return (sum(adj) / len(adj) if adj else float(here[n]), here[n])

            rows[lvl] = sorted(row, key=barycentre)


def layered_layout(graph: LoopGraph, group_of: Mapping[str, int] | None = None, sweeps: int = 6) -> GraphLayout:
    """:func:`layers` top to bottom, long edges through virtual nodes, rows ordered first by warp group
    then graph order and refined by :func:`_order_rows`; x packs each row (ops 1 cell, virtual nodes
    ``VIRTUAL_WIDTH``) centred on the widest row."""
    group_of = group_of or {}
    layer = layers(graph)
    chains = _virtual_chains(graph, layer)
    index = {n: i for i, n in enumerate(graph.op_names)}
    rows: dict[int, list[str]] = {}
    for n in sorted(graph.op_names, key=lambda n: (group_of.get(n, -1), index[n])):
        rows.setdefault(layer[n], []).append(n)
    neighbours: dict[str, list[str]] = {n: [] for n in graph.op_names}
    for edge_index, e in enumerate(graph.edges):
        if e.src == e.dst:
            continue
        path = [e.src] + [v for v, _ in chains.get(edge_index, [])] + [e.dst]
        for v, lvl in chains.get(edge_index, []):
            rows.setdefault(lvl, []).append(v)
            neighbours[v] = []
        for u, v in zip(path, path[1:]):
            neighbours[u].append(v)
            neighbours[v].append(u)
    _order_rows(rows, neighbours, sweeps)

    def width(n: str) -> float:
        return VIRTUAL_WIDTH if n.startswith("~") else 1.0

    widest = max(sum(width(n) for n in row) for row in rows.values())
    depth = max(rows)
    coords: dict[str, tuple[float, float]] = {}
    for lvl, row in rows.items():
        x = (widest - sum(width(n) for n in row)) / 2
        for n in row:
            coords[n] = (x + width(n) / 2, float(depth - lvl))
            x += width(n)
    via = {i: tuple(coords[v] for v, _ in chain) for i, chain in chains.items()}
    return GraphLayout({n: coords[n] for n in graph.op_names}, via, {}, "layered")


def graph_layout(graph: LoopGraph, group_of: Mapping[str, int] | None = None) -> GraphLayout:
    """``dot``'s layout when available, else :func:`layered_layout`."""
    return dot_layout(graph) or layered_layout(graph, group_of)
