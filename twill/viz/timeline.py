"""The timeline picture: a few consecutive iterations of the pipelined loop, one lane per warp group and
one per functional unit, prologue / steady state / epilogue shaded and the initiation interval marked."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.viz import _mpl
from twill.viz.layout import Bar, Lane, Timeline, timeline
from twill.viz.palette import text_color, warp_group_colors, warp_group_label

#: Height of one sub-row of a lane, and the gap between lanes (data units; 1 unit = ROW_INCHES).
ROW_INCHES = 0.42
LANE_GAP = 0.35
#: Width of the plotting area in inches: chosen so the narrowest labelled bars fit, within these bounds.
MIN_WIDTH, MAX_WIDTH = 11.0, 22.0
#: Points of horizontal space we would like per label character at the bar font size.
LABEL_FONT = 7.0
#: Bars are drawn at least this many points wide, and this tall (fraction of a row).
MIN_BAR_PT, BAR_HEIGHT = 2.5, 0.84
PHASE_COLORS = {"prologue": "#e8eef7", "steady state": "#ffffff", "epilogue": "#f2f2f2"}


def time_unit(schedule: Schedule) -> str:
    """Axis unit: normalized cycles (with the raw cycles per unit) when the solver normalized costs
    (paper §5.2), else cycles."""
    norm = schedule.stats.get("normalization")
    if not norm or not norm.get("enabled", True):
        return "cycles"
    per_unit = norm.get("cycles_per_unit")
    if not per_unit or abs(float(per_unit) - 1.0) < 1e-9:
        return "normalized cycles"
    return f"normalized cycles, 1 = ~{float(per_unit):.3g} raw cycles"


def _lane_offsets(lanes: tuple[Lane, ...]) -> dict[str, float]:
    """Top-down y offset (of the lane's top edge) of each lane; warp lanes, a wider gap, then unit lanes."""
    offsets: dict[str, float] = {}
    y = 0.0
    previous_kind = None
    for lane in lanes:
        if previous_kind is not None:
            y += LANE_GAP * (3 if lane.kind != previous_kind else 1)
        offsets[lane.key] = y
        y += lane.rows
        previous_kind = lane.kind
    return offsets


def _plot_width(tl: Timeline) -> float:
    """Inches of plotting width: enough for ``LABEL_FONT`` labels on half of the bars."""
    span = max(tl.phases.end, 1)
    needs = sorted(0.6 * LABEL_FONT * len(b.label) / 72 * span / max(b.end - b.start, 1) for b in tl.bars)
    wanted = needs[(len(needs) - 1) // 2] if needs else MIN_WIDTH
    return min(MAX_WIDTH, max(MIN_WIDTH, wanted))


def _draw_bar(ax, bar: Bar, y_top: float, kind: str, unit_per_pt: float) -> None:
    """The bar's rectangle(s); at least ``MIN_BAR_PT`` wide so that one-cycle ops stay visible."""
    y = y_top + bar.row + 0.08
    edge = _mpl.darker(bar.color)
    end = max(bar.end, bar.start + MIN_BAR_PT * unit_per_pt)
    if kind == "warp":
        issue_end = bar.start
        if bar.issue_end > bar.start:
            issue_end = min(max(bar.issue_end, bar.start + MIN_BAR_PT * unit_per_pt), end)
        if issue_end > bar.start:
            ax.add_patch(Rectangle((bar.start, y), issue_end - bar.start, BAR_HEIGHT, facecolor=bar.color,
                                   edgecolor=edge, linewidth=0.6))
        if end > issue_end:
            ax.add_patch(Rectangle((issue_end, y), end - issue_end, BAR_HEIGHT, facecolor=bar.color,
                                   alpha=0.35, edgecolor=edge, linewidth=0.4, hatch="///"))
    else:
        ax.add_patch(Rectangle((bar.start, y), end - bar.start, BAR_HEIGHT, facecolor=bar.color,
                               edgecolor=edge, linewidth=0.6))


def _label_bars(ax, bars: list[Bar], y_top: float, kind: str, pt_per_unit: float, x_end: float) -> None:
    """Label each bar of one lane row inside it when the label fits, else just right of it when the row
    is free until the next bar (sparse rows: loads, waits), else not at all."""
    height_pt = BAR_HEIGHT * ROW_INCHES * 72
    bars = sorted(bars, key=lambda b: b.start)
    for i, bar in enumerate(bars):
        y = y_top + bar.row + 0.08 + BAR_HEIGHT / 2
        solid = kind != "warp" or bar.issue_end - bar.start >= 0.5 * (bar.end - bar.start)
        color = text_color(bar.color) if solid else "black"
        inside = next((f for f in (LABEL_FONT, 6.0, 5.0)
                       if _mpl.text_fits(bar.label, (bar.end - bar.start) * pt_per_unit, height_pt, f)), None)
        if inside is not None:
            ax.text((bar.start + bar.end) / 2, y, bar.label, ha="center", va="center", fontsize=inside,
                    color=color, clip_on=True)
            continue
        right = max(bar.end, bar.start + MIN_BAR_PT / pt_per_unit)
        free_until = bars[i + 1].start if i + 1 < len(bars) else x_end
        if _mpl.text_fits(bar.label, (free_until - right) * pt_per_unit - 3, height_pt, 6.0):
            ax.text(right + 2 / pt_per_unit, y, bar.label, ha="left", va="center", fontsize=6.0,
                    color=_mpl.darker(bar.color, 0.7), clip_on=True)


def _shade_phases(ax, tl: Timeline, pt_per_unit: float) -> None:
    ph = tl.phases
    spans = (("prologue", 0, ph.steady_start), ("steady state", ph.steady_start, ph.epilogue_start),
             ("epilogue", ph.epilogue_start, ph.end))
    for name, a, b in spans:
        if b <= a:
            continue
        ax.axvspan(a, b, color=PHASE_COLORS[name], zorder=0)
        label = name
        if name == "steady state":
            repeats = (b - a) // ph.ii
            label = f"steady state ({repeats} x II)"
        if _mpl.text_fits(label, (b - a) * pt_per_unit, 20, 9):
            ax.text((a + b) / 2, -1.35, label, ha="center", va="center", fontsize=9, style="italic",
                    color="#444444")
    for k in range((ph.epilogue_start - ph.steady_start) // ph.ii + 1):
        x = ph.steady_start + k * ph.ii
        ax.axvline(x, color="#b22222", linestyle="--", linewidth=0.9, zorder=1)
    first, second = ph.steady_start, ph.steady_start + ph.ii
    ax.annotate("", xy=(first, -0.55), xytext=(second, -0.55),
                arrowprops={"arrowstyle": "<->", "color": "#b22222", "linewidth": 1.1})
    ax.text((first + second) / 2, -0.75, f"II = {ph.ii}", ha="center", va="bottom", fontsize=9,
            color="#b22222", fontweight="bold")


def _legend(ax, schedule: Schedule, run_ahead: bool) -> None:
    handles: list[Patch] = []
    colors = warp_group_colors(schedule.warps)
    for wg in schedule.warps:
        handles.append(Patch(facecolor=colors[wg.id], edgecolor=_mpl.darker(colors[wg.id]),
                             label=warp_group_label(wg)))
    if schedule.warps:
        handles.append(Patch(facecolor="#bbbbbb", edgecolor="#555555", label="warp busy issuing"))
        handles.append(Patch(facecolor="#e4e4e4", edgecolor="#555555", hatch="///",
                             label="asynchronous work in flight"))
    handles.append(Patch(facecolor="none", edgecolor="#b22222", linestyle="--", label="II boundary"))
    if run_ahead:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"streaming loads run ahead ({schedule.streaming_depth} buffers)"))
    ax.legend(handles=handles, **_mpl.legend_kwargs(loc="upper left", bbox_to_anchor=(1.005, 1.0)))


def draw_timeline(schedule: Schedule, machine: Machine, iterations: int | None = None) -> Figure:
    """The timeline figure of :func:`twill.viz.layout.timeline`; bars read ``op[iteration]``."""
    tl = timeline(schedule, machine, iterations)
    offsets = _lane_offsets(tl.lanes)
    y_max = max(offsets[lane.key] + lane.rows for lane in tl.lanes) if tl.lanes else 1.0
    plot_width = _plot_width(tl)
    # Inches: 2.0 for lane labels on the left, 1.2 for the legend on the right; 0.9 below for the axis.
    width, height = plot_width + 3.2, (y_max + 2.2) * ROW_INCHES + 1.0
    fig = _mpl.new_figure(width, height)
    ax = fig.add_axes((2.0 / width, 0.9 / height, plot_width / width, (y_max + 1.7) * ROW_INCHES / height))
    ax.set_xlim(0, tl.phases.end)
    ax.set_ylim(y_max + 0.1, -1.7)
    pt_per_unit = plot_width * 72 / max(tl.phases.end, 1)
    _shade_phases(ax, tl, pt_per_unit)
    kinds = {lane.key: lane.kind for lane in tl.lanes}
    rows: dict[tuple[str, int], list[Bar]] = {}
    for bar in tl.bars:
        _draw_bar(ax, bar, offsets[bar.lane], kinds[bar.lane], 1 / pt_per_unit)
        rows.setdefault((bar.lane, bar.row), []).append(bar)
    for (lane, _), row_bars in rows.items():
        _label_bars(ax, row_bars, offsets[lane], kinds[lane], pt_per_unit, tl.phases.end)
    ax.set_yticks([offsets[lane.key] + lane.rows / 2 for lane in tl.lanes])
    ax.set_yticklabels([lane.label for lane in tl.lanes], fontsize=8)
    for tick, lane in zip(ax.get_yticklabels(), tl.lanes):
        tick.set_color(_mpl.darker(lane.color, 0.8))
    for lane in tl.lanes:
        ax.axhline(offsets[lane.key] + lane.rows + 0.02, color="#dddddd", linewidth=0.5, zorder=0.5)
    ax.set_xlabel(f"time ({time_unit(schedule)}); iteration k issues op v at start(v) + k*II", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"{schedule.graph.name} on {machine.name.upper()} ({schedule.status}): II = {schedule.ii} "
                 f"(lower bound {schedule.ii_lower_bound}), L = {schedule.length}, {schedule.copies} overlapped "
                 f"copies, iterations 0..{tl.phases.iterations - 1}", fontsize=10, loc="left")
    _legend(ax, schedule, tl.run_ahead)
    return fig
