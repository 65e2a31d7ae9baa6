"""The search space of ``twill tune``: candidates (kernel options × solver knobs) per target.

A *target* is a built-in kernel, a ``twill-graph/1`` file or a Triton kernel ``path.py:fn``. Its space is the
product of *axes*, each a tuple of values:

* built-in kernels: the kernel options of :func:`twill.kernels.kernel_options` (``block_m``, ``subtiles``...)
  plus the solver knobs ``streaming_depth`` and ``reg_limit`` and, for the kernel families with a persistent
  form on Hopper, the code-generator choice ``persistent`` (same graph and schedule, another kernel); each
  family's ``DEFAULT_AXES`` (``twill/kernels/<family>/tune.py``) gives its default sweep, and an axis given on
  the command line replaces it;
* graph files: ``streaming_depth`` and ``reg_limit`` only;
* Triton kernels: the ``tl.constexpr`` values, ``num_warps`` and ``num_stages`` given on the command line.

Candidates that surely cannot run are filtered before any solve (:func:`smem_lower_bound` above
``machine.smem_per_block``), and recorded with the reason; everything else is left to the solver, which may
prove a candidate infeasible.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from twill.errors import TwillError
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine

#: Axes that are solver knobs (:class:`~twill.solve.options.SolveOptions` fields), not kernel options.
SOLVER_AXES = ("streaming_depth", "reg_limit")

#: Axes that are code-generator choices (:func:`twill.codegen.gluon.emit_gluon` keywords): they change the
#: emitted kernel, not the loop graph or the schedule. ``persistent`` is an axis of the kernel families whose
#: persistent form the Gluon generator emits and the prediction prices (:attr:`twill.kernels.Family.persistent`).
CODEGEN_AXES = ("persistent",)

#: Axes of a Triton target besides its constexprs.
TRITON_AXES = ("num_warps", "num_stages")

@dataclass(frozen=True)
class Candidate:
    """One point of the space.

    Attributes:
        options: kernel options as ``(name, value)`` pairs: ``build_kernel`` keywords for a built-in kernel,
            ``tl.constexpr`` values for a Triton kernel, empty for a graph file.
        streaming_depth: ring depth of streaming loads (``None`` = the graph's default).
        reg_limit: per-thread register budget of compute warp groups (``None`` = the graph's default).
        num_warps: Triton ``num_warps`` (Triton targets only).
        num_stages: Triton ``num_stages`` (Triton targets only).
        persistent: the persistent kernel (GEMM or attention forward; ``None``: not an axis of the target).
    """

    options: tuple[tuple[str, Any], ...] = ()
    streaming_depth: int | None = None
    reg_limit: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    persistent: bool | None = None

    def settings(self) -> dict[str, Any]:
        """Every setting that was chosen, options first: ``{"block_m": 128, ..., "streaming_depth": 3}``."""
        knobs = {"streaming_depth": self.streaming_depth, "reg_limit": self.reg_limit,
                 "num_warps": self.num_warps, "num_stages": self.num_stages, "persistent": self.persistent}
        return {**dict(self.options), **{k: v for k, v in knobs.items() if v is not None}}

    def label(self) -> str:
        """``block_m=128 block_n=256 streaming_depth=3``."""
        return " ".join(f"{k}={v}" for k, v in self.settings().items()) or "(defaults)"


@dataclass(frozen=True)
class Space:
    """The candidates of one target and those filtered out before solving (with their one-line reason)."""

    candidates: tuple[Candidate, ...]
    rejected: tuple[tuple[Candidate, str], ...] = ()


def default_axes(kernel: str, machine: Machine, check_spills: bool = False) -> dict[str, tuple[Any, ...]]:
    """The default sweep of a built-in kernel on ``machine``: its family's ``DEFAULT_AXES`` (``{"streaming_depth":
    (2, 3)}`` without), ``reg_limit`` as offsets from each candidate's default budget (:func:`kernel_space` adds
    them). On Blackwell (accumulators in TMEM) the ``warps`` axis does not exist and ``reg_limit`` is not swept:
    below the kernel's budget of 160 the joint search runs into its time limit instead of finding or refuting a
    schedule; nor is ``persistent`` (a choice of the Hopper Gluon generator), nor the family's ``TMEM_DROPPED``
    axes (the backward's ``block_m``: FA4's 128 rows, its only tile there). The family's ``CHECKED_ONLY`` values
    are swept only with ``check_spills`` (on Hopper the backward's 128-row tile at head dim 64 is refused by
    the model's register count and found by ``--check-spills``, the ptxas-checked search)."""
    from twill.tune.predict import hooks

    family = hooks(kernel)
    axes = dict(getattr(family, "DEFAULT_AXES", {"streaming_depth": (2, 3)}))
    if not check_spills:
        for name, values in getattr(family, "CHECKED_ONLY", {}).items():
            axes[name] = tuple(v for v in axes[name] if v not in values)
    if machine.mma_accumulates_in == "tmem":
        for name in ("warps", "reg_limit", "persistent", *getattr(family, "TMEM_DROPPED", ())):
            axes.pop(name, None)
    return axes


def product(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, as dicts, in axis order."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def candidate_of(point: Mapping[str, Any]) -> Candidate:
    """The candidate of one combination of axis values (kernel options and knobs separated)."""
    knobs = {k: point[k] for k in (*SOLVER_AXES, *TRITON_AXES, *CODEGEN_AXES) if k in point}
    options = tuple((k, v) for k, v in point.items() if k not in knobs)
    return Candidate(options=options, **knobs)


def smem_lower_bound(graph: LoopGraph, streaming_depth: int) -> int:
    """Shared memory the kernel needs at least: every op's buffer times its least depth (streaming loads
    ``streaming_depth``, or their pinned ring depth), plus the resident tiles (``attrs["smem_resident"]``)."""
    buffers = sum(op.smem * graph.least_depth(op.name, streaming_depth) for op in graph.ops)
    return buffers + int(graph.attrs.get("smem_resident", 0))


def staging_bytes(graph: LoopGraph) -> int:
    """Shared memory a persistent kernel keeps at least beside its rings (the GEMM's C staging buffer: its
    family's ``persistent_staging`` hook); 0 for a family without."""
    from twill.tune.predict import graph_hooks

    family = graph_hooks(graph)
    return family.persistent_staging(graph) if hasattr(family, "persistent_staging") else 0


def accumulator_registers(graph: LoopGraph, machine: Machine) -> int:
    """Registers per thread that a compute partition needs at least (the attention forward's S and O
    accumulators and bookkeeping on Hopper: its family's ``register_floor`` hook); 0 for other kernels. A lower
    budget cannot hold them without spilling, and the joint search spends its time limit proving so."""
    from twill.tune.predict import graph_hooks

    family = graph_hooks(graph)
    return family.register_floor(graph, machine) if hasattr(family, "register_floor") else 0


def kernel_space(kernel: str, machine: Machine, axes: Mapping[str, Sequence[Any]],
                 check_spills: bool = False) -> Space:
    """The space of built-in ``kernel``: :func:`default_axes` (for a sweep with ``check_spills`` or not) with
    ``axes`` overriding (the default ``reg_limit``
    offsets added to each candidate's own budget, the graph's ``reg_limit``: three attention sub-tiles have
    less than two); candidates the kernel refuses on ``machine`` (three attention sub-tiles on Blackwell) or
    whose shared memory surely exceeds ``machine.smem_per_block`` are rejected with the reason (a persistent
    GEMM counts its C staging buffer too; a persistent attention forward adds no buffer)."""
    from twill.kernels import build_kernel, families, kernel_options

    known = kernel_options(kernel)
    persistent = [f.name for f in families() if f.persistent]
    for name in axes:
        if name in CODEGEN_AXES and kernel not in persistent:
            raise TwillError(f"{name} is an axis of {' and '.join(persistent)}; there is no persistent "
                             f"{kernel!r} kernel to price")
        if name in CODEGEN_AXES and machine.mma_accumulates_in == "tmem":
            raise TwillError(f"{name} is a choice of the Hopper Gluon generator; {machine.name} has none")
        if name not in known and name not in SOLVER_AXES and name not in CODEGEN_AXES:
            raise TwillError(f"kernel {kernel!r} has no option {name!r} (options: {', '.join(known) or 'none'})")
    merged = {k: tuple(v) for k, v in default_axes(kernel, machine, check_spills).items() if k not in axes}
    offsets = "reg_limit" in merged
    merged.update({k: tuple(v) for k, v in axes.items()})
    kept: list[Candidate] = []
    rejected: list[tuple[Candidate, str]] = []
    for point in product(merged):
        cand = candidate_of(point)
        try:
            graph = build_kernel(kernel, machine, **dict(cand.options))
        except TwillError as exc:
            refused = (replace(cand, reg_limit=None) if offsets else cand, str(exc))
            if refused not in rejected:
                rejected.append(refused)
            continue
        if offsets:
            budget = graph.attrs.get("reg_limit")
            cand = replace(cand, reg_limit=None if budget is None else int(budget) + (cand.reg_limit or 0))
        depth = cand.streaming_depth or int(graph.attrs.get("streaming_depth", 2))
        staging = staging_bytes(graph) if cand.persistent else 0
        need = smem_lower_bound(graph, depth) + staging
        floor = accumulator_registers(graph, machine)
        if cand.reg_limit is not None and cand.reg_limit < floor:
            rejected.append((cand, f"a budget of {cand.reg_limit} registers is below the {floor} that the "
                                   f"sub-tile's S and O accumulators and the kernel's bookkeeping hold"))
        elif need > machine.smem_per_block:
            rejected.append((cand, f"needs at least {need // 1024} KB of shared memory, "
                                   f"over the {machine.smem_per_block // 1024} KB per block"))
        else:
            kept.append(cand)
    return Space(tuple(kept), tuple(rejected))


def graph_space(axes: Mapping[str, Sequence[Any]]) -> Space:
    """The space of a graph file: only the solver knobs can vary."""
    for name in axes:
        if name not in SOLVER_AXES:
            raise TwillError(f"a graph file has no option {name!r}; only {' and '.join(SOLVER_AXES)} vary")
    return Space(tuple(candidate_of(p) for p in product({"streaming_depth": (2, 3, 4), **axes})))


def triton_space(constexprs: Mapping[str, Sequence[Any]], axes: Mapping[str, Sequence[Any]]) -> Space:
    """The space of a Triton kernel: every combination of constexpr values, ``num_warps`` and ``num_stages``
    (defaults 4 warps, 3 stages)."""
    unknown = [n for n in axes if n not in TRITON_AXES]
    if unknown:
        raise TwillError(f"a Triton target has no option {unknown[0]!r}; use --constexpr NAME=V1,V2, "
                         f"--num-warps and --num-stages")
    merged = {**{k: tuple(v) for k, v in constexprs.items()}, "num_warps": (4,), "num_stages": (3,), **axes}
    return Space(tuple(candidate_of(p) for p in product(merged)))
