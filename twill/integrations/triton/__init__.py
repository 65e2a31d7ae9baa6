"""Triton integration: schedule real ``@triton.jit`` kernels from their TTGIR.

``graph_from_target(path, fn, signature=..., constexprs=..., num_warps=..., num_stages=..., machine=...)``
compiles the kernel for the machine's architecture on the CPU (Triton 3.6.0, no GPU), captures the TTGIR as
it enters Triton's software pipeliner, and lowers an innermost ``scf.for`` body to a :class:`LoopGraph`
(:mod:`twill.integrations.triton.lower`); ``graphs_from_target`` lowers every innermost loop that holds a
dot. ``graph_from_ttgir`` does the same from TTGIR text or a ``.ttgir`` file. Injection of a Twill schedule back into Triton lives in :mod:`twill.integrations.triton.inject`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from twill.errors import TwillError, UnsupportedFeatureError
from twill.integrations.triton.compile import (KernelSpec, capability_of, capture_prepipeline, load_kernel,
                                               parse_constexprs, parse_signature, require_triton)
from twill.integrations.triton.lower import LoweredLoop, lower_loop
from twill.integrations.triton.mlir import (ForLoop, find_loops, function_name, location_table, module_num_warps,
                                            module_target, source_positions)
from twill.ir.graph import LoopGraph
from twill.ir.validate import MAX_DEPTH
from twill.machine.models import Machine, get_machine

__all__ = ["KernelSpec", "LoweredLoop", "graph_from_function", "graph_from_target", "graph_from_ttgir",
           "graphs_from_target", "kernel_spec", "lower_ttgir", "lower_ttgir_loops", "select_loop", "select_loops",
           "spec_from_target"]


def loop_label(index: int, loop: ForLoop, table: Mapping[str, str]) -> str:
    """One line naming a loop: index, Python source line (and the call sites it was inlined through), TTGIR
    line, tensor-core ops, whether it is innermost."""
    place = loop_place(loop, table) or "unknown source line"
    nest = "" if loop.innermost else ", contains another loop"
    return f"loop {index} at {place}, TTGIR line {loop.header_line + 1}: {_dots(loop)} dot(s){nest}"


def loop_place(loop: ForLoop, table: Mapping[str, str]) -> str | None:
    """``"kernel.py:114 (called at kernel.py:159)"``: the Python line of a loop and the call sites it was
    inlined through, ``None`` without locations."""
    where = source_positions(loop.loc, dict(table))
    return where[0] + "".join(f" (called at {p})" for p in where[1:]) if where else None


def _dots(loop: ForLoop) -> int:
    return sum(st.op in ("tt.dot", "tt.dot_scaled", "ttng.warp_group_dot", "ttng.tc_gen5_mma") for st in loop.body)


def _loop_lines(loops: Sequence[ForLoop], table: Mapping[str, str]) -> str:
    return "; ".join(loop_label(k, lp, table) for k, lp in enumerate(loops))


def select_loops(loops: Sequence[ForLoop], loop: int | str | None = None,
                 table: Mapping[str, str] | None = None) -> list[ForLoop]:
    """The loops to schedule. ``loop`` picks one: an index into ``loops`` (an int or its digits), or
    ``"line:N"``: the loop whose Python source line (or a call site it was inlined through) is N. Without it:
    every innermost loop that holds a tensor-core op, in program order; when none does, the only innermost
    loop (several are ambiguous and are listed)."""
    table = table or {}
    if not loops:
        raise UnsupportedFeatureError("the TTGIR has no scf.for loop to schedule")
    if loop is not None:
        chosen = _pick(loops, loop, table)
        if not chosen.innermost:
            raise UnsupportedFeatureError(f"{loop_label(loops.index(chosen), chosen, table)}: Twill schedules "
                                          f"innermost loops")
        return [chosen]
    inner = [lp for lp in loops if lp.innermost]
    if not inner:
        raise UnsupportedFeatureError("no innermost scf.for loop found")
    with_dots = [lp for lp in inner if _dots(lp)]
    if with_dots:
        return with_dots
    if len(inner) > 1:
        raise TwillError(f"the kernel has {len(inner)} innermost loops and none holds a dot: pick one with "
                         f"--loop N (index) or --loop line:N (Python line); {_loop_lines(loops, table)}")
    return inner


def select_loop(loops: Sequence[ForLoop], loop: int | str | None = None,
                table: Mapping[str, str] | None = None) -> ForLoop:
    """The one loop :func:`select_loops` gives; several loops that hold dots are listed for ``--loop`` to pick
    one (``twill schedule`` and ``twill inject`` take them all)."""
    chosen = select_loops(loops, loop, table)
    if len(chosen) > 1:
        raise TwillError(f"the kernel has {len(chosen)} loops that hold dots and this takes one: pick it with "
                         f"--loop N (index) or --loop line:N (Python line), or give the kernel to twill schedule "
                         f"or twill inject, which take every loop; {_loop_lines(loops, table or {})}")
    return chosen[0]


def _pick(loops: Sequence[ForLoop], loop: int | str, table: Mapping[str, str]) -> ForLoop:
    text = str(loop).strip()
    if text.isdigit():
        if int(text) >= len(loops):
            raise TwillError(f"--loop {text} is out of range: {_loop_lines(loops, table)}")
        return loops[int(text)]
    m = re.match(r"^line:(\d+)$", text)
    if not m:
        raise TwillError(f"--loop takes a loop index N or line:N (a Python source line), got {text!r}")
    line = m.group(1)
    hits = [lp for lp in loops
            if any(p.rsplit(":", 1)[1] == line for p in source_positions(lp.loc, dict(table)))]
    if len(hits) != 1:
        found = "no loop" if not hits else f"{len(hits)} loops"
        raise TwillError(f"--loop line:{line} matches {found}: {_loop_lines(loops, table)}")
    return hits[0]


def _graph_attrs(text: str, loop: ForLoop, index: int, table: Mapping[str, str],
                 extra: Mapping[str, Any]) -> dict[str, Any]:
    """The graph's attributes: where the loop is (``loop_index``, the index ``--loop`` takes; ``loop_line``;
    ``loop_source``), the module's arch and warps, ``extra`` (the compile settings), and the streaming depth
    from the kernel's ``num_stages`` (see :func:`streaming_depth_of`)."""
    attrs: dict[str, Any] = {"source": "triton", "loop_index": index, "loop_line": loop.header_line + 1}
    place = loop_place(loop, table)
    if place:
        attrs["loop_source"] = place
    arch = module_target(text)
    if arch:
        attrs["arch"] = arch
    warps = module_num_warps(text)
    if warps:
        attrs["num_warps"] = warps
    attrs.update(extra)
    depth = streaming_depth_of(loop, extra.get("num_stages"))
    if depth is not None:
        attrs["streaming_depth"] = depth
    return attrs


def streaming_depth_of(loop: ForLoop, num_stages: int | None) -> int | None:
    """The streaming depth a Triton kernel asks for: the loop's own ``tl.range(..., num_stages=N)``, else the
    kernel's ``num_stages`` (``--num-stages``, or the autotune config's), kept within [1, MAX_DEPTH]; None when
    neither is given (the solver's default then). Triton's pipeliner gives each pipelined load ``num_stages``
    buffers, so Twill's ring of streaming buffers has the same depth; ``--streaming-depth`` overrides it."""
    stages = loop.num_stages if loop.num_stages is not None else num_stages
    return None if stages is None else min(MAX_DEPTH, max(1, int(stages)))


def lower_ttgir(text: str, machine: Machine, *, loop: int | str | None = None, name: str | None = None,
                attrs: Mapping[str, Any] | None = None) -> LoweredLoop:
    """Lower the one chosen loop (see :func:`select_loop`) of a TTGIR module text; returns the graph with the
    statement -> op map."""
    loops = find_loops(text)
    table = location_table(text)
    chosen = select_loop(loops, loop, table)
    return _lower(text, chosen, loops.index(chosen), table, machine, name, attrs)


def lower_ttgir_loops(text: str, machine: Machine, *, loop: int | str | None = None, name: str | None = None,
                      attrs: Mapping[str, Any] | None = None) -> list[tuple[int, LoweredLoop]]:
    """Lower every loop :func:`select_loops` chooses, in program order; returns (loop index, lowered loop)
    pairs, the index being the one ``--loop`` takes."""
    loops = find_loops(text)
    table = location_table(text)
    return [(loops.index(lp), _lower(text, lp, loops.index(lp), table, machine, name, attrs))
            for lp in select_loops(loops, loop, table)]


def _lower(text: str, chosen: ForLoop, index: int, table: Mapping[str, str], machine: Machine, name: str | None,
           attrs: Mapping[str, Any] | None) -> LoweredLoop:
    num_warps = module_num_warps(text) or 4
    graph_name = name or function_name(text) or "triton-loop"
    lowered = lower_loop(chosen, machine, num_warps=num_warps, name=graph_name, loc_table=table,
                         attrs=_graph_attrs(text, chosen, index, table, attrs or {}))
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


def graph_from_ttgir(source: str | os.PathLike, machine: Machine | str, *, loop: int | str | None = None) -> LoopGraph:
    """Loop graph from TTGIR text or a ``.ttgir`` file (best taken just before the pipeliner)."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    text = str(source)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and source.endswith((".ttgir", ".mlir"))):
        from twill.files import read_text_file

        text = read_text_file(source, "TTGIR")    # regular, size-capped UTF-8 text, else one line
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


def lower_function(spec: KernelSpec, machine: Machine, *, loop: int | str | None = None) -> tuple[LoweredLoop, str]:
    """Compile ``spec`` up to the pipeliner and lower its loop; returns (lowered loop, pre-pipeline TTGIR)."""
    text = capture_prepipeline(spec)
    return lower_ttgir(text, machine, loop=loop, name=spec.name, attrs=_spec_attrs(spec)), text


def lower_function_loops(spec: KernelSpec, machine: Machine, *,
                         loop: int | str | None = None) -> tuple[list[tuple[int, LoweredLoop]], str]:
    """Compile ``spec`` up to the pipeliner and lower every loop :func:`select_loops` chooses; returns
    ((loop index, lowered loop) pairs, pre-pipeline TTGIR)."""
    text = capture_prepipeline(spec)
    return lower_ttgir_loops(text, machine, loop=loop, name=spec.name, attrs=_spec_attrs(spec)), text


def graph_from_function(fn, *, signature: str, constexprs: Sequence[str] | Mapping[str, Any] = (),
                        num_warps: int = 4, num_stages: int | None = None, machine: Machine | str = "h100",
                        loop: int | str | None = None) -> LoopGraph:
    """Loop graph of a ``@triton.jit`` function compiled for ``machine`` (its ``arch``) on this CPU."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    spec = kernel_spec(fn, signature=signature, constexprs=constexprs, num_warps=num_warps, num_stages=num_stages,
                       machine=machine)
    return lower_function(spec, machine, loop=loop)[0].graph


def graphs_from_function(fn, *, signature: str, constexprs: Sequence[str] | Mapping[str, Any] = (),
                         num_warps: int = 4, num_stages: int | None = None,
                         machine: Machine | str = "h100") -> list[LoopGraph]:
    """The loop graph of every loop :func:`select_loops` chooses of a ``@triton.jit`` function compiled for
    ``machine`` on this CPU, in program order."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    spec = kernel_spec(fn, signature=signature, constexprs=constexprs, num_warps=num_warps, num_stages=num_stages,
                       machine=machine)
    return [lowered.graph for _, lowered in lower_function_loops(spec, machine)[0]]


def graph_from_target(path: str | os.PathLike, fn: str, *, signature: str | None,
                      constexprs: Sequence[str] | Mapping[str, Any], num_warps: int | None,
                      num_stages: int | None, machine: Machine | str, loop: int | str | None = None,
                      config: int | None = None) -> LoopGraph:
    """Entry point of ``twill schedule/graph path.py:fn``: import ``fn`` from ``path`` and extract the loop
    graph of ``loop`` (see :func:`select_loop`). ``constexprs`` are ``NAME=VALUE`` strings or a mapping;
    ``config`` picks an ``@triton.autotune`` config; ``num_warps`` defaults to the config's, else 4, and
    ``num_stages`` to the config's, else Triton's default (3). A ``.ttgir`` path is read directly (``fn`` and
    the compile options are then ignored)."""
    if str(path).endswith((".ttgir", ".mlir")):
        return graph_from_ttgir(Path(path), machine, loop=loop)
    machine = get_machine(machine) if isinstance(machine, str) else machine
    return lower_function(spec_from_target(path, fn, signature=signature, constexprs=constexprs,
                                           num_warps=num_warps, num_stages=num_stages, machine=machine,
                                           config=config), machine, loop=loop)[0].graph


def graphs_from_target(path: str | os.PathLike, fn: str, *, signature: str | None,
                       constexprs: Sequence[str] | Mapping[str, Any], num_warps: int | None,
                       num_stages: int | None, machine: Machine | str, loop: int | str | None = None,
                       config: int | None = None) -> list[LoopGraph]:
    """Like :func:`graph_from_target`, but the graph of every loop :func:`select_loops` chooses (every
    innermost loop that holds a dot unless ``loop`` picks one), in program order: ``twill schedule`` and
    ``twill inject`` schedule each."""
    machine = get_machine(machine) if isinstance(machine, str) else machine
    if str(path).endswith((".ttgir", ".mlir")):
        from twill.files import read_text_file

        text = read_text_file(path, "TTGIR")
        return [lowered.graph for _, lowered in lower_ttgir_loops(text, machine, loop=loop)]
    spec = spec_from_target(path, fn, signature=signature, constexprs=constexprs, num_warps=num_warps,
                            num_stages=num_stages, machine=machine, config=config)
    return [lowered.graph for _, lowered in lower_function_loops(spec, machine, loop=loop)[0]]


def spec_from_target(path: str | os.PathLike, fn: str, *, signature: str | None,
                     constexprs: Sequence[str] | Mapping[str, Any], num_warps: int | None, num_stages: int | None,
                     machine: Machine, config: int | None = None) -> KernelSpec:
    """The :class:`KernelSpec` of kernel ``fn`` of file ``path`` with the command-line settings."""
    if not signature:
        raise TwillError(f"Triton target {str(path)}:{fn} needs --signature listing every non-constexpr "
                         f"argument, e.g. --signature 'a_ptr=*fp16:16,M=i32:16'")
    require_triton()
    source = load_kernel(path, fn)
    given = dict(constexprs) if isinstance(constexprs, Mapping) else parse_constexprs(list(constexprs))
    values, warps, stages = source.settings(given, config=config, num_warps=num_warps, num_stages=num_stages)
    return kernel_spec(source.fn, signature=signature, constexprs=values, num_warps=warps or 4,
                       num_stages=stages, machine=machine)
