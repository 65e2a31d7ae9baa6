"""Plain-text report of a schedule (``twill schedule`` without ``--json``)."""

from __future__ import annotations

from typing import Any, Mapping

from twill.ir.validate import effective_units
from twill.machine.models import Machine
from twill.quote import printable
from twill.schedule.result import Schedule
from twill.schedule.vocab import Objective, Status


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return lines


def _normalization_line(norm: Mapping[str, Any] | None) -> str:
    if not norm or not norm.get("enabled"):
        return "normalization: off (raw cycle counts)"
    pairs = ", ".join(f"{raw}->{n}" for raw, n in norm.get("map", {}).items())
    floored = norm.get("floored") or []
    below = f", floored to 1: {', '.join(str(v) for v in floored)}" if floored else ""
    return (f"normalization: U={norm.get('U')}, distortion F={norm.get('F')}, "
            f"~{norm.get('cycles_per_unit')} raw cycles per unit, max relative error "
            f"{100 * float(norm.get('max_relative_error', 0)):.1f}%{below}\n  raw->normalized: {pairs}")


def _tried_outcome(row: Mapping[str, Any]) -> str:
    """``optimal`` for a modulo search row; ``(modulo optimal, joint infeasible)`` for a joint one;
    ``(joint optimal, by extra_copies: 2 copies, unhoisted < 2)`` for a row of the extra copies."""
    if "status" in row:
        return str(row["status"])
    phases = [f"{key} {row[key]}" for key in ("modulo", "joint") if key in row]
    if "by" in row:
        phases.append(f"by {row['by']}")
    if row.get("by") == "extra_copies":
        phases[-1] += f": {row.get('copies')} copies" + (f", unhoisted < {row['unhoisted_below']}"
                                                          if "unhoisted_below" in row else "")
    return f"({', '.join(phases)})" if phases else ""


def _tried_line(tried: list[Mapping[str, Any]], norm: Mapping[str, Any] | None = None) -> str:
    """The IIs tried, consecutive IIs with the same outcome merged, raw cycles beside them when normalized:
    ``272-298 = ~1570-1720 cycles (modulo optimal, joint infeasible), 299 = ~1726 cycles (...)``."""
    runs: list[list[Any]] = []                       # [first ii, last ii, outcome]
    for row in tried:
        ii, outcome = row.get("ii"), _tried_outcome(row)
        if runs and runs[-1][2] == outcome and isinstance(ii, int) and runs[-1][1] == ii - 1:
            runs[-1][1] = ii
        else:
            runs.append([ii, ii, outcome])
    def span(a: Any, b: Any) -> str:
        text = f"{a}" if a == b else f"{a}-{b}"
        if not isinstance(a, int) or not isinstance(b, int) or raw_cycles(a, norm) is None:
            return text
        ra, rb = raw_cycles(a, norm), raw_cycles(b, norm)
        return text + (f" = ~{ra} cycles" if a == b else f" = ~{ra}-{rb} cycles")

    parts = [span(a, b) + (f" {outcome}" if outcome else "") for a, b, outcome in runs]
    return "IIs tried: " + ", ".join(parts)


def raw_cycles(value: int, norm: Mapping[str, Any] | None) -> int | None:
    """A normalized time in raw machine cycles; ``None`` when times are raw cycles already."""
    per_unit = (norm or {}).get("cycles_per_unit") if (norm or {}).get("enabled") else None
    if not per_unit or per_unit == 1:
        return None
    return round(value * float(per_unit))


def _time(value: int, norm: Mapping[str, Any] | None) -> str:
    """``356 (~2054 cycles)``, or ``356`` when there is no normalization."""
    cycles = raw_cycles(value, norm)
    return f"{value}" if cycles is None else f"{value} (~{cycles} cycles)"


def proof_text(schedule: Schedule) -> str:
    """What the status rests on, from ``stats["proven"]``: ``II and L proven minimal; stages, warps proven;
    not proven within the time limit: smem`` (empty when the schedule records nothing)."""
    proven = dict(schedule.stats.get("proven") or {})
    if not proven:
        return ""
    names = {"ii": "II minimal", Objective.LENGTH: "L minimal"}
    done = [names.get(k, k) for k, ok in proven.items() if ok]
    open_ = [names.get(k, k) for k, ok in proven.items() if not ok]
    parts = [f"proven: {', '.join(done)}"] if done else []
    if open_:
        parts.append(f"not proven within the time limit: {', '.join(open_)}")
    return "; ".join(parts)


def status_line(schedule: Schedule) -> str:
    """``status: optimal`` (everything proven), or ``status: feasible (proven: II minimal, L minimal; not
    proven within the time limit: smem)``."""
    detail = proof_text(schedule) if schedule.status != Status.OPTIMAL else ""
    return f"status: {schedule.status}" + (f" ({detail})" if detail else "")


def _header(schedule: Schedule) -> list[str]:
    stats = schedule.stats
    norm = stats.get("normalization")
    res, rec = stats.get("res_mii"), stats.get("rec_mii")
    cycles = raw_cycles(schedule.ii_lower_bound, norm)
    notes = ([f"~{cycles} cycles"] if cycles is not None else []) + \
        ([f"ResMII {res}, RecMII {rec}"] if res is not None and rec is not None else [])
    bound = f"II lower bound {schedule.ii_lower_bound}" + (f" ({'; '.join(notes)})" if notes else "")
    lines = [f"schedule of {schedule.graph.name!r} on {schedule.arch} (solver {schedule.solver})",
             status_line(schedule),
             f"II: {_time(schedule.ii, norm)}    {bound}",
             f"L: {_time(schedule.length, norm)}    stages: {schedule.num_stages}    copies: {schedule.copies}"]
    if "length_lower_bound" in stats:
        lines[-1] += f"    L lower bound: {stats['length_lower_bound']}"
    if stats.get("fallback"):       # the joint search found none of its own (twill.solve.joint.search.fall_back)
        lines.insert(2, f"fallback: the modulo-only schedule with the kernel's warp groups, because: "
                        f"{stats['fallback']}")
    if schedule.graph.attrs.get("loop_source"):         # a loop extracted from a Triton kernel
        lines.insert(1, f"loop: {schedule.graph.attrs['loop_source']}")
    lines.append(f"solve time: {schedule.solve_seconds:.2f} s")
    tried = stats.get("tried")
    if tried:
        lines.append(_tried_line(tried, norm))
    lines.extend(_normalization_line(stats.get("normalization")).split("\n"))     # one or two lines
    return lines


def _utilization_line(schedule: Schedule, machine: Machine) -> str:
    """Per unit, the share of its ``cap·II`` unit-cycles an iteration uses: ``Σ_v usage_f(v) / (cap(f)·II)``."""
    units = effective_units(schedule.graph, machine.units)
    parts = []
    for unit, cap in sorted(units.items()):
        used = sum(op.usage(unit) for op in schedule.graph.ops)
        if used:
            parts.append(f"{unit} {100 * used / (cap * schedule.ii):.0f}%")
    return "unit utilization: " + (", ".join(parts) if parts else "none")


def _op_rows(schedule: Schedule) -> list[str]:
    """The op table; with normalized costs, the start time also in raw machine cycles (``~``; an op's raw
    cost is in the ``raw->normalized`` line)."""
    has_warps = bool(schedule.assignment)
    norm = schedule.stats.get("normalization")
    raw = raw_cycles(1, norm) is not None or raw_cycles(schedule.ii, norm) is not None
    header = (["op", "kind", "start"] + (["~raw start"] if raw else []) + ["stage", "residue", "order", "cycles"]
              + (["warp"] if has_warps else []))
    rows = []
    for name in schedule.steady_state_order():
        op = schedule.graph.op(name)
        row: list[Any] = [name, op.kind, schedule.start(name)]
        if raw:
            row.append(raw_cycles(schedule.start(name), norm))
        row += [schedule.stage(name), schedule.residue(name), schedule.order(name), op.cycles]
        if has_warps:
            row.append(schedule.assignment.get(name, "-"))
        rows.append(row)
    return ["ops (steady-state order):"] + _table(header, rows)


def _buffer_rows(schedule: Schedule) -> list[str]:
    rows = [[f"{e.src}->{e.dst}", e.distance, schedule.buffer_depth(e)] for e in schedule.graph.edges]
    if not rows:
        return []
    return ["buffers (copies of the source's result in flight):"] + _table(["edge", "distance", "depth"], rows)


def _warp_rows(schedule: Schedule) -> list[str]:
    if not schedule.warps:
        return []
    out = ["warp groups (steady-state op sequence, stage in brackets):"]
    order = schedule.steady_state_order()
    for w in schedule.warps:
        ops = [n for n in order if schedule.assignment.get(n) == w.id]
        seq = " -> ".join(f"{n}[s{schedule.stage(n)}]" for n in ops) or "(no ops)"
        out.append(f"  {w.id} {w.role:<11s} {w.num_warps} warps, {w.regs} regs: {seq}")
    return out


def _blocked_rows(schedule: Schedule) -> list[str]:
    blocked = schedule.stats.get("blocked_by")
    if not blocked:
        return []
    if isinstance(blocked, Mapping):
        items = [f"{k}: {v}" for k, v in blocked.items()]
    elif isinstance(blocked, (list, tuple)):
        items = [str(x) for x in blocked]
    else:
        items = [str(blocked)]
    note = schedule.stats.get("blocked_by_note")
    return ["blocked_by:"] + [f"  {x}" for x in items] + ([f"  ({note})"] if note else [])


def _triton_notes(schedule: Schedule) -> list[str]:
    """For a loop extracted from a Triton kernel (``attrs["source"] == "triton"``): why ``stages`` and the
    warp groups' warps differ from the kernel's ``num_stages`` and ``num_warps``. Streaming loads have no
    latency in the model and run ahead in rings of buffers, so they need no stage of their own; each tile op
    is modelled on one 4-warp group, so a group shows 4 warps where Triton spreads the tile over all of them."""
    g = schedule.graph
    if g.attrs.get("source") != "triton":
        return []
    notes = []
    streaming = [op.name for op in g.ops if g.is_streaming(op.name)]
    if streaming:
        stages = g.attrs.get("num_stages")
        ahead = (f", where Triton's num_stages {stages} puts them {stages - 1} "
                 f"{'stage' if stages == 2 else 'stages'} ahead") if isinstance(stages, int) and stages > 1 else ""
        depth = schedule.streaming_depth
        where = ("each has one buffer, so none runs ahead of its consumer's previous read" if depth == 1 else
                 f"run ahead of their consumers in rings of {depth} buffers{ahead}")
        notes.append(f"stages: {schedule.num_stages} counts the stages of the computation; the streaming loads "
                     f"({', '.join(streaming)}) have no latency in the model and {where}")
    warps = g.attrs.get("num_warps")
    if schedule.warps and isinstance(warps, int) and warps > 4:
        notes.append(f"warp groups: the kernel runs {warps} warps; the model runs each tile op on one 4-warp group "
                     f"(the warp group a wgmma issues from) and each load on one warp, so a group shows 4 warps "
                     f"where Triton spreads the tile over all {warps}; registers are counted over the kernel's "
                     f"{warps} warps (docs/triton.md, Limits)")
    return ["notes:"] + [f"  {n}" for n in notes] if notes else []


def format_report(schedule: Schedule, machine: Machine) -> str:
    """II, bounds, L, stages, status, solve time, normalization, unit utilization, per-op table, buffers,
    warp groups, ``blocked_by`` explanations and, for a Triton kernel's loop, notes on its stages and warps,
    as plain text; names (of the graph, ops, units, groups) are shown through :func:`twill.quote.printable`,
    so no control character reaches the terminal."""
    sections = [_header(schedule) + [_utilization_line(schedule, machine)], _op_rows(schedule),
                _buffer_rows(schedule), _warp_rows(schedule), _blocked_rows(schedule), _triton_notes(schedule)]
    lines: list[str] = []
    for block in sections:
        if block:
            if lines:
                lines.append("")
            lines.extend(block)
    if machine.name != schedule.arch:
        lines.append(f"(note: report rendered for {machine.name}, schedule is for {schedule.arch})")
    return "\n".join(printable(line) for line in lines)
