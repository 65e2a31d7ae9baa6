"""The memory-pressure picture: registers per warp group, then shared and tensor memory, live at each
cycle of the steady state against their limits."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.viz import _mpl
from twill.viz.layout import PressureSeries, pressure
from twill.viz.timeline import time_unit

LIMIT_COLOR = "#b22222"
PANEL_INCHES = 1.7


def _fmt(value: float, unit: str) -> str:
    return f"{value / 1024:.1f} KiB" if unit == "bytes" else f"{value:g}"


def _draw_series(ax, series: PressureSeries, ii: int) -> None:
    """Stacked step areas per owner over ``t mod II``, the limit (dashed) and, for memories, the static
    allocation (dotted). Memories are plotted in KiB."""
    scale = 1024.0 if series.unit == "bytes" else 1.0
    xs = list(range(ii + 1))
    base = [0.0] * (ii + 1)
    for owner, values in series.by_owner.items():
        top = [b + v / scale for b, v in zip(base, list(values) + [values[-1]])]
        ax.fill_between(xs, base, top, step="post", facecolor=series.colors[owner], alpha=0.55,
                        edgecolor=_mpl.darker(series.colors[owner]), linewidth=0.8, label=owner)
        base = top
    ax.axhline(series.limit / scale, color=LIMIT_COLOR, linestyle="--", linewidth=1.2)
    ax.text(ii, series.limit / scale, f" limit {_fmt(series.limit, series.unit)}", color=LIMIT_COLOR,
            fontsize=8, va="bottom" if series.allocated is not None else "center", ha="left")
    used = series.peak
    title = f"{series.title}: live peak {_fmt(series.peak, series.unit)}"
    if series.allocated is not None:
        used = series.allocated
        ax.axhline(series.allocated / scale, color="#333333", linestyle=":", linewidth=1.2)
        # Keep the two right-hand labels apart when the allocation is close to the limit.
        near = abs(series.allocated - series.limit) < 0.08 * max(series.limit, series.allocated, 1)
        ax.text(ii, series.allocated / scale, f" allocated {_fmt(series.allocated, series.unit)}", fontsize=8,
                va="top" if near else "center", ha="left", color="#333333")
        title = f"{series.title}: allocated {_fmt(series.allocated, series.unit)} (live peak " \
                f"{_fmt(series.peak, series.unit)})"
    over = used > series.limit
    title += f" of {_fmt(series.limit, series.unit)}" + (" — OVER LIMIT" if over else "")
    ax.set_ylim(0, max(series.limit, series.peak, series.allocated or 0) / scale * 1.18 + 1)
    ax.set_xlim(0, ii)
    ax.set_title(title, fontsize=9, loc="left", color=LIMIT_COLOR if over else "black")
    ax.set_ylabel("KiB" if series.unit == "bytes" else series.unit, fontsize=8)
    ax.tick_params(labelsize=7)
    if len(series.by_owner) > 1:
        ax.legend(**_mpl.legend_kwargs(loc="upper left", fontsize=7, ncol=len(series.by_owner)))


def draw_pressure(schedule: Schedule, machine: Machine) -> Figure:
    """One panel per :class:`~twill.viz.layout.PressureSeries`, values stepped over ``t mod II``."""
    panels = pressure(schedule, machine)
    height = PANEL_INCHES * len(panels) + 1.0
    fig = _mpl.new_figure(10.0, height)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    fig.subplots_adjust(left=0.09, right=0.86, top=1 - 0.85 / height, bottom=0.5 / height, hspace=0.55)
    for ax, series in zip(axes, panels):
        _draw_series(ax, series, schedule.ii)
    axes[-1].set_xlabel(f"cycle of the steady state, t mod II ({time_unit(schedule)})", fontsize=9)
    fig.suptitle(f"{schedule.graph.name}: live registers and memory over the steady state (II = {schedule.ii})",
                 fontsize=10, x=0.09, ha="left")
    fig.legend(handles=[Line2D([], [], color=LIMIT_COLOR, linestyle="--", label="limit"),
                        Line2D([], [], color="#333333", linestyle=":", label="allocated (buffers, staging)")],
               loc="upper right", fontsize=7)
    return fig
