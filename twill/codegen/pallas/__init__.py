"""Pallas backend: Twill schedules emitted as JAX Pallas Mosaic GPU kernels for Hopper.

    >>> from twill.codegen.pallas import emit_pallas
    >>> source = emit_pallas(schedule)     # a complete module: a jitted gemm(a, b) or attention(q, k, v)

The backend-neutral :class:`~twill.codegen.plan.KernelPlan` (the one the Gluon backend renders) is mapped
onto ``plgpu.emit_pipeline_warp_specialized``: ring depth -> ``max_concurrent_steps``, compute partitions ->
compute warpgroups, the producer's budget -> ``memory_registers``, wait lags -> ``delay_release`` and
``plgpu.wgmma_wait``, tensor-core turns -> ``plgpu.Barrier`` hand-offs (:mod:`~twill.codegen.pallas.render`, and
the kernel family's body ``twill/kernels/<family>/pallas.py``, ``emit(plan) -> str``, found through
:mod:`twill.kernels`). A decision the Pallas template cannot carry raises
:class:`~twill.errors.UnsupportedFeatureError` ("cannot emit: ..."). Importing this package does not import
JAX; the emitted modules do.
"""

from __future__ import annotations

from twill.codegen.plan import KernelPlan, kernel_plan, quoted_plan
from twill.kernels import family
from twill.schedule.result import Schedule

__all__ = ["BACKEND", "emit_pallas", "pallas_plan", "render_plan"]

#: The backend's name in error messages.
BACKEND = "Pallas"


def pallas_plan(schedule: Schedule) -> KernelPlan:
    """The kernel plan of ``schedule``, with errors naming the Pallas backend."""
    return kernel_plan(schedule, BACKEND)


def render_plan(plan: KernelPlan) -> str:
    """Source text of the emitted Pallas module for ``plan``, rendered from its
    :func:`~twill.codegen.plan.quoted_plan` (input names only ever inside comments, docstrings and string
    literals)."""
    plan = quoted_plan(plan)
    return family(plan.kernel).body("pallas").emit(plan)


def emit_pallas(schedule: Schedule) -> str:
    """Source of a complete Pallas Mosaic GPU module for a verified schedule with a warp assignment."""
    return render_plan(pallas_plan(schedule))
