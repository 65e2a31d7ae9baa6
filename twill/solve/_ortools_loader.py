"""Load OR-Tools' CP-SAT (``ortools.sat.python.cp_model``), Twill's default solver backend.

OR-Tools is a dependency of the package, but the code can run where it is absent: a GPU machine running the
repository from a checkout, which only generates or measures kernels, or answers a sweep from its cache.
Every CP-SAT import goes through :func:`load_cp_model`, so a solve there stops with one line that says what
to install instead of an ``ImportError`` deep in the solver. Every solver comes from :func:`new_solver` and
every search runs through :func:`solve_model`, so that Ctrl-C and SIGTERM stop it at once.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from twill.errors import SolverUnavailableError

INSTALL_HINT = "pip install 'ortools>=9.10,<10'"


def load_cp_model() -> ModuleType:
    """Import and return ``ortools.sat.python.cp_model``; raise :class:`SolverUnavailableError` if OR-Tools is
    not installed."""
    module = sys.modules.get("ortools.sat.python.cp_model")
    if module is not None:
        return module
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:
        raise SolverUnavailableError(f"solving needs OR-Tools' CP-SAT ({exc}); install it with {INSTALL_HINT}, "
                                     f"or use a machine where it is installed") from None
    return cp_model


def new_solver() -> Any:
    """A new ``CpSolver`` that leaves SIGINT to Python (``catch_sigint_signal`` off: CP-SAT's own handler
    would only end the current search, and the command would go on and write its outputs)."""
    solver = load_cp_model().CpSolver()
    solver.parameters.catch_sigint_signal = False
    return solver


def solve_model(solver: Any, model: Any) -> Any:
    """``solver.solve(model)``, CP-SAT's status code; a Ctrl-C or SIGTERM during the search stops it
    (``stop_search``) and its exception is raised at once (:func:`twill.solve._interrupt.interruptible`)."""
    from twill.solve._interrupt import interruptible

    return interruptible(lambda: solver.solve(model), solver.stop_search)
