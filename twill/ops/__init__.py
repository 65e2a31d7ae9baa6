"""PyTorch operators built on Twill's generated kernels (needs torch and a Hopper GPU at call time).

``twill.ops.attention(q, k, v, causal=False, scale=None)``: see :mod:`twill.ops.flash`.
"""

from twill.ops.flash import attention

__all__ = ["attention"]
