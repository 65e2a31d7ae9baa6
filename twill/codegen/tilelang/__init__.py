"""TileLang backend: Twill schedules emitted as TileLang 0.1.15 kernels for Hopper.

    >>> from twill.codegen.tilelang import emit_tilelang
    >>> source = emit_tilelang(schedule)   # a module: make_kernel(...) -> T.prim_func, launch(...) with torch

A schedule with a warp assignment goes through the backend-neutral
:class:`~twill.codegen.plan.KernelPlan` (the one the Gluon and Pallas backends render) and becomes a
``T.WSSchedule`` (:mod:`~twill.codegen.tilelang.ws`); one without (``--no-ws``) becomes a
``T.Pipelined(num_stages, stage, order)`` loop. What TileLang cannot express raises
:class:`~twill.errors.UnsupportedFeatureError` ("cannot emit tilelang: ..."). Importing this package does not
import TileLang; the emitted modules do.
"""

from __future__ import annotations

from typing import Any

from twill.codegen.plan import DTYPES, KernelPlan, kernel_plan
from twill.errors import UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine
from twill.schedule.result import Schedule

__all__ = ["BACKEND", "emit_tilelang", "solve_for_tilelang", "tilelang_plan"]

#: The backend's name in error messages.
BACKEND = "TileLang"


def tilelang_plan(schedule: Schedule) -> KernelPlan:
    """The kernel plan of a warp-specialized ``schedule``, with errors naming the TileLang backend."""
    return kernel_plan(schedule, BACKEND)


def _kind(schedule: Schedule) -> str:
    graph = schedule.graph
    kind = str(graph.attrs.get("kernel") or graph.name)
    if kind not in ("gemm", "flash-fwd"):
        raise UnsupportedFeatureError(f"cannot emit tilelang: kernel {kind!r} (gemm, flash-fwd)")
    if schedule.arch not in ("h100", "h200"):
        raise UnsupportedFeatureError(f"cannot emit tilelang: arch {schedule.arch!r} (Hopper only: h100, h200)")
    return kind


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
    kind = _kind(schedule)
    graph = schedule.graph
    if kind == "flash-fwd" and (graph.attrs.get("causal") or graph.attrs.get("kv_heads")):
        raise UnsupportedFeatureError("cannot emit tilelang: causal or grouped-K/V attention (the TileLang "
                                      "renderer writes the non-causal, one-K/V-head-per-head forward pass)")
    if schedule.assignment and schedule.warps:
        plan = tilelang_plan(schedule)
        if kind == "gemm":
            from twill.codegen.tilelang.gemm import emit_gemm_ws

            return emit_gemm_ws(plan, schedule)
        from twill.codegen.tilelang.flash import emit_flash_ws

        return emit_flash_ws(plan, schedule)
    dtype = str(graph.attrs.get("dtype", "fp16"))
    if dtype not in DTYPES:
        raise UnsupportedFeatureError(f"cannot emit tilelang: dtype {dtype} (supported: {', '.join(DTYPES)})")
    if kind == "gemm":
        from twill.codegen.tilelang.gemm import emit_gemm_pipelined

        return emit_gemm_pipelined(schedule, dtype)
    from twill.codegen.tilelang.flash import emit_flash_pipelined

    return emit_flash_pipelined(schedule, dtype)
