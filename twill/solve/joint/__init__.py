"""Joint software pipelining + warp specialization (paper §4, Algorithm 1).

:func:`twill.solve.schedule` calls :func:`twill.solve.joint.search.solve_joint` when ``options.ws`` is set.
The model is specified in docs/model.md; :mod:`.problem` holds the solver-independent problem,
:mod:`.backend` the protocol of a solver backend, :mod:`.cpsat` the default backend and :mod:`.yices` the
paper-faithful time-indexed one. Importing this package does not import a solver.
"""
