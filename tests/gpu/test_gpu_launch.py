"""The emitted launchers' direct launch path and ``twill.ops.attention`` under CUDA graphs, on a Hopper GPU.

The first launch of each argument specialization goes through Triton's JIT, later ones call the compiled
kernel's launcher directly (``_launch`` in every attention module): repeated calls on fresh data, calls whose
lengths change the specialization (a multiple of 16 or not), and calls from another stream must all match
fp64 attention. A training step's attention (forward and backward of the op) is captured in a CUDA graph and
replayed on new inputs copied into the captured ones.

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


def _qkv(b, h, s, d, dtype=torch.bfloat16, grad=False):
    return tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype).requires_grad_(grad) for _ in range(3))


@pytest.mark.parametrize("causal", [False, True])
def test_repeated_launches_take_the_direct_path_and_stay_correct(causal):
    """Same shapes, fresh data and a NaN-poisoned output each call: one JIT launch, then direct launches;
    lengths of another specialization (S = 77, 200: not multiples of 16) take the JIT once, then run direct."""
    module = kernel_module(KernelSpec("flash-fwd", 128, "bf16", causal, 0))
    module._COMPILED.clear()
    for s in (256, 256, 256, 77, 77, 200, 256):
        q, k, v = _qkv(2, 4, s, 128)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((2, 4, s), float("nan"), device="cuda")
        module.launch(q, k, v, sm_scale=0.2, out=out, lse=lse)
        ref_out, ref_lse = reference(q, k, v, causal, 0.2)
        assert relerr(out, ref_out) < 1e-2, s
        assert torch.allclose(lse.double(), ref_lse, atol=1e-3), s
    assert len(module._COMPILED) == 2      # S = 256 and S = 77 or 200 (alike for Triton: neither divisible by 16)


def test_the_direct_path_launches_on_the_current_stream():
    module = kernel_module(KernelSpec("flash-fwd", 64, "fp16", False, 0))
    q, k, v = _qkv(1, 2, 300, 64, torch.float16)
    module.launch(q, k, v)                           # the JIT launch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)                # a launch on the default stream would not wait for this
        out = module.launch(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    assert relerr(out, reference(q, k, v, False, 64 ** -0.5)[0]) < 1e-2


@pytest.mark.parametrize("causal,hkv", [(True, 2), (False, 4)])
def test_a_training_steps_attention_replays_in_a_cuda_graph(causal, hkv):
    """Forward + backward of the op captured once, replayed on new q, k, v and output gradient copied into the
    captured inputs: output and gradients match fp64 attention of the new inputs."""
    q, _, _ = _qkv(2, 4, 500, 128, grad=True)
    k, v = (torch.randn(2, hkv, 500, 128, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    dout = torch.randn_like(q)

    def step():
        out = attention(q, k, v, causal=causal)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                    # warm up (compiles, fills the launch caches) off the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for t in (q, k, v, dout):
        with torch.no_grad():
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, causal, 128 ** -0.5)[0]
    grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    assert relerr(captured[0], ref) < 1e-2
    for got, want in zip(captured[1:], grads):
        assert relerr(got, want) < 2e-2


def test_the_persistent_work_counters_are_left_zero_and_kept_per_stream():
    """The persistent forward's work counters: the kernel's last CTA to finish claiming zeroes them, so launch
    after launch on one stream (grids of different sizes, fresh data) reuses one pair and stays correct, and a
    launch on another stream, running beside them, takes its own pair."""
    module = kernel_module(KernelSpec("flash-fwd", 128, "bf16", True, 0))
    module._WORK_COUNTERS.clear()
    for b, s in ((2, 1000), (1, 77), (4, 2048), (2, 1000)):
        q, k, v = _qkv(b, 8, s, 128)
        out = module.launch(q, k, v, sm_scale=0.1)
        assert relerr(out, reference(q, k, v, True, 0.1)[0]) < 1e-2, (b, s)
    torch.cuda.synchronize()
    assert len(module._WORK_COUNTERS) == 1
    assert all(int(c.abs().sum()) == 0 for c in module._WORK_COUNTERS.values())
    side = torch.cuda.Stream()
    q, k, v = _qkv(4, 8, 2048, 128)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        beside = module.launch(q, k, v, sm_scale=0.1)
    here = module.launch(q, k, v, sm_scale=0.1)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert len(module._WORK_COUNTERS) == 2
    ref = reference(q, k, v, True, 0.1)[0]
    assert relerr(beside, ref) < 1e-2 and relerr(here, ref) < 1e-2
    assert all(int(c.abs().sum()) == 0 for c in module._WORK_COUNTERS.values())
