"""The colours of every Twill picture, chosen in one place so that all pictures agree.

A warp group's colour depends only on its role and on its rank among the groups of the same role family
(the first compute group is blue, the second orange...), following the key of the paper's Figure 9:
green = variable-latency (load) warp, pink = tensor-core (MMA) warp, blue/orange = the two softmax or
compute groups, yellow = correction. Functional units have fixed colours. An op takes the colour of its
warp group; in a schedule without warp specialization it takes the colour of the unit it uses most.

This module does not import matplotlib.
"""

from __future__ import annotations

import zlib
from typing import Mapping, Sequence

from twill.ir.graph import Op
from twill.schedule.result import Schedule, WarpGroup

#: Role families: groups whose roles share a family take successive colours of the family's list.
ROLE_FAMILY = {"load": "load", "producer": "load", "mma": "mma", "compute": "compute", "softmax": "compute",
               "consumer": "compute", "correction": "correction", "epilogue": "epilogue"}

FAMILY_COLORS: Mapping[str, tuple[str, ...]] = {
    "load": ("#2ca02c", "#98df8a", "#17becf"),
    "mma": ("#e377c2", "#f7b6d2", "#c51b7d"),
    "compute": ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#aec7e8", "#ffbb78", "#c5b0d5", "#c49c94"),
    "correction": ("#e6c619", "#dbdb8d"),
    "epilogue": ("#7f7f7f", "#c7c7c7"),
    "other": ("#bcbd22", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39"),
}

#: Fixed colours of the machine's functional units (lower-case unit names; ``exp`` is an alias of ``mufu``).
UNIT_COLORS: Mapping[str, str] = {
    "tc": "#6a3d9a",
    "tma": "#33a02c",
    "mufu": "#e31a1c",
    "exp": "#e31a1c",
    "alu": "#1f78b4",
    "smem": "#ff7f00",
    "tmem": "#b15928",
}

#: Colours of units that the table above does not know, picked by a stable hash of the name.
EXTRA_UNIT_COLORS = ("#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99")

#: Colour of an op that holds no functional unit and has no warp group (e.g. a wgmma wait).
NEUTRAL = "#9e9e9e"

#: Order in which unit lanes and rows are listed.
UNIT_ORDER = ("tc", "tma", "mufu", "exp", "alu", "smem", "tmem")


def role_color(role: str, rank: int = 0) -> str:
    """Colour of the ``rank``-th warp group (0-based) whose role belongs to ``role``'s family."""
    colors = FAMILY_COLORS[ROLE_FAMILY.get(role.lower(), "other")]
    return colors[rank % len(colors)]


def warp_group_colors(warps: Sequence[WarpGroup]) -> dict[int, str]:
    """Warp-group id -> colour: groups are ranked by id within their role family."""
    seen: dict[str, int] = {}
    out: dict[int, str] = {}
    for wg in sorted(warps, key=lambda w: w.id):
        family = ROLE_FAMILY.get(wg.role.lower(), "other")
        rank = seen.get(family, 0)
        seen[family] = rank + 1
        out[wg.id] = role_color(wg.role, rank)
    return out


def unit_color(unit: str) -> str:
    """Fixed colour of a functional unit (case-insensitive)."""
    key = unit.lower()
    if key in UNIT_COLORS:
        return UNIT_COLORS[key]
    return EXTRA_UNIT_COLORS[zlib.crc32(key.encode()) % len(EXTRA_UNIT_COLORS)]


def primary_unit(op: Op) -> str | None:
    """The unit an op holds for the most unit-cycles (ties: the first in ``UNIT_ORDER``, then by name)."""
    units = op.units()
    if not units:
        return None
    return min(units, key=lambda u: (-op.usage(u), unit_rank(u), u))


def unit_rank(unit: str) -> int:
    """Position of a unit in the lane order: known units first, in ``UNIT_ORDER``."""
    key = unit.lower()
    return UNIT_ORDER.index(key) if key in UNIT_ORDER else len(UNIT_ORDER)


def op_color(schedule: Schedule, name: str) -> str:
    """Colour of op ``name``: its warp group's colour, else the colour of its primary unit, else neutral."""
    return op_colors(schedule)[name]


def op_colors(schedule: Schedule) -> dict[str, str]:
    """Op name -> colour for every op of the schedule's graph (see :func:`op_color`)."""
    groups = warp_group_colors(schedule.warps)
    out: dict[str, str] = {}
    for op in schedule.graph.ops:
        if op.name in schedule.assignment:
            out[op.name] = groups[schedule.assignment[op.name]]
        else:
            unit = primary_unit(op)
            out[op.name] = unit_color(unit) if unit is not None else NEUTRAL
    return out


def text_color(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (``#rrggbb``), by relative luminance
    Y = 0.299 R + 0.587 G + 0.114 B against 0.6."""
    r, g, b = (int(background[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"


def warp_group_label(wg: WarpGroup) -> str:
    """Short legend text of a warp group: ``wg1 compute (4 warps, 240 regs)``."""
    plural = "warp" if wg.num_warps == 1 else "warps"
    return f"wg{wg.id} {wg.role} ({wg.num_warps} {plural}, {wg.regs} regs)"
