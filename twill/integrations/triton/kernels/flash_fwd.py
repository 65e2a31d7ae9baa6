"""Flash-attention forward with the structure of Triton's tutorial (``06-fused-attention``, TMA path,
non-causal): per program one ``BLOCK_M`` block of queries of one (batch, head); the KV loop loads K and V
tiles by TMA, computes ``S = Q K^T``, the online softmax in base 2 (running max ``m_i``, sum ``l_i``,
correction ``alpha``) and ``O = O * alpha + P V``.

Q, K, V, O are ``[Z * H * N_CTX, HEAD_DIM]`` row-major fp16 (heads stacked along the rows).
"""

from __future__ import annotations

import triton
import triton.language as tl

SIGNATURE = "Q=*fp16:16,K=*fp16:16,V=*fp16:16,Out=*fp16:16,sm_scale=fp32,ZH=i32,N_CTX=i32:16"
CONSTEXPRS = ("HEAD_DIM=128", "BLOCK_M=128", "BLOCK_N=128")
NUM_WARPS = 8
NUM_STAGES = 3


@triton.jit
def attn_fwd(Q, K, V, Out, sm_scale, ZH, N_CTX,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    rows = ZH * N_CTX
    desc_q = tl.make_tensor_descriptor(Q, shape=[rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, shape=[rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, shape=[rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    desc_o = tl.make_tensor_descriptor(Out, shape=[rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    offset_y = off_hz * N_CTX
    qo_offset_y = offset_y + start_m * BLOCK_M
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2): exp(x) = exp2(x / ln 2)
    q = desc_q.load([qo_offset_y, 0])
    offsetkv_y = offset_y
    for start_n in range(0, N_CTX, BLOCK_N):
        k = desc_k.load([offsetkv_y, 0]).T
        qk = tl.dot(q, k)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        v = desc_v.load([offsetkv_y, 0])
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
        offsetkv_y += BLOCK_N
    acc = acc / l_i[:, None]
    desc_o.store([qo_offset_y, 0], acc.to(tl.float16))


def grid(n_ctx: int, zh: int, block_m: int = 128) -> tuple[int, int]:
    return (triton.cdiv(n_ctx, block_m), zh)


def twill_launch(fn, shape, **meta):
    """``twill tune --measure`` launch convention (:mod:`twill.integrations.triton.launch`): attention forward on
    ``shape`` ``{"B", "H", "S", "D"}`` (``HEAD_DIM`` must be ``D``), one program per ``BLOCK_M`` queries of one head."""
    from twill.integrations.triton.launch import attention_launch

    zh = shape["B"] * shape["H"]
    return attention_launch(fn, shape, lambda m: grid(shape["S"], zh, m["BLOCK_M"]), meta)
