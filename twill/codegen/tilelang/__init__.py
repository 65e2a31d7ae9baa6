"""TileLang backend: Twill schedules emitted as TileLang 0.1.15 kernels for Hopper.

    >>> from twill.codegen.tilelang import emit_tilelang
    >>> source = emit_tilelang(schedule)   # a module: make_kernel(...) -> T.prim_func, launch(...) with torch

A schedule with a warp assignment goes through the backend-neutral
:class:`~twill.codegen.plan.KernelPlan` (the one the Gluon and Pallas backends render) and becomes a
``T.WSSchedule`` (:mod:`~twill.codegen.tilelang.ws`); one without (``--no-ws``) becomes a
``T.Pipelined(num_stages, stage, order)`` loop. The kernel family's body (``twill/kernels/<family>/tilelang.py``,
found through :mod:`twill.kernels`) writes each form: ``refuse(graph)`` raises for what it does not write,
``emit_ws(plan, schedule)`` and ``emit_pipelined(schedule, dtype)`` return the module. What TileLang cannot
express raises :class:`~twill.errors.UnsupportedFeatureError` ("cannot emit tilelang: ..."). Importing this
package does not import TileLang; the emitted modules do.
"""

from __future__ import annotations

from types import ModuleType

from twill.codegen.plan import DTYPES, KernelPlan, kernel_plan
from twill.errors import UnsupportedFeatureError
from twill.kernels import emitting_family
from twill.schedule.result import Schedule

__all__ = ["BACKEND", "emit_tilelang", "tilelang_plan"]

#: The backend's name in error messages.
BACKEND = "TileLang"


def tilelang_plan(schedule: Schedule) -> KernelPlan:
    """The kernel plan of a warp-specialized ``schedule``, with errors naming the TileLang backend."""
    return kernel_plan(schedule, BACKEND)


def _body(schedule: Schedule) -> ModuleType:
    """The TileLang body of the schedule's kernel family (:func:`twill.kernels.emitting_family`)."""
    family = emitting_family(schedule.graph, "tilelang")
    if schedule.arch not in ("h100", "h200"):
        raise UnsupportedFeatureError(f"cannot emit tilelang: arch {schedule.arch!r} (Hopper only: h100, h200)")
    return family.body("tilelang")


def emit_tilelang(schedule: Schedule) -> str:
    """Source of a complete TileLang module for a verified schedule."""
    body = _body(schedule)
    graph = schedule.graph
    body.refuse(graph)
    if schedule.assignment and schedule.warps:
        return body.emit_ws(tilelang_plan(schedule), schedule)
    dtype = str(graph.attrs.get("dtype", "fp16"))
    if dtype not in DTYPES:
        raise UnsupportedFeatureError(f"cannot emit tilelang: dtype {dtype} (supported: {', '.join(DTYPES)})")
    return body.emit_pipelined(schedule, dtype)
