"""Small Triton kernels for the frontend's inputs and messages.

Written for Twill's tests (not copied from anywhere): an expert GEMM that computes in the dtype a constexpr
names (``x.to(compute_type)``), a kernel whose error lies in a helper that its epilogue helper calls, a
chunked state update whose decay is a scalar ``exp2`` of a gate carried from one iteration to the next, and a
split-K matmul whose ``@triton.heuristics`` constexpr needs a launch argument.
"""

import triton
import triton.language as tl

GEMM_SIGNATURE = "x_ptr=*fp16:16,w_ptr=*fp16:16,y_ptr=*fp16:16,K=i32:16"
GEMM_CONSTEXPRS = ("BLOCK_M=64", "BLOCK_N=128", "BLOCK_K=64")


@triton.jit
def expert_gemm(x_ptr, w_ptr, y_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                compute_type: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] * K + (k0 + ks)[None, :])
        w = tl.load(w_ptr + (k0 + ks)[:, None] * BLOCK_N + cols[None, :])
        acc = tl.dot(x.to(compute_type), w.to(compute_type), acc)
    tl.store(y_ptr + rows[:, None] * BLOCK_N + cols[None, :], acc.to(compute_type))


@triton.jit
def _add_bias(tile, bias_ptr, BLOCK: tl.constexpr):
    bias = tl.load(bias_ptr + tl.arange(0, BLOCK))
    return tile + bias[None, :] * bias_scale  # noqa: F821 (the error under test: an undefined name)


@triton.jit
def _epilogue(acc, bias_ptr, BLOCK_N: tl.constexpr):
    return _add_bias(acc, bias_ptr, BLOCK_N).to(tl.float16)


@triton.jit
def gemm_bias_helper(x_ptr, w_ptr, y_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] * K + (k0 + ks)[None, :])
        w = tl.load(w_ptr + (k0 + ks)[:, None] * BLOCK_N + cols[None, :])
        acc = tl.dot(x, w, acc)
    out = _epilogue(acc, w_ptr, BLOCK_N)
    tl.store(y_ptr + rows[:, None] * BLOCK_N + cols[None, :], out)


DECAY_SIGNATURE = "c_ptr=*fp16:16,b_ptr=*fp16:16,gate_ptr=*fp32:16,state_ptr=*fp32:16,chunks=i32"
DECAY_CONSTEXPRS = ("CHUNK=64", "DSTATE=64", "HEAD_D=64")


@triton.jit
def chunk_state_decay(c_ptr, b_ptr, gate_ptr, state_ptr, chunks, CHUNK: tl.constexpr, DSTATE: tl.constexpr,
                      HEAD_D: tl.constexpr):
    t = tl.arange(0, CHUNK)
    n = tl.arange(0, DSTATE)
    d = tl.arange(0, HEAD_D)
    state = tl.zeros((DSTATE, HEAD_D), dtype=tl.float32)
    decay = 1.0
    for c in range(0, chunks):
        bt = tl.load(b_ptr + c * CHUNK * DSTATE + n[:, None] + t[None, :] * DSTATE)
        x = tl.load(c_ptr + c * CHUNK * HEAD_D + t[:, None] * HEAD_D + d[None, :])
        gate = tl.load(gate_ptr + c)
        decay = decay * tl.exp2(gate)
        state = state * decay + tl.dot(bt, x)
    tl.store(state_ptr + n[:, None] * HEAD_D + d[None, :], state)


SPLIT_SIGNATURE = "a_ptr=*fp16:16,b_ptr=*fp16:16,c_ptr=*fp32:16,K=i32:16"


@triton.heuristics({"EVEN_K": lambda args: args["K"] % (args["BLOCK_K"] * args["SPLIT"]) == 0})
@triton.jit
def split_k_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr, EVEN_K: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K * SPLIT):
        a = tl.load(a_ptr + rows[:, None] * K + (k0 + ks)[None, :], mask=EVEN_K or (k0 + ks)[None, :] < K)
        b = tl.load(b_ptr + (k0 + ks)[:, None] * BLOCK_N + cols[None, :], mask=EVEN_K or (k0 + ks)[:, None] < K)
        acc = tl.dot(a, b, acc)
    tl.atomic_add(c_ptr + rows[:, None] * BLOCK_N + cols[None, :], acc)
