"""TMA matmul ``C = A @ B`` (fp16 in, fp32 accumulate, fp16 out), one ``BLOCK_M x BLOCK_N`` tile per program.

The K loop is the loop Twill schedules: two TMA loads (A and B tiles), one ``tl.dot`` into a loop-carried
fp32 accumulator. Tensor descriptors are created on the device from plain pointers, so the kernel compiles
ahead of time from a pointer signature; launching it needs ``triton.set_allocator`` (see :func:`launch`).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: ``twill graph``/``twill inject`` settings: every non-constexpr argument, ``:16`` = divisible by 16.
SIGNATURE = "a_ptr=*fp16:16,b_ptr=*fp16:16,c_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16"
CONSTEXPRS = ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=64")
NUM_WARPS = 8
NUM_STAGES = 3


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])
        b = b_desc.load([k * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc)
    c_desc.store([off_m, off_n], acc.to(tl.float16))


def grid(M: int, N: int, block_m: int = 128, block_n: int = 128) -> tuple[int, int]:
    return (triton.cdiv(M, block_m), triton.cdiv(N, block_n))


def twill_launch(fn, shape, **meta):
    """``twill tune --measure`` launch convention (:mod:`twill.integrations.triton.launch`): ``C = A @ B`` on
    ``shape`` ``{"M", "N", "K"}``, one program per ``BLOCK_M x BLOCK_N`` tile."""
    from twill.integrations.triton.launch import gemm_launch

    return gemm_launch(fn, shape, lambda m: grid(shape["M"], shape["N"], m["BLOCK_M"], m["BLOCK_N"]), meta)
