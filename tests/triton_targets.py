"""The example Triton kernels of ``twill/integrations/triton/kernels/`` as loop graphs, for the tests that
schedule them (each kernel module names its ``SIGNATURE``, ``CONSTEXPRS``, ``NUM_WARPS`` and ``NUM_STAGES``)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

KERNELS = Path(__file__).resolve().parents[1] / "twill" / "integrations" / "triton" / "kernels"


def triton_module(name: str) -> ModuleType:
    """The example kernel module ``name`` (e.g. ``matmul``)."""
    return importlib.import_module(f"twill.integrations.triton.kernels.{name}")


def triton_graph(name: str, fn: str, arch: str = "h100", **over):
    """The loop graph of kernel ``fn`` in example module ``name`` on ``arch``, traced with the module's own
    signature and constexprs unless ``over`` gives ``signature`` or ``constexprs``."""
    from twill.integrations.triton import graph_from_target
    from twill.machine import get_machine

    mod = triton_module(name)
    return graph_from_target(KERNELS / f"{name}.py", fn, signature=over.get("signature", mod.SIGNATURE),
                             constexprs=list(over.get("constexprs", mod.CONSTEXPRS)), num_warps=mod.NUM_WARPS,
                             num_stages=mod.NUM_STAGES, machine=get_machine(arch))
