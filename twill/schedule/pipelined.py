"""The pipelined program: a modulo schedule expanded into prologue, steady state and epilogue (paper §4.2).

With ``n = ⌈L/II⌉`` overlapped copies of the iteration, copy ``i`` starts at ``i·II``; the straight-line
program ``Q`` runs for ``T = (n − 1)·II + L`` cycles. Its sections:

* prologue — cycles ``[0, (n − 1)·II)``: the first copies ramp up;
* steady state — cycles ``[(n − 1)·II, n·II)``: every op issues exactly once, the op of stage ``s`` belonging
  to copy ``n − 1 − s``; this window is the loop body;
* epilogue — cycles ``[n·II, T)``: the last copies drain.

Executing the steady state once is a legal execution of the loop, and every execution of it is the same,
which is what makes ``Q`` a faithful stand-in for the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.quote import printable
from twill.schedule.result import Schedule

SECTIONS = ("prologue", "steady", "epilogue")


@dataclass(frozen=True)
class Instance:
    """One issue of an op in ``Q``: op ``op`` of copy ``copy`` at cycle ``cycle = copy·II + t_op``."""

    op: str
    copy: int
    cycle: int
    stage: int
    warp: int | None


@dataclass(frozen=True, kw_only=True)
class PipelinedProgram:
    """The straight-line program ``Q`` of a schedule.

    Attributes:
        ii: initiation interval.
        length: L, the length of one iteration's schedule.
        copies: ``n = ⌈L/II⌉``.
        total: ``T = (n − 1)·II + L``.
        instances: every op of every copy, sorted by cycle, then copy, then op order.
    """

    ii: int
    length: int
    copies: int
    total: int
    instances: tuple[Instance, ...]

    @property
    def steady_start(self) -> int:
        return (self.copies - 1) * self.ii

    @property
    def steady_end(self) -> int:
        return self.copies * self.ii

    def section_of(self, cycle: int) -> str:
        if cycle < self.steady_start:
            return "prologue"
        return "steady" if cycle < self.steady_end else "epilogue"

    def section(self, name: str) -> tuple[Instance, ...]:
        """The instances issued in section ``name`` (``prologue``, ``steady`` or ``epilogue``)."""
        if name not in SECTIONS:
            raise ValueError(f"unknown section {name!r} (choose from {', '.join(SECTIONS)})")
        return tuple(x for x in self.instances if self.section_of(x.cycle) == name)

    def bounds(self, name: str) -> tuple[int, int]:
        """The half-open cycle range ``[begin, end)`` of section ``name``."""
        return {"prologue": (0, self.steady_start), "steady": (self.steady_start, self.steady_end),
                "epilogue": (self.steady_end, self.total)}[name]


def pipelined_program(schedule: Schedule) -> PipelinedProgram:
    """Expand ``schedule`` into ``Q`` (see the module docstring)."""
    ii, length = schedule.ii, schedule.length
    n = schedule.copies
    names = schedule.graph.op_names
    instances = [Instance(name, i, i * ii + schedule.starts[name], schedule.stage(name),
                          schedule.assignment.get(name)) for i in range(n) for name in names]
    instances.sort(key=lambda x: (x.cycle, x.copy, names.index(x.op)))
    return PipelinedProgram(ii=ii, length=length, copies=n, total=(n - 1) * ii + length,
                            instances=tuple(instances))


def loop_label(schedule: Schedule, name: str) -> str:
    """Steady-state name of an op relative to the oldest iteration ``j`` in flight: ``S[j+1]``, ``P[j]``."""
    ahead = schedule.num_stages - 1 - schedule.stage(name)
    return f"{name}[j+{ahead}]" if ahead else f"{name}[j]"


def _lines(program: PipelinedProgram, schedule: Schedule, section: str, warp: int | None) -> list[str]:
    by_cycle: dict[int, list[str]] = {}
    for x in program.section(section):
        if warp is not None and x.warp != warp:
            continue
        label = loop_label(schedule, x.op) if section == "steady" else f"{x.op}[{x.copy}]"
        by_cycle.setdefault(x.cycle, []).append(label)
    return [f"    t={cycle:<4d} {'  '.join(ops)}" for cycle, ops in sorted(by_cycle.items())]


def format_pipelined(schedule: Schedule, program: PipelinedProgram | None = None) -> str:
    """Readable text of ``Q``: sections with issue cycles; per warp group when the schedule has warps (names
    through :func:`twill.quote.printable`)."""
    program = program or pipelined_program(schedule)
    out = [f"pipelined program Q: II={program.ii}, L={program.length}, copies n={program.copies}, "
           f"T=(n-1)*II+L={program.total}"]
    groups: list[tuple[int | None, str]] = [(None, "")]
    if schedule.warps:
        groups = [(w.id, f"warp group {w.id} ({w.role}, {w.num_warps} warps)") for w in schedule.warps]
    titles = {"prologue": "prologue", "steady": "steady state (loop body, iteration j)", "epilogue": "epilogue"}
    for warp, title in groups:
        indent = ""
        if title:
            out.append(title + ":")
            indent = "  "
        for section in SECTIONS:
            begin, end = program.bounds(section)
            span = f"cycles {begin}-{end - 1}" if end > begin else "empty"
            out.append(f"{indent}{titles[section]} ({span}):")
            out.extend(indent + line for line in _lines(program, schedule, section, warp))
    return "\n".join(printable(line) for line in out)


def program_to_dict(program: PipelinedProgram) -> dict:
    """JSON form of ``Q`` (for ``twill schedule --json --pipelined``)."""
    return {"ii": program.ii, "length": program.length, "copies": program.copies, "total": program.total,
            "sections": {s: list(program.bounds(s)) for s in SECTIONS},
            "instances": [{"op": x.op, "copy": x.copy, "cycle": x.cycle, "stage": x.stage,
                           **({"warp": x.warp} if x.warp is not None else {})} for x in program.instances]}
