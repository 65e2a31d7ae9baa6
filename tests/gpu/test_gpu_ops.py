"""``twill.ops.attention`` on a Hopper GPU: outputs and gradients against fp32 attention, and one training
step of a small transformer block with the op against the same step with torch SDPA.

Marked ``gpu``; skipped without torch, CUDA or an sm_90 device (the kernels come from the shipped schedules:
no solver needed).
Fresh random data on every call; the kernels' own outputs are poisoned with NaN in the launch tests.
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


def _inputs(b, h, hkv, s, d, dtype, grad=False):
    make = lambda heads: torch.randn(b, heads, s, d, device="cuda", dtype=dtype).requires_grad_(grad)  # noqa: E731
    return make(h), make(hkv), make(hkv)


CASES = [(2, 4, 4, 1000, 128, torch.float16, False), (1, 4, 4, 77, 64, torch.float16, True),
         (2, 8, 2, 513, 128, torch.bfloat16, True), (1, 2, 2, 300, 256, torch.float16, True),
         (1, 4, 1, 2048, 64, torch.bfloat16, False), (1, 2, 2, 1000, 256, torch.bfloat16, False)]


@pytest.mark.parametrize("b,h,hkv,s,d,dtype,causal", CASES)
def test_forward_launch_matches_fp64_with_poisoned_outputs(b, h, hkv, s, d, dtype, causal):
    q, k, v = _inputs(b, h, hkv, s, d, dtype)
    spec = KernelSpec("flash-fwd", d, "fp16" if dtype == torch.float16 else "bf16", causal, 0 if h == hkv else hkv)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, s), float("nan"), device="cuda")
    kernel_module(spec).launch(q, k, v, sm_scale=0.3, out=out, lse=lse)
    assert relerr(out, reference(q, k, v, causal, 0.3)[0]) < 1e-2
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("b,h,hkv,s,d,dtype,causal", CASES)
def test_gradients_match_fp64(b, h, hkv, s, d, dtype, causal):
    q, k, v = _inputs(b, h, hkv, s, d, dtype, grad=True)
    grad = torch.randn(b, h, s, d, device="cuda", dtype=dtype)
    out = attention(q, k, v, causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, causal, d ** -0.5)[0]
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    assert relerr(out, ref) < 1e-2
    for name, got, want in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert relerr(got, want) < 2e-2, name


def test_unsupported_head_dim_with_gradient_is_refused():
    q, k, v = _inputs(1, 2, 2, 64, 96, torch.float16, grad=True)
    with pytest.raises(Exception, match="head dimension 96 is not supported with a gradient"):
        attention(q, k, v)


class Block(torch.nn.Module):
    """A pre-norm transformer block whose attention is ``attn(q, k, v, causal=True)``."""

    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.o = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, attn):
        b, s, _ = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(y).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = attn(q, k, v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(a)
        return x + self.mlp(self.norm2(x))


def test_training_step_matches_sdpa():
    torch.manual_seed(0)
    dim, heads, kv_heads = 512, 4, 2
    block = Block(dim, heads, kv_heads).cuda().to(torch.bfloat16)
    twin = Block(dim, heads, kv_heads).cuda().to(torch.bfloat16)
    twin.load_state_dict(block.state_dict())
    x = torch.randn(2, 700, dim, device="cuda", dtype=torch.bfloat16)

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    for model, attn in ((block, lambda q, k, v: attention(q, k, v, causal=True)), (twin, sdpa)):
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        loss = model(x, attn).float().pow(2).mean()
        loss.backward()
        opt.step()
        model.loss = loss.item()
    assert abs(block.loss - twin.loss) <= 1e-2 * abs(twin.loss)
    for (name, p), t in zip(block.named_parameters(), twin.parameters()):
        assert relerr(p.grad, t.grad) < 5e-2, name
        assert relerr(p.detach(), t.detach()) < 1e-2, name


def _twill_causal(q, k, v):
    return attention(q, k, v, causal=True)


def test_compiled_training_step_matches_eager():
    """``torch.compile`` (Inductor) captures the block with the op in one graph (``explain``: no graph break),
    and its loss and gradients match the eager step's."""
    torch.manual_seed(0)
    eager = Block(512, 4, 2).cuda().to(torch.bfloat16)
    compiled = Block(512, 4, 2).cuda().to(torch.bfloat16)
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(2, 700, 512, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(compiled)(x, _twill_causal)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    losses = {}
    for name, forward in (("eager", eager), ("compiled", torch.compile(compiled))):
        losses[name] = forward(x, _twill_causal).float().pow(2).mean()
        losses[name].backward()
    assert abs(losses["eager"].item() - losses["compiled"].item()) <= 1e-2 * abs(losses["eager"].item())
    for (name, p), t in zip(eager.named_parameters(), compiled.parameters()):
        assert relerr(t.grad, p.grad) < 2e-2, name


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_on_the_kernels(causal):
    """``torch.library.opcheck`` on the real implementations: the schema, the fake outputs against the
    kernels' (shapes, dtypes, strides), the registered autograd, and the op under AOT dispatch."""
    q, k, v = _inputs(2, 8, 2, 384, 128, torch.bfloat16, grad=True)
    forward = torch.library.opcheck(torch.ops.twill.attention_forward.default, (q, k, v, causal, 0.1))
    assert set(forward.values()) == {"SUCCESS"}
    out, lse = torch.ops.twill.attention_forward(q.detach(), k.detach(), v.detach(), causal, 0.1)
    grad = torch.randn_like(out)
    backward = torch.library.opcheck(torch.ops.twill.attention_backward.default,
                                     (grad, q.detach(), k.detach(), v.detach(), out, lse, causal, 0.1))
    assert set(backward.values()) == {"SUCCESS"}
