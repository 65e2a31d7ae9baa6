"""The custom ops behind ``twill.ops.attention``, registered with ``torch.library`` so that ``torch.compile``
captures a model that calls it in one graph:

* ``twill::attention_forward(q, k, v, causal, scale, q_descale=None, k_descale=None, v_descale=None,
  out_dtype=None) -> (out, lse)``: the generated ``flash-fwd`` kernel; ``out [B, H, S, D]`` in ``out_dtype``
  (default: q's dtype, bfloat16 for fp8 q) and ``lse [B, H, S]`` float32 (the natural-log log-sum-exp of each
  row's scaled scores); ``out`` takes q's strides (``torch.empty_like``: a ``[B, S, H, D]`` tensor's
  ``transpose(1, 2)`` gets an output laid out the same way), ``lse`` is contiguous. The descale factors (fp8
  only, each None, ``[]`` or ``[B, H_kv]`` float32) multiply q, k and v as FA3's do;
* ``twill::attention_backward(grad_out, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)``: the generated
  ``flash-bwd`` kernel; the gradients take the strides of q, k and v;
* ``twill::attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
  scale) -> (out, lse)``: the generated varlen forward over packed sequences (FlashAttention's varlen
  interface); ``out [total_q, H, D]`` like q, ``lse [H, total_q]`` float32 (FlashAttention's varlen layout);
* ``twill::attention_varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, causal, scale) -> (dq, dk, dv)``: the generated varlen ``flash-bwd`` kernel, the varlen forward's
  registered autograd; the gradients take the strides of q, k and v.

Neither op copies its inputs: the kernels read q, k, v, out and grad_out where they lie (any strides whose
last dimension is contiguous and whose other strides are multiples of 16 bytes, what TMA reads;
:func:`layout_problem`), and the autograd saves the caller's tensors themselves for the backward. The one
exception is a ``grad_out`` TMA cannot read (the expanded gradient of ``out.sum()`` has stride 0), which the
backward copies first.

Each has a fake implementation (the outputs' shapes, dtypes and strides, for tracing and for tensors without
data such as ``meta`` ones), and the forward's autograd formula is the backward op
(:func:`torch.library.register_autograd`). The K/V head grouping follows from the shapes; the kernel (its
:class:`~twill.ops.flash.KernelSpec`) is chosen inside the real implementation, which first checks the
device (:func:`~twill.ops.flash.check_device`).

Eager calls on CUDA tensors skip the custom ops' dispatch: :func:`forward` runs the same implementations and
autograd formula through :class:`EagerAttention`, a plain :class:`torch.autograd.Function` (less host time per
call); while ``torch.compile`` traces, and for tensors without data, it calls the custom op.

Importing this module imports torch and registers the ops, once per process (Python imports a module
once); :func:`twill.ops.attention` imports it on its first call, an import ``torch.compile`` runs while it
traces rather than a graph break.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from twill.ops.flash import (BACKWARD, FORWARD, check_device, kernel_module, kernel_spec, on_device,
                             varlen_kernel_spec)

#: The ops' schemas (what ``torch.library`` records of their arguments and results).
FORWARD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool causal, float scale, Tensor? q_descale=None, "
                  "Tensor? k_descale=None, Tensor? v_descale=None, ScalarType? out_dtype=None) -> (Tensor, Tensor)")
VARLEN_FORWARD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
                         "SymInt max_seqlen_k, bool causal, float scale) -> (Tensor, Tensor)")
VARLEN_BACKWARD_SCHEMA = ("(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                          "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
                          "bool causal, float scale) -> (Tensor, Tensor, Tensor)")
BACKWARD_SCHEMA = ("(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, "
                   "float scale) -> (Tensor, Tensor, Tensor)")


def layout_problem(t: torch.Tensor, name: str) -> str | None:
    """Why the kernels' TMA loads cannot read ``t`` where it lies, or None: its last dimension must be
    contiguous and every other stride of a dimension longer than 1 a multiple of 16 bytes (the base address,
    which TMA also needs 16-byte aligned, is the launcher's check: tensors being traced have none)."""
    strides = tuple(t.stride())
    if strides[-1] != 1:
        return f"{name} has strides {strides}; the kernels need its last dimension contiguous (stride 1)"
    size = t.element_size()
    if any(n > 1 and s * size % 16 for n, s in zip(t.shape[:-1], strides[:-1])):
        return (f"{name} has strides {strides} ({size}-byte elements); the kernels' TMA loads need every stride "
                f"but the last to be a multiple of 16 bytes")
    return None


def _forward_outputs(q: torch.Tensor, out_dtype: torch.dtype | None,
                     with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``out`` like q (its shape and strides, ``out_dtype``: by default q's dtype, bfloat16 for fp8 q) and
    contiguous float32 ``lse [B, H, S]`` on q's device (None without ``with_lse``)."""
    if out_dtype is None:
        out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    lse = q.new_empty(q.shape[:3], dtype=torch.float32) if with_lse else None
    return torch.empty_like(q, dtype=out_dtype), lse


def _backward_outputs(q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq``, ``dk``, ``dv`` like q, k and v (their shapes, dtype and strides)."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("twill::attention_forward", mutates_args=(), schema=FORWARD_SCHEMA)
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                      q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                      v_descale: torch.Tensor | None = None,
                      out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of ``softmax(q kᵀ · scale [+ causal mask]) v`` by the generated forward kernel (for fp8
    q, k, v standing for ``q · q_descale``, ``k · k_descale``, ``v · v_descale``)."""
    return _forward(q, k, v, causal, scale, q_descale, k_descale, v_descale, out_dtype)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
             q_descale: torch.Tensor | None, k_descale: torch.Tensor | None, v_descale: torch.Tensor | None,
             out_dtype: torch.dtype | None, with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward's real implementation, shared by the custom op, :class:`EagerAttention` and the eager calls
    that ask for no gradient (``with_lse`` False: no lse is written, None is returned in its place)."""
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    check_device(q, k, v, *(t for t in descales.values() if t is not None))
    out, lse = _forward_outputs(q, out_dtype, with_lse)
    module = kernel_module(kernel_spec(FORWARD.name, q, k, causal))
    fp8 = {name: t for name, t in descales.items() if t is not None} if q.dtype == torch.float8_e4m3fn else {}
    with on_device(q):
        module.launch(q, k, v, sm_scale=scale, out=out, lse=lse, **fp8)
    return out, lse


@attention_forward.register_fake
def _attention_forward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                            q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                            v_descale: torch.Tensor | None = None,
                            out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_outputs(q, out_dtype)


@torch.library.custom_op("twill::attention_backward", mutates_args=(), schema=BACKWARD_SCHEMA)
def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` by the generated backward kernel, from the forward's ``out`` and ``lse``."""
    return _backward_kernel(grad_out, q, k, v, out, lse, causal, scale)


def _tma_readable(grad_out: torch.Tensor) -> torch.Tensor:
    """``grad_out`` itself, or a contiguous copy when TMA cannot read its layout (e.g. the expanded gradient of
    ``out.sum()``, stride 0) or its base address."""
    if layout_problem(grad_out, "grad_out") is not None or grad_out.data_ptr() % 16:
        return grad_out.contiguous()
    return grad_out


def _backward_kernel(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                     lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward's real implementation, shared by the custom op and :class:`EagerAttention`."""
    check_device(q, k, v, grad_out, out, lse)
    dq, dk, dv = _backward_outputs(q, k, v)
    grad_out = _tma_readable(grad_out)
    module = kernel_module(kernel_spec(BACKWARD.name, q, k, causal))
    with on_device(q):
        module.launch(q, k, v, out, grad_out, lse, sm_scale=scale, dq=dq, dk=dk, dv=dv)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, lse: torch.Tensor, causal: bool,
                             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_outputs(q, k, v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Save what the backward reads: q, k, v, out and lse, the mask and the scale; lse has no gradient. (The
    fp8 forward, the one with descale factors or another output dtype, has no backward: :func:`twill.ops.attention`
    refuses a gradient request on fp8 inputs before calling the op.)"""
    q, k, v, causal, scale = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: Any) -> tuple[Any, ...]:
    """The gradients of q, k and v by :func:`attention_backward` (none for the mask, the scale, the descale
    factors and the output dtype)."""
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The forward and its gradient for eager calls on CUDA tensors: the custom ops' own implementations and
    autograd formula (:func:`_setup_context`, :func:`_backward`'s kernel) behind a plain
    :class:`torch.autograd.Function`, which skips the dispatcher's custom-op layers (the autograd kernel, the
    redispatch to the implementation, the backward op's own dispatch): the host time of a call, not its
    work. :func:`forward` chooses it; traced calls take the custom ops."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                q_descale: torch.Tensor | None, k_descale: torch.Tensor | None, v_descale: torch.Tensor | None,
                out_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = _forward(q, k, v, causal, scale, q_descale, k_descale, v_descale, out_dtype)
        _setup_context(ctx, (q, k, v, causal, scale), (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: Any) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward_kernel(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None, None, None, None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
            v_descale: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out, lse)`` as :func:`attention_forward` returns them, differentiable in q, k and v: for plain CUDA
    tensors outside any tracing (:func:`is_eager`), through :class:`EagerAttention`, or, when no gradient is
    asked for (grad mode off, or no input requiring one), straight through the implementation with no lse
    (``(out, None)``: no autograd node, no lse buffer); else through the custom op, which ``torch.compile``
    captures and whose fake implementation serves tensors without data (``meta``, fake)."""
    if is_eager(q):
        if not wants_gradient(q, k, v):
            return _forward(q, k, v, causal, scale, q_descale, k_descale, v_descale, out_dtype, with_lse=False)
        return EagerAttention.apply(q, k, v, causal, scale, q_descale, k_descale, v_descale, out_dtype)
    return attention_forward(q, k, v, causal, scale, q_descale, k_descale, v_descale, out_dtype)


def wants_gradient(q: Any, k: Any, v: Any) -> bool:
    """Whether a call asks for a gradient: grad mode on and q, k or v requiring one (any argument that is not a
    tensor requires none)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))


def is_eager(q: Any) -> bool:
    """Whether a call on ``q`` runs eagerly on a CUDA tensor with data: a plain ``torch.Tensor`` (no subclass,
    no fake tensor) on a CUDA device, outside ``torch.compile`` and any dispatch mode."""
    return (type(q) is torch.Tensor and q.device.type == "cuda" and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None)


def _varlen_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` like the packed q ``[total_q, H, D]`` (its strides) and contiguous float32 ``lse [H, total_q]``."""
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("twill::attention_varlen_forward", mutates_args=(), schema=VARLEN_FORWARD_SCHEMA)
def attention_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of attention over each packed sequence by the generated varlen forward kernel."""
    check_device(q, k, v, cu_seqlens_q, cu_seqlens_k)
    out, lse = _varlen_outputs(q)
    module = kernel_module(varlen_kernel_spec(q, k, causal))
    with on_device(q):
        module.launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale=scale, out=out,
                      lse=lse)
    return out, lse


@attention_varlen_forward.register_fake
def _attention_varlen_forward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _varlen_outputs(q)


@torch.library.custom_op("twill::attention_varlen_backward", mutates_args=(), schema=VARLEN_BACKWARD_SCHEMA)
def attention_varlen_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` over the packed sequences by the generated varlen backward kernel, from the varlen
    forward's ``out`` and ``lse``."""
    check_device(q, k, v, grad_out, out, lse, cu_seqlens_q, cu_seqlens_k)
    dq, dk, dv = _backward_outputs(q, k, v)
    grad_out = _tma_readable(grad_out)
    spec = replace(kernel_spec(BACKWARD.name, q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2),
                               causal), varlen=True)
    with on_device(q):
        kernel_module(spec).launch(q, k, v, out, grad_out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, sm_scale=scale, dq=dq, dk=dk, dv=dv)
    return dq, dk, dv


@attention_varlen_backward.register_fake
def _attention_varlen_backward_fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                                    scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_outputs(q, k, v)


def _setup_varlen_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Save what the varlen backward reads: q, k, v, out, lse and the offsets, the lengths, mask and scale."""
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.max_seqlen_q, ctx.max_seqlen_k, ctx.causal, ctx.scale = max_seqlen_q, max_seqlen_k, causal, scale
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx: Any, grad_out: torch.Tensor, grad_lse: Any) -> tuple[Any, ...]:
    """The gradients of q, k and v by :func:`attention_varlen_backward` (none for the offsets and the rest)."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = attention_varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                           ctx.max_seqlen_q, ctx.max_seqlen_k, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None


attention_varlen_forward.register_autograd(_varlen_backward, setup_context=_setup_varlen_context)
