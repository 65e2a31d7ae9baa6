"""``twill.ops.attention``, the function users call: its input checks, then the custom op of
:mod:`twill.ops.library` (imported on the first call, so importing twill needs no torch)."""

from __future__ import annotations

from typing import Any

from twill.errors import UnsupportedFeatureError
from twill.ops.flash import check_fp8_options, check_inputs


def attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None, *, q_descale: Any = None,
              k_descale: Any = None, v_descale: Any = None, out_dtype: Any = None) -> Any:
    """``softmax(q kᵀ · scale [+ causal mask]) v`` with Twill's generated Hopper kernels.

    A ``torch.library`` custom op (``twill::attention_forward``, its gradient ``twill::attention_backward``):
    ``torch.compile`` captures it without a graph break. Inputs the kernels do not cover raise
    :class:`~twill.errors.UnsupportedFeatureError` with the reason before any work
    (:func:`~twill.ops.flash.check_inputs` and :func:`~twill.ops.flash.check_fp8_options`, then
    :func:`~twill.ops.flash.check_device` in the op).

    fp8 (``torch.float8_e4m3fn`` q, k and v) runs the fp8 forward (FA3's: e4m3 wgmmas, V transposed by a
    pre-pass) and has no backward, as FA3's has none: a gradient request (grad mode on and q, k or v requiring
    a gradient) raises :class:`~twill.errors.UnsupportedFeatureError`.

    Args:
        q: ``[B, H, S, D]`` float16, bfloat16 or float8_e4m3fn CUDA tensor (D = 64, 128 or 256; 64 or 128 for
            gradients, which fp8 has none of). q, k and v are read where they lie, never copied: any strides
            whose last dimension is contiguous and whose other strides are multiples of 16 bytes, such as a
            ``[B, S, H, D]`` tensor's ``.transpose(1, 2)``; another layout raises
            :class:`~twill.errors.UnsupportedFeatureError` naming the tensor.
        k, v: ``[B, H_kv, S, D]``, same dtype; ``H`` a multiple of ``H_kv`` (grouped-query attention; the
            gradients of k and v are summed over each group's query heads).
        causal: mask keys after each query's position (query i sees keys 0..i).
        scale: softmax scale, default ``1/sqrt(D)``.
        q_descale, k_descale, v_descale: fp8 only: None or a float32 tensor on q's device, of shape ``[]``
            (one factor) or ``[B, H_kv]`` (one per batch and K/V head, as FA3 takes them); the kernel computes
            with ``q · q_descale``, ``k · k_descale`` and ``v · v_descale``.
        out_dtype: the output's dtype: for fp8 inputs ``torch.bfloat16`` (the default) or ``torch.float16``;
            for float16/bfloat16 inputs None or q's dtype.

    Returns:
        ``[B, H, S, D]`` in ``out_dtype`` (q's dtype for 16-bit inputs), laid out like q (its strides: the
        transpose of a ``[B, S, H, D]`` tensor for such a q); differentiable in q, k and v for 16-bit inputs,
        their gradients laid out like them.
    """
    import math

    import torch

    from twill.ops import library

    needs_grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))
    spec = check_inputs(q, k, v, causal=causal, backward=needs_grad)
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    out_dtype = check_fp8_options(q, k, descales, out_dtype)
    scale = 1.0 / math.sqrt(spec.head_dim) if scale is None else float(scale)
    for name, t in (("q", q), ("k", k), ("v", v)):   # read where they lie: never copied
        problem = library.layout_problem(t, name)
        if problem is not None:
            raise UnsupportedFeatureError(f"twill.ops.attention: {problem} (.contiguous() gives it such a layout)")
    out, _ = library.attention_forward(q, k, v, bool(causal), scale, q_descale, k_descale, v_descale, out_dtype)
    return out
