"""``twill.ops.attention`` with a key length different from the query length, on a Hopper GPU: outputs, LSE and
gradients against fp64 attention with FlashAttention's bottom-right aligned causal mask (query i sees keys
0..i + S_k - S), for S_k > S (a decode step: S = 1), S_k < S (the first S - S_k queries see no key: output 0,
LSE -inf, gradient 0), ragged lengths, grouped-query, D 64/128/256 forward and backward.

Marked ``gpu``; skipped without torch, CUDA or an sm_90 device.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from twill.ops import attention, library  # noqa: E402
from attention_reference import reference, relerr  # noqa: E402


#: (B, H, H_kv, S, S_k, D, dtype, causal)
CASES = [(2, 4, 4, 1, 1000, 128, torch.bfloat16, True), (2, 4, 2, 77, 1000, 64, torch.float16, True),
         (1, 4, 4, 1000, 77, 128, torch.float16, True), (2, 8, 2, 513, 300, 128, torch.bfloat16, True),
         (1, 4, 4, 300, 513, 64, torch.bfloat16, False), (1, 2, 2, 129, 64, 256, torch.float16, True),
         (1, 2, 1, 64, 4096, 256, torch.bfloat16, False), (1, 4, 4, 200, 200, 64, torch.float16, True),
         (1, 4, 4, 3000, 1, 64, torch.float16, True)]


@pytest.mark.parametrize("b,h,hkv,s,sk,d,dtype,causal", CASES)
def test_forward_matches_fp64_with_the_bottom_right_causal_mask(b, h, hkv, s, sk, d, dtype, causal):
    torch.manual_seed(0)
    q = torch.randn(b, h, s, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    scale = 1 / math.sqrt(d)
    out, lse = library.attention_forward(q, k, v, causal, scale)
    ref, ref_lse = reference(q, k, v, causal, scale)
    assert relerr(out, ref) < 1e-2
    blind = torch.isinf(ref_lse)                                  # rows that see no key (S_k < S, causal)
    assert torch.equal(torch.isinf(lse) & (lse < 0), blind)      # their LSE is -inf, no other's
    assert (out.transpose(1, 2)[blind.transpose(1, 2)] == 0).all()
    assert torch.allclose(lse[~blind].double(), ref_lse[~blind], atol=1e-2)


@pytest.mark.parametrize("b,h,hkv,s,sk,d,dtype,causal", CASES)
def test_gradients_match_fp64(b, h, hkv, s, sk, d, dtype, causal):
    torch.manual_seed(1)
    q = torch.randn(b, h, s, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn(b, h, s, d, device="cuda", dtype=dtype)
    attention(q, k, v, causal=causal).backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = reference(*refs, causal, 1 / math.sqrt(d))
    ref.backward(grad.double())
    for t, r in zip((q, k, v), refs):
        assert torch.isfinite(t.grad).all()
        if r.grad.abs().max() == 0:   # e.g. dK with one key: softmax over one key is constant, dK is exactly 0
            assert t.grad.abs().max() < 1e-3   # the kernel's is rounding noise (fp16 subnormals seen)
        else:
            assert relerr(t.grad, r.grad) < 2e-2
