"""Flash-attention forward in TileLang 0.1.15, the structure of TileLang's own example (``example_mha_fwd``):
Q [B, S, H, D] in shared memory, an online softmax over K/V blocks in a ``T.Pipelined`` loop whose stage and
order TileLang plans from ``num_stages`` alone.

    twill schedule examples/tilelang/flash_fwd.py:flashattn --arg batch=4 --arg heads=32 --arg seq_len=4096 \
        --arg dim=128
"""

import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[3])
def flashattn(batch, heads, seq_len, dim, block_M=128, block_N=128, num_stages=2, threads=256,
              dtype="float16"):
    """Non-causal softmax(Q K^T / sqrt(dim)) V for Q, K, V [batch, seq_len, heads, dim]."""
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e): the softmax runs in base 2
    shape = [batch, seq_len, heads, dim]

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], "float32")
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], "float32")
            scores_max = T.alloc_fragment([block_M], "float32")
            scores_max_prev = T.alloc_fragment([block_M], "float32")
            scores_scale = T.alloc_fragment([block_M], "float32")
            scores_sum = T.alloc_fragment([block_M], "float32")
            logsum = T.alloc_fragment([block_M], "float32")

            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity("float32"))
            for k in T.Pipelined(T.ceildiv(seq_len, block_N), num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(scores_max, scores_max_prev)
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return main
