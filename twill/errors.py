"""Twill's error hierarchy.

Every error a user can provoke is a :class:`TwillError`; the CLI prints its message on one line and exits
with status 2. Messages name the offending object (``op 'qk'``, ``edge qk->exp``) and, where there is one,
the remedy.
"""

from __future__ import annotations


class TwillError(Exception):
    """Base class of every error Twill reports to a user."""


class GraphError(TwillError):
    """A loop graph is malformed: unknown unit, negative delay, zero-distance cycle, duplicate name..."""


class FormatError(TwillError):
    """A JSON file does not follow its declared format (``twill-graph/1``, ``twill-schedule/1``)."""


class MachineError(TwillError):
    """Unknown architecture or an impossible machine parameter."""


class InfeasibleScheduleError(TwillError):
    """No schedule exists within the limits that were asked for (max II, time limit)."""


class SpillsError(InfeasibleScheduleError):
    """Every schedule the ptxas-checked search (:mod:`twill.tune.registers`) found compiles to a kernel that
    spills registers (or that the generator cannot build)."""


class VerificationError(TwillError):
    """A schedule violates a constraint of the model. ``violations`` lists every violated constraint."""

    def __init__(self, violations: list[str]):
        self.violations = list(violations)
        head = self.violations[0] if self.violations else "unknown violation"
        more = f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        super().__init__(f"schedule rejected by the verifier: {head}{more}")


class UnsupportedFeatureError(TwillError):
    """The input uses something a backend or frontend cannot handle (op kind, dtype, Triton version...)."""


class SolverUnavailableError(TwillError):
    """An optional solver backend was requested but its package is not installed."""
