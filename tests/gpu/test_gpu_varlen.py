"""``twill.ops.attention_varlen`` on a Hopper GPU: packed sequences of mixed lengths (1, 0, ragged, longer
than a tile, key lengths different from query lengths, empty key sequences) against fp64 attention of each
sequence alone, causal aligned bottom-right per sequence, grouped-query, D 64/128/256, fp16 and bf16; the
LSE ([H, total_q]) too; rows of neighbouring sequences never leak (NaN poison in the rows past the packed
tensors' ends and in other sequences' outputs is checked by comparing every row).

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
from twill.errors import UnsupportedFeatureError  # noqa: E402
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


def test_varlen_gradient_request_is_refused():
    q = torch.randn(10, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    cu = _cu([10])
    with pytest.raises(UnsupportedFeatureError, match="no backward is generated for variable-length"):
        attention_varlen(q, q, q, cu, cu, 10, 10)
