"""``twill.ops.attention`` and ``twill.ops.attention_varlen``, the functions users call: their input checks,
then the custom ops of :mod:`twill.ops.library` (imported on the first call, so importing twill needs no
torch)."""

from __future__ import annotations

from typing import Any

from twill.errors import UnsupportedFeatureError
from twill.ops.flash import check_fp8_options, check_inputs, check_varlen_inputs


def attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None, *, q_descale: Any = None,
              k_descale: Any = None, v_descale: Any = None, out_dtype: Any = None) -> Any:
    """``softmax(q kᵀ · scale [+ causal mask]) v`` with Twill's generated Hopper kernels.

    A ``torch.library`` custom op (``twill::attention_forward``, its gradient ``twill::attention_backward``):
    ``torch.compile`` captures it without a graph break; an eager call on CUDA tensors runs the same kernels
    through a plain autograd function (:func:`twill.ops.library.forward`), for less host time per call.
    Inputs the kernels do not cover raise :class:`~twill.errors.UnsupportedFeatureError` with the reason
    before any work (:func:`~twill.ops.flash.check_inputs` and :func:`~twill.ops.flash.check_fp8_options`,
    then :func:`~twill.ops.flash.check_device` in the op).

    fp8 (``torch.float8_e4m3fn`` q, k and v) runs the fp8 forward (FA3's: e4m3 wgmmas, V transposed by a
    pre-pass) and has no backward, as FA3's has none: a gradient request (grad mode on and q, k or v requiring
    a gradient) raises :class:`~twill.errors.UnsupportedFeatureError`.

    Args:
        q: ``[B, H, S, D]`` float16, bfloat16 or float8_e4m3fn CUDA tensor (D = 64, 128 or 256; 64 or 128 for
            gradients, which fp8 has none of). q, k and v are read where they lie, never copied: any strides
            whose last dimension is contiguous and whose other strides are multiples of 16 bytes, such as a
            ``[B, S, H, D]`` tensor's ``.transpose(1, 2)``; another layout raises
            :class:`~twill.errors.UnsupportedFeatureError` naming the tensor.
        k, v: ``[B, H_kv, S_k, D]``, same dtype; ``H`` a multiple of ``H_kv`` (grouped-query attention; the
            gradients of k and v are summed over each group's query heads); the key length ``S_k`` may differ
            from the query length ``S`` (not 0 when ``S`` is not).
        causal: the causal mask aligned bottom-right, as FlashAttention's: query i sees keys
            ``0..i + S_k - S`` (keys 0..i when ``S_k == S``; a decode step's queries, the last of a KV cache,
            see every key before them). When ``S_k < S`` the first ``S - S_k`` queries see no key: their output
            rows are 0 (and their log-sum-exp -inf, FA3's convention), and their gradients 0.
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

    from twill.ops import library

    backward = library.wants_gradient(q, k, v)
    plain = q_descale is None and k_descale is None and v_descale is None and out_dtype is None
    key = _checked_key(library, q, k, v, causal, backward) if plain else None
    head_dim = _CHECKED.get(key) if key is not None else None
    if head_dim is None:
        spec = check_inputs(q, k, v, causal=causal, backward=backward)
        descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        out_dtype = check_fp8_options(q, k, descales, out_dtype)
        _check_layouts(library, "twill.ops.attention", q, k, v)
        head_dim = spec.head_dim
        if key is not None:
            if len(_CHECKED) >= _CHECKED_MAX:
                _CHECKED.clear()
            _CHECKED[key] = head_dim
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out, _ = library.forward(q, k, v, bool(causal), scale, q_descale, k_descale, v_descale, out_dtype)
    return out


#: The eager calls' arguments that passed :func:`attention`'s checks (the checks read nothing else: types,
#: shapes, strides, dtypes, devices, the mask, whether a gradient is asked for), each with its head dimension;
#: up to ``_CHECKED_MAX``, emptied when full. A call with these arguments skips the checks' Python.
_CHECKED: dict[tuple[Any, ...], int] = {}
_CHECKED_MAX = 1024


def _checked_key(library: Any, q: Any, k: Any, v: Any, causal: Any, backward: bool) -> tuple[Any, ...] | None:
    """What :func:`attention`'s checks read of an eager call on plain CUDA tensors (:func:`twill.ops.library.
    is_eager`), as a key of :data:`_CHECKED`; None for any other call (traced, fake, not tensors), which is
    checked every time."""
    if not (library.is_eager(q) and type(k) is type(q) and type(v) is type(q) and type(causal) is bool):
        return None
    return (causal, backward, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device)


def attention_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: float | None = None) -> Any:
    """Attention over variable-length packed sequences with Twill's generated Hopper forward kernel,
    FlashAttention's varlen interface (``flash_attn_varlen_func``).

    Sequence ``b`` is rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of ``q`` and ``cu_seqlens_k[b]:cu_seqlens_k[b +
    1]`` of ``k`` and ``v``; each attends only to its own keys. A ``torch.library`` custom op
    (``twill::attention_varlen_forward``, its gradient ``twill::attention_varlen_backward``): ``torch.compile``
    captures it without a graph break. The inputs the kernels do not cover raise
    :class:`~twill.errors.UnsupportedFeatureError` (:func:`~twill.ops.flash.check_varlen_inputs`, then
    :func:`~twill.ops.flash.check_device` in the op).

    Args:
        q: ``[total_q, H, D]`` float16 or bfloat16 CUDA tensor (D = 64, 128 or 256), the sequences' queries one
            after another; read where it lies (any strides whose last dimension is contiguous and whose other
            strides are multiples of 16 bytes).
        k, v: ``[total_k, H_kv, D]``, same dtype; ``H`` a multiple of ``H_kv`` (grouped-query attention).
        cu_seqlens_q, cu_seqlens_k: int32 ``[batch + 1]`` on q's device: the sequences' first rows, from 0,
            non-decreasing, ending at ``total_q`` / ``total_k``; a sequence may be empty (length 0).
        max_seqlen_q, max_seqlen_k: ints, at least every sequence's query / key length (the kernels' grids
            cover ``max_seqlen_q`` query rows and, for the gradient, ``max_seqlen_k`` keys per sequence: rows past
            them are never computed, as in FlashAttention; the values are not checked, which would read the
            offsets on the host).
        causal: the causal mask aligned bottom-right in each sequence, as FlashAttention's: query i sees keys
            ``0..i + len_k - len_q``; a query that sees no key (``len_k < len_q``, or ``len_k = 0``) gets 0.
        scale: softmax scale, default ``1/sqrt(D)``.

    Returns:
        ``[total_q, H, D]`` in q's dtype, laid out like q; differentiable in q, k and v, their gradients laid out
        like them (the keys no query sees get 0).
    """
    import math

    from twill.ops import library

    spec = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                               backward=library.wants_gradient(q, k, v))
    scale = 1.0 / math.sqrt(spec.head_dim) if scale is None else float(scale)
    _check_layouts(library, "twill.ops.attention_varlen", q, k, v)
    out, _ = library.attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              bool(causal), scale)
    return out


def _check_layouts(library: Any, function: str, q: Any, k: Any, v: Any) -> None:
    """Refuse, naming the tensor, a q, k or v the kernels cannot read where it lies (they never copy one):
    :func:`twill.ops.library.layout_problem`."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        problem = library.layout_problem(t, name)
        if problem is not None:
            raise UnsupportedFeatureError(f"{function}: {problem} (.contiguous() gives it such a layout)")
