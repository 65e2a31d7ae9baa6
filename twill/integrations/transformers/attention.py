"""The attention and mask functions ``attn_implementation="twill"`` selects (registered by
:func:`twill.integrations.transformers.register`).

transformers builds a model's mask with the mask function of its ``attn_implementation`` and hands it, with
``query [B, H, S, D]`` and ``key``, ``value [B, H_kv, S_kv, D]``, to the attention function, which returns
``[B, S, H, D]``. :func:`attention_mask` returns no mask when the model's mask is the plain causal one (or,
for a bidirectional model, none), which the kernels apply by their causal flag: the causal one includes a
query offset from a KV cache when the queries are the cache's last ones (prefill or decode with a cache:
``q_offset - kv_offset == kv_length - q_length``), the kernels' bottom-right aligned causal mask. Any other
mask (padding, sliding window, chunks, packed sequences, a static cache's unfilled slots) is built as
SDPA's boolean mask, and
:func:`attention_forward` refuses every mask it is given: the kernels cannot apply one, and ignoring it
would compute something else.
"""

from __future__ import annotations

from typing import Any

from twill.errors import UnsupportedFeatureError

#: Keyword arguments some models pass for features the kernels do not have: a non-None value is refused.
UNSUPPORTED_KWARGS = ("softcap", "sliding_window", "s_aux", "position_bias")


def _unsupported(what: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(f"twill.integrations.transformers: {what}")


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
                   mask_function: Any = None, attention_mask: Any = None, allow_is_causal_skip: bool = True,
                   allow_is_bidirectional_skip: bool = False, **kwargs: Any) -> Any:
    """None when the mask transformers asks for is one the kernels apply by their causal flag, with no padding
    in ``attention_mask`` (the 2-D padding mask, when given: reading it is a data-dependent step, a graph
    break under ``torch.compile``; pass none to avoid it): the causal mask with the queries aligned
    bottom-right on the keys (``q_offset - kv_offset == kv_length - q_length``, integer offsets: offset 0
    over equal lengths, or the last ``q_length`` positions of a filled KV cache, where query i sees keys
    0..i + kv_length - q_length), or no mask over equal lengths at offset 0; else SDPA's boolean mask of the
    same arguments, which :func:`attention_forward` refuses."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function, sdpa_mask

    offsets = isinstance(q_offset, int) and isinstance(kv_offset, int)
    causal = (mask_function is causal_mask_function and allow_is_causal_skip and offsets
              and q_offset - kv_offset == kv_length - q_length)   # bottom-right: the kernels' causal mask
    bidirectional = (mask_function is bidirectional_mask_function and allow_is_bidirectional_skip and offsets
                     and q_offset == kv_offset == 0 and q_length == kv_length)
    unpadded = attention_mask is None or (attention_mask.shape[-1] == kv_length and bool(attention_mask.all()))
    if (causal or bidirectional) and unpadded:
        return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     allow_is_causal_skip=False, allow_is_bidirectional_skip=False, **kwargs)


def attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None,
                      **kwargs: Any) -> tuple[Any, None]:
    """``(attn_output [B, S, H, D], None)`` by :func:`twill.ops.attention`: causal as ``is_causal`` says, else
    as ``module.is_causal`` (default True, as transformers' SDPA function has it); the K/V heads as the model
    has them (grouped-query attention without repeating them); the model's ``scaling``. The output is a
    transposed view of the op's ``[B, H, S, D]`` result. Raises :class:`UnsupportedFeatureError` for
    dropout, for any mask (:func:`attention_mask` leaves none where the causal flag suffices) and for the
    keyword arguments of :data:`UNSUPPORTED_KWARGS`, and for what :func:`twill.ops.attention` refuses."""
    from twill.ops import attention

    if dropout:
        raise _unsupported(f"attention dropout {dropout} is not supported (set the config's attention_dropout "
                           "to 0.0)")
    if attention_mask is not None:
        raise _unsupported("the model's attention mask is not the causal one (padding, sliding window, packed "
                           "sequences, a static cache's unfilled slots or an additive mask); the kernels apply only the "
                           "causal mask (aligned bottom-right): "
                           "pass no attention_mask, or one without padding")
    for name in UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise _unsupported(f"{name} is not supported")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = attention(query, key, value, causal=bool(causal), scale=scaling)
    return out.transpose(1, 2), None
