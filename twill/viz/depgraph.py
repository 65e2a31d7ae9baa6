"""The dependence-graph picture: ops coloured by warp group (paper Figure 9), loop-carried edges dashed,
blocking edges drawn thick and red."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch
from matplotlib.path import Path

from twill.ir.graph import Edge
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.viz import _mpl
from twill.viz.graphlayout import GraphLayout, graph_layout
from twill.viz.palette import op_colors, text_color, warp_group_colors, warp_group_label

#: Inches per node cell horizontally and per layer vertically.
SLOT_INCHES, LAYER_INCHES = 1.9, 1.05
#: Node box size in node-cell / layer units.
NODE_W, NODE_H = 0.8, 0.5
EDGE_COLOR, BLOCKING_COLOR = "#555555", "#b22222"

Point = tuple[float, float]


def _edge_label(edge: Edge) -> str:
    return f"{edge.delay}, δ={edge.distance}" if edge.distance else str(edge.delay)


def clip_to_box(center: Point, toward: Point) -> Point:
    """Where the segment from a node's ``center`` toward ``toward`` leaves the node's box
    (half-width NODE_W/2, half-height NODE_H/2): ``center + s·(toward - center)`` with the largest s ≤ 1
    that stays inside."""
    dx, dy = toward[0] - center[0], toward[1] - center[1]
    limits = [abs(NODE_W / 2 / dx) if dx else float("inf"), abs(NODE_H / 2 / dy) if dy else float("inf")]
    s = min(1.0, *limits)
    return (center[0] + s * dx, center[1] + s * dy)


def edge_path(edge_index: int, edge: Edge, layout: GraphLayout) -> tuple[Path, Point]:
    """The drawn path of an edge and a point for its label. ``dot`` gives Bézier control points; a routed
    edge is a smooth quadratic curve through its virtual nodes (on-curve points at the midpoints between
    them); a short edge is straight, or bent by a quarter of its length when loop-carried or when it joins
    ops of the same layer."""
    a, b = layout.positions[edge.src], layout.positions[edge.dst]
    if edge_index in layout.bezier:
        # dot's spline stops where its arrowhead would start: extend it straight to the node's box.
        pts = list(layout.bezier[edge_index])
        codes = [Path.MOVETO] + [Path.CURVE4] * (len(pts) - 1) + [Path.LINETO]
        return Path(pts + [clip_to_box(b, pts[-1])], codes), pts[len(pts) // 2]
    via = list(layout.via.get(edge_index, ()))
    if via:
        start, end = clip_to_box(a, via[0]), clip_to_box(b, via[-1])
        verts: list[Point] = [start]
        codes = [Path.MOVETO]
        previous = start
        for k, v in enumerate(via):
            nxt = via[k + 1] if k + 1 < len(via) else end
            mid = ((v[0] + nxt[0]) / 2, (v[1] + nxt[1]) / 2)
            if k == 0:
                verts.append(((previous[0] + v[0]) / 2, (previous[1] + v[1]) / 2))
                codes.append(Path.LINETO)
            verts += [v, mid]
            codes += [Path.CURVE3, Path.CURVE3]
        verts.append(end)
        codes.append(Path.LINETO)
        return Path(verts, codes), via[len(via) // 2]
    bend = 0.25 if edge.loop_carried or abs(a[1] - b[1]) < 0.5 else 0.0
    # Control point: the midpoint pushed sideways by bend x length, perpendicular to the edge.
    mid = ((a[0] + b[0]) / 2 + bend * (b[1] - a[1]), (a[1] + b[1]) / 2 - bend * (b[0] - a[0]))
    start, end = clip_to_box(a, mid), clip_to_box(b, mid)
    if not bend:
        return Path([start, end], [Path.MOVETO, Path.LINETO]), mid
    label = (0.25 * start[0] + 0.5 * mid[0] + 0.25 * end[0], 0.25 * start[1] + 0.5 * mid[1] + 0.25 * end[1])
    return Path([start, mid, end], [Path.MOVETO, Path.CURVE3, Path.CURVE3]), label


def _edge_style(edge: Edge) -> dict:
    return {"arrowstyle": "-|>", "mutation_scale": 10, "color": BLOCKING_COLOR if edge.blocking else EDGE_COLOR,
            "linewidth": 1.8 if edge.blocking else 0.9, "linestyle": (0, (4, 3)) if edge.loop_carried else "-",
            "zorder": 1, "shrinkA": 0, "shrinkB": 0}


def _draw_edge(ax, edge_index: int, edge: Edge, layout: GraphLayout) -> None:
    style = _edge_style(edge)
    if edge.src == edge.dst:
        x0, y0 = layout.positions[edge.src]
        right = x0 + NODE_W / 2
        ax.add_patch(FancyArrowPatch((right, y0 + 0.12), (right, y0 - 0.12), connectionstyle="arc3,rad=-2.2",
                                     **style))
        ax.text(right + 0.2, y0 + 0.17, _edge_label(edge), fontsize=6.5, color=style["color"], ha="left",
                va="bottom", zorder=5)
        return
    path, (lx, ly) = edge_path(edge_index, edge, layout)
    ax.add_patch(FancyArrowPatch(path=path, **style))
    ax.text(lx, ly, _edge_label(edge), fontsize=6.5, color=style["color"], ha="center", va="center",
            bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            zorder=2)


def draw_dependence_graph(schedule: Schedule, machine: Machine) -> Figure:
    """Boxes are ops (name, warp group, stage, start); arrows are edges labelled with their delay d (and
    distance δ when loop-carried)."""
    graph = schedule.graph
    layout = graph_layout(graph, dict(schedule.assignment))
    positions, engine = layout.positions, layout.engine
    points = [*positions.values(), *(p for route in (*layout.via.values(), *layout.bezier.values()) for p in route)]
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    span_x, span_y = max(xs) - min(xs) + 1.6, max(ys) - min(ys) + 1.2
    width, height = max(6.0, span_x * SLOT_INCHES) + 3.2, max(3.0, span_y * LAYER_INCHES) + 0.8
    fig = _mpl.new_figure(width, height)
    plot_w = width - 3.2
    ax = fig.add_axes((0.1 / width, 0.2 / height, plot_w / width, (height - 0.8) / height))
    ax.set_xlim(min(xs) - 0.8, min(xs) - 0.8 + plot_w / SLOT_INCHES)
    ax.set_ylim(min(ys) - 0.6, min(ys) - 0.6 + (height - 0.8) / LAYER_INCHES)
    ax.axis("off")
    colors = op_colors(schedule)
    for index, edge in enumerate(graph.edges):
        _draw_edge(ax, index, edge, layout)
    for op in graph.ops:
        x, y = positions[op.name]
        color = colors[op.name]
        ax.add_patch(FancyBboxPatch((x - NODE_W / 2, y - NODE_H / 2), NODE_W, NODE_H,
                                    boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=color,
                                    edgecolor=_mpl.darker(color), linewidth=1.0, zorder=3))
        wg = schedule.warp_of(op.name)
        detail = f"{'wg' + str(wg.id) + ' · ' if wg else ''}s{schedule.stage(op.name)} · t={schedule.start(op.name)}"
        ink = text_color(color)
        ax.text(x, y + 0.08, op.name, ha="center", va="center", fontsize=8, fontweight="bold", color=ink, zorder=4)
        ax.text(x, y - 0.13, detail, ha="center", va="center", fontsize=6.5, color=ink, zorder=4)
    group_colors = warp_group_colors(schedule.warps)
    handles: list = [Patch(facecolor=group_colors[wg.id], edgecolor=_mpl.darker(group_colors[wg.id]),
                           label=warp_group_label(wg)) for wg in schedule.warps]
    handles += [Line2D([], [], color=EDGE_COLOR, linewidth=0.9, label="dependence (delay d)"),
                Line2D([], [], color=EDGE_COLOR, linewidth=0.9, linestyle=(0, (4, 3)),
                       label="loop-carried (distance δ)"),
                Line2D([], [], color=BLOCKING_COLOR, linewidth=1.8, label="blocking (synchronous wait)")]
    ax.legend(handles=handles, **_mpl.legend_kwargs(loc="upper left", bbox_to_anchor=(1.0, 1.0)))
    ax.set_title(f"{graph.name}: dependence graph ({len(graph.ops)} ops, {len(graph.edges)} edges; "
                 f"layout: {engine})", fontsize=10, loc="left")
    return fig
