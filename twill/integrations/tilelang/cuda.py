"""Lower a TileLang kernel to CUDA C++ on a machine without a GPU (TileLang 0.1.15, ``sm_90a``).

Used by the tests (every emitted or planned kernel is lowered and its CUDA checked) and by ``twill inject``
for TileLang kernels (which writes the CUDA next to the rewritten kernel). Imports TileLang on call.
"""

from __future__ import annotations

from typing import Any

from twill.integrations.tilelang import import_tilelang

#: CUDA architecture of the Hopper targets.
CUDA_ARCH = {"h100": "sm_90a", "h200": "sm_90a"}


def lower_cuda(prim_func: Any, pass_configs: dict[str, Any] | None = None, arch: str = "h100") -> str:
    """The CUDA source TileLang generates for ``prim_func`` on ``arch`` (no GPU, no nvcc needed)."""
    tilelang = import_tilelang()
    from tvm.target import Target

    target = Target({"kind": "cuda", "arch": CUDA_ARCH[arch]})
    with tilelang.transform.PassContext(config=dict(pass_configs or {})), target:
        artifact = tilelang.lower(prim_func, target=target)
    return artifact.kernel_source
