"""Built-in loop graphs (``twill kernels``), built from the machine cost model.

Each entry names a module with ``build(machine, **options) -> LoopGraph`` and ``OPTIONS``, a dict
``option -> KernelOption``. Modules are imported only when a kernel is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from twill.errors import TwillError
from twill.ir.graph import LoopGraph
from twill.machine.models import Machine


@dataclass(frozen=True)
class KernelOption:
    """A kernel build option, exposed on the command line as ``--name-with-dashes``."""

    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class KernelEntry:
    name: str
    module: str
    summary: str


KERNELS: dict[str, KernelEntry] = {e.name: e for e in (
    KernelEntry("paper-example", "twill.kernels.paper_example",
                "the paper's running example: S = gemm, P = exp, O += gemm (unit costs)"),
    KernelEntry("gemm", "twill.kernels.gemm", "tiled GEMM: TMA loads of A/B, wgmma/tcgen05, accumulator"),
    KernelEntry("flash-fwd", "twill.kernels.flash_fwd",
                "flash attention forward (Triton-tutorial structure), --subtiles 1|2|3"),
    KernelEntry("flash-bwd", "twill.kernels.flash_bwd",
                "flash attention backward, single-pass FA3 algorithm (5 GEMMs, exp, dQ atomic add)"),
)}


def list_kernels() -> list[KernelEntry]:
    return list(KERNELS.values())


def kernel_module(name: str):
    try:
        entry = KERNELS[name]
    except KeyError:
        raise TwillError(f"unknown kernel {name!r} (built-in kernels: {', '.join(KERNELS)})") from None
    return importlib.import_module(entry.module)


def kernel_options(name: str) -> dict[str, KernelOption]:
    return dict(getattr(kernel_module(name), "OPTIONS", {}))


def build_kernel(name: str, machine: Machine, **options: Any) -> LoopGraph:
    """Build the built-in graph ``name`` for ``machine``; unknown or invalid options raise TwillError."""
    module = kernel_module(name)
    known = getattr(module, "OPTIONS", {})
    for key, value in options.items():
        if key not in known:
            raise TwillError(f"kernel {name!r} has no option {key!r} (options: {', '.join(known) or 'none'})")
        opt = known[key]
        if opt.choices is not None and value not in opt.choices:
            raise TwillError(f"kernel {name!r}: {key} must be one of {list(opt.choices)}, got {value!r}")
    return module.build(machine, **options)
