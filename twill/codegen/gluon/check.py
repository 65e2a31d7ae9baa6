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


def attention_statistics(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """The forward's output (in q's dtype) and its log-sum-exp rows (fp32, natural log), computed in fp32 one
    (batch, head) at a time: what a backward kernel is given."""
    import torch

    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h].float() @ k[b, h].float().T) / q.shape[-1] ** 0.5
            lse[b, h] = torch.logsumexp(s, dim=-1)
            out[b, h] = (torch.softmax(s, dim=-1) @ v[b, h].float()).to(q.dtype)
    return out, lse


def check_attention_backward(module: Any, dtype: str, head_dim: int) -> list[dict[str, Any]]:
    """Largest relative error of dq, dk, dv from an emitted backward's ``module.launch(q, k, v, o, do, lse,
    dq=..., dk=..., dv=...)`` (outputs poisoned with NaN) against fp32 torch autograd of
    :func:`attention_reference`, on :data:`ATTN_RAGGED`; O and LSE are the fp32 forward's."""
    import torch

    rows = []
    for b, h, s in ATTN_RAGGED:
        q, k, v, do = (torch.randn(b, h, s, head_dim, device="cuda", dtype=torch_dtype(dtype)) for _ in range(4))
        o, lse = attention_statistics(q, k, v)
        grads = [torch.full_like(q, float("nan")) for _ in range(3)]
        module.launch(q, k, v, o, do, lse, dq=grads[0], dk=grads[1], dv=grads[2])
        torch.cuda.synchronize()
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        refs = torch.autograd.grad(attention_reference(*leaves), leaves, do.float())
        rows.append({"B": b, "H": h, "S": s, "D": head_dim,
                     "relerr": max(relative_error(got, ref) for got, ref in zip(grads, refs))})
    return rows

