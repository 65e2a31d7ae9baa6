"""The protocol every joint solver backend implements, and the one place that picks a backend.

Algorithm 1 (:mod:`twill.solve.joint.search`) builds one :class:`JointModel` per II it tries and speaks to
it only through this protocol: seed it with start times, pin start times, fix an objective at a value or
bound it from above, minimise one objective, ask whether the problem is feasible without some constraint families (the UNSAT
explanation) and read its size. CP-SAT (:class:`twill.solve.joint.cpsat.CpsatJoint`) and Yices
(:class:`twill.solve.joint.yices_joint.YicesJoint`, which minimises by its own binary search over ``objective ≤ k``
queries) implement it. Adding a backend means one class with these methods and one line in
:func:`open_model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from twill.schedule.vocab import Family, Objective, Status
from twill.solve.joint.problem import JointOutcome, JointProblem, JointSolution, ModelSize


@dataclass(frozen=True)
class SearchSettings:
    """How Algorithm 1 (:mod:`twill.solve.joint.search`) drives one backend (docs/model.md §5).

    Attributes:
        phase_one_minimises: what phase 1 minimises ("Copies"): the joint problem needs only the copies
            ``n = ⌈LEN(M)/II⌉``, so CP-SAT, whose joint model minimises L itself from any valid lower end, gets
            ``copies`` (cheap to prove); Yices's length search probes ``L = length_min`` first
            (:func:`twill.solve.joint.yices_joint.search_lengths`), so it gets LEN(M) itself (``length``).
        relaxation: solve the joint relaxation before the joint problem at the IIs after the modulo-only II
            ("Relaxation"); off for Yices (not tried there: every Yices model builds its time-indexed grid,
            so a relaxed model is not obviously cheaper than the joint one).
    """

    phase_one_minimises: str
    relaxation: bool


SEARCH_SETTINGS = {"cpsat": SearchSettings("copies", relaxation=True),
                   "yices": SearchSettings("length", relaxation=False)}


class JointModel(Protocol):
    """One backend's model of a :class:`JointProblem`, solved for a sequence of lexicographic objectives."""

    problem: JointProblem
    #: Objectives after II in lexicographic order: ``unhoisted`` (when the model has it), ``length``, then
    #: :data:`twill.schedule.vocab.SECONDARY`.
    objectives: tuple[Objective, ...]
    #: How the last objective's ties are decided (``stats["tie_break"]``).
    tie_break: str

    def hint(self, starts: Mapping[str, int]) -> None:
        """Suggest start times to the next solve (a backend may ignore a hint)."""

    def hint_solution(self, solution: JointSolution) -> None:
        """Suggest a whole schedule (starts, slots, widths, L) of this problem or a relaxation of it to the next
        solve (a backend may ignore a hint)."""

    def pin(self, starts: Mapping[str, int]) -> None:
        """Force these start times in every later solve."""

    def fix(self, objective: Objective, value: int) -> None:
        """Keep ``objective`` at ``value`` in every later solve."""

    def bound(self, objective: Objective, value: int) -> None:
        """Keep ``objective`` at ``value`` or below in every later solve."""

    def solve(self, objective: Objective, *, time_limit: float, workers: int | None = None) -> JointOutcome:
        """Minimise ``objective`` with the objectives fixed so far, within ``time_limit`` seconds."""

    def feasible_without(self, families: tuple[Family, ...], seconds: float) -> Status:
        """``feasible``, ``infeasible`` or ``unknown``: the problem with ``families`` dropped."""

    def size(self) -> ModelSize:
        """The model's size."""

    def close(self) -> None:
        """Free what the backend holds (a Yices context); the model is not used afterwards."""


def open_model(problem: JointProblem, *, solver: str, hoist: list[tuple[str, str]], workers: int, seed: int,
               report: Callable[[str], None]) -> JointModel:
    """The ``solver`` backend's model of ``problem`` with the ``unhoisted`` objective over the pairs
    ``hoist`` (none when empty)."""
    if solver == "yices":
        from twill.solve.joint.yices_joint import YicesJoint

        return YicesJoint(problem, hoist=hoist, report=report)
    from twill.solve.joint.cpsat import CpsatJoint

    return CpsatJoint(problem, hoist=hoist, workers=workers, seed=seed)


def require(solver: str) -> None:
    """Raise :class:`~twill.errors.SolverUnavailableError` now when ``solver`` is not installed (Yices is
    an optional extra; its one import point is :mod:`twill.solve._yices_loader`)."""
    if solver == "yices":
        from twill.solve._yices_loader import load_yices

        load_yices()
