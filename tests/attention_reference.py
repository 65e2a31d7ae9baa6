"""The fp64 attention the GPU tests compare Twill's kernels with (torch imported by the caller's module)."""

from __future__ import annotations

from typing import Any


def reference(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """fp64 ``(out, lse)`` of ``q [B, H, S, D]`` against ``k, v [B, H_kv, S_k, D]``, K/V heads repeated over
    their query-head group; the causal mask aligned bottom-right as FlashAttention's (query i sees keys
    0..i + S_k - S). A row that sees no key has out 0 and lse -inf. Differentiable."""
    import torch

    group = q.shape[1] // k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(sk - sq + 1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)      # rows with no key: 0
    return p @ v, lse


def relerr(out: Any, ref: Any) -> float:
    """``‖out − ref‖ / ‖ref‖`` in fp64, after checking that ``out`` is finite (an unwritten, NaN-poisoned
    element fails here)."""
    import torch

    assert torch.isfinite(out).all(), "NaN/Inf in the output (an element never written?)"
    return float((out.double() - ref.double()).norm() / max(ref.double().norm(), 1e-30))
