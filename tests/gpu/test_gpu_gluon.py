"""Gluon backend on a Hopper GPU: emitted kernels against torch in fp32 (ragged shapes, poisoned outputs).

Marked ``gpu``; skipped when torch, CUDA or an sm_90 device is missing (CI has none). Timing lives in
``benchmarks/gluon_bench.py run``, not here.
"""

from __future__ import annotations

import pytest

from twill.codegen.gluon import emit_gluon, load_emitted
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
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


#: (block_m, block_n, lag, depth, warps) of the persistent kernels checked on the GPU.
#: (128, 256, 1, 4, 8) stages the C tile in two column halves (rings + the whole tile overflow shared memory).
PERSISTENT_KERNELS = [(128, 256, 1, 3, 8), (128, 256, 1, 4, 8), (128, 256, 0, 3, 8), (128, 128, 1, 4, 8),
                      (64, 128, 1, 4, 4)]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("bm,bn,lag,depth,warps", PERSISTENT_KERNELS)
@pytest.mark.parametrize("M,N,K", [
    (300, 520, 200),      # ragged M, N, K; fewer tiles than SMs
    (1000, 72, 40),       # one K step (fewer than the lag + 1): the drain releases every buffer
    (3000, 2050, 1000),   # ragged, more tiles than SMs: CTAs walk several tiles, the ring runs on
    (4096, 4096, 512),    # many tiles per CTA, short K loops (the epilogue overlaps the next tile's loads)
])
def test_persistent_gemm_matches_torch(tmp_path, dtype, bm, bn, lag, depth, warps, M, N, K):
    graph = build_kernel("gemm", H100, block_m=bm, block_n=bn, block_k=64, dtype=dtype)
    sched = gemm_schedule(graph, H100, lag=lag, depth=depth, warps=warps)
    name = f"gemm_p_{dtype}_{bm}_{bn}_{lag}_{depth}"
    path = tmp_path / f"{name}.py"
    path.write_text(emit_gluon(sched, persistent=True))
    mod = load_emitted(str(path), f"gpu_{name}_{M}_{N}_{K}")
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(M, K, device="cuda", dtype=torch_dtype)
    b = torch.randn(K, N, device="cuda", dtype=torch_dtype)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch_dtype)
    mod.launch(a, b, c)
    tiles = -(-M // bm) * -(-N // bn)
    assert (tiles > mod._sm_count(a.device.index)) == (M * N >= 3000 * 2050)   # the case covers what it says
    assert _relerr(c, a.float() @ b.float()) < (2e-3 if dtype == "fp16" else 1e-2)


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


def _attention_inputs(options, B, H, S):
    """Fresh random q [B, H, S, D] and k, v with the options' K/V heads (fp16, or bf16), and the output and LSE
    poisoned with NaN."""
    dtype = torch.bfloat16 if options.get("dtype") == "bf16" else torch.float16
    d, kv_heads = options["head_dim"], options.get("kv_heads", 0) or H
    q = torch.randn(B, H, S, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, kv_heads, S, d, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
    return q, k, v, out, lse


def _attention_reference(q, k, v, sm_scale, causal):
    """fp64 softmax(q k^T * sm_scale [causal]) v and the natural-log LSE of the scaled scores; k, v may have
    fewer heads (grouped-query: query head h reads K/V head h // (H // H_kv))."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * sm_scale
    if causal:
        S = q.shape[2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


MODEL_CASES = [  # (kernel options, ahead, sm_scale)
    ({"subtiles": 2, "head_dim": 128, "causal": True}, 1, None),
    ({"subtiles": 2, "head_dim": 64, "causal": True}, 0, 0.3),
    ({"subtiles": 1, "head_dim": 128, "causal": True}, 1, None),
    ({"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2, "dtype": "bf16"}, 1, None),
    ({"subtiles": 2, "head_dim": 128, "kv_heads": 1}, 1, 0.05),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, 1, None),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64, "dtype": "bf16"}, 1, None),
    ({"subtiles": 2, "head_dim": 128}, 1, None),
]


@pytest.mark.parametrize("options,ahead,sm_scale", MODEL_CASES)
@pytest.mark.parametrize("B,H,S", [(1, 4, 77), (2, 4, 1000), (1, 2, 1537)])
def test_attention_causal_gqa_lse_match_torch(tmp_path, options, ahead, sm_scale, B, H, S):
    """Outputs and LSE against fp64 torch: causal and not, grouped-query and multi-query K/V heads, head dims
    64/128/256, fp16/bf16, ragged S, a given softmax scale; outputs and LSE poisoned with NaN, fresh data."""
    graph = build_kernel("flash-fwd", H100, **options)
    name = "_".join(f"{k}{v}" for k, v in options.items()) + f"_a{ahead}"
    path = tmp_path / f"fa_{name}.py"
    path.write_text(emit_gluon(flash_schedule(graph, H100, ahead=ahead, depth=2)))
    mod = load_emitted(str(path), f"gpu_fa_{name}_{S}")
    q, k, v, out, lse = _attention_inputs(options, B, H, S)
    dtype, d = q.dtype, options["head_dim"]
    scale = d ** -0.5 if sm_scale is None else sm_scale
    got, got_lse = mod.launch(q, k, v, sm_scale=sm_scale, out=out, lse=lse, return_lse=True)
    assert got is out and got_lse is lse
    ref, ref_lse = _attention_reference(q, k, v, scale, options.get("causal", False))
    assert _relerr(out, ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)
    assert torch.isfinite(lse).all() and float((lse.double() - ref_lse).abs().max()) < 1e-3
    plain = mod.launch(q, k, v, sm_scale=sm_scale)           # no LSE: lse_ptr None, the store compiled out
    assert _relerr(plain, ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)


#: Three sub-tiles (BLOCK_M 192, tensor-core turns round robin): (kernel options, schedule). ``h200``: the joint
#: solver's on the H200 model; ``calibrated``: on the measured H200 model of benchmarks/results (its D = 64
#: schedule gives the partitions different numbers of turns per iteration); ``hand``: the hand-built variant
#: with S and the softmax in one stage (no solver).
SUB3_CASES = [
    ({"head_dim": 64}, "h200"),
    ({"head_dim": 64, "causal": True}, "h200"),
    ({"head_dim": 64, "kv_heads": 2, "dtype": "bf16"}, "h200"),
    ({"head_dim": 64, "block_n": 64, "causal": True}, "h200"),
    ({"head_dim": 128}, "h200"),
    ({"head_dim": 128, "causal": True, "dtype": "bf16"}, "h200"),
    ({"head_dim": 64}, "calibrated"),
    ({"head_dim": 64, "causal": True, "kv_heads": 1}, "calibrated"),
    ({"head_dim": 64, "causal": True}, "hand"),
]


def _sub3_schedule(options, source):
    """The schedule of flash-fwd ``--subtiles 3`` with ``options`` from ``source`` (see SUB3_CASES)."""
    options = {"subtiles": 3, **options}
    if source == "hand":
        return flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=0, depth=2)
    pytest.importorskip("ortools", reason="the joint solver's schedules need OR-Tools")
    if source == "h200":
        from solved import solved_kernel

        return solved_kernel("flash-fwd", "h200", options)
    from pathlib import Path

    from twill.machine.calibration import load_machine
    from twill.solve import SolveOptions, schedule

    machine = load_machine(str(Path(__file__).parents[2] / "benchmarks/results/calibration_h200.machine.json"))
    return schedule(build_kernel("flash-fwd", machine, **options), machine, SolveOptions())


@pytest.mark.parametrize("options,source", SUB3_CASES)
@pytest.mark.parametrize("B,H,S", [(1, 4, 77), (2, 4, 1000), (1, 2, 1537)])
def test_three_subtile_attention_matches_torch(tmp_path, options, source, B, H, S):
    """Three compute partitions against fp64 torch: head dims 64/128, causal and not, grouped-query and
    multi-query K/V heads, fp16/bf16, ragged S (a partial last query block of 192 rows), outputs and LSE
    poisoned with NaN, fresh data."""
    sched = _sub3_schedule(options, source)
    name = "_".join(f"{k}{v}" for k, v in options.items()) + f"_{source}"
    path = tmp_path / f"fa_sub3_{name}.py"
    path.write_text(emit_gluon(sched))
    mod = load_emitted(str(path), f"gpu_fa_sub3_{name}_{S}")
    assert mod.NUM_COMPUTE.value == 3 and mod.BLOCK_M.value == 192
    q, k, v, out, lse = _attention_inputs(options, B, H, S)
    dtype, d = q.dtype, options["head_dim"]
    mod.launch(q, k, v, out=out, lse=lse)
    ref, ref_lse = _attention_reference(q, k, v, d ** -0.5, options.get("causal", False))
    assert _relerr(out, ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)
    assert torch.isfinite(lse).all() and float((lse.double() - ref_lse).abs().max()) < 1e-3


PERSISTENT_ATTENTION_CASES = [  # (kernel options, ahead)
    ({"subtiles": 2, "head_dim": 128}, 1),
    ({"subtiles": 2, "head_dim": 128, "causal": True}, 1),
    ({"subtiles": 2, "head_dim": 64, "kv_heads": 2, "dtype": "bf16"}, 1),
    ({"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2}, 1),
    ({"subtiles": 2, "head_dim": 64, "causal": True, "kv_heads": 1, "dtype": "bf16"}, 0),
    ({"subtiles": 1, "head_dim": 128, "causal": True}, 0),
    ({"subtiles": 3, "head_dim": 64, "block_n": 64, "causal": True}, 0),
]


@pytest.mark.parametrize("options,ahead", PERSISTENT_ATTENTION_CASES)
@pytest.mark.parametrize("B,H,S", [(1, 2, 77), (2, 64, 1000), (3, 6, 1537), (1, 8, 4100)])
def test_persistent_attention_matches_torch(tmp_path, options, ahead, B, H, S):
    """The persistent forward (at most one CTA per SM, work items claimed from a counter) against fp64 torch:
    fewer query blocks than SMs and many per CTA (the claims, the rings, the turns and the Q hand-back run
    on across blocks), causal and not, grouped and multi-query K/V heads, ragged S, outputs and LSE
    poisoned with NaN. The same kernel is launched three times on fresh data: a work counter left over from
    an earlier launch would leave blocks unwritten (NaN)."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=ahead, depth=2)
    name = "_".join(f"{k}{v}" for k, v in options.items()) + f"_a{ahead}"
    path = tmp_path / f"fa_p_{name}.py"
    path.write_text(emit_gluon(sched, persistent=True))
    mod = load_emitted(str(path), f"gpu_fa_p_{name}_{S}")
    for _ in range(3):
        q, k, v, out, lse = _attention_inputs(options, B, H, S)
        mod.launch(q, k, v, out=out, lse=lse)
        ref, ref_lse = _attention_reference(q, k, v, options["head_dim"] ** -0.5, options.get("causal", False))
        assert _relerr(out, ref) < (1e-2 if q.dtype == torch.bfloat16 else 2e-3)
        assert torch.isfinite(lse).all() and float((lse.double() - ref_lse).abs().max()) < 1e-3


def test_attention_launcher_rejects_wrong_kv_heads(tmp_path):
    graph = build_kernel("flash-fwd", H100, subtiles=2, kv_heads=2)
    path = tmp_path / "fa_kv2.py"
    path.write_text(emit_gluon(flash_schedule(graph, H100, ahead=1, depth=2)))
    mod = load_emitted(str(path), "gpu_fa_kv2_errors")
    q = torch.randn(1, 3, 64, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 64, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="not a multiple of KV_HEADS=2"):
        mod.launch(q, k, k)
    with pytest.raises(ValueError, match="expected k, v of shape"):
        mod.launch(q[:, :2], q[:, :1], q[:, :1])
