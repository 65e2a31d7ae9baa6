"""``twill.ops.attention`` as a ``torch.library`` custom op, on the CPU: ``torch.compile`` captures a model
that calls it, forward and backward, in one graph; the fake implementations give the outputs' shapes,
dtypes and strides; ``torch.library.opcheck`` passes on tensors without data (``meta``: the dispatcher runs
the fake implementations, the real ones need a Hopper GPU and are checked in tests/gpu/test_gpu_ops.py);
and the device check of the real implementation refuses what the kernels do not run on."""

from __future__ import annotations

import contextlib

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import twill.ops  # noqa: E402
from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.ops import api, flash, library  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16, grad=True):
    """A bf16 tensor without data that requires a gradient."""
    return torch.randn(*shape, device="meta", dtype=dtype).requires_grad_(grad)


class GroupedAttention(torch.nn.Module):
    """Projections to 8 query and 2 K/V heads as ``[B, S, H, D]`` views, attention on the ``[B, H, S, D]``
    transposes, as a decoder layer calls it."""

    def __init__(self, dim=512, heads=8, kv_heads=2, causal=True):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.causal = heads, kv_heads, dim // heads, causal
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        out = twill.ops.attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=self.causal)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def _model():
    return GroupedAttention().to(device="meta", dtype=torch.bfloat16)


def _fp8(*shape):
    """An fp8 (e4m3) tensor without data."""
    return torch.empty(*shape, device="meta", dtype=torch.float8_e4m3fn)


def _descale(*shape):
    """A float32 descale factor without data: shape [] or [B, H_kv]."""
    return torch.empty(shape, device="meta", dtype=torch.float32)


def fp8_attention(q, k, v, q_descale, k_descale, v_descale):
    """fp8 attention with per-(batch, K/V head) descale factors and an fp16 output, as an inference step calls
    it."""
    return twill.ops.attention(q, k, v, causal=True, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                               out_dtype=torch.float16)


def test_dynamo_captures_a_model_calling_the_op_in_one_graph():
    x = torch.randn(2, 256, 512, device="meta", dtype=torch.bfloat16)
    explained = torch._dynamo.explain(_model())(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    ops = [n.target for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.twill.attention_forward.default) == 1


def test_dynamo_captures_an_fp8_call_with_descale_factors_in_one_graph():
    q, k, v = _fp8(2, 8, 128, 128), _fp8(2, 2, 128, 128), _fp8(2, 2, 128, 128)
    with torch.no_grad():
        explained = torch._dynamo.explain(fp8_attention)(q, k, v, _descale(2, 2), _descale(), None)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    [call] = [n for g in explained.graphs for n in g.graph.nodes if n.target == torch.ops.twill.attention_forward.default]
    assert call.args[-1] == torch.float16
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fp8_attention, backend="aot_eager", fullgraph=True)(q, k, v, _descale(2, 2), None, None)
    assert (out.shape, out.dtype) == ((2, 8, 128, 128), torch.float16)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_forward_and_backward_have_the_shapes_of_eager(backend):
    """``fullgraph=True`` fails on any graph break; the backward runs through the registered autograd (under
    ``aot_eager`` traced into the backward graph as ``twill::attention_backward``)."""
    torch._dynamo.reset()
    model = _model()
    x = torch.randn(2, 256, 512, device="meta", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    out = compiled(x)
    assert out.shape == (2, 256, 512) and out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name


def test_fake_outputs_have_the_kernels_shapes_dtypes_and_strides():
    q = _meta(2, 128, 8, 64).transpose(1, 2)              # [B, H, S, D] views of [B, S, H, D]
    k, v = (_meta(2, 128, 2, 64).transpose(1, 2) for _ in range(2))
    out, lse = library.attention_forward(q, k, v, True, 0.125)
    assert (out.shape, out.dtype, out.stride()) == ((2, 8, 128, 64), torch.bfloat16, q.stride())   # laid out like q
    assert (lse.shape, lse.dtype, lse.is_contiguous()) == ((2, 8, 128), torch.float32, True)
    dq, dk, dv = library.attention_backward(out, q, k, v, out, lse, True, 0.125)
    assert (dq.shape, dk.shape, dv.shape) == ((2, 8, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64))
    assert {t.dtype for t in (dq, dk, dv)} == {torch.bfloat16}
    assert (dq.stride(), dk.stride(), dv.stride()) == (q.stride(), k.stride(), v.stride())   # like their inputs
    # the public function returns the forward's out, with a gradient through the registered autograd
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = twill.ops.attention(q, k, v, causal=True)
    assert out.shape == q.shape and out.grad_fn is not None
    out.sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)


@pytest.mark.parametrize("sq,sk", [(1, 300), (300, 1), (128, 512), (96, 64)])
def test_key_length_may_differ_from_the_query_length(sq, sk):
    """k, v [B, H_kv, S_k, D] with S_k != S: out and lse follow q, dk and dv follow k and v (fake outputs,
    through the public function and its registered autograd); a key length of 0 is refused."""
    q = _meta(2, sq, 8, 64).transpose(1, 2)
    k, v = (_meta(2, sk, 2, 64).transpose(1, 2) for _ in range(2))
    out, lse = library.attention_forward(q, k, v, True, 0.125)
    assert (out.shape, lse.shape) == ((2, 8, sq, 64), (2, 8, sq))
    dq, dk, dv = library.attention_backward(out, q, k, v, out, lse, True, 0.125)
    assert (dq.shape, dk.shape, dv.shape) == ((2, 8, sq, 64), (2, 2, sk, 64), (2, 2, sk, 64))
    for causal in (False, True):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = twill.ops.attention(q, k, v, causal=causal)
        out.sum().backward()
        assert out.shape == q.shape and (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    with pytest.raises(UnsupportedFeatureError, match=r"no keys \(key length 0\) for \d+ queries"):
        twill.ops.attention(q, k[:, :, :0], v[:, :, :0])


def test_fp8_fake_outputs_are_bf16_by_default_or_the_output_dtype():
    q, k = _fp8(2, 8, 128, 64), _fp8(2, 2, 128, 64)
    out, lse = library.attention_forward(q, k, k, False, 0.125)
    assert (out.shape, out.dtype, lse.dtype) == ((2, 8, 128, 64), torch.bfloat16, torch.float32)
    out, _ = library.attention_forward(q, k, k, False, 0.125, _descale(2, 2), _descale(), None, torch.float16)
    assert out.dtype == torch.float16
    for grad in (False, True):       # no gradient requested: grad mode off, or no input requiring one
        with torch.set_grad_enabled(grad):
            out = twill.ops.attention(q, k, k, v_descale=_descale(2, 2))
        assert (out.dtype, out.requires_grad) == (torch.bfloat16, False)


def test_opcheck_passes_on_meta_tensors():
    q = _meta(2, 8, 128, 64)
    k, v = _meta(2, 2, 128, 64), _meta(2, 2, 128, 64)
    results = torch.library.opcheck(torch.ops.twill.attention_forward.default, (q, k, v, True, 0.125))
    assert set(results.values()) == {"SUCCESS"} and "test_autograd_registration" in results
    out = torch.randn(2, 8, 128, 64, device="meta", dtype=torch.bfloat16)
    lse = torch.randn(2, 8, 128, device="meta")
    results = torch.library.opcheck(torch.ops.twill.attention_backward.default,
                                    (out, q.detach(), k.detach(), v.detach(), out, lse, False, 0.125))
    assert set(results.values()) == {"SUCCESS"}
    q8, k8 = _fp8(2, 8, 128, 64), _fp8(2, 2, 128, 64)
    results = torch.library.opcheck(torch.ops.twill.attention_forward.default,
                                    (q8, k8, k8, True, 0.125, _descale(2, 2), _descale(), None, torch.float16))
    assert set(results.values()) == {"SUCCESS"}


@pytest.mark.parametrize("args,kwargs,match", [
    (("q8", "k8", "k8"), {"requires_grad": True}, r"float8_e4m3fn inputs have no backward \(FA3's fp8 attention "
                                                  r"has none either\): call it under torch.no_grad\(\)"),
    (("q8", "k8", "kb"), {}, "q, k and v must all be float16, all bfloat16 or all float8_e4m3fn, got "
                             "torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16"),
    (("q8", "k8", "k8"), {"q_descale": "bad shape"}, r"q_descale must have shape \[\] \(one factor\) or "
                                                     r"\[batch, K/V heads\] = \[2, 2\], got \[2, 8\]"),
    (("q8", "k8", "k8"), {"k_descale": "fp16"}, "k_descale must be float32, got torch.float16"),
    (("q8", "k8", "k8"), {"v_descale": "cpu"}, "v_descale is on cpu, q on meta; they must be on one device"),
    (("q8", "k8", "k8"), {"v_descale": 0.5}, r"v_descale must be a torch.Tensor \(float32, shape \[\] or "
                                             r"\[2, 2\]\), got float"),
    (("q8", "k8", "k8"), {"out_dtype": torch.float32}, "out_dtype must be torch.bfloat16 or torch.float16 for "
                                                       "float8_e4m3fn inputs, got torch.float32"),
    (("qb", "kb", "kb"), {"q_descale": "ok"}, "q_descale applies to float8_e4m3fn inputs only, not torch.bfloat16"),
    (("qb", "kb", "kb"), {"out_dtype": torch.float16}, "out_dtype must be q's dtype torch.bfloat16 for "
                                                       "torch.bfloat16 inputs, got torch.float16"),
])
def test_fp8_arguments_the_kernels_do_not_take_are_refused_in_one_line(args, kwargs, match):
    """fp8 q/k/v all three, descale factors of FA3's shapes in float32 on q's device and fp8 inputs only, a
    16-bit output, and no gradient: each other case is one error line, at trace time too."""
    tensors = {"q8": _fp8(2, 8, 128, 64), "k8": _fp8(2, 2, 128, 64),
               "qb": _meta(2, 8, 128, 64, grad=False), "kb": _meta(2, 2, 128, 64, grad=False)}
    descales = {"bad shape": _descale(2, 8), "fp16": torch.empty((), device="meta", dtype=torch.float16),
                "cpu": torch.ones(()), "ok": _descale()}
    kwargs = {name: descales.get(value, value) if isinstance(value, str) else value
              for name, value in kwargs.items()}
    q, k, v = (tensors[name] for name in args)
    if kwargs.pop("requires_grad", False):
        q.requires_grad_()
    for call in (twill.ops.attention, torch.compile(twill.ops.attention, backend="eager")):
        torch._dynamo.reset()
        with pytest.raises(UnsupportedFeatureError, match=match) as info:
            call(q, k, v, **kwargs)
        assert "\n" not in str(info.value) and str(info.value).startswith("twill.ops.attention: ")


def test_inputs_the_kernels_do_not_cover_are_refused_at_trace_time_too():
    """The shape and dtype checks run in the function, before the op, compiled or not."""
    q = _meta(1, 4, 64, 96)
    with pytest.raises(UnsupportedFeatureError, match="head dimension 96 is not supported with a gradient"):
        twill.ops.attention(q, q, q)
    torch._dynamo.reset()
    with pytest.raises(UnsupportedFeatureError, match="4 query heads are not a multiple of 3 K/V heads"):
        torch.compile(twill.ops.attention, backend="eager")(q, _meta(1, 3, 64, 96), _meta(1, 3, 64, 96))


def test_grids_past_cudas_limit_are_refused_before_any_launch():
    """The forward's grid (blocks, heads, batch) takes 2200 x 32 heads; the backward's (key blocks, batch x K/V
    heads) takes 65535 rows at most, and 70000 sequences are past the forward's too."""
    assert twill.ops.attention(_meta(2200, 32, 16, 64, grad=False), _meta(2200, 8, 16, 64, grad=False),
                               _meta(2200, 8, 16, 64, grad=False)).shape == (2200, 32, 16, 64)
    with pytest.raises(UnsupportedFeatureError, match=r"^twill.ops.attention: the backward launches one CTA row per "
                                                      r"sequence and K/V head, at most 65535: 8200 x 8 is more"):
        twill.ops.attention(_meta(8200, 32, 16, 64), _meta(8200, 8, 16, 64), _meta(8200, 8, 16, 64))
    with pytest.raises(UnsupportedFeatureError, match="70000 sequences of 1 heads: the kernels launch at most 65535"):
        twill.ops.attention(*[_meta(70000, 1, 16, 64, grad=False)] * 3)


def test_the_real_implementation_checks_the_device_first():
    """CPU tensors reach the real implementation, which refuses them before any work; a CUDA device other
    than Hopper is refused with its compute capability."""
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(UnsupportedFeatureError, match="is on cpu; the kernels run on a CUDA"):
        twill.ops.attention(q, q, q)
    with pytest.raises(UnsupportedFeatureError, match="is on cpu"):
        torch.ops.twill.attention_forward(q, q, q, False, 0.125)
    q8 = torch.zeros(1, 2, 16, 64, dtype=torch.float8_e4m3fn)
    with torch.no_grad(), pytest.raises(UnsupportedFeatureError, match="is on cpu; the kernels run on a CUDA"):
        twill.ops.attention(q8, q8, q8, q_descale=torch.ones(()), out_dtype=torch.float16)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda = torch.empty(1, 2, 16, 64, device="cuda", dtype=torch.float16)
    capability = torch.cuda.get_device_capability
    try:   # the capability is asked once per device and kept
        torch.cuda.get_device_capability = lambda device=None: (8, 0)
        flash._capability.cache_clear()
        with pytest.raises(UnsupportedFeatureError, match=r"generated for Hopper \(sm_90\); cuda:0 is sm_80"):
            flash.check_device(cuda, cuda)
        torch.cuda.get_device_capability = lambda device=None: (9, 0)
        with pytest.raises(UnsupportedFeatureError, match="cuda:0 is sm_80"):
            flash.check_device(cuda, cuda)
        flash._capability.cache_clear()
        flash.check_device(cuda, cuda)
    finally:
        torch.cuda.get_device_capability = capability
        flash._capability.cache_clear()


def test_tensors_on_two_devices_are_refused_and_the_launch_runs_on_the_tensors_device(monkeypatch):
    """One device per call: tensors on two CUDA devices are refused before any work. The launchers launch on
    the current device's stream, so the op makes q's device current around them when it is not."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        first = torch.empty(1, 2, 16, 64, device="cuda:0", dtype=torch.float16)
        second = torch.empty(1, 2, 16, 64, device="cuda:1", dtype=torch.float16)
    with pytest.raises(UnsupportedFeatureError, match="the tensors are on cuda:0 and cuda:1; the kernels take them "
                                                      "on one device"):
        flash.check_device(first, second)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert isinstance(flash.on_device(first), contextlib.nullcontext)
    guard = flash.on_device(second)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1


def test_importing_twill_ops_imports_no_torch_and_the_ops_register_once():
    code = ("import sys, twill, twill.ops\n"
            "assert 'torch' not in sys.modules\n"
            "import torch\n"
            "q = torch.zeros(1, 1, 8, 64, device='meta', dtype=torch.float16)\n"
            "twill.ops.attention(q, q, q); twill.ops.attention(q, q, q, causal=True)\n"
            "import importlib; importlib.import_module('twill.ops.library')\n"
            "print(torch.ops.twill.attention_forward.default, torch.ops.twill.attention_backward.default)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["twill.attention_forward.default", "twill.attention_backward.default"]


class _ReferenceKernels:
    """Stand-ins for the emitted modules of ``spec`` on the CPU (``kernel_module``'s replacement): ``launch``
    writes fp64 attention (forward) or its gradients (backward) into the outputs it is given, as the kernels do."""

    def __init__(self, spec):
        self.kernel, self.causal = spec.kernel, spec.causal

    def launch(self, q, k, v, *args, sm_scale, **outputs):
        from attention_reference import reference

        causal = self.causal
        if self.kernel == flash.FORWARD.name:
            out, lse = reference(q, k, v, causal, sm_scale)
            outputs["out"].copy_(out)
            if outputs["lse"] is not None:   # None: a call that asks for no gradient writes no lse
                outputs["lse"].copy_(lse)
            return
        _, grad_out, _ = args   # the analytic gradients (a kernel runs below autograd: no grad_fn there)
        group = q.shape[1] // k.shape[1]
        qd, kd, vd, do = (t.double() for t in (q, k, v, grad_out))
        kd, vd = (t.repeat_interleave(group, dim=1) for t in (kd, vd))
        out, lse = reference(q, k, v, causal, sm_scale)
        p = torch.exp(qd @ kd.transpose(-1, -2) * sm_scale - lse[..., None]).nan_to_num(0.0)
        if causal:
            sq, sk = p.shape[-2:]
            p = p.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), 0.0)
        ds = p * (do @ vd.transpose(-1, -2) - (do * out).sum(-1, keepdim=True))
        fold = lambda t: t.unflatten(1, (-1, group)).sum(2)  # noqa: E731 - a K/V head's query heads summed
        grads = (ds @ kd * sm_scale, fold(ds.transpose(-1, -2) @ qd * sm_scale), fold(p.transpose(-1, -2) @ do))
        for name, g in zip(("dq", "dk", "dv"), grads):
            outputs[name].copy_(g)


def test_eager_calls_take_the_same_kernels_and_gradients_as_the_custom_op(monkeypatch):
    """:class:`~twill.ops.library.EagerAttention` (eager CUDA calls) and the custom op run the same
    implementations: with the kernels replaced by fp64 attention on the CPU, both give the reference's output
    and gradients (GQA, causal, bottom-right with S_k > S), and both save what the backward reads."""
    monkeypatch.setattr(library, "kernel_module", _ReferenceKernels)
    monkeypatch.setattr(library, "check_device", lambda *tensors: None)
    torch.manual_seed(0)
    q = torch.randn(2, 4, 40, 64, dtype=torch.float16).requires_grad_()
    k, v = (torch.randn(2, 2, 56, 64, dtype=torch.float16).requires_grad_() for _ in range(2))
    dout = torch.randn(2, 4, 40, 64, dtype=torch.float16)
    from attention_reference import reference

    ref = reference(q, k, v, True, 0.2)[0]
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    for call in (lambda: library.EagerAttention.apply(q, k, v, True, 0.2, None, None, None, None),
                 lambda: library.attention_forward(q, k, v, True, 0.2)):
        out, lse = call()
        assert not lse.requires_grad
        assert torch.allclose(out.double(), ref, atol=2e-3)   # the reference rounded to fp16
        for got, want in zip(torch.autograd.grad(out, (q, k, v), dout), ref_grads):
            assert torch.allclose(got.double(), want.double(), atol=1e-2, rtol=1e-3)


def _eager_on_cpu(monkeypatch, launches=None):
    """CPU tensors taken for eager CUDA calls (:func:`~twill.ops.library.is_eager`), the kernels stood in for by
    fp64 attention; each forward launch's ``lse`` argument is appended to ``launches``."""
    def module(spec):
        kernels = _ReferenceKernels(spec)
        if launches is not None and spec.kernel == flash.FORWARD.name:
            launch = kernels.launch
            kernels.launch = lambda *a, **kw: (launches.append(kw["lse"]), launch(*a, **kw))
        return kernels

    monkeypatch.setattr(library, "kernel_module", module)
    monkeypatch.setattr(library, "check_device", lambda *tensors: None)
    monkeypatch.setattr(library, "is_eager", lambda q: type(q) is torch.Tensor)


def test_an_eager_call_asking_no_gradient_takes_no_autograd_node_and_writes_no_lse(monkeypatch):
    """With no gradient asked for (no input requires one, or grad mode off) an eager call runs the forward's
    implementation directly: no :class:`~twill.ops.library.EagerAttention` node, no lse buffer; with one, the
    autograd function saves an lse for the backward. The output is the same."""
    from attention_reference import reference

    launches, applied = [], []
    _eager_on_cpu(monkeypatch, launches)
    real_apply = library.EagerAttention.apply
    monkeypatch.setattr(library.EagerAttention, "apply", lambda *a: (applied.append(a), real_apply(*a))[1])
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 64, dtype=torch.float16) for _ in range(3))
    want = reference(q, k, v, True, 0.125)[0]
    out = twill.ops.attention(q, k, v, causal=True)
    assert launches == [None] and not applied and out.grad_fn is None
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        assert torch.equal(twill.ops.attention(qg, k, v, causal=True), out)
    assert launches == [None, None] and not applied
    grad_out = twill.ops.attention(qg, k, v, causal=True)
    assert len(applied) == 1 and isinstance(launches[-1], torch.Tensor) and grad_out.grad_fn is not None
    assert torch.equal(grad_out.detach(), out) and torch.allclose(out.double(), want, atol=2e-3)


def test_an_eager_calls_checks_run_once_per_layout_and_refusals_every_time(monkeypatch):
    """An eager call whose arguments passed the checks skips them the next time; another layout, dtype, mask
    or gradient request is checked again, and a refused call is refused every time."""
    _eager_on_cpu(monkeypatch)
    checks = []
    real = api.check_inputs
    monkeypatch.setattr(api, "check_inputs", lambda *a, **kw: (checks.append(kw), real(*a, **kw))[1])
    monkeypatch.setattr(api, "_CHECKED", {})
    q = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    for _ in range(3):
        twill.ops.attention(q, q, q)
    assert len(checks) == 1
    bshd = torch.randn(1, 16, 2, 64, dtype=torch.float16).transpose(1, 2)
    twill.ops.attention(bshd, bshd, bshd)
    twill.ops.attention(q, q, q, causal=True)
    twill.ops.attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
    twill.ops.attention(q.clone().requires_grad_(), q, q)
    assert len(checks) == 5 and checks[-1]["backward"]
    strided = torch.randn(1, 2, 16, 128, dtype=torch.float16)[..., ::2]
    for _ in range(2):
        with pytest.raises(UnsupportedFeatureError, match="the kernels need its last dimension contiguous"):
            twill.ops.attention(strided, q, q)
    assert len(checks) == 7


def test_traced_and_dataless_calls_take_the_custom_op(monkeypatch):
    """:func:`~twill.ops.library.forward` sends only plain CUDA tensors outside tracing to the eager path:
    meta tensors and fake CUDA tensors reach the custom op's fake implementation (no kernel runs)."""
    monkeypatch.setattr(library.EagerAttention, "apply", lambda *a: pytest.fail("took the eager path"))
    out, lse = library.forward(_meta(1, 2, 64, 64), _meta(1, 2, 64, 64), _meta(1, 2, 64, 64), False, 0.125)
    assert out.device.type == "meta" and lse.shape == (1, 2, 64)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda = torch.empty(1, 2, 64, 64, device="cuda", dtype=torch.float16)
        out, _ = library.forward(cuda, cuda, cuda, True, 0.125)
    assert out.shape == cuda.shape
