"""The fp8 attention forward (issue 35) on a Hopper GPU: emitted kernels against an fp32 reference of the
dequantized inputs (ragged S, causal and not, grouped-query, descale factors, LSE), outputs poisoned with NaN.

Marked ``gpu``; skipped when torch, CUDA or an sm_90 device is missing. Timing beside FA3's fp8 forward lives in
``benchmarks/fp8_attention.py``, not here.
"""

from __future__ import annotations

import pytest

from twill.codegen.gluon import emit_gluon, load_emitted
from twill.kernels import build_kernel
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.machine.models import H100

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs a Hopper (sm_90) GPU")]

#: Relative error against fp32 on the dequantized inputs: e4m3 P (3 mantissa bits) bounds it; FA3's fp8 forward
#: measured 0.054 against the unquantized inputs (issue 35), most of it the quantization of q, k, v.
FP8_RELERR = 0.05


def _relerr(out, ref) -> float:
    assert torch.isfinite(out).all(), "output has NaN/Inf (unwritten elements?)"
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _kernel(tmp_path, options, ahead, persistent=False):
    graph = build_kernel("flash-fwd", H100, dtype=options.get("dtype", "fp8e4m3"),
                         **{k: v for k, v in options.items() if k != "dtype"})
    name = "_".join(f"{k}{v}" for k, v in options.items()) + f"_a{ahead}" + ("_p" if persistent else "")
    path = tmp_path / f"fa8_{name}.py"
    path.write_text(emit_gluon(flash_schedule(graph, H100, ahead=ahead, depth=2), persistent=persistent))
    return load_emitted(str(path), f"gpu_fa8_{name}")


def _inputs(options, B, H, S, descale):
    """fp8 q [B, H, S, D] and k, v with the options' K/V heads, quantized from random fp32 values with
    per-(batch, K/V head) scales (``descale``) or none, and the fp32 reference's dequantized inputs."""
    fp8 = torch.float8_e5m2 if options.get("dtype") == "fp8e5m2" else torch.float8_e4m3fn
    d, kv_heads = options["head_dim"], options.get("kv_heads", 0) or H
    raw = [torch.randn(B, n, S, d, device="cuda") for n in (H, kv_heads, kv_heads)]
    scales = [torch.rand(B, kv_heads, device="cuda") + 0.5 if descale else None for _ in range(3)]
    group = H // kv_heads
    quantized, dequantized = [], []
    for t, s in zip(raw, scales):
        per_head = 1.0 if s is None else (s.repeat_interleave(group, dim=1) if t.shape[1] == H else s)
        per_head = per_head if s is None else per_head[:, :, None, None]
        x = (t / per_head).to(fp8)
        quantized.append(x)
        dequantized.append(x.float() * per_head)
    return quantized, dequantized, scales


def _reference(q, k, v, sm_scale, causal):
    """fp32 softmax(q k^T * sm_scale [causal]) v and the natural-log LSE; k, v may have fewer heads."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * sm_scale
    if causal:
        S = q.shape[2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


CASES = [  # (kernel options, ahead, persistent)
    ({"subtiles": 2, "head_dim": 128}, 1, False),
    ({"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2}, 1, False),
    ({"subtiles": 1, "head_dim": 64, "causal": True}, 1, False),
    ({"subtiles": 3, "head_dim": 64, "kv_heads": 1}, 0, False),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, 1, False),
    ({"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2}, 1, True),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64}, 1, True),
    ({"subtiles": 2, "head_dim": 128, "dtype": "fp8e5m2"}, 1, False),
]


@pytest.mark.parametrize("options,ahead,persistent", CASES)
@pytest.mark.parametrize("B,H,S", [(1, 4, 77), (2, 4, 1000), (1, 4, 1537)])
@pytest.mark.parametrize("descale", [False, True])
def test_fp8_attention_matches_fp32_of_the_dequantized_inputs(tmp_path, options, ahead, persistent, B, H, S,
                                                              descale):
    mod = _kernel(tmp_path, options, ahead, persistent)
    (q, k, v), (qf, kf, vf), (qd, kd, vd) = _inputs(options, B, H, S, descale)
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
    got, got_lse = mod.launch(q, k, v, out=out, lse=lse, return_lse=True, q_descale=qd, k_descale=kd,
                              v_descale=vd)
    assert got is out and got_lse is lse
    ref, ref_lse = _reference(qf, kf, vf, options["head_dim"] ** -0.5, options.get("causal", False))
    assert _relerr(out, ref) < FP8_RELERR
    assert torch.isfinite(lse).all() and float((lse - ref_lse).abs().max()) < 2e-2


def test_fp8_attention_fp16_output_and_per_tensor_descale(tmp_path):
    """``out_dtype=torch.float16`` gives an fp16 O; one descale value per tensor scales every head alike."""
    options = {"subtiles": 2, "head_dim": 128}
    mod = _kernel(tmp_path, options, 1)
    (q, k, v), (qf, kf, vf), _ = _inputs(options, 2, 4, 513, False)
    got = mod.launch(q, k, v, q_descale=0.5, k_descale=torch.tensor(2.0, device="cuda"), v_descale=3.0,
                     out_dtype=torch.float16)
    assert got.dtype == torch.float16
    ref, _ = _reference(qf * 0.5, kf * 2.0, vf * 3.0, 128 ** -0.5, False)
    assert _relerr(got, ref) < FP8_RELERR


def test_fp8_launcher_rejects_a_descale_of_the_wrong_shape(tmp_path):
    mod = _kernel(tmp_path, {"subtiles": 2, "head_dim": 128}, 1)
    (q, k, v), _, _ = _inputs({"head_dim": 128}, 2, 4, 128, False)
    with pytest.raises(ValueError, match="descale factor must be one value or of shape"):
        mod.launch(q, k, v, q_descale=torch.ones(3, device="cuda"))
