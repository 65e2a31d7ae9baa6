"""``twill tune``: sweep tile sizes, depths and register budgets, solve each candidate, rank by predicted time.

:mod:`twill.tune.space` (the candidates), :mod:`twill.tune.sweep` (parallel solves, cache, progress),
:mod:`twill.tune.predict` (the time model), :mod:`twill.tune.spills` (ptxas spill reports),
:mod:`twill.tune.measure` (GPU timing of the best candidates), :mod:`twill.tune.measure_triton` (a Triton
target's timing against ``@triton.autotune``). Nothing here imports a solver at import time.
"""
