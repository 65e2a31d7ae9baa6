"""Joint software pipelining + warp specialization (paper §4, Algorithm 1).

``solve_joint(graph, machine, options, lower_bound=...)`` is what :func:`twill.solve.schedule` calls when
``options.ws`` is set. The model is specified in docs/model.md; :mod:`.cpsat` is the default backend and
:mod:`.yices` the paper-faithful time-indexed one. Importing this package does not import a solver.
"""

from __future__ import annotations

from twill.solve.joint.problem import JointOutcome, JointProblem, JointSolution
from twill.solve.joint.search import solve_joint

__all__ = ["JointOutcome", "JointProblem", "JointSolution", "solve_joint"]
