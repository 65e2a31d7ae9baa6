"""Sub-tiled flash-attention forward: each program owns ``2 * BLOCK_M`` queries as two independent halves
(``q0``, ``q1``) that share every K and V tile. The KV loop holds two copies of the online softmax, so a
scheduler can overlap the softmax of one half with the tensor-core work of the other (the FA3 ping-pong,
expressed inside one loop). Same layout conventions as :mod:`flash_fwd`.
"""

from __future__ import annotations

import triton
import triton.language as tl

SIGNATURE = "Q=*fp16:16,K=*fp16:16,V=*fp16:16,Out=*fp16:16,sm_scale=fp32,ZH=i32,N_CTX=i32:16"
CONSTEXPRS = ("HEAD_DIM=128", "BLOCK_M=64", "BLOCK_N=128")
NUM_WARPS = 8
NUM_STAGES = 3


@triton.jit
def _softmax_step(qk, m_i, l_i, acc, qk_scale):
    """One online-softmax update for one query half: returns (p, m_new, l_new, rescaled acc)."""
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    qk = qk * qk_scale - m_ij[:, None]
    p = tl.math.exp2(qk)
    l_ij = tl.sum(p, 1)
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + l_ij
    acc = acc * alpha[:, None]
    return p, m_ij, l_i, acc


@triton.jit
def attn_fwd_subtiled(Q, K, V, Out, sm_scale, ZH, N_CTX,
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
    q0_y = offset_y + start_m * (2 * BLOCK_M)
    q1_y = q0_y + BLOCK_M
    m0 = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    m1 = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l0 = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    l1 = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc0 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2)
    q0 = desc_q.load([q0_y, 0])
    q1 = desc_q.load([q1_y, 0])
    offsetkv_y = offset_y
    for start_n in range(0, N_CTX, BLOCK_N):
        k = desc_k.load([offsetkv_y, 0]).T
        qk0 = tl.dot(q0, k)
        qk1 = tl.dot(q1, k)
        p0, m0, l0, acc0 = _softmax_step(qk0, m0, l0, acc0, qk_scale)
        p1, m1, l1, acc1 = _softmax_step(qk1, m1, l1, acc1, qk_scale)
        v = desc_v.load([offsetkv_y, 0])
        acc0 = tl.dot(p0.to(tl.float16), v, acc0)
        acc1 = tl.dot(p1.to(tl.float16), v, acc1)
        offsetkv_y += BLOCK_N
    acc0 = acc0 / l0[:, None]
    acc1 = acc1 / l1[:, None]
    desc_o.store([q0_y, 0], acc0.to(tl.float16))
    desc_o.store([q1_y, 0], acc1.to(tl.float16))


def grid(n_ctx: int, zh: int, block_m: int = 64) -> tuple[int, int]:
    return (triton.cdiv(n_ctx, 2 * block_m), zh)


def twill_launch(fn, shape, **meta):
    """``twill tune --measure`` launch convention (:mod:`twill.integrations.triton.launch`): attention forward on
    ``shape`` ``{"B", "H", "S", "D"}`` (``HEAD_DIM`` must be ``D``), one program per ``2 * BLOCK_M`` queries of
    one head."""
    from twill.integrations.triton.launch import attention_launch

    zh = shape["B"] * shape["H"]
    return attention_launch(fn, shape, lambda m: grid(shape["S"], zh, m["BLOCK_M"]), meta)
