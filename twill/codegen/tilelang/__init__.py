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
from typing import Any

from twill.codegen.plan import DTYPES, KernelPlan, kernel_plan
from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.kernels import families
from twill.machine.models import Machine
from twill.schedule.result import Schedule

__all__ = ["BACKEND", "emit_tilelang", "solve_for_tilelang", "tilelang_plan"]

#: The backend's name in error messages.
BACKEND = "TileLang"


def tilelang_plan(schedule: Schedule) -> KernelPlan:
    """The kernel plan of a warp-specialized ``schedule``, with errors naming the TileLang backend."""
    return kernel_plan(schedule, BACKEND)


def _body(schedule: Schedule) -> ModuleType:
    """The TileLang body of the schedule's kernel family (by the graph's ``kernel`` attribute or name)."""
    graph = schedule.graph
    kind = str(graph.attrs.get("kernel") or graph.name)
    bodies = [f for f in families() if "tilelang" in f.backends]
    family = next((f for f in bodies if f.name == kind), None)
    if family is None:
        raise UnsupportedFeatureError(f"cannot emit tilelang: kernel {kind!r} "
                                      f"({', '.join(f.name for f in bodies)})")
    if schedule.arch not in ("h100", "h200"):
        raise UnsupportedFeatureError(f"cannot emit tilelang: arch {schedule.arch!r} (Hopper only: h100, h200)")
    return family.body("tilelang")


def solve_for_tilelang(graph: LoopGraph, machine: Machine, options: Any) -> Schedule:
    """A schedule TileLang can express: every op but the TMA loads in one stage (its ``T.gemm`` is synchronous
    and its fragments single-versioned), the window Triton's sm_90 pipeliner also needs
    (:func:`twill.integrations.triton.inject.constrain_for_triton`). With ``options.ws`` the joint solver runs on the
    constrained graph; without, :func:`twill.integrations.triton.inject.solve_for_triton` searches II under it."""
    from twill.integrations.triton.inject import constrain_for_triton, solve_for_triton

    if not options.ws:
        return solve_for_triton(graph, machine, 90, options)
    from twill.solve import schedule

    return schedule(constrain_for_triton(graph, 90), machine, options)


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
