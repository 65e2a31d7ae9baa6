"""``twill.ops.attention`` on fp8 (e4m3) inputs on a Hopper GPU (issue 35): outputs against an fp32 reference of
the dequantized inputs (ragged S, and S a multiple of 32, where the V pre-pass pads nothing; causal and not,
grouped-query, with and without descale factors, bf16 and fp16 outputs), ``torch.compile`` of an fp8 call, and
the refusal of a gradient request. The emitted kernels' own launch tests (every variant, the LSE, poisoned
outputs) are tests/gpu/test_gpu_fp8_attention.py.

Marked ``gpu``; skipped without torch, CUDA or an sm_90 device. The kernels come from the shipped schedules (no
solver needed).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.ops import attention  # noqa: E402
from attention_reference import reference, relerr  # noqa: E402

#: Relative error against fp32 on the dequantized inputs (the kernel tests' bound: e4m3 P, 3 mantissa bits).
FP8_RELERR = 0.05


def _inputs(b, h, hkv, s, d, descale):
    """fp8 q [b, h, s, d], k, v [b, hkv, s, d] quantized from random fp32 values, with float32 descale factors
    ``descale`` ("none", "tensor": one factor each, shape [], or "head": [b, hkv] each), the factors, and the
    dequantized fp32 inputs."""
    raw = [torch.randn(b, n, s, d, device="cuda") for n in (h, hkv, hkv)]
    if descale == "none":
        factors = [None, None, None]
    elif descale == "tensor":
        factors = [torch.rand((), device="cuda") + 0.5 for _ in range(3)]
    else:
        factors = [torch.rand(b, hkv, device="cuda") + 0.5 for _ in range(3)]
    quantized, dequantized = [], []
    for t, f in zip(raw, factors):
        if f is None:
            scale = torch.ones((), device="cuda")
        elif f.dim() == 0:
            scale = f
        else:
            scale = (f.repeat_interleave(h // hkv, dim=1) if t.shape[1] == h else f)[:, :, None, None]
        x = (t / scale).to(torch.float8_e4m3fn)
        quantized.append(x)
        dequantized.append(x.float() * scale)
    return quantized, factors, dequantized


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,hkv,s", [(1, 4, 4, 77), (2, 8, 2, 1000), (1, 4, 1, 1537), (1, 2, 2, 256)])
@pytest.mark.parametrize("descale", ["none", "tensor", "head"])
def test_fp8_attention_matches_fp32_of_the_dequantized_inputs(d, causal, b, h, hkv, s, descale):
    (q, k, v), (qd, kd, vd), (qf, kf, vf) = _inputs(b, h, hkv, s, d, descale)
    out = attention(q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    assert (out.shape, out.dtype) == (q.shape, torch.bfloat16)
    assert relerr(out, reference(qf, kf, vf, causal, d ** -0.5)[0]) < FP8_RELERR


def test_fp8_attention_fp16_output_and_scale():
    (q, k, v), (qd, kd, vd), (qf, kf, vf) = _inputs(2, 4, 2, 513, 128, "head")
    out = attention(q, k, v, causal=True, scale=0.1, q_descale=qd, k_descale=kd, v_descale=vd,
                    out_dtype=torch.float16)
    assert out.dtype == torch.float16
    assert relerr(out, reference(qf, kf, vf, True, 0.1)[0]) < FP8_RELERR


def test_compiled_fp8_call_matches_eager():
    (q, k, v), (qd, kd, vd), _ = _inputs(2, 8, 2, 1024, 128, "head")

    def step(q, k, v, qd, kd, vd):
        return attention(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(q, k, v, qd, kd, vd)
    torch.testing.assert_close(compiled, step(q, k, v, qd, kd, vd), rtol=0, atol=0)


def test_a_gradient_request_on_fp8_inputs_is_refused():
    (q, k, v), _, _ = _inputs(1, 4, 4, 128, 128, "none")
    q.requires_grad_()
    with pytest.raises(UnsupportedFeatureError, match="float8_e4m3fn inputs have no backward"):
        attention(q, k, v)
    with torch.no_grad():
        assert attention(q, k, v).dtype == torch.bfloat16
