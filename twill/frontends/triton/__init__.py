"""Triton frontend: schedule real ``@triton.jit`` kernels from their TTGIR.

``graph_from_target(path, fn, signature=..., constexprs=..., num_warps=..., num_stages=..., machine=...)``
compiles the kernel for the machine's architecture on the CPU (Triton 3.6.0, no GPU), captures the TTGIR as
it enters Triton's software pipeliner, and lowers the innermost ``scf.for`` body to a :class:`LoopGraph`
(:mod:`twill.frontends.triton.lower`). ``graph_from_ttgir`` does the same from TTGIR text or a ``.ttgir``
file. Injection of a Twill schedule back into Triton lives in :mod:`twill.codegen.triton`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from twill.errors import FormatError, TwillError, UnsupportedFeatureError
from twill.frontends.triton.compile import (KernelSpec, capability_of, capture_prepipeline, load_kernel,
                                            parse_constexprs, parse_signature, require_triton)
from twill.frontends.triton.lower import LoweredLoop, lower_loop
from twill.frontends.triton.mlir import (ForLoop, find_loops, function_name, location_table, module_num_warps,
                                         module_target)
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine, get_machine

__all__ = ["KernelSpec", "LoweredLoop", "graph_from_function", "graph_from_target", "graph_from_ttgir",
           "kernel_spec", "lower_ttgir", "select_loop"]


def select_loop(loops: Sequence[ForLoop], loop: int | None = None) -> ForLoop:
    """The loop to schedule: ``loops[loop]`` if given, else the innermost loop with the most tensor-core
    ops (ties: the first)."""
    if not loops:
        raise UnsupportedFeatureError("the TTGIR has no scf.for loop to schedule")
    if loop is not None:
        if not 0 <= loop < len(loops):
            raise TwillError(f"loop index {loop} out of range: the module has {len(loops)} scf.for loops")
        if not loops[loop].innermost:
            raise UnsupportedFeatureError(f"loop {loop} contains another loop; Twill schedules innermost loops")
        return loops[loop]
    inner = [lp for lp in loops if lp.innermost]
    if not inner:
        raise UnsupportedFeatureError("no innermost scf.for loop found")

    def dots(lp: ForLoop) -> int:
        return sum(st.op in ("tt.dot", "ttng.warp_group_dot", "ttng.tc_gen5_mma") for st in lp.body)

    return max(inner, key=lambda lp: (dots(lp), -lp.header_line))


def _graph_attrs(text: str, loop: ForLoop, extra: Mapping[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {"source": "triton", "loop_line": loop.header_line + 1}
    arch = module_target(text)
    if arch:
        attrs["arch"] = arch
    warps = module_num_warps(text)
    if warps:
        attrs["num_warps"] = warps
    attrs.update(extra)
    return attrs


def lower_ttgir(text: str, machine: Machine, *, loop: int | None = None, name: str | None = None,
                attrs: Mapping[str, Any] | None = None) -> LoweredLoop:
    """Lower the chosen loop of a TTGIR module text; returns the graph with the statement -> op map."""
    loops = find_loops(text)
    chosen = select_loop(loops, loop)
    num_warps = module_num_warps(text) or 4
    graph_name = name or function_name(text) or "triton-loop"
    lowered = lower_loop(chosen, machine, num_warps=num_warps, name=graph_name, loc_table=location_table(text),
                         attrs=_graph_attrs(text, chosen, attrs or {}))
    return _with_summary_attrs(lowered)


def _with_summary_attrs(lowered: LoweredLoop) -> LoweredLoop:
    from dataclasses import replace

    g = lowered.graph
    attrs = dict(g.attrs)
    mmas = [op for op in g.ops if op.kind == "mma"]
    if mmas:
        attrs.setdefault("dtype", mmas[0].attrs.get("dtype"))
    subtiles = {op.attrs["subtile"] for op in g.ops if "subtile" in op.attrs}
    if subtiles:
        attrs["subtiles"] = len(subtiles)
    return replace(lowered, graph=LoopGraph(g.name, g.ops, g.edges, g.units, attrs))


def graph_from_ttgir(source: str | os.PathLike, machine: Machine | str, *, loop: int | None = None) -> LoopGraph:
    """Loop graph from TTGIR text or a ``.ttgir`` file (best taken just before the pipeliner)."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    text = str(source)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and source.endswith((".ttgir", ".mlir"))):
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise FormatError(f"cannot read TTGIR file {str(source)!r}: {exc.strerror}") from None
    return lower_ttgir(text, machine, loop=loop).graph


def kernel_spec(fn, *, signature: str, constexprs: Sequence[str] | Mapping[str, Any] = (), num_warps: int = 4,
                num_stages: int | None = None, machine: Machine | str = "h100") -> KernelSpec:
    """A :class:`KernelSpec` from the command-line forms of signature and constexprs."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    consts = dict(constexprs) if isinstance(constexprs, Mapping) else parse_constexprs(list(constexprs))
    return KernelSpec(fn=fn, signature=parse_signature(signature), constexprs=consts, num_warps=num_warps,
                      num_stages=num_stages, capability=capability_of(machine.arch))


def _spec_attrs(spec: KernelSpec) -> dict[str, Any]:
    attrs: dict[str, Any] = {"kernel": spec.name, "num_warps": spec.num_warps, "triton": "3.6.0"}
    if spec.num_stages is not None:
        attrs["num_stages"] = spec.num_stages
    for key, value in spec.constexprs.items():
        if isinstance(value, (int, float, bool, str)):
            attrs[key.lower()] = value
    return attrs


def lower_function(spec: KernelSpec, machine: Machine, *, loop: int | None = None) -> tuple[LoweredLoop, str]:
    """Compile ``spec`` up to the pipeliner and lower its loop; returns (lowered loop, pre-pipeline TTGIR)."""
    text = capture_prepipeline(spec)
    return lower_ttgir(text, machine, loop=loop, name=spec.name, attrs=_spec_attrs(spec)), text


def graph_from_function(fn, *, signature: str, constexprs: Sequence[str] | Mapping[str, Any] = (),
                        num_warps: int = 4, num_stages: int | None = None, machine: Machine | str = "h100",
                        loop: int | None = None) -> LoopGraph:
    """Loop graph of a ``@triton.jit`` function compiled for ``machine`` (its ``arch``) on this CPU."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    spec = kernel_spec(fn, signature=signature, constexprs=constexprs, num_warps=num_warps, num_stages=num_stages,
                       machine=machine)
    return lower_function(spec, machine, loop=loop)[0].graph


def graph_from_target(path: str | os.PathLike, fn: str, *, signature: str | None,
                      constexprs: Sequence[str] | Mapping[str, Any], num_warps: int | None,
                      num_stages: int | None, machine: Machine | str) -> LoopGraph:
    """Entry point of ``twill schedule/graph path.py:fn``: import ``fn`` from ``path`` and extract its loop
    graph. ``constexprs`` are ``NAME=VALUE`` strings or a mapping; ``num_warps`` defaults to 4 and
    ``num_stages`` to Triton's default (3). A ``.ttgir`` path is read directly (``fn`` and the compile
    options are then ignored)."""
    if str(path).endswith((".ttgir", ".mlir")):
        return graph_from_ttgir(Path(path), machine)
    if not signature:
        raise TwillError(f"Triton target {str(path)}:{fn} needs --signature listing every non-constexpr "
                         f"argument, e.g. --signature 'a_ptr=*fp16:16,M=i32:16'")
    require_triton()
    kernel = load_kernel(path, fn)
    return graph_from_function(kernel, signature=signature, constexprs=constexprs, num_warps=num_warps or 4,
                               num_stages=num_stages, machine=machine)
