"""Small Triton kernels for the frontend's loop selection and streaming depth.

Written for Twill's tests (not copied from anywhere): a causal attention forward with its two KV loops written
out in the kernel (the blocks left of the diagonal, then the diagonal block under a mask), both holding the
QK and PV dots; and matmuls that declare their ``num_stages`` (an autotune config, a ``tl.range`` loop).
"""

import triton
import triton.language as tl

CAUSAL_SIGNATURE = "Q=*fp16:16,K=*fp16:16,V=*fp16:16,O=*fp16:16,scale=fp32,seq_len=i32:16"
CAUSAL_CONSTEXPRS = ("HEAD_DIM=64", "BLOCK_M=64", "BLOCK_N=64")


@triton.jit
def causal_two_pass(Q, K, V, O, scale, seq_len,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row0 = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64) * seq_len * HEAD_DIM
    q_blk = tl.make_block_ptr(Q + head, (seq_len, HEAD_DIM), (HEAD_DIM, 1), (row0, 0), (BLOCK_M, HEAD_DIM), (1, 0))
    kt_blk = tl.make_block_ptr(K + head, (HEAD_DIM, seq_len), (1, HEAD_DIM), (0, 0), (HEAD_DIM, BLOCK_N), (0, 1))
    v_blk = tl.make_block_ptr(V + head, (seq_len, HEAD_DIM), (HEAD_DIM, 1), (0, 0), (BLOCK_N, HEAD_DIM), (1, 0))
    q = tl.load(q_blk)
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.full([BLOCK_M], 1.0, tl.float32)
    o = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    log2_scale = scale * 1.4426950408889634
    # pass 1: every KV block left of the diagonal, no mask
    for n0 in range(0, row0, BLOCK_N):
        s = tl.dot(q, tl.load(kt_blk)) * log2_scale
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        corr = tl.math.exp2(m - m_new)
        l = l * corr + tl.sum(p, 1)
        o = tl.dot(p.to(tl.float16), tl.load(v_blk), o * corr[:, None])
        m = m_new
        kt_blk = tl.advance(kt_blk, (0, BLOCK_N))
        v_blk = tl.advance(v_blk, (BLOCK_N, 0))
    # pass 2: the diagonal block, masked above the diagonal
    for n0 in range(row0, row0 + BLOCK_M, BLOCK_N):
        s = tl.dot(q, tl.load(kt_blk)) * log2_scale
        s = tl.where(rows[:, None] >= (n0 + cols)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        corr = tl.math.exp2(m - m_new)
        l = l * corr + tl.sum(p, 1)
        o = tl.dot(p.to(tl.float16), tl.load(v_blk), o * corr[:, None])
        m = m_new
        kt_blk = tl.advance(kt_blk, (0, BLOCK_N))
        v_blk = tl.advance(v_blk, (BLOCK_N, 0))
    o_blk = tl.make_block_ptr(O + head, (seq_len, HEAD_DIM), (HEAD_DIM, 1), (row0, 0), (BLOCK_M, HEAD_DIM), (1, 0))
    tl.store(o_blk, (o / l[:, None]).to(tl.float16))


MATMUL_SIGNATURE = "a=*fp16:16,b=*fp16:16,c=*fp16:16,K=i32:16"
MATMUL_CONSTEXPRS = ("BM=64", "BN=64", "BK=64")


@triton.autotune(configs=[triton.Config({"BM": 64, "BN": 64, "BK": 64}, num_warps=4, num_stages=1)], key=["K"])
@triton.jit
def matmul_one_stage(a, b, c, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(a + rows[:, None] * K + (k0 + ks)[None, :])
        y = tl.load(b + (k0 + ks)[:, None] * BN + cols[None, :])
        acc = tl.dot(x, y, acc)
    tl.store(c + rows[:, None] * BN + cols[None, :], acc.to(tl.float16))


@triton.jit
def matmul_ranged(a, b, c, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=4):
        x = tl.load(a + rows[:, None] * K + (k0 + ks)[None, :])
        y = tl.load(b + (k0 + ks)[:, None] * BN + cols[None, :])
        acc = tl.dot(x, y, acc)
    tl.store(c + rows[:, None] * BN + cols[None, :], acc.to(tl.float16))


#: ``causal_two_pass`` under ``@triton.autotune``: two configs, each with both loops holding dots.
causal_two_pass_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4),
             triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8)],
    key=["seq_len"])(causal_two_pass)
