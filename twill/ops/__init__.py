"""PyTorch operators built on Twill's generated kernels (needs torch and a Hopper GPU at call time).

``twill.ops.attention(q, k, v, causal=False, scale=None, *, q_descale=None, k_descale=None, v_descale=None,
out_dtype=None)`` (fp16/bf16, or fp8 e4m3 forward-only): see :mod:`twill.ops.api` (the custom op it calls:
:mod:`twill.ops.library`; the kernels and their cache: :mod:`twill.ops.flash`).
``twill.ops.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
scale=None)``: packed variable-length sequences, FlashAttention's varlen interface (forward and backward).
``twill.ops.prepare(head_dim, dtype, causal=False, kv_heads=0, backward=True)``: emit a configuration's kernel
modules into the kernel cache from the shipped schedules (:mod:`twill.ops.shipped`), without a GPU, torch or the
solver.
"""

from twill.ops.api import attention, attention_varlen
from twill.ops.flash import prepare

__all__ = ["attention", "attention_varlen", "prepare"]
