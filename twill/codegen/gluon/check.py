"""Correctness checks of an emitted Gluon kernel module against torch (GPU only; torch imported when run).

Every check draws fresh random inputs, poisons the output with NaN (so an unwritten element fails), runs the
emitted module's ``launch`` and compares with an fp32 torch reference by relative Frobenius error, on ragged
shapes that exercise the TMA tails. Used by ``twill tune --measure`` and the benchmark scripts.
"""

from __future__ import annotations

from typing import Any

#: (M, N, K) shapes for GEMM checks: tails in every dimension, a K that is not a multiple of 64, a tiny tile.
GEMM_RAGGED = ((300, 520, 200), (257, 333, 129), (1000, 72, 4104), (128, 256, 64))
#: (B, H, S) shapes for attention checks: key tails, one partial query tile, a long sequence.
ATTN_RAGGED = ((1, 3, 77), (2, 2, 1000), (1, 2, 4096), (2, 1, 200))


def relative_error(out: Any, ref: Any) -> float:
    """``‖out − ref‖ / ‖ref‖`` in float64; NaN when ``out`` holds a non-finite value (unwritten, overflow)."""
    import torch

    if not torch.isfinite(out).all():
        return float("nan")
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def check_gemm(module: Any, dtype: str) -> list[dict[str, Any]]:
    """Relative error of ``module.launch(a, b, c)`` against an fp32 product on :data:`GEMM_RAGGED`."""
    import torch

    rows = []
    for m, n, k in GEMM_RAGGED:
        a = torch.randn(m, k, device="cuda", dtype=torch_dtype(dtype))
        b = torch.randn(k, n, device="cuda", dtype=torch_dtype(dtype))
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch_dtype(dtype))
        module.launch(a, b, c)
        torch.cuda.synchronize()
        rows.append({"M": m, "N": n, "K": k, "relerr": relative_error(c, a.float() @ b.float())})
    return rows


def attention_reference(q: Any, k: Any, v: Any) -> Any:
    """softmax(q kᵀ / √D) v in fp32."""
    import torch

    s = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(s, dim=-1) @ v.float()


def check_attention(module: Any, dtype: str, head_dim: int) -> list[dict[str, Any]]:
    """Relative error of ``module.launch(q, k, v, out=...)`` against :func:`attention_reference` on
    :data:`ATTN_RAGGED`."""
    import torch

    rows = []
    for b, h, s in ATTN_RAGGED:
        q, k, v = (torch.randn(b, h, s, head_dim, device="cuda", dtype=torch_dtype(dtype)) for _ in range(3))
        out = torch.full_like(q, float("nan"))
        module.launch(q, k, v, out=out)
        torch.cuda.synchronize()
        rows.append({"B": b, "H": h, "S": s, "D": head_dim, "relerr": relative_error(out, attention_reference(q, k, v))})
    return rows
