"""A TileLang 0.1.15 GEMM with ``T.Pipelined`` in its automatic form: ``num_stages`` alone, TileLang's
PipelinePlanning picks each statement's stage and order (and, on Hopper, its automatic producer/consumer warp
specialization). ``num_stages=0`` gives the loop without a pipeline.

    twill schedule examples/tilelang/gemm.py:matmul --arg M=4096 --arg N=4096 --arg K=4096
    twill inject examples/tilelang/gemm.py:matmul --arg M=4096 --arg N=4096 --arg K=4096 -o out/
"""

import tilelang
import tilelang.language as T


@tilelang.jit
def matmul(M, N, K, block_M=128, block_N=128, block_K=64, num_stages=3, threads=128, dtype="float16"):
    """C = A @ B for A [M, K], B [K, N]; one CTA per block_M x block_N tile."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * block_M, bx * block_N])

    return main
