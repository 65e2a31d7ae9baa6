"""The HTML report: one self-contained page (no server, no external files) with the four pictures inlined as
SVG, the op / warp-group / buffer tables, solver statistics, lower bounds, the text schedule and the
pipelined program."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import twill
from twill.machine.models import Machine
from twill.schedule.report import proof_text
from twill.schedule.result import Schedule
from twill.viz import PICTURES, _mpl, figure
from twill.viz.palette import op_colors, primary_unit, warp_group_colors, warp_group_label
from twill.viz.timeline import time_unit

CAPTIONS = {
    "timeline": "Timeline of consecutive iterations: one lane per warp group (solid = the warp is busy issuing, "
                "hatched = asynchronous work in flight) and one per functional unit; bars read op[iteration]. "
                "Shading marks prologue, steady state and epilogue; dashed red lines are II boundaries.",
    "mrt": "Modulo reservation table: which op holds each functional unit at every cycle t mod II of the steady "
           "state (sN = pipeline stage of the op).",
    "graph": "Dependence graph coloured by warp group: edge labels are delays d (and distances δ); dashed edges "
             "are loop-carried, thick red edges need a blocking wait.",
    "pressure": "Live registers per thread of each warp group, and shared/tensor memory of the CTA, over the "
                "steady state, against their limits.",
}

STYLE = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1500px; padding: 0 1.5em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; border: 1px solid #555; margin-right: 0.4em;
          vertical-align: -0.1em; }
figure { margin: 1em 0 2em; overflow-x: auto; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9em; margin-top: 0.3em; }
pre { background: #f7f7f7; border: 1px solid #e2e2e2; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.status-optimal { color: #1a7f37; font-weight: bold; } .status-feasible { color: #b35900; font-weight: bold; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """An HTML table (no header row when ``headers`` is empty); cells are escaped unless given as
    ``("raw", markup)``; ``numeric`` columns align right."""
    out = ["<table>"]
    if headers:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            content = cell[1] if isinstance(cell, tuple) and cell[:1] == ("raw",) else _e(cell)
            cls = ' class="num"' if i in numeric else ""
            cells.append(f"<td{cls}>{content}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _swatch(color: str, text: str) -> tuple[str, str]:
    return ("raw", f'<span class="swatch" style="background:{_e(color)}"></span>{_e(text)}')


def namespaced_svg(svg: str, prefix: str) -> str:
    """Prefix every ``id`` and every ``#id`` reference of an SVG so that several SVGs can share one page."""
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r'url\(#([^)]+)\)', lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    return re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}-{m.group(1)}"', svg)


def lower_bounds(schedule: Schedule) -> list[tuple[str, Any]]:
    """The lower bounds known for the schedule: the proven II bound and, when the solver recorded them,
    ResMII = max_f ⌈Σ usage_f / cap(f)⌉, RecMII = max over cycles ⌈Σ d / Σ δ⌉ and the bound on L."""
    rows: list[tuple[str, Any]] = [("II lower bound (proven)", schedule.ii_lower_bound)]
    for key, label in (("res_mii", "ResMII (resources)"), ("rec_mii", "RecMII (recurrences)")):
        if key in schedule.stats:
            rows.append((label, schedule.stats[key]))
    rows.append(("II - lower bound", schedule.ii - schedule.ii_lower_bound))
    if "length_lower_bound" in schedule.stats:
        rows.append(("L lower bound", schedule.stats["length_lower_bound"]))
    return rows


def _summary(schedule: Schedule, machine: Machine) -> str:
    status = f'<span class="status-{_e(schedule.status)}">{_e(schedule.status)}</span>'
    rows: list[Sequence[Any]] = [
        ("graph", schedule.graph.name), ("machine", f"{machine.full_name} ({machine.arch})"),
        ("solver", schedule.solver), ("status", ("raw", status)), ("proof", proof_text(schedule) or "not recorded"),
        ("initiation interval II", schedule.ii), ("schedule length L", schedule.length),
        ("stages", schedule.num_stages), ("overlapped copies ⌈L/II⌉", schedule.copies),
        ("warp groups", len(schedule.warps) or "none (no warp specialization)"),
        ("streaming depth", schedule.streaming_depth), ("solve time", f"{schedule.solve_seconds:.2f} s"),
    ]
    rows.append(("time unit", time_unit(schedule)))
    rows += list(lower_bounds(schedule))
    return _table((), rows)


def _ops_table(schedule: Schedule) -> str:
    colors = op_colors(schedule)
    rows = []
    for name in schedule.steady_state_order():
        op = schedule.graph.op(name)
        wg = schedule.warp_of(name)
        units = ", ".join(f"{u}×{op.usage(u)}" for u in sorted(op.units())) or "—"
        rows.append((_swatch(colors[name], name), op.attrs.get("role", ""), op.kind,
                     f"wg{wg.id} {wg.role}" if wg else "—", schedule.start(name), schedule.stage(name),
                     schedule.residue(name), op.cycles, op.issue_latency, units, op.regs, op.smem,
                     primary_unit(op) or "—"))
    return _table(("op", "role", "kind", "warp group", "start", "stage", "t mod II", "cycles", "latency",
                   "unit-cycles", "regs", "smem B", "main unit"), rows, numeric=(4, 5, 6, 7, 8, 10, 11))


def _warps_table(schedule: Schedule) -> str:
    if not schedule.warps:
        return "<p>No warp specialization: every op runs on the same warps.</p>"
    colors = warp_group_colors(schedule.warps)
    rows = [(_swatch(colors[wg.id], warp_group_label(wg)), wg.role, wg.num_warps, wg.regs, " ".join(wg.ops))
            for wg in schedule.warps]
    return _table(("warp group", "role", "warps", "regs/thread", "ops (steady-state order)"), rows,
                  numeric=(2, 3))


def _buffers_table(schedule: Schedule) -> str:
    rows = [(b["src"], b["dst"], b["depth"]) for b in schedule.buffers()]
    return _table(("producer", "consumer", "buffers in flight"), rows, numeric=(2,))


def _stats_table(schedule: Schedule) -> str:
    if not schedule.stats:
        return "<p>The solver recorded no statistics.</p>"
    rows = []
    for key in sorted(schedule.stats):
        value = schedule.stats[key]
        text = value if isinstance(value, (str, int, float)) else json.dumps(_plain(value), sort_keys=True)
        rows.append((key, ("raw", f"<code>{_e(text)}</code>")))
    return _table(("statistic", "value"), rows)


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def render_report(schedule: Schedule, machine: Machine, *, text_report: str, pipelined: str) -> str:
    """The report page as a string (see :func:`write_report`)."""
    title = f"Twill schedule: {schedule.graph.name} on {machine.name.upper()}"
    sections = [("summary", "Summary"), *((name, name) for name in PICTURES), ("ops", "Ops"),
                ("warps", "Warp groups"), ("buffers", "Buffers"), ("stats", "Solver statistics"),
                ("text", "Text schedule"), ("pipelined", "Pipelined program")]
    headings = {"timeline": "Timeline", "mrt": "Modulo reservation table", "graph": "Dependence graph",
                "pressure": "Register and memory pressure"}
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{_e(title)}</h1>",
             "<nav>" + "".join(f'<a href="#{key}">{_e(headings.get(key, label))}</a>' for key, label in sections)
             + "</nav>",
             '<h2 id="summary">Summary</h2>', _summary(schedule, machine)]
    for name in PICTURES:
        svg = namespaced_svg(_mpl.svg_markup(figure(name, schedule, machine)), f"tw-{name}")
        parts += [f'<h2 id="{name}">{_e(headings[name])}</h2>', "<figure>", svg,
                  f"<figcaption>{_e(CAPTIONS[name])}</figcaption>", "</figure>"]
    parts += ['<h2 id="ops">Ops</h2>', _ops_table(schedule),
              '<h2 id="warps">Warp groups</h2>', _warps_table(schedule),
              '<h2 id="buffers">Buffers</h2>', _buffers_table(schedule),
              '<h2 id="stats">Solver statistics</h2>', _stats_table(schedule),
              '<h2 id="text">Text schedule</h2>', f"<pre>{_e(text_report)}</pre>",
              '<h2 id="pipelined">Pipelined program</h2>', f"<pre>{_e(pipelined)}</pre>",
              f"<footer><p>Generated by twill {_e(twill.__version__)}.</p></footer>", "</body></html>"]
    return "\n".join(parts) + "\n"


def write_report(schedule: Schedule, machine: Machine, path: Path, *, text_report: str, pipelined: str) -> Path:
    """Render the report and write it to ``path`` atomically."""
    page = render_report(schedule, machine, text_report=text_report, pipelined=pipelined)
    return _mpl.write_atomic(path, page.encode("utf-8"))
