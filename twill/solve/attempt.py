"""One II a search tried: a ``stats["tried"]`` row of the schedule JSON, with one type for every search."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from twill.schedule.vocab import Status


@dataclass(frozen=True)
class Attempt:
    """What the search learned at one II. Fields left ``None`` are not written.

    Attributes:
        ii: the initiation interval (normalized units).
        status: phase 1's answer in a modulo-only search (``--no-ws``, the Triton window search).
        modulo: phase 1's answer in the joint search (``optimal``: the copies n, or LEN(M) under Yices,
            proved minimal).
        joint: the joint problem's answer.
        by: what decided the row besides a solve: ``projection`` (a unit's projection proved phase 1
            infeasible), ``warp_issue_bound`` (no solve: below the bound), ``relaxation`` (the joint
            relaxation proved the joint problem infeasible), ``last_resort``.
        units: the units whose projections were solved (``by = projection``).
        relaxed: the families the joint relaxation that decided the row switched off (``by = relaxation``).
        modulo_by: ``greedy`` when phase 1's schedule is the greedy one (CP-SAT ran out of time).
        length_min / copies: the joint problem's window ``L ∈ [length_min, copies·II]``: n = ⌈LEN(M)/II⌉ and
            LEN(M), or under CP-SAT a proved lower end of L that keeps n (docs/model.md §5, "Copies").
        fixed_starts: the answer of the warp assignment solved alone for greedy start times, or ``no greedy
            placement``.
        bound: the warp-issue bound (``ii``, ``warps``, ``groups``, ``busy``) that decided the row.
        unhoisted_below: on an ``extra_copies`` row at the II the search stopped at, the ``unhoisted`` value
            of the best schedule so far: the row's problem asks for fewer unhoisted pairs (docs/model.md §5).
        seconds: time of the solve that decided the row.
    """

    ii: int
    status: Status | None = None
    modulo: Status | None = None
    joint: Status | None = None
    by: str | None = None
    units: tuple[str, ...] | None = None
    relaxed: tuple[str, ...] | None = None
    modulo_by: str | None = None
    length_min: int | None = None
    copies: int | None = None
    fixed_starts: str | None = None
    bound: Mapping[str, int] | None = None
    unhoisted_below: int | None = None
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON row: every field that is set, statuses as their words, seconds to the millisecond."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, Status):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float):
                value = round(value, 3)
            elif f.name == "bound":
                value = dict(value)
            out[f.name] = value
        return out

    @property
    def proves_infeasible(self) -> bool:
        """See :func:`row_proven_infeasible`."""
        return row_proven_infeasible(self.to_dict())


def row_proven_infeasible(row: Mapping[str, Any]) -> bool:
    """Whether a ``tried`` row of the joint search proves its II infeasible: phase 1 infeasible, or the
    joint problem infeasible at the proven copies (phase 1 ``optimal``) or with the extra copies after
    them (``by = extra_copies``, unless the row only asked for fewer unhoisted pairs), or the warp-issue
    bound."""
    if row.get("modulo") == Status.INFEASIBLE or row.get("by") == "warp_issue_bound":
        return True
    if row.get("by") == "extra_copies":
        return row.get("joint") == Status.INFEASIBLE and "unhoisted_below" not in row
    return row.get("joint") == Status.INFEASIBLE and row.get("modulo") == Status.OPTIMAL
