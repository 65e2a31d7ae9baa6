"""Gluon backend on a Hopper GPU: emitted kernels against torch in fp32 (ragged shapes, poisoned outputs).

Marked ``gpu``; skipped when torch, CUDA or an sm_90 device is missing (CI has none). Timing lives in
``benchmarks/gluon_bench.py run``, not here.
"""

from __future__ import annotations

import pytest

from twill.codegen.gluon import emit_gluon, load_emitted
from benchmarks.variants import flash_schedule, gemm_schedule
from twill.kernels import build_kernel
from twill.machine.models import H100

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs a Hopper (sm_90) GPU")]


def _relerr(out, ref) -> float:
    assert torch.isfinite(out).all(), "output has NaN/Inf (unwritten elements?)"
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("lag,depth", [(0, 3), (1, 4)])
@pytest.mark.parametrize("M,N,K", [(300, 520, 200), (257, 333, 129), (1024, 1024, 1024)])
def test_gemm_matches_torch(tmp_path, lag, depth, M, N, K):
    sched = gemm_schedule(build_kernel("gemm", H100, block_n=256), H100, lag=lag, depth=depth)
    path = tmp_path / f"gemm_{lag}_{depth}.py"
    path.write_text(emit_gluon(sched))
    mod = load_emitted(str(path), f"gpu_gemm_{lag}_{depth}_{M}")
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    mod.launch(a, b, c)
    assert _relerr(c, a.float() @ b.float()) < 2e-3


@pytest.mark.parametrize("subtiles,head_dim,ahead", [(2, 128, 1), (1, 128, 1), (2, 64, 0)])
@pytest.mark.parametrize("B,H,S", [(1, 3, 77), (2, 2, 1000)])
def test_attention_matches_torch(tmp_path, subtiles, head_dim, ahead, B, H, S):
    graph = build_kernel("flash-fwd", H100, subtiles=subtiles, head_dim=head_dim)
    path = tmp_path / f"fa_{subtiles}_{head_dim}_{ahead}.py"
    path.write_text(emit_gluon(flash_schedule(graph, H100, ahead=ahead, depth=2)))
    mod = load_emitted(str(path), f"gpu_fa_{subtiles}_{head_dim}_{ahead}_{S}")
    q, k, v = (torch.randn(B, H, S, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    mod.launch(q, k, v, out=out)
    ref = torch.softmax(q.float() @ k.float().transpose(-1, -2) / head_dim ** 0.5, dim=-1) @ v.float()
    assert _relerr(out, ref) < 2e-3
