"""``twill inject --ws`` on a Hopper GPU: the TMA matmul compiled with Twill's warp groups as Triton 3.6's Hopper
partitions against the original kernel (Triton's own schedule, same num_warps) and torch, on fresh data
(NaN-poisoned outputs, shapes with a partial K tile and several tiles per side). The CPU half is
tests/integrations/triton/test_triton_warp_specialize.py.

Marked ``gpu``; skipped when torch, CUDA, an sm_90 device or OR-Tools (the schedule is solved here) is
missing."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")
pytest.importorskip("ortools")

from twill.machine import get_machine  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(triton.__version__ != "3.6.0", reason="partitions are written for Triton 3.6.0"),
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs a Hopper (sm_90) GPU")]

H100 = get_machine("h100")


@pytest.mark.parametrize("M,N,K", [(512, 512, 512), (384, 640, 1008), (1024, 256, 4096)])
def test_warp_specialized_matmul_matches_the_original_kernel(M, N, K):
    from twill.integrations.triton import lower_function_loops, spec_from_target
    from twill.integrations.triton.kernels import matmul
    from twill.integrations.triton.warp_specialize import compile_warp_specialized
    from twill.solve import schedule as solve

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    spec = spec_from_target(matmul.__file__, "matmul_kernel", signature=matmul.SIGNATURE,
                            constexprs=list(matmul.CONSTEXPRS), num_warps=4, num_stages=None, machine=H100)
    (_, lowered), = lower_function_loops(spec, H100)[0]
    ws = compile_warp_specialized(spec, solve(lowered.graph, H100), H100)
    assert ws.partitions, "the kernel is not warp-specialized"
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=gen)
    grid = matmul.grid(M, N)
    c_ws = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    # a CompiledKernel is launched with every argument of its signature, constexprs included, and a 3-D grid
    ws.kernel[(*grid, 1)](a, b, c_ws, M, N, K, 128, 128, 64)
    c_orig = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    triton.jit(matmul.matmul_kernel.fn)[grid](a, b, c_orig, M, N, K, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                                              num_warps=4)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    assert not torch.isnan(c_ws).any()
    assert float((c_ws.float() - ref).norm() / ref.norm()) < 1e-2
    # the same tiles and the same K order: the warp-specialized kernel agrees with the original closely
    assert float((c_ws.float() - c_orig.float()).abs().max()) <= float((c_orig.float() - ref).abs().max()) + 0.5
