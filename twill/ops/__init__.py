"""PyTorch operators built on Twill's generated kernels (needs torch and a Hopper GPU at call time).

``twill.ops.attention(q, k, v, causal=False, scale=None)``: see :mod:`twill.ops.api` (the custom op it calls:
:mod:`twill.ops.library`; the kernels and their cache: :mod:`twill.ops.flash`).
"""

from twill.ops.api import attention

__all__ = ["attention"]
