"""The steady-state chart every renderer writes into its emitted module's header."""

from __future__ import annotations

from twill.codegen.plan import KernelPlan

#: Width of the steady-state chart in characters (one row per op, the II scaled onto it).
CHART_WIDTH = 48


def render_chart(plan: KernelPlan) -> list[str]:
    """A compact steady-state chart: per op, its start, stage, warp group, and the cycles it occupies in
    ``[0, II)`` drawn with its stage digit (SLOTHY-style)."""
    ii = plan.ii
    lines = [f"{'op':12s} {'role':9s} {'start':>6s} {'stage':>5s} {'wg':>3s}  |{'0':<{CHART_WIDTH - 1}s}|II={ii}"]
    order = sorted(range(len(plan.placements)), key=lambda i: (plan.placements[i].start, i))
    for p in (plan.placements[i] for i in order):
        row = [" "] * CHART_WIDTH
        for c in range(max(1, p.cycles)):
            row[(p.residue + c) % ii * CHART_WIDTH // ii] = str(p.stage % 10)
        wg = "-" if p.group is None else p.group
        lines.append(f"{p.name:12s} {p.role:9s} {p.start:6d} {p.stage:5d} {wg!s:>3s}  |{''.join(row)}|")
    return lines
