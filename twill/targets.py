"""Targets: the one string that names what a command schedules, resolved to its loop graph.

A *target* is one of

* a built-in kernel name (``twill kernels`` lists them), built with the static kernel options given
  (``--subtiles``, ``--head-dim``, ``--block-m``, ``--block-n``, ``--block-k``, ``--dtype``, ``--causal``,
  ``--kv-heads``);
* a ``twill-graph/1`` file (``*.json``);
* a Triton kernel ``path.py:fn``, traced with ``--signature``, ``--constexpr NAME=VAL``, ``--num-warps``,
  ``--num-stages``; or a Triton ``.ttgir`` / ``.mlir`` dump, read directly;
* a TileLang kernel ``path.py:fn`` (its file imports ``tilelang``): a ``T.prim_func``, or a factory called
  with ``--arg NAME=VALUE``; its ``T.Pipelined`` loop is the graph.

:func:`resolve_target` takes the target and its :class:`TargetOptions` (what the command line gave); an
option that does not apply to the kind of target is a one-line :class:`~twill.errors.TwillError` naming it.
:func:`resolve_targets` gives every loop of a Triton kernel that holds a dot (``twill schedule``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

from twill.errors import FormatError, TwillError
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine

#: A kernel in a Python file: ``path.py:fn``.
_PYTHON_TARGET = re.compile(r"^(?P<path>.+\.py):(?P<fn>[A-Za-z_][A-Za-z_0-9]*)$")

#: Suffixes of a Triton TTGIR dump read as a target.
TTGIR_SUFFIXES = (".ttgir", ".mlir")


class PythonTarget(NamedTuple):
    """A target ``path.py:fn``: a Triton or TileLang kernel ``fn`` defined in the Python file ``path``."""

    path: str
    fn: str


def python_target(target: str) -> PythonTarget | None:
    """``(path, fn)`` when ``target`` is ``path.py:fn`` (a Triton or TileLang kernel), else None."""
    match = _PYTHON_TARGET.match(target)
    return PythonTarget(match["path"], match["fn"]) if match else None


def is_triton_source(target: str) -> bool:
    """Whether ``target`` names a kernel source rather than a graph: ``path.py:fn`` or a TTGIR dump."""
    return python_target(target) is not None or target.endswith(TTGIR_SUFFIXES)


def target_file(target: str) -> str:
    """The file a target reads: ``path`` of ``path.py:fn``, else the target itself."""
    match = python_target(target)
    return match.path if match else target


@dataclass(frozen=True)
class TargetOptions:
    """The options of a target, as given (``None``/empty: not given).

    ``kernel`` holds the static options of a built-in kernel (keywords of ``build_kernel``); ``signature``,
    ``constexprs`` (``NAME=VAL`` items), ``num_warps``, ``num_stages``, ``loop`` and ``config`` are a Triton
    kernel's; ``tl_args`` (``NAME=VALUE`` items) are a TileLang factory's arguments."""

    kernel: Mapping[str, Any] = field(default_factory=dict)
    signature: str | None = None
    constexprs: tuple[str, ...] = ()
    num_warps: int | None = None
    num_stages: int | None = None
    loop: str | None = None
    config: int | str | None = None
    tl_args: tuple[str, ...] = ()

    def triton_flags(self) -> list[str]:
        """The flags of the Triton options that were given."""
        names = [("--signature", self.signature), ("--num-warps", self.num_warps),
                 ("--num-stages", self.num_stages), ("--loop", self.loop), ("--config", self.config)]
        given = [flag for flag, value in names if value is not None]
        return given + (["--constexpr"] if self.constexprs else [])

    def kernel_flags(self) -> list[str]:
        """The flags of the static kernel options that were given, sorted."""
        return [f"--{dest.replace('_', '-')}" for dest in sorted(self.kernel)]


def resolve_target(target: str, options: TargetOptions, machine: Machine) -> LoopGraph:
    """The loop graph that ``target`` names (see the module docstring); a Triton kernel with several loops
    that hold dots needs ``--loop`` to pick one."""
    return _resolve(target, options, machine, every_loop=False)[0]


def resolve_targets(target: str, options: TargetOptions, machine: Machine) -> list[LoopGraph]:
    """The loop graphs that ``target`` names: for a Triton kernel, every innermost loop that holds a dot (in
    program order) unless ``--loop`` picks one; for any other target, its one graph."""
    return _resolve(target, options, machine, every_loop=True)


def _resolve(target: str, options: TargetOptions, machine: Machine, *, every_loop: bool) -> list[LoopGraph]:
    kernel_opts = dict(options.kernel)
    triton_flags = options.triton_flags()
    match = python_target(target)
    if options.config == "all":
        raise TwillError("--config all applies to twill inject only; pick one config with --config N")
    tilelang = tilelang_target(target, options)
    if tilelang:
        from twill.integrations.tilelang import load_loop

        return [load_loop(*tilelang, list(options.tl_args), machine)[1].graph]
    if options.tl_args:
        raise TwillError("--arg applies to TileLang kernels (path.py:fn whose file imports tilelang) only")
    if match:
        if kernel_opts:
            raise TwillError(f"{options.kernel_flags()[0]} applies to built-in kernels only; "
                             f"use --constexpr for a Triton target")
        return _triton_graphs(match.path, match.fn, options, machine, every_loop)
    if target.endswith(TTGIR_SUFFIXES):
        return _triton_graphs(target, "", options, machine, every_loop)
    if triton_flags:
        raise TwillError(f"{triton_flags[0]} applies to Triton targets (path.py:fn) only")
    if target.endswith(".json") or os.path.sep in target or os.path.isfile(target):
        if kernel_opts:
            raise TwillError(f"{options.kernel_flags()[0]} applies to built-in kernels only, "
                             f"not to graph file {target!r}")
        from twill.ir.io import load_graph

        return [load_graph(target)]
    from twill.kernels import build_kernel

    return [build_kernel(target, machine, **kernel_opts)]


def tilelang_target(target: str, options: TargetOptions) -> PythonTarget | None:
    """``(path, fn)`` when ``target`` is a TileLang kernel ``path.py:fn`` (its file imports ``tilelang``), else
    None. Triton and built-in kernel options are refused for it."""
    from twill.integrations.tilelang import is_tilelang_source

    match = python_target(target)
    if not match or not is_tilelang_source(match.path):
        return None
    given = options.triton_flags() + options.kernel_flags()
    if given:
        raise TwillError(f"{given[0]} does not apply to TileLang kernel {target!r}; give its factory's "
                         f"arguments with --arg NAME=VALUE")
    return match


def _triton_graphs(path: str, fn: str, options: TargetOptions, machine: Machine,
                   every_loop: bool) -> list[LoopGraph]:
    if not os.path.exists(path):
        raise FormatError(f"cannot read Triton source {path!r}: no such file")
    try:
        from twill.integrations.triton import graph_from_target, graphs_from_target
    except ImportError as exc:
        raise TwillError(f"the Triton frontend is not available ({exc}); install twill-gpu[triton]") from None
    kwargs = dict(signature=options.signature, constexprs=list(options.constexprs), num_warps=options.num_warps,
                  num_stages=options.num_stages, machine=machine, loop=options.loop, config=options.config)
    if every_loop:
        return graphs_from_target(path, fn, **kwargs)
    return [graph_from_target(path, fn, **kwargs)]
