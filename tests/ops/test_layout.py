"""``twill.ops.attention`` takes q, k, v with the strides models give them (``[B, S, H, D]`` projections
transposed to ``[B, H, S, D]``) and copies nothing: the op receives the caller's tensors, its fake
implementations lay the outputs out as the real ones do (``out`` and the gradients like their inputs), the
autograd hands the caller's views to the backward, and a layout TMA cannot read is refused with one error
naming the tensor. On the CPU with ``meta`` tensors; the kernels on such tensors are
tests/gpu/test_gpu_strides.py's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import twill.ops  # noqa: E402
from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.ops import library  # noqa: E402


def _bshd(b, s, h, d, grad=False):
    """A bf16 ``[B, H, S, D]`` view of a ``[B, S, H, D]`` tensor without data (as a projection gives it)."""
    x = torch.randn(b, s, h, d, device="meta", dtype=torch.bfloat16).requires_grad_(grad)
    return x, x.transpose(1, 2)


def test_the_fake_forward_lays_out_out_like_q_and_lse_contiguous():
    _, q = _bshd(2, 256, 8, 64)
    _, k = _bshd(2, 256, 2, 64)
    out, lse = torch.ops.twill.attention_forward(q, k, k, True, 0.125)
    assert not q.is_contiguous() and out.shape == q.shape and out.stride() == q.stride()
    assert lse.shape == (2, 8, 256) and lse.is_contiguous() and lse.dtype == torch.float32


def test_the_fake_backward_lays_out_each_gradient_like_its_input():
    _, q = _bshd(2, 256, 8, 128)
    _, k = _bshd(2, 256, 2, 128)
    v = torch.randn(2, 2, 256, 128, device="meta", dtype=torch.bfloat16)     # contiguous: another layout
    out, lse = torch.ops.twill.attention_forward(q, k, v, False, 0.1)
    grad = torch.randn(2, 8, 256, 128, device="meta", dtype=torch.bfloat16)
    dq, dk, dv = torch.ops.twill.attention_backward(grad, q, k, v, out, lse, False, 0.1)
    assert (dq.stride(), dk.stride(), dv.stride()) == (q.stride(), k.stride(), v.stride())
    assert dk.stride() != dv.stride()


def test_attention_hands_the_callers_tensors_to_the_op_and_its_backward(monkeypatch):
    seen = {}
    forward, backward = library.attention_forward, library.attention_backward

    def record_forward(q, k, v, *rest):
        seen["forward"] = (q, k, v)
        return forward(q, k, v, *rest)

    def record_backward(grad_out, q, k, v, out, lse, *rest):
        seen["backward"] = (q, k, v, out)
        return backward(grad_out, q, k, v, out, lse, *rest)

    monkeypatch.setattr(library, "attention_forward", record_forward)
    monkeypatch.setattr(library, "attention_backward", record_backward)
    xq, q = _bshd(2, 128, 8, 64, grad=True)
    xk, k = _bshd(2, 128, 2, 64, grad=True)
    xv, v = _bshd(2, 128, 2, 64, grad=True)
    out = twill.ops.attention(q, k, v, causal=True)
    assert all(a is b for a, b in zip(seen["forward"], (q, k, v)))           # no copy before the op
    assert out.stride() == q.stride()
    out.backward(torch.ones_like(out))
    saved = seen["backward"]
    assert [t.stride() for t in saved] == [q.stride(), k.stride(), v.stride(), out.stride()]
    # the gradients reach the [B, S, H, D] leaves through the transposes alone
    assert (xq.grad.stride(), xk.grad.stride(), xv.grad.stride()) == (xq.stride(), xk.stride(), xv.stride())


@pytest.mark.parametrize("name,words", [("q", "last dimension contiguous"), ("v", "multiple of 16 bytes")])
def test_a_layout_tma_cannot_read_is_refused_naming_the_tensor(name, words):
    tensors = {"q": _bshd(2, 128, 8, 64)[1], "k": _bshd(2, 128, 2, 64)[1], "v": _bshd(2, 128, 2, 64)[1]}
    if name == "q":      # D strided: [B, H, D, S] transposed
        tensors["q"] = torch.randn(2, 8, 64, 128, device="meta", dtype=torch.bfloat16).transpose(2, 3)
    else:                # rows of 65 elements (130 bytes): sliced from a wider tensor
        tensors["v"] = torch.randn(2, 2, 128, 65, device="meta", dtype=torch.bfloat16)[..., :64]
    with pytest.raises(UnsupportedFeatureError) as err:
        twill.ops.attention(**tensors)
    message = str(err.value)
    assert message.startswith(f"twill.ops.attention: {name} has strides") and words in message
    assert "\n" not in message
