"""Pictures of schedules and a self-contained HTML report.

Four pictures, all coloured by :mod:`twill.viz.palette` (warp groups by role, units fixed):

* ``timeline`` — a few consecutive iterations: one lane per warp group and per functional unit,
  prologue / steady state / epilogue shaded, II marked (:mod:`twill.viz.timeline`);
* ``mrt`` — the modulo reservation table, unit x (t mod II) (:mod:`twill.viz.mrt`);
* ``graph`` — the dependence graph coloured by warp group, loop-carried edges dashed, blocking edges red
  (:mod:`twill.viz.depgraph`; graphviz ``dot`` lays it out when installed);
* ``pressure`` — live registers per warp group and shared/tensor memory over the steady state against
  their limits (:mod:`twill.viz.pressure`).

Importing this package does not import matplotlib (the drawing modules are loaded on first use) and
never imports a solver. Every file is written atomically.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.viz.palette import op_color, op_colors, role_color, unit_color, warp_group_colors

#: Picture name -> (module, drawing function), in the order ``save_all`` and the report use.
PICTURES: dict[str, tuple[str, str]] = {
    "timeline": ("twill.viz.timeline", "draw_timeline"),
    "mrt": ("twill.viz.mrt", "draw_reservation_table"),
    "graph": ("twill.viz.depgraph", "draw_dependence_graph"),
    "pressure": ("twill.viz.pressure", "draw_pressure"),
}


def drawer(picture: str) -> Callable[[Schedule, Machine], Any]:
    """The function that draws ``picture`` (imports matplotlib on first use)."""
    module, function = PICTURES[picture]
    return getattr(importlib.import_module(module), function)


#: rcParams in force while a picture is drawn: text is shown as written, so a name with ``$`` is not read as
#: mathtext (a ``$x^$`` op name would stop the drawing with a parse error).
DRAW_RC = {"text.parse_math": False}


def figure(picture: str, schedule: Schedule, machine: Machine):
    """A matplotlib ``Figure`` of ``picture`` (one of :data:`PICTURES`), its text drawn as written
    (:data:`DRAW_RC`)."""
    draw = drawer(picture)
    import matplotlib

    with matplotlib.rc_context(DRAW_RC):
        return draw(schedule, machine)


def save_picture(picture: str, schedule: Schedule, machine: Machine, path: str | Path) -> Path:
    """Draw ``picture`` and write it to ``path``; the format comes from the suffix (.svg, .png, .pdf)."""
    from twill.viz import _mpl

    path = Path(path)
    _mpl.picture_format(path)
    return _mpl.save_figure(figure(picture, schedule, machine), path)


def save_timeline(schedule: Schedule, machine: Machine, path: str | Path) -> Path:
    """Write the timeline picture to ``path`` (.svg, .png or .pdf by suffix)."""
    return save_picture("timeline", schedule, machine, path)


def save_all(schedule: Schedule, machine: Machine, directory: str | Path, *, fmt: str = "png") -> list[Path]:
    """Write the four pictures as ``timeline.<fmt>``, ``mrt.<fmt>``, ``graph.<fmt>`` and
    ``pressure.<fmt>`` in ``directory`` (created if missing); return their paths in that order."""
    from twill.viz import _mpl

    directory = _mpl.make_directory(Path(directory))
    return [save_picture(name, schedule, machine, directory / f"{name}.{fmt.lstrip('.')}") for name in PICTURES]


def write_report(schedule: Schedule, machine: Machine, path: str | Path, *, text_report: str,
                 pipelined: str) -> Path:
    """Write one self-contained HTML page: the four pictures inlined as SVG, the text schedule
    (``text_report``), the pipelined program (``pipelined``), solver statistics and lower bounds."""
    from twill.viz.report import write_report as _write

    return _write(schedule, machine, Path(path), text_report=text_report, pipelined=pipelined)


__all__ = ["PICTURES", "drawer", "figure", "op_color", "op_colors", "role_color", "save_all", "save_picture",
           "save_timeline", "unit_color", "warp_group_colors", "write_report"]
