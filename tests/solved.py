"""Solves of the built-in kernels shared by the test files: each (kernel, arch, kernel options, solve options)
is solved once per test session, whichever test asks first (B200 flash-bwd alone takes seconds per solve).

A schedule is a frozen dataclass, so sharing it between tests is safe. Every solve uses the default time
limit (600 s), far above what these solves need (docs/performance.md), so the answer does not depend on which
test asked first.
"""

from __future__ import annotations

from functools import lru_cache

from twill.kernels import build_kernel
from twill.machine import get_machine
from twill.schedule.result import Schedule
from twill.solve import SolveOptions, schedule

DEFAULTS = SolveOptions()


def solved_kernel(kernel: str, arch: str, kernel_options: dict | None = None, **solve_options) -> Schedule:
    """``schedule(build_kernel(kernel, machine, **kernel_options), machine, SolveOptions(**solve_options))``,
    cached for the session. Solve options given at their default value share the cache entry of the call
    that omits them."""
    given = tuple(sorted((kernel_options or {}).items()))
    chosen = tuple(sorted((k, v) for k, v in solve_options.items() if v != getattr(DEFAULTS, k)))
    return _solved(kernel, arch, given, chosen)


@lru_cache(maxsize=None)
def _solved(kernel: str, arch: str, kernel_options: tuple, solve_options: tuple) -> Schedule:
    machine = get_machine(arch)
    return schedule(build_kernel(kernel, machine, **dict(kernel_options)), machine,
                    SolveOptions(**dict(solve_options)))
