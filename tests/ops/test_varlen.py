"""``twill.ops.attention_varlen`` (FlashAttention's varlen interface) on the CPU: the custom op's fake outputs
(``out`` like the packed q, ``lse [H, total_q]``), ``torch.compile`` capturing a call in one graph,
``torch.library.opcheck`` of both ops on ``meta`` tensors, gradients of ``meta`` tensors through the registered
autograd (laid out like q, k and v), and the inputs the kernels do not cover refused in one line. The kernels'
values are tests/gpu/test_gpu_varlen.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import twill.ops  # noqa: E402
from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.ops import library  # noqa: E402
from twill.ops.flash import check_varlen_inputs  # noqa: E402

LENGTHS_Q, LENGTHS_K = [5, 0, 300, 1], [7, 3, 300, 0]


def _cu(lengths):
    """int32 offsets [batch + 1] of ``lengths`` (on the meta device: values are never read on the host)."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32).to("meta")


def _packed(total, heads, d=128, dtype=torch.bfloat16):
    return torch.randn(total, heads, d, device="meta", dtype=dtype)


def _args(hkv=2):
    q = _packed(sum(LENGTHS_Q), 8)
    k, v = _packed(sum(LENGTHS_K), hkv), _packed(sum(LENGTHS_K), hkv)
    return q, k, v, _cu(LENGTHS_Q), _cu(LENGTHS_K), max(LENGTHS_Q), max(LENGTHS_K)


def test_fake_outputs_are_out_like_q_and_lse_per_head_and_row():
    q, k, v, cu_q, cu_k, mq, mk = _args()
    out, lse = library.attention_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, True, 0.125)
    assert (out.shape, out.dtype, out.stride()) == (q.shape, q.dtype, q.stride())
    assert (lse.shape, lse.dtype, lse.is_contiguous()) == ((8, sum(LENGTHS_Q)), torch.float32, True)
    head_major = torch.randn(8, sum(LENGTHS_Q), 128, device="meta", dtype=torch.bfloat16).transpose(0, 1)
    out = twill.ops.attention_varlen(head_major, k, v, cu_q, cu_k, mq, mk, causal=False)
    assert out.shape == head_major.shape and out.stride() == head_major.stride()   # laid out like q
    strided = torch.randn(sum(LENGTHS_Q), 2, 8, 128, device="meta", dtype=torch.bfloat16)[:, 0]   # not dense
    assert twill.ops.attention_varlen(strided, k, v, cu_q, cu_k, mq, mk).is_contiguous()


def _varlen(q, k, v, cu_q, cu_k):
    return twill.ops.attention_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True).float().sum(-1)


def test_dynamo_captures_a_varlen_call_in_one_graph():
    q, k, v, cu_q, cu_k, _, _ = _args()
    explained = torch._dynamo.explain(_varlen)(q, k, v, cu_q, cu_k)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    [call] = [n for g in explained.graphs for n in g.graph.nodes
              if n.target == torch.ops.twill.attention_varlen_forward.default]
    assert call.args[5:8] == (300, 300, True)
    torch._dynamo.reset()
    out = torch.compile(_varlen, backend="aot_eager", fullgraph=True)(q, k, v, cu_q, cu_k)
    assert out.shape == (sum(LENGTHS_Q), 8)


def test_opcheck_passes_on_meta_tensors():
    q, k, v, cu_q, cu_k, mq, mk = _args()
    results = torch.library.opcheck(torch.ops.twill.attention_varlen_forward.default,
                                    (q, k, v, cu_q, cu_k, mq, mk, False, 0.125))
    assert set(results.values()) == {"SUCCESS"}


def test_the_spec_is_the_varlen_forward_of_the_shapes():
    q, k, v, cu_q, cu_k, mq, mk = _args()
    spec = check_varlen_inputs(q, k, v, cu_q, cu_k, mq, mk, causal=True, backward=False)
    assert (spec.kernel, spec.head_dim, spec.dtype, spec.causal, spec.kv_heads, spec.varlen) == \
        ("flash-fwd", 128, "bf16", True, 2, True)
    assert not spec.persistent() and spec.kernel_options()["varlen"] is True
    assert "_varlen_" in spec.file_name("v") and "varlen" not in check_varlen_inputs.__module__


@pytest.mark.parametrize("change,match", [
    ({"grad": True, "q": _packed(313, 8, d=96), "k": _packed(310, 2, d=96), "v": _packed(310, 2, d=96)},
     r"head dimension 96 is not supported with a gradient \(supported: 64, 128, 256\)"),
    ({"q": _packed(313, 8, dtype=torch.float8_e4m3fn)}, "must all be float16 or all bfloat16"),
    ({"q": torch.randn(1, 313, 8, 128, device="meta", dtype=torch.bfloat16)},
     r"q must be 3-D \[total, heads, head_dim\] \(packed sequences\), got shape \(1, 313, 8, 128\)"),
    ({"k": _packed(310, 3), "v": _packed(310, 3)}, "8 query heads are not a multiple of 3 K/V heads"),
    ({"q": _packed(313, 8, d=96), "k": _packed(310, 2, d=96), "v": _packed(310, 2, d=96)},
     "head dimension 96 is not supported"),
    ({"q": _packed(313, 8, d=64)}, "k has head dimension 128, q 64"),
    ({"cu_q": torch.zeros(5, dtype=torch.int64, device="meta")}, "cu_seqlens_q must be a contiguous int32 vector"),
    ({"cu_k": torch.zeros(5, 2, dtype=torch.int32, device="meta")[:, 0]},
     r"cu_seqlens_k must be a contiguous int32 vector of batch \+ 1 offsets, got torch.int32 of shape \(5,\) and "
     r"strides \(2,\)"),
    ({"cu_k": torch.zeros(4, dtype=torch.int32, device="meta")}, "must have one length \\(batch \\+ 1\\), got 5 and 4"),
    ({"mq": 3.5}, "max_seqlen_q must be a non-negative int, got 3.5"),
    ({"grad": True, "cu_q": torch.zeros(40001, dtype=torch.int32, device="meta"),
      "cu_k": torch.zeros(40001, dtype=torch.int32, device="meta")},
     "the backward launches one CTA row per sequence and K/V head, at most 65535: 40000 x 2 is more"),
    ({"k": torch.randn(310, 2, 128, device="meta", dtype=torch.bfloat16).transpose(0, 1).contiguous()
      .transpose(0, 1)[:, :, :128]}, None),
])
def test_inputs_the_kernels_do_not_cover_are_refused_in_one_line(change, match):
    q, k, v, cu_q, cu_k, mq, mk = _args()
    values = {"q": q, "k": k, "v": v, "cu_q": cu_q, "cu_k": cu_k, "mq": mq, "mk": mk, **change}
    grad = values.pop("grad", False)
    if grad:
        values["q"] = values["q"].requires_grad_()
    call = (values["q"], values["k"], values["v"], values["cu_q"], values["cu_k"], values["mq"], values["mk"])
    if match is None:    # a K laid out head-major is read where it lies: no refusal
        assert twill.ops.attention_varlen(*call).shape == q.shape
        return
    with pytest.raises(UnsupportedFeatureError, match=match) as info:
        twill.ops.attention_varlen(*call)
    assert "\n" not in str(info.value) and str(info.value).startswith("twill.ops.attention_varlen: ")


def test_opcheck_passes_on_the_backward_op():
    q, k, v, cu_q, cu_k, mq, mk = _args()
    out, lse = library.attention_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, True, 0.125)
    results = torch.library.opcheck(torch.ops.twill.attention_varlen_backward.default,
                                    (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, mq, mk, True, 0.125))
    assert set(results.values()) == {"SUCCESS"}


def test_gradients_flow_through_the_registered_autograd_laid_out_like_the_inputs():
    """On ``meta`` tensors (shapes only) the varlen call is differentiable: its autograd is the backward op, whose
    fake gradients take q's, k's and v's shapes and strides; a compiled step traces it in one graph."""
    q, k, v, cu_q, cu_k, mq, mk = _args()
    k = torch.randn(2, sum(LENGTHS_K), 128, device="meta", dtype=torch.bfloat16).transpose(0, 1)       # head-major
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = twill.ops.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
    for grad, like in ((dq, q), (dk, k), (dv, v)):
        assert (grad.shape, grad.dtype, grad.stride()) == (like.shape, like.dtype, like.stride())

    torch._dynamo.reset()
    compiled = torch.compile(lambda *args: twill.ops.attention_varlen(*args, mq, mk, causal=True),
                             backend="aot_eager", fullgraph=True)   # the forward and its backward in one graph each
    grads = torch.autograd.grad(compiled(q, k, v, cu_q, cu_k).float().sum(), (q, k, v))
    assert [(g.shape, g.stride()) for g in grads] == [(t.shape, t.stride()) for t in (q, k, v)]
    torch._dynamo.reset()


def test_on_the_cpu_the_op_refuses_the_device():
    q = torch.zeros(sum(LENGTHS_Q), 8, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(sum(LENGTHS_K), 2, 128, dtype=torch.bfloat16)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32)
                  for x in (LENGTHS_Q, LENGTHS_K))
    mq, mk = max(LENGTHS_Q), max(LENGTHS_K)
    with pytest.raises(UnsupportedFeatureError, match="is on cpu; the kernels run on a CUDA"):
        twill.ops.attention_varlen(q, k, v, cu_q, cu_k, mq, mk)
