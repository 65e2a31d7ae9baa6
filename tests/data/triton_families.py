"""Triton kernels in the styles public kernel libraries write them, one per family the frontend must handle.

Written for Twill's tests (not copied from anywhere): pointer-based tutorial matmul with grouped program
ordering, block-pointer batched matmul, a persistent matmul (``tl.range(..., flatten=True)`` with the
epilogue inside the flattened loop), pointer-load attention forward (causal: two KV loops), the dK/dV loop
of an attention backward, ``@triton.autotune`` / ``@triton.heuristics`` wrappers, and fp8 matmuls (the K
blocks' products summed in the wgmma or added outside it, and block-scaled per 1 x 128 / 128 x 128 blocks).
"""

import triton
import triton.language as tl

MATMUL_SIGNATURE = ("a_ptr=*fp16:16,b_ptr=*fp16:16,c_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16,"
                    "stride_am=i32:16,stride_ak=i32,stride_bk=i32:16,stride_bn=i32,stride_cm=i32:16,stride_cn=i32")


@triton.jit
def matmul_grouped(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=8, num_stages=3),
                          triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32}, num_warps=4, num_stages=4)],
                 key=["M", "N", "K"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def matmul_tuned(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(tl.float16))


@triton.jit
def bmm_block_ptr(a_ptr, b_ptr, c_ptr, M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                  stride_cb, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    batch = tl.program_id(2)
    a_blk = tl.make_block_ptr(a_ptr + batch * stride_ab, shape=(M, K), strides=(stride_am, stride_ak),
                              offsets=(tl.program_id(0) * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_blk = tl.make_block_ptr(b_ptr + batch * stride_bb, shape=(K, N), strides=(stride_bk, stride_bn),
                              offsets=(0, tl.program_id(1) * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        acc += tl.dot(tl.load(a_blk, boundary_check=(0, 1)), tl.load(b_blk, boundary_check=(0, 1)))
        a_blk = tl.advance(a_blk, (0, BLOCK_K))
        b_blk = tl.advance(b_blk, (BLOCK_K, 0))
    c_blk = tl.make_block_ptr(c_ptr + batch * stride_cb, shape=(M, N), strides=(stride_cm, stride_cn),
                              offsets=(tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N),
                              block_shape=(BLOCK_M, BLOCK_N), order=(1, 0))
    tl.store(c_blk, acc.to(tl.float16), boundary_check=(0, 1))


@triton.jit
def matmul_persistent(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                      stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      NUM_SMS: tl.constexpr):
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        offs_m = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + (kk * BLOCK_K + offs_k)[None, :] * stride_ak)
            b = tl.load(b_ptr + (kk * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn)
            acc = tl.dot(a, b, acc)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(tl.float16),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, qk_scale, lo, hi,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            qk = qk * qk_scale + tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_ptrs)
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


ATTN_SIGNATURE = ("Q=*fp16:16,K=*fp16:16,V=*fp16:16,Out=*fp16:16,sm_scale=fp32,stride_qm=i32:16,"
                  "stride_kn=i32:16,stride_vn=i32:16,stride_om=i32:16,N_CTX=i32:16")


@triton.jit
def attn_fwd_ptr(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N_CTX
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (base + offs_m)[:, None] * stride_qm + offs_d[None, :])
    k_ptrs = K + (base + offs_n)[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + (base + offs_n)[:, None] * stride_vn + offs_d[None, :]
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    if CAUSAL:
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                    qk_scale, 0, start_m * BLOCK_M, BLOCK_N, False)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                    qk_scale, start_m * BLOCK_M, (start_m + 1) * BLOCK_M, BLOCK_N, True)
    else:
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                    qk_scale, 0, N_CTX, BLOCK_N, False)
    acc = acc / l_i[:, None]
    tl.store(Out + (base + offs_m)[:, None] * stride_om + offs_d[None, :], acc.to(tl.float16))


BWD_SIGNATURE = ("Q=*fp16:16,K=*fp16:16,V=*fp16:16,DO=*fp16:16,M=*fp32:16,D=*fp32:16,DK=*fp16:16,DV=*fp16:16,"
                 "stride_tok=i32:16,N_CTX=i32:16")


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, M, D, DK, DV, stride_tok, N_CTX,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(K + offs_n[:, None] * stride_tok + offs_d[None, :])
    v = tl.load(V + offs_n[:, None] * stride_tok + offs_d[None, :])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qT_ptrs = Q + offs_m[None, :] * stride_tok + offs_d[:, None]
    do_ptrs = DO + offs_m[:, None] * stride_tok + offs_d[None, :]
    curr_m = 0
    for _ in range(0, N_CTX, BLOCK_M):
        qT = tl.load(qT_ptrs)
        m = tl.load(M + curr_m + offs_m)
        qkT = tl.dot(k, qT)
        pT = tl.math.exp2(qkT - m[None, :])
        do = tl.load(do_ptrs)
        dv += tl.dot(pT.to(tl.float16), do)
        Di = tl.load(D + curr_m + offs_m)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        dsT = pT * (dpT - Di[None, :])
        dk += tl.dot(dsT.to(tl.float16), tl.trans(qT))
        curr_m += BLOCK_M
        qT_ptrs += BLOCK_M * stride_tok
        do_ptrs += BLOCK_M * stride_tok
    tl.store(DV + offs_n[:, None] * stride_tok + offs_d[None, :], dv.to(tl.float16))
    tl.store(DK + offs_n[:, None] * stride_tok + offs_d[None, :], dk.to(tl.float16))


@triton.jit
def attn_bwd_dq(Q, K, V, DO, M, D, DQ, stride_tok, N_CTX,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_tok + offs_d[None, :])
    do = tl.load(DO + offs_m[:, None] * stride_tok + offs_d[None, :])
    m = tl.load(M + offs_m)[:, None]
    Di = tl.load(D + offs_m)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kT_ptrs = K + offs_n[None, :] * stride_tok + offs_d[:, None]
    vT_ptrs = V + offs_n[None, :] * stride_tok + offs_d[:, None]
    for _ in range(0, N_CTX, BLOCK_N):
        kT = tl.load(kT_ptrs)
        vT = tl.load(vT_ptrs)
        p = tl.math.exp2(tl.dot(q, kT) - m)
        dp = tl.dot(do, vT).to(tl.float32)
        ds = p * (dp - Di[:, None])
        dq += tl.dot(ds.to(tl.float16), tl.trans(kT))
        kT_ptrs += BLOCK_N * stride_tok
        vT_ptrs += BLOCK_N * stride_tok
    tl.store(DQ + offs_m[:, None] * stride_tok + offs_d[None, :], dq.to(tl.float16))


SCALED_SIGNATURE = ("a_ptr=*fp8e4nv:16,b_ptr=*fp8e4nv:16,c_ptr=*fp16:16,a_scale=*u8:16,b_scale=*u8:16,"
                    "M=i32:16,N=i32:16,K=i32:16")


@triton.jit
def matmul_block_scaled(a_ptr, b_ptr, c_ptr, a_scale, b_scale, M, N, K, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC_SIZE: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    scales_k = K // VEC_SIZE
    offs_s = tl.arange(0, BLOCK_K // VEC_SIZE)
    a_s_ptrs = a_scale + (off_m + tl.arange(0, BLOCK_M))[:, None] * scales_k + offs_s[None, :]
    b_s_ptrs = b_scale + (off_n + tl.arange(0, BLOCK_N))[:, None] * scales_k + offs_s[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])
        b = b_desc.load([off_n, k * BLOCK_K])
        sa = tl.load(a_s_ptrs)
        sb = tl.load(b_s_ptrs)
        acc = tl.dot_scaled(a, sa, "e4m3", b.T, sb, "e4m3", acc)
        a_s_ptrs += BLOCK_K // VEC_SIZE
        b_s_ptrs += BLOCK_K // VEC_SIZE
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.float16))


GROUP_GEMM_SIGNATURE = ("group_a_ptrs=*i64:16,group_b_ptrs=*i64:16,group_c_ptrs=*i64:16,group_sizes=*i32:16,"
                        "g_lds=*i32:16,group_size=i32")


@triton.jit
def grouped_gemm(group_a_ptrs, group_b_ptrs, group_c_ptrs, group_sizes, g_lds, group_size,
                 NUM_SM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tile_idx = tl.program_id(0)
    last_problem_end = 0
    for g in range(group_size):
        gm = tl.load(group_sizes + g * 3)
        gn = tl.load(group_sizes + g * 3 + 1)
        gk = tl.load(group_sizes + g * 3 + 2)
        num_n_tiles = tl.cdiv(gn, BLOCK_N)
        num_tiles = tl.cdiv(gm, BLOCK_M) * num_n_tiles
        while tile_idx >= last_problem_end and tile_idx < last_problem_end + num_tiles:
            lda = tl.load(g_lds + g * 3)
            ldb = tl.load(g_lds + g * 3 + 1)
            ldc = tl.load(g_lds + g * 3 + 2)
            a_ptr = tl.load(group_a_ptrs + g).to(tl.pointer_type(tl.float16))
            b_ptr = tl.load(group_b_ptrs + g).to(tl.pointer_type(tl.float16))
            c_ptr = tl.load(group_c_ptrs + g).to(tl.pointer_type(tl.float16))
            tile_in_group = tile_idx - last_problem_end
            offs_m = (tile_in_group // num_n_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = (tile_in_group % num_n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            a_ptrs = a_ptr + offs_m[:, None] * lda + offs_k[None, :]
            b_ptrs = b_ptr + offs_k[:, None] * ldb + offs_n[None, :]
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kk in range(0, tl.cdiv(gk, BLOCK_K)):
                tl.multiple_of(a_ptrs, [16, 16])
                tl.multiple_of(b_ptrs, [16, 16])
                acc += tl.dot(tl.load(a_ptrs), tl.load(b_ptrs))
                a_ptrs += BLOCK_K
                b_ptrs += BLOCK_K * ldb
            tl.store(c_ptr + offs_m[:, None] * ldc + offs_n[None, :], acc.to(tl.float16))
            tile_idx += NUM_SM
        last_problem_end = last_problem_end + num_tiles


TMA_PERSISTENT_SIGNATURE = "a_ptr=*fp16:16,b_ptr=*fp16:16,c_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16"


@triton.jit
def matmul_tma_persistent(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                       block_shape=[BLOCK_M, BLOCK_N // 2 if SPLIT_EPILOGUE else BLOCK_N])
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        off_m = (tile // tiles_n) * BLOCK_M
        off_n = (tile % tiles_n) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(a_desc.load([off_m, kk * BLOCK_K]), b_desc.load([off_n, kk * BLOCK_K]).T, acc)
        if SPLIT_EPILOGUE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([off_m, off_n], left.to(tl.float16))
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(tl.float16))
        else:
            c_desc.store([off_m, off_n], acc.to(tl.float16))


@triton.jit
def matmul_fp4_scaled(a_ptr, b_ptr, c_ptr, a_scale, b_scale, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, VEC_SIZE: tl.constexpr):
    """Both operands e2m1 (fp4), two per byte along K: the tiles are BLOCK_K // 2 bytes wide."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K // 2], strides=[K // 2, 1],
                                       block_shape=[BLOCK_M, BLOCK_K // 2])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K // 2], strides=[K // 2, 1],
                                       block_shape=[BLOCK_N, BLOCK_K // 2])
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    offs_s = tl.arange(0, BLOCK_K // VEC_SIZE)
    a_s_ptrs = a_scale + (off_m + tl.arange(0, BLOCK_M))[:, None] * (K // VEC_SIZE) + offs_s[None, :]
    b_s_ptrs = b_scale + (off_n + tl.arange(0, BLOCK_N))[:, None] * (K // VEC_SIZE) + offs_s[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K // 2])
        b = b_desc.load([off_n, k * BLOCK_K // 2])
        acc = tl.dot_scaled(a, tl.load(a_s_ptrs), "e2m1", b.T, tl.load(b_s_ptrs), "e2m1", acc)
        a_s_ptrs += BLOCK_K // VEC_SIZE
        b_s_ptrs += BLOCK_K // VEC_SIZE
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.float16))


@triton.jit
def attn_fwd_runtime_mask(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Causal attention in one KV loop: the diagonal blocks take a masked softmax step, chosen at run time."""
    start_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N_CTX
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (base + offs_m)[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, (start_m + 1) * BLOCK_M, BLOCK_N):
        k = tl.load(K + (base + start_n + offs_n)[:, None] * stride_kn + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k))
        if start_n >= start_m * BLOCK_M:
            qk = qk * qk_scale + tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (base + start_n + offs_n)[:, None] * stride_vn + offs_d[None, :])
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m_i = m_ij
    tl.store(Out + (base + offs_m)[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


FP8_SIGNATURE = "a_ptr=*fp8e4nv:16,b_ptr=*fp8e4nv:16,c_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16"


@triton.jit
def matmul_fp8(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PROMOTE: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])
        b = b_desc.load([off_n, k * BLOCK_K])
        if PROMOTE:     # each K block's product added to the fp32 sum outside the wgmma
            acc += tl.dot(a, b.T)
        else:
            acc = tl.dot(a, b.T, acc)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.float16))


FP8_SCALED_SIGNATURE = ("a_ptr=*fp8e4nv:16,b_ptr=*fp8e4nv:16,c_ptr=*fp16:16,a_scale=*fp32:16,b_scale=*fp32:16,"
                        "M=i32:16,N=i32:16,K=i32:16")


@triton.jit
def matmul_fp8_block_scaled(a_ptr, b_ptr, c_ptr, a_scale, b_scale, M, N, K, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp8 GEMM with a scale per row of A and K block (1 x 128) and per 128 x 128 block of B, applied to each
    K block's product before it joins the fp32 sum."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    a_scales = a_scale + offs_m * k_blocks
    b_scales = b_scale + (offs_n // 128) * k_blocks
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, k_blocks):
        a = a_desc.load([off_m, k * BLOCK_K])
        b = b_desc.load([off_n, k * BLOCK_K])
        sa = tl.load(a_scales + k)
        sb = tl.load(b_scales + k)
        acc += tl.dot(a, b.T) * sa[:, None] * sb[None, :]
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.float16))


MLA_DECODE_SIGNATURE = ("q_nope=*fp16:16,q_rope=*fp16:16,kv=*fp16:16,k_rope=*fp16:16,out=*fp16:16,scale=fp32,"
                        "n=i32:16,stride_kv=i32:16,stride_rope=i32:16")


@triton.jit
def mla_decode_step(q_nope, q_rope, kv, k_rope, out, scale, n, stride_kv, stride_rope,
                    HEADS: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Decode attention over a latent cache (MLA-style): the score is the sum of two dots, over the latent and the
    rotary parts (the second accumulates into the first), and the latent rows are the values too: three dots."""
    seq = tl.program_id(0)
    heads = seq * HEADS + tl.arange(0, HEADS)
    lat = tl.arange(0, LATENT)
    rot = tl.arange(0, ROPE)
    keys = tl.arange(0, BLOCK_N)
    qn = tl.load(q_nope + heads[:, None] * LATENT + lat[None, :])
    qr = tl.load(q_rope + heads[:, None] * ROPE + rot[None, :])
    m = tl.full([HEADS], float("-inf"), tl.float32)
    total = tl.zeros([HEADS], dtype=tl.float32)
    acc = tl.zeros([HEADS, LATENT], dtype=tl.float32)
    for start in tl.range(0, n, BLOCK_N):
        rows = seq * n + start + keys
        c = tl.load(kv + rows[:, None] * stride_kv + lat[None, :])
        kr = tl.load(k_rope + rows[:, None] * stride_rope + rot[None, :])
        s = tl.dot(qr, tl.trans(kr), tl.dot(qn, tl.trans(c))) * scale
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), c, acc * alpha[:, None])
        m = m_new
    tl.store(out + heads[:, None] * LATENT + lat[None, :], (acc / total[:, None]).to(tl.float16))
