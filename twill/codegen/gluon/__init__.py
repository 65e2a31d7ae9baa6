"""Gluon backend: warp-specialized Hopper (sm_90) kernels emitted from Twill schedules.

    >>> from twill.codegen.gluon import emit_gluon
    >>> source = emit_gluon(schedule)          # a complete Python module: @gluon.jit kernel + launcher
    >>> source = emit_gluon(schedule, persistent=True)   # GEMM: at most one CTA per SM, walking output tiles

Stages: :func:`~twill.codegen.plan.kernel_plan` turns the schedule into a frozen, backend-neutral
:class:`~twill.codegen.plan.KernelPlan` (partitions, rings and barriers, waits with their reasons, stages,
tensor-core turns); :func:`render_plan` renders it with the shared module renderer
(:mod:`~twill.codegen.gluon.render`) and the kernel family's compute body (``twill/kernels/<family>/gluon.py``,
``body(plan) -> KernelBody``, found through :mod:`twill.kernels`). Unsupported graphs raise
:class:`~twill.errors.UnsupportedFeatureError`
("cannot generate: <op> not supported by the Gluon backend"). Importing this package does not import Triton;
:mod:`~twill.codegen.gluon.aot` and the emitted modules do.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from twill.codegen.plan import KernelPlan, kernel_plan, quoted_plan
from twill.files import write_text_atomic
from twill.kernels import family
from twill.schedule.result import Schedule

__all__ = ["BACKEND", "emit_gluon", "gluon_plan", "load_emitted", "render_plan", "write_gluon"]

#: The backend's name in error messages.
BACKEND = "Gluon"


def gluon_plan(schedule: Schedule, persistent: bool = False) -> KernelPlan:
    """The kernel plan of ``schedule``, with errors naming the Gluon backend; ``persistent`` asks for a
    persistent GEMM (docs/codegen.md, "Persistent GEMM")."""
    return kernel_plan(schedule, BACKEND, persistent)


def render_plan(plan: KernelPlan) -> str:
    """Source text of the emitted module for ``plan``, rendered from its :func:`~twill.codegen.plan.quoted_plan`
    (input names only ever inside comments, docstrings and string literals)."""
    from twill.codegen.gluon.render import render_module

    plan = quoted_plan(plan)
    return render_module(plan, family(plan.kernel).body("gluon").body(plan))


def emit_gluon(schedule: Schedule, persistent: bool = False) -> str:
    """Source of a complete ``@gluon.jit`` kernel module (kernel, partitions, host ``launch``) for a
    verified schedule with a warp assignment; ``persistent``: a persistent GEMM."""
    return render_plan(gluon_plan(schedule, persistent))


def write_gluon(schedule: Schedule, path: str, persistent: bool = False) -> str:
    """Emit ``schedule``'s kernel into ``path``, all or nothing (a temporary file renamed into place)."""
    source = emit_gluon(schedule, persistent)
    write_text_atomic(path, source)
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
