"""``twill.ops.attention`` and the emitted launchers on the layouts models pass, on a Hopper GPU: q, k, v as
``[B, S, H, D]`` tensors transposed to ``[B, H, S, D]`` (and K/V interleaved in one projection), read where
they lie. Outputs and gradients against fp64 attention (ragged S, causal, grouped-query, D 64/128/256
forward and backward), outputs and gradients laid out like their inputs, and a profiler check that a
forward + backward step runs no copy kernel around the op: only the generated kernels and the zero fills of
the launchers' own buffers.

Marked ``gpu``; skipped without torch, CUDA or an sm_90 device.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from twill.ops import attention  # noqa: E402
from twill.ops.flash import KernelSpec, kernel_module  # noqa: E402
from attention_reference import reference, relerr  # noqa: E402

#: The generated kernels (every other kernel in the step's profile must be a fill of a launcher's buffer).
GENERATED = ("attention_kernel", "backward_kernel", "preprocess_kernel", "dq_convert_kernel")


def _bshd(b, s, h, d, dtype, grad=False):
    """A ``[B, S, H, D]`` leaf and its ``[B, H, S, D]`` transpose (the view a model passes)."""
    x = torch.randn(b, s, h, d, device="cuda", dtype=dtype).requires_grad_(grad)
    return x, x.transpose(1, 2)


def _packed_kv(b, s, hkv, d, dtype):
    """K and V as one projection gives them: ``[B, S, 2, H_kv, D]`` split and transposed (interleaved rows)."""
    kv = torch.randn(b, s, 2, hkv, d, device="cuda", dtype=dtype)
    return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


#: (B, H, H_kv, S, D, dtype, causal): ragged lengths, grouped-query, every head dimension.
CASES = [(2, 4, 4, 1000, 128, torch.float16, False), (1, 4, 4, 77, 64, torch.float16, True),
         (2, 8, 2, 513, 128, torch.bfloat16, True), (1, 2, 2, 300, 256, torch.float16, True),
         (1, 4, 1, 2048, 64, torch.bfloat16, False), (2, 4, 2, 1000, 256, torch.bfloat16, False)]


@pytest.mark.parametrize("b,h,hkv,s,d,dtype,causal", CASES)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed_kv"])
def test_forward_of_transposed_views_matches_fp64_and_keeps_the_layout(b, h, hkv, s, d, dtype, causal, packed):
    _, q = _bshd(b, s, h, d, dtype)
    k, v = _packed_kv(b, s, hkv, d, dtype) if packed else (_bshd(b, s, hkv, d, dtype)[1] for _ in range(2))
    out = attention(q, k, v, causal=causal, scale=0.3)
    assert relerr(out, reference(q, k, v, causal, 0.3)[0]) < 1e-2
    assert out.stride() == q.stride()                       # written in the caller's layout


@pytest.mark.parametrize("b,h,hkv,s,d,dtype,causal", CASES)
def test_launch_writes_poisoned_strided_outputs_rows_past_s_untouched(b, h, hkv, s, d, dtype, causal):
    """The launcher on transposed views with a given out, itself a view of a bigger [B, S + 16, H, D] buffer:
    every element of the view is written, the 16 rows after each (batch, head)'s S are not (the stores
    follow out's strides and stop at S; the loads of rows past S are zero-filled by TMA, not the next head's)."""
    _, q = _bshd(b, s, h, d, dtype)
    k, v = (_bshd(b, s, hkv, d, dtype)[1] for _ in range(2))
    spec = KernelSpec("flash-fwd", d, "fp16" if dtype == torch.float16 else "bf16", causal, 0 if h == hkv else hkv)
    buffer = torch.full((b, s + 16, h, d), float("nan"), device="cuda", dtype=dtype)
    out = buffer[:, :s].transpose(1, 2)
    kernel_module(spec).launch(q, k, v, sm_scale=0.3, out=out)
    assert relerr(out, reference(q, k, v, causal, 0.3)[0]) < 1e-2
    assert torch.isnan(buffer[:, s:]).all()


@pytest.mark.parametrize("b,h,hkv,s,d,dtype,causal", CASES)
def test_gradients_of_transposed_views_match_fp64_in_the_inputs_layout(b, h, hkv, s, d, dtype, causal):
    xq, q = _bshd(b, s, h, d, dtype, grad=True)
    xk, k = _bshd(b, s, hkv, d, dtype, grad=True)
    xv, v = _bshd(b, s, hkv, d, dtype, grad=True)
    grad = torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2)   # as the next layer's backward
    out = attention(q, k, v, causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, causal, d ** -0.5)[0]
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    assert relerr(out, ref) < 1e-2
    for name, got, want, like in (("dq", dq, rq, q), ("dk", dk, rk, k), ("dv", dv, rv, v)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert got.stride() == like.stride(), name            # the gradient in its input's layout
        assert relerr(got, want) < 2e-2, name


def test_an_expanded_output_gradient_is_taken():
    """out.sum()'s gradient is expanded (stride 0), a layout TMA cannot read: the backward copies that one."""
    xq, q = _bshd(1, 200, 4, 64, torch.float16, grad=True)
    xk, k = _bshd(1, 200, 4, 64, torch.float16, grad=True)
    attention(q, k, k, causal=True).sum().backward()
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    reference(q64, k64, k64, True, 64 ** -0.5)[0].sum().backward()
    assert relerr(xq.grad.transpose(1, 2), q64.grad) < 2e-2 and relerr(xk.grad.transpose(1, 2), k64.grad) < 2e-2


def test_a_misaligned_base_is_refused_naming_the_tensor():
    _, q = _bshd(1, 128, 4, 64, torch.float16)
    k = torch.randn(4 * 128 * 64 + 1, device="cuda", dtype=torch.float16)[1:].view(1, 4, 128, 64)
    with pytest.raises(ValueError, match="^k starts at address"):
        attention(q, k, q)


@pytest.mark.parametrize("hkv", [8, 2])
def test_a_training_step_runs_no_copy_kernel_around_the_op(hkv):
    """Forward and backward of the op on [B, S, H, D] projections' transposes with a [B, S, H, D] output
    gradient, profiled: the kernels are the generated ones and fills of the launchers' buffers, no copy."""
    from torch.profiler import ProfilerActivity, profile

    xq, q = _bshd(2, 1024, 8, 128, torch.bfloat16, grad=True)
    xk, k = _bshd(2, 1024, hkv, 128, torch.bfloat16, grad=True)
    xv, v = _bshd(2, 1024, hkv, 128, torch.bfloat16, grad=True)
    grad = torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    def step():
        for x in (xq, xk, xv):
            x.grad = None
        attention(q, k, v, causal=True).backward(grad)

    step()                                                    # generates and compiles the kernels
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert all(any(g in n for n in names) for g in GENERATED), names
    others = [n for n in names if not any(g in n for g in GENERATED)]
    assert not [n for n in others if "copy" in n.lower()], others
    # the zeroed dQ accumulator and work counter only
    assert all("FillFunctor" in n or n.startswith("Memset") for n in others), others
    assert (xq.grad.stride(), xk.grad.stride(), xv.grad.stride()) == (xq.stride(), xk.stride(), xv.stride())
