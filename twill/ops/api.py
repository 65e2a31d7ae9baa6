"""``twill.ops.attention``, the function users call: its input checks, then the custom op of
:mod:`twill.ops.library` (imported on the first call, so importing twill needs no torch)."""

from __future__ import annotations

from typing import Any

from twill.ops.flash import check_inputs


def attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """``softmax(q kᵀ · scale [+ causal mask]) v`` with Twill's generated Hopper kernels.

    A ``torch.library`` custom op (``twill::attention_forward``, its gradient ``twill::attention_backward``):
    ``torch.compile`` captures it without a graph break. Inputs the kernels do not cover raise
    :class:`~twill.errors.UnsupportedFeatureError` with the reason before any work
    (:func:`~twill.ops.flash.check_inputs`, then :func:`~twill.ops.flash.check_device` in the op).

    Args:
        q: ``[B, H, S, D]`` float16 or bfloat16 CUDA tensor (D = 64, 128 or 256; 64 or 128 for gradients).
        k, v: ``[B, H_kv, S, D]``, same dtype; ``H`` a multiple of ``H_kv`` (grouped-query attention; the
            gradients of k and v are summed over each group's query heads).
        causal: mask keys after each query's position (query i sees keys 0..i).
        scale: softmax scale, default ``1/sqrt(D)``.

    Returns:
        ``[B, H, S, D]`` in q's dtype; differentiable in q, k and v.
    """
    import math

    import torch

    from twill.ops import library

    needs_grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))
    spec = check_inputs(q, k, v, causal=causal, backward=needs_grad)
    scale = 1.0 / math.sqrt(spec.head_dim) if scale is None else float(scale)
    # The kernels read contiguous tensors: copied here once, so that the op saves them for its backward.
    q, k, v = (t.contiguous() for t in (q, k, v))
    out, _ = library.attention_forward(q, k, v, bool(causal), scale)
    return out
