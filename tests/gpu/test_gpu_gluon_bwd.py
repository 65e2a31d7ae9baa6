"""Gluon attention backward on a Hopper GPU: emitted forward (with LSE) and backward against torch autograd of
fp32 attention (ragged shapes, NaN-poisoned outputs).

Marked ``gpu``; skipped when torch, CUDA or an sm_90 device is missing (CI has none). The schedules are the
hand-built ones of ``twill/kernels/*/variants.py`` (no solver); timing lives in ``benchmarks/flash_bwd_check.py``.
"""

from __future__ import annotations

import pytest

from twill.kernels.flash_bwd.variants import flash_bwd_schedule
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.codegen.gluon import emit_gluon, load_emitted
from twill.kernels import build_kernel
from twill.machine.models import H100

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs a Hopper (sm_90) GPU")]

#: (attention options, backward schedule shape): one and two compute stages, ring depths, dQ staging depths.
CASES = [
    ({"head_dim": 128}, {"depth": 2, "dq_lag": 1}),
    ({"head_dim": 128, "causal": True, "kv_heads": 2}, {"depth": 2, "dq_lag": 1}),
    ({"head_dim": 64, "dtype": "bf16"}, {"depth": 3, "dq_lag": 2}),
    ({"head_dim": 64, "causal": True}, {"depth": 2, "dq_lag": 1, "late": ("p_cvt", "dv", "dq_store")}),
    # FA3's head-dim-64 tile: 128 query rows per iteration, dQ on warps [8, 1]
    ({"head_dim": 64, "block_m": 128}, {"depth": 2, "dq_lag": 1}),
    ({"head_dim": 64, "block_m": 128, "causal": True, "kv_heads": 2, "dtype": "bf16"}, {"depth": 2, "dq_lag": 1}),
    # head dim 256: 64-key blocks, P and dS in shared memory, dQ in chunks reduced by the compute warps
    ({"head_dim": 256}, {"depth": 2}),
    ({"head_dim": 256, "causal": True, "kv_heads": 2, "dtype": "bf16"}, {"depth": 2}),
]


def _modules(tmp_path, options, shape, name):
    fwd_options = {k: v for k, v in options.items() if k in ("head_dim", "dtype", "causal", "kv_heads")}
    if options["head_dim"] == 256:
        fwd_options["block_n"] = 64   # two 128-key K/V stages do not fit beside Q at D = 256
    fwd = flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, **fwd_options), H100, ahead=1, depth=2)
    bwd = flash_bwd_schedule(build_kernel("flash-bwd", H100, **options), H100, **shape)
    mods = []
    for kind, sched in (("fwd", fwd), ("bwd", bwd)):
        path = tmp_path / f"{name}_{kind}.py"
        path.write_text(emit_gluon(sched))
        mods.append(load_emitted(str(path), f"gpu_bwd_{name}_{kind}"))
    return mods


def _reference(q, k, v, do, causal):
    """dq, dk, dv of fp32 attention by autograd (K/V heads repeated for GQA: dk, dv sum each group)."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = q @ kr.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.autograd.grad(torch.softmax(s, dim=-1) @ vr, (q, k, v), do.float())


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("B,H,S", [(1, 2, 77), (2, 4, 1000), (1, 2, 1537)])
def test_backward_matches_autograd(tmp_path, case, B, H, S):
    options, shape = CASES[case]
    fwd, bwd = _modules(tmp_path, options, shape, f"c{case}_{S}")
    dtype = torch.bfloat16 if options.get("dtype") == "bf16" else torch.float16
    D, kv = options["head_dim"], options.get("kv_heads", 0) or H
    q, do = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(B, kv, S, D, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = fwd.launch(q, k, v, return_lse=True)
    dq = torch.full_like(q, float("nan"))
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    bwd.launch(q, k, v, o, do, lse, dq=dq, dk=dk, dv=dv)
    tolerance = 3e-2 if dtype is torch.bfloat16 else 1e-2
    for name, out, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), _reference(q, k, v, do, options.get("causal"))):
        assert torch.isfinite(out).all(), f"{name} has NaN/Inf (unwritten elements?)"
        err = float((out.float() - ref).abs().max() / ref.abs().max())
        assert err < tolerance, f"{name}: max relative error {err:.2e}"
