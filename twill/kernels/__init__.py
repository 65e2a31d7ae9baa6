"""Kernel families (``twill kernels``): the registry of built-in loop graphs and everything each one needs.

A *family* is one package ``twill/kernels/<package>/``; adding one is that folder plus its line in
:data:`PACKAGES`. The package's ``__init__`` defines ``FAMILY``, a :class:`Family`, and nothing heavier; the
registry imports a family's other modules only when they are used:

* ``graph``: ``build(machine, **options) -> LoopGraph`` and ``OPTIONS`` (option -> :class:`KernelOption`);
* ``plan``: ``plan(schedule, backend, persistent) -> KernelPlan`` (:func:`twill.codegen.plan.kernel_plan`),
  for a family with ``planned``;
* one body per backend in ``backends``: ``gluon`` (``body(plan) -> KernelBody``), ``pallas``
  (``emit(plan) -> str``), ``tilelang`` (``refuse(graph)``, ``emit_ws(plan, schedule)``,
  ``emit_pipelined(schedule, dtype)``); any body may define ``streaming_depth(attrs) -> int | None`` (``attrs``: the graph's), the
  streaming depth ``twill emit`` solves with for that backend when none is asked for
  (:func:`emit_streaming_depth`);
* ``tune``: the tuner's cost hooks, for a family with ``tuned``. ``PROBLEM`` (the problem it is tuned for) and
  ``DEFAULT_AXES`` (its default sweep) are required; the others are optional and read by name where the
  tuner prices something that depends on the family: ``CHECKED_ONLY``, ``TMEM_DROPPED``, ``CAUSAL``,
  ``FLOPS_SCALE``, ``RESTARTS_PER_BLOCK``, ``persistent_staging``, ``register_floor`` (:mod:`twill.tune.space`,
  ``twill tune``); ``loop_extent``, ``grid_heads``, ``shared_readers``, ``causal_blocks``,
  ``stored_from_registers``, ``extra_passes``, ``plan``, ``chain`` (:mod:`twill.tune.predict`).

Importing this package imports no family, solver, Triton, JAX or torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from twill.errors import TwillError, UnsupportedFeatureError
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine

#: The families, by package under ``twill/kernels/``, in the order ``twill kernels`` lists them.
PACKAGES = ("paper_example", "gemm", "flash_fwd", "flash_bwd")


@dataclass(frozen=True)
class KernelOption:
    """A kernel build option, exposed on the command line as ``--name-with-dashes``."""

    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Family:
    """One kernel family: what the registry knows of it without importing its modules.

    Attributes:
        name: the name the command line spells (``twill schedule gemm``) and its graphs carry as
            ``attrs["kernel"]``.
        summary: one line for ``twill kernels``.
        package: the family's package (``twill.kernels.gemm``).
        planned: it has a ``plan`` module (a kernel plan, so code generators).
        backends: the backends with a body module (``gluon``, ``pallas``, ``tilelang``).
        tuned: it has a ``tune`` module (the tuner's cost hooks).
        persistent: the Gluon generator emits its persistent form (``--persistent``, the tuner's axis).
        aliases: other graph kinds (``attrs["kernel"]`` or graph names) planned as this family.
        claims: for a graph whose kind names no family, whether its set of op roles is one of this family's.
    """

    name: str
    summary: str
    package: str
    planned: bool = False
    backends: tuple[str, ...] = ()
    tuned: bool = False
    persistent: bool = False
    aliases: tuple[str, ...] = ()
    claims: Callable[[frozenset[str]], bool] | None = None

    def module(self, part: str) -> ModuleType:
        """The family's module ``part`` (``graph``, ``plan``, ``tune`` or a backend), imported now."""
        return importlib.import_module(f"{self.package}.{part}")

    @property
    def options(self) -> dict[str, KernelOption]:
        """The graph builder's options."""
        return dict(getattr(self.module("graph"), "OPTIONS", {}))

    def build(self, machine: Machine, **options: Any) -> LoopGraph:
        """The family's loop graph for ``machine``; unknown or invalid options raise TwillError."""
        known = self.options
        for key, value in options.items():
            if key not in known:
                raise TwillError(f"kernel {self.name!r} has no option {key!r} "
                                 f"(options: {', '.join(known) or 'none'})")
            opt = known[key]
            if opt.choices is not None and value not in opt.choices:
                raise TwillError(f"kernel {self.name!r}: {key} must be one of {list(opt.choices)}, got {value!r}")
        return self.module("graph").build(machine, **options)

    def body(self, backend: str) -> ModuleType:
        """The body module of ``backend``; UnsupportedFeatureError when the family has none."""
        if backend not in self.backends:
            raise UnsupportedFeatureError(f"cannot emit {backend}: kernel {self.name!r} has no {backend} body "
                                          f"(it has: {', '.join(self.backends) or 'none'})")
        return self.module(backend)

    def hooks(self) -> ModuleType | None:
        """The tuner's cost hooks (the ``tune`` module), or None for a family without."""
        return self.module("tune") if self.tuned else None


def families() -> list[Family]:
    """Every registered family, in :data:`PACKAGES` order."""
    return [importlib.import_module(f"{__name__}.{p}").FAMILY for p in PACKAGES]


def list_kernels() -> list[Family]:
    """The built-in kernels ``twill kernels`` lists (every family)."""
    return families()


def find_family(kind: Any) -> Family | None:
    """The family called ``kind`` (a graph's ``attrs["kernel"]``, maybe absent), or None."""
    return next((f for f in families() if f.name == kind), None) if kind else None


def family(name: str) -> Family:
    """The family called ``name``; an unknown name raises TwillError."""
    found = find_family(name)
    if found is None:
        raise TwillError(f"unknown kernel {name!r} (built-in kernels: {', '.join(f.name for f in families())})")
    return found


def family_of(graph: LoopGraph) -> Family | None:
    """The family a loop graph was built by (its ``kernel`` attribute), or None."""
    return find_family(graph.attrs.get("kernel"))


def kernel_options(name: str) -> dict[str, KernelOption]:
    """The options of kernel ``name``."""
    return family(name).options


def build_kernel(name: str, machine: Machine, **options: Any) -> LoopGraph:
    """Build the built-in graph ``name`` for ``machine``; unknown or invalid options raise TwillError."""
    return family(name).build(machine, **options)


def planned_family(graph: LoopGraph) -> Family | None:
    """The planned family a loop graph's kernel is generated as: the one its ``kernel`` attribute (or its name)
    names or aliases, else, for a graph of no registered family, the one whose roles its ops have
    (:attr:`Family.claims`); None when none is (a family without a plan, such as ``paper-example``, included)."""
    kind = graph.attrs.get("kernel") or graph.name
    planned = [f for f in families() if f.planned]
    found = next((f for f in planned if kind == f.name or kind in f.aliases), None)
    if found is None and find_family(kind) is None:
        roles = frozenset(str(graph.op(n).attrs.get("role", "")) for n in graph.op_names)
        found = next((f for f in planned if f.claims is not None and f.claims(roles)), None)
    return found


def emitting_family(graph: LoopGraph, backend: str, persistent: bool = False) -> Family:
    """The family whose ``backend`` body emits ``graph`` (``persistent``: in its persistent form), checked from the
    graph alone so that a command refuses before it solves; an unsupported pair raises UnsupportedFeatureError."""
    found = planned_family(graph)
    if found is None:
        kind = graph.attrs.get("kernel") or graph.name
        writers = [f.name for f in families() if backend in f.backends]
        raise UnsupportedFeatureError(f"cannot emit {backend}: kernel {kind!r} is not one the {backend} generator "
                                      f"writes (it writes: {', '.join(writers)})")
    if backend not in found.backends:
        raise UnsupportedFeatureError(f"cannot emit {backend}: kernel {found.name!r} has no {backend} body "
                                      f"(it has: {', '.join(found.backends) or 'none'})")
    if persistent and not found.persistent:
        raise UnsupportedFeatureError(f"cannot emit {backend}: kernel {found.name!r} has no persistent form "
                                      f"(persistent: {', '.join(f.name for f in families() if f.persistent)})")
    return found


def emit_streaming_depth(family: Family, backend: str, graph: LoopGraph) -> int | None:
    """The streaming depth ``family``'s ``backend`` body asks to solve ``graph`` with when the command gives
    none (its optional ``streaming_depth(attrs)``, read from the graph's attributes), or None for the graph's
    default."""
    chooser = getattr(family.body(backend), "streaming_depth", None)
    return chooser(graph.attrs) if chooser is not None else None
