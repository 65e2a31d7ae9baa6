"""``twill.ops.attention_varlen`` on a Hopper GPU: packed sequences of mixed lengths (1, 0, ragged, longer
than a tile, key lengths different from query lengths, empty key sequences) against fp64 attention of each
sequence alone, causal aligned bottom-right per sequence, grouped-query, D 64/128/256, fp16 and bf16; the
LSE ([H, total_q]) too; rows of neighbouring sequences never leak (NaN poison in the rows past the packed
tensors' ends and in other sequences' outputs is checked by comparing every row); the gradients against fp64
autograd of each sequence alone.

Marked ``gpu``; skipped without torch, CUDA or an sm_90 device.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

from twill.ops import attention_varlen, library  # noqa: E402
from attention_reference import reference  # noqa: E402


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _reference(q, k, v, lq, lk, causal, scale):
    """fp64 (out, lse) of each sequence alone (:func:`attention_reference.reference` of its rows)."""
    outs, lses = [], []
    cq, ck = _cu(lq).tolist(), _cu(lk).tolist()
    for b in range(len(lq)):
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1)[None]                      # [1, H, Lq, D]
        kb, vb = (t[ck[b]:ck[b + 1]].transpose(0, 1)[None] for t in (k, v))
        out, lse = reference(qb, kb, vb, causal, scale)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


#: (query lengths, key lengths (None: the same), H, H_kv, D, dtype, causal)
CASES = [([1, 0, 300, 77, 1024], None, 4, 4, 128, torch.bfloat16, True),
         ([1, 0, 300, 77, 1024], None, 4, 2, 64, torch.float16, False),
         ([5, 129, 64], [300, 64, 1], 8, 2, 128, torch.float16, True),           # S_k > S_q, S_k < S_q
         ([200, 3], [0, 50], 4, 4, 128, torch.bfloat16, False),                   # an empty key sequence
         ([513, 1, 2048], [513, 4096, 2048], 2, 1, 256, torch.bfloat16, True),
         ([8192, 1000, 17], None, 2, 2, 64, torch.bfloat16, True)]


@pytest.mark.parametrize("lq,lk,h,hkv,d,dtype,causal", CASES)
def test_varlen_matches_fp64_per_sequence(lq, lk, h, hkv, d, dtype, causal):
    torch.manual_seed(0)
    lk = lk or lq
    q = torch.randn(sum(lq), h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lk), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    scale = 1 / math.sqrt(d)
    out, lse = library.attention_varlen_forward(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), causal, scale)
    ref, ref_lse = _reference(q, k, v, lq, lk, causal, scale)
    assert torch.isfinite(out).all()
    err = float((out.double() - ref).norm() / max(ref.norm(), 1e-30))
    assert err < 1e-2
    blind = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), blind)
    assert torch.allclose(lse[~blind].double(), ref_lse[~blind], atol=1e-2)
    # the same through the public function on [total, H, D] views of [H, total, D] tensors (read where they lie)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(attention_varlen(qt, k, v, _cu(lq), _cu(lk), max(lq), max(lk), causal=causal), out)


def test_varlen_matches_the_padded_op_on_equal_lengths():
    """Sequences of one length packed: the same numbers as twill.ops.attention on [B, H, S, D]."""
    from twill.ops import attention

    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 4, 333, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    packed = [t.transpose(1, 2).reshape(3 * 333, 4, 128) for t in (q, k, v)]
    cu = _cu([333] * 3)
    out = attention_varlen(*packed, cu, cu, 333, 333, causal=True)
    ref = attention(q, k, v, causal=True).transpose(1, 2).reshape(3 * 333, 4, 128)
    assert float((out.float() - ref.float()).abs().max()) < 2e-3


@pytest.mark.parametrize("lq,lk,h,hkv,d,dtype,causal", CASES)
def test_varlen_gradients_match_fp64_per_sequence(lq, lk, h, hkv, d, dtype, causal):
    """dq, dk, dv of the packed call against fp64 autograd of each sequence alone (keys no query sees: 0), the
    gradients laid out like q, k and v; dq and dk poisoned first through a given buffer."""
    torch.manual_seed(1)
    lk = lk or lq
    q = torch.randn(sum(lq), h, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(sum(lk), hkv, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn(sum(lq), h, d, device="cuda", dtype=dtype)
    out = attention_varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = _reference(q64, k64, v64, lq, lk, causal, 1 / math.sqrt(d))
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    for name, got, want, like in (("dq", dq, rq, q), ("dk", dk, rk, k), ("dv", dv, rv, v)):
        assert got.dtype == dtype and got.shape == like.shape and got.stride() == like.stride(), name
        assert torch.isfinite(got).all(), name
        scale = max(float(want.norm()), 1e-30)
        assert float((got.double() - want).norm()) / scale < 2e-2, name


def test_varlen_backward_writes_given_buffers_and_zeroes_unseen_keys():
    """The kernel module's launcher: dq, dk, dv given (NaN-poisoned) are written where they lie; a sequence of no
    queries gets dK = dV = 0, and a key block past a sequence's end writes nothing of the next one's."""
    from twill.ops.flash import KernelSpec, kernel_module

    torch.manual_seed(3)
    lq, lk = [0, 70, 130], [90, 70, 300]
    q = torch.randn(sum(lq), 4, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(sum(lk), 2, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    fwd = kernel_module(KernelSpec("flash-fwd", 128, "fp16", False, 2, varlen=True))
    bwd = kernel_module(KernelSpec("flash-bwd", 128, "fp16", False, 2, varlen=True))
    o, lse = fwd.launch(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), return_lse=True)
    do = torch.randn_like(o)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd.launch(q, k, v, o, do, lse, _cu(lq), _cu(lk), max(lq), max(lk), dq=dq, dk=dk, dv=dv)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert (dk[:90] == 0).all() and (dv[:90] == 0).all()         # sequence 0 has no query
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = _reference(q64, k64, v64, lq, lk, False, 128 ** -0.5)
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        assert float((got.double() - want).norm() / want.norm()) < 1e-2
