"""The modulo reservation table picture: functional-unit instances against cycles ``t mod II``."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.viz import _mpl
from twill.viz.layout import reservation_table
from twill.viz.palette import text_color, unit_color, warp_group_colors, warp_group_label
from twill.viz.timeline import time_unit

#: Draw a grid line per cycle when II is at most this.
CYCLE_GRID_MAX_II = 64
ROW_INCHES = 0.55
#: Cells are drawn at least this many points wide.
MIN_CELL_PT = 2.5


def draw_reservation_table(schedule: Schedule, machine: Machine) -> Figure:
    """One row per unit instance, one column per cycle of the steady state; a cell shows the op that
    holds the unit there as ``name s<stage>`` (the op's stage ⌊t/II⌋ says which iteration it serves)."""
    table = reservation_table(schedule, machine)
    ii = table.ii
    rows: list[tuple[str, int]] = [(unit, r) for unit, count in table.units for r in range(count)]
    row_of = {key: i for i, key in enumerate(rows)}
    width = min(15.0, max(8.0, 0.22 * ii))
    height = ROW_INCHES * max(len(rows), 1) + 1.6
    fig = _mpl.new_figure(width + 3.0, height)
    ax = fig.add_axes((1.3 / (width + 3.0), 0.9 / height, width / (width + 3.0), (height - 1.4) / height))
    ax.set_xlim(0, ii)
    ax.set_ylim(len(rows), 0)
    pt_per_cycle = width * 72 / ii
    height_pt = 0.88 * ROW_INCHES * 72
    by_row: dict[int, list] = {}
    for cell in table.cells:
        y = row_of[(cell.unit, cell.row)]
        end = max(cell.end, cell.start + MIN_CELL_PT / pt_per_cycle)
        ax.add_patch(Rectangle((cell.start, y + 0.06), end - cell.start, 0.88, facecolor=cell.color,
                               edgecolor=_mpl.darker(cell.color), linewidth=0.7))
        by_row.setdefault(y, []).append(cell)
    for y, cells in by_row.items():
        cells.sort(key=lambda c: c.start)
        for i, cell in enumerate(cells):
            label = f"{cell.op} s{cell.stage}"
            fit = next((f for f in (8.0, 6.5, 5.5)
                        if _mpl.text_fits(label, (cell.end - cell.start) * pt_per_cycle, height_pt, f)), None)
            if fit is not None:
                ax.text((cell.start + cell.end) / 2, y + 0.5, label, ha="center", va="center", fontsize=fit,
                        color=text_color(cell.color), clip_on=True)
                continue
            right = max(cell.end, cell.start + MIN_CELL_PT / pt_per_cycle)
            free_until = cells[i + 1].start if i + 1 < len(cells) else ii
            if _mpl.text_fits(label, (free_until - right) * pt_per_cycle - 3, height_pt, 6.5):
                ax.text(right + 2 / pt_per_cycle, y + 0.5, label, ha="left", va="center", fontsize=6.5,
                        color=_mpl.darker(cell.color, 0.7), clip_on=True)
    for i, (unit, r) in enumerate(rows):
        over = r >= table.capacity.get(unit, 1)
        ax.axhspan(i, i + 1, color="#fde0dd" if over else ("#fafafa" if i % 2 else "#ffffff"), zorder=0)
    if ii <= CYCLE_GRID_MAX_II:
        for t in range(ii + 1):
            ax.axvline(t, color="#dddddd", linewidth=0.5, zorder=0.5)
        ax.set_xticks(range(ii) if ii <= 32 else range(0, ii, 4))
    ax.set_yticks([i + 0.5 for i in range(len(rows))])
    labels = [f"{unit}" if dict(table.units)[unit] == 1 else f"{unit} #{r}" for unit, r in rows]
    ax.set_yticklabels(labels, fontsize=9)
    for tick, (unit, _) in zip(ax.get_yticklabels(), rows):
        tick.set_color(_mpl.darker(unit_color(unit), 0.8))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(f"cycle of the steady state, t mod II ({time_unit(schedule)})", fontsize=9)
    used = {unit: sum(c.end - c.start for c in table.cells if c.unit == unit) for unit, _ in table.units}
    util = ", ".join(f"{unit} {100 * used[unit] / (ii * table.capacity.get(unit, 1)):.0f}%"
                     for unit, _ in table.units)
    ax.set_title(f"{schedule.graph.name}: modulo reservation table, II = {ii}; utilization {util}",
                 fontsize=10, loc="left")
    if schedule.warps:
        colors = warp_group_colors(schedule.warps)
        handles = [Patch(facecolor=colors[wg.id], label=warp_group_label(wg)) for wg in schedule.warps]
        ax.legend(handles=handles, **_mpl.legend_kwargs(loc="upper left", bbox_to_anchor=(1.005, 1.0)))
    return fig
