"""Gluon backend: warp-specialized Hopper (sm_90) kernels emitted from Twill schedules.

    >>> from twill.codegen.gluon import emit_gluon
    >>> source = emit_gluon(schedule)          # a complete Python module: @gluon.jit kernel + launcher

Stages: :func:`~twill.codegen.gluon.plan.kernel_plan` turns the schedule into a frozen
:class:`~twill.codegen.gluon.plan.KernelPlan` (partitions, rings, wait lags, tensor-core turns), then a
``render_*`` function turns the plan into source text. Unsupported graphs raise
:class:`~twill.errors.UnsupportedFeatureError` ("cannot generate: <op> not supported by the Gluon backend").
Importing this package does not import Triton; :mod:`~twill.codegen.gluon.aot` and the emitted modules do.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from twill.codegen.gluon.plan import KernelPlan, kernel_plan
from twill.schedule.result import Schedule

__all__ = ["KernelPlan", "emit_gluon", "kernel_plan", "load_emitted", "render_plan", "write_gluon"]


def render_plan(plan: KernelPlan) -> str:
    """Source text of the emitted module for ``plan``."""
    if plan.kernel == "gemm":
        from twill.codegen.gluon.render_gemm import render_gemm

        return render_gemm(plan)
    from twill.codegen.gluon.render_flash import render_flash

    return render_flash(plan)


def emit_gluon(schedule: Schedule) -> str:
    """Source of a complete ``@gluon.jit`` kernel module (kernel, partitions, host ``launch``) for a
    verified schedule with a warp assignment."""
    return render_plan(kernel_plan(schedule))


def write_gluon(schedule: Schedule, path: str) -> str:
    """Emit the kernel for ``schedule`` into ``path`` (atomically); returns the source."""
    source = emit_gluon(schedule)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(source)
    os.replace(tmp, path)
    return source


def load_emitted(path: str, name: str | None = None) -> ModuleType:
    """Import an emitted kernel file as a module (Gluon needs the source on disk to compile it)."""
    name = name or "twill_gluon_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import emitted kernel {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
