"""The launch convention of ``twill tune path.py:fn --measure K`` for Triton kernels, and its GEMM and
attention implementations that the built-in kernels use.

A kernel module that can be measured defines, next to its ``@triton.jit`` function::

    def twill_launch(fn, shape, **meta):
        '''(launch, check) of ``fn`` on ``shape`` with launch keywords ``meta``.'''

* ``fn``: the kernel to launch as ``fn[grid](...)``, its only use: the module's own function, a fresh
  ``JITFunction`` of the same source that compiles with Twill's schedule injected
  (:class:`twill.tune.measure_triton.HookedKernel`), or an ``@triton.autotune`` wrapper of it.
* ``shape``: the problem's sizes as a plain dict: ``{"M", "N", "K"}`` (GEMM) or ``{"B", "H", "S", "D"}``
  (attention).
* ``meta``: the ``tl.constexpr`` values plus ``num_warps`` and ``num_stages``, passed through to
  ``fn[grid](...)``; empty for an autotuned ``fn``, which picks them itself. The grid must therefore be a
  function of the launch's meta-parameters (``lambda meta: ...``), never of ``meta`` here.

It allocates the inputs once on the GPU and returns two callables: ``launch()`` launches the kernel once
(what is timed), ``check()`` draws fresh random inputs, poisons the output with NaN, launches, and returns the
relative error of the output against a float32 torch reference (``inf`` when NaN is left). torch is imported
only when ``twill_launch`` is called.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

#: ``(launch, check)`` as returned by a ``twill_launch`` hook.
Launch = tuple[Callable[[], Any], Callable[[], float]]


def relative_error(out: Any, ref: Any) -> float:
    """``‖out − ref‖ / ‖ref‖`` in float32; ``inf`` when ``out`` holds NaN."""
    import torch

    if torch.isnan(out).any():
        return float("inf")
    return float((out.float() - ref).norm() / ref.norm())


def gemm_launch(fn: Any, shape: Mapping[str, int], grid: Callable[[Mapping[str, Any]], tuple[int, ...]],
                meta: Mapping[str, Any]) -> Launch:
    """``C = A @ B`` with fp16 ``A[M, K]``, ``B[K, N]``, ``C[M, N]``, launched as
    ``fn[grid](a, b, c, M, N, K, **meta)``."""
    import torch

    m, n, k = shape["M"], shape["N"], shape["K"]
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)

    def launch() -> Any:
        return fn[grid](a, b, c, m, n, k, **meta)

    def check() -> float:
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        c.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        return relative_error(c, a.float() @ b.float())

    return launch, check


def attention_launch(fn: Any, shape: Mapping[str, int], grid: Callable[[Mapping[str, Any]], tuple[int, ...]],
                     meta: Mapping[str, Any]) -> Launch:
    """Non-causal attention forward with fp16 Q, K, V, O stored ``[B·H·S, D]`` (heads stacked along the
    rows), launched as ``fn[grid](q, k, v, o, 1/√D, B·H, S, **meta)``; the check compares three heads (the
    first, one in the middle, the last) with a float32 softmax reference."""
    import torch

    heads, seq, dim = shape["B"] * shape["H"], shape["S"], shape["D"]
    q, k, v = (torch.randn(heads * seq, dim, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.full((heads * seq, dim), float("nan"), device="cuda", dtype=torch.float16)
    scale = 1.0 / math.sqrt(dim)

    def launch() -> Any:
        return fn[grid](q, k, v, o, scale, heads, seq, **meta)

    def check() -> float:
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        o.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        errors = []
        for h in sorted({0, heads // 2, heads - 1}):
            rows = slice(h * seq, (h + 1) * seq)
            p = torch.softmax((q[rows].float() @ k[rows].float().T) * scale, dim=-1)
            errors.append(relative_error(o[rows], p @ v[rows].float()))
        return max(errors)

    return launch, check
