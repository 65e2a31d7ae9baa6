"""The attention-backward body of the shared Gluon module (:mod:`~twill.codegen.gluon.render`): FA3's
algorithm on one 8-warp compute partition, the dQ reduce in the producer, the dO·O pre-pass and dQ
conversion kernels, and the launcher.

One CTA owns a ``BLOCK_N``-key block of one K/V head (K and V loaded once, resident in shared memory) and
loops over the ``BLOCK_M``-row query blocks (of every query head of its group, for grouped-query attention)
that can see it. Per iteration, in the schedule's steady-state order of the compute ops:

====================  ============================  =============================================  ===========
tile                  shape                         layout (8 warps)                               lives in
====================  ============================  =============================================  ===========
S^T = K Q^T, dP^T     [BLOCK_N, BLOCK_M] fp32       wgmma accumulator, warps [8, 1] (16 keys each)  registers
P^T, dS^T (fp16)      [BLOCK_N, BLOCK_M]            DotOperandLayout(0, dK/dV layout): wgmma A      registers
dS^T                  [BLOCK_N, BLOCK_M] fp16       NVMMA shared (A of dQ, transposed view)         smem
dK, dV                [BLOCK_N, HEAD_DIM] fp32      wgmma accumulator, warps [8, 1]                 registers
dQ                    [BLOCK_M, HEAD_DIM] fp32      wgmma accumulator, warps [4, 2] at BLOCK_M 64   registers
                                                    (N split), [8, 1] at 128
dQ staging            [DQ_DEPTH, BLOCK_M, HEAD_DIM] NVMMA shared fp32 (the TMA reduce's source)     smem
LSE, D rows           [2, BLOCK_M] fp32 per buffer    SliceLayout(0, S^T) (one value per query)       smem ring
====================  ============================  =============================================  ===========

With 64-key blocks (head dim 256: the *split-query* backward) eight warps cannot spread S^T's 64 key rows,
so the warp groups split its queries (warps [4, 2]) and dK, dV their head dimension; P^T goes to shared
memory beside dS^T (dV and dK read both from there), and dQ is computed ``DQ_CHUNK`` columns at a time, each
chunk staged in one of ``DQ_SLOTS`` fp32 buffers and reduce-added by the compute warps themselves (the
producer only loads).

Keys past ``seq_k`` and queries past ``seq_q`` (ragged tails) and, causal, keys after the query's last key
(query + seq_k - seq_q: aligned bottom-right, as FlashAttention's; the mask counts keys on the query axis,
from ``n_pos``) are masked to -inf in S^T, so their P and dS are exactly 0: they add nothing to dK, dV or
dQ. The producer warp adds each staged
dQ tile into a padded fp32 buffer with one TMA reduce-add (``tma_reduce_add``: Triton 3.6's Gluon builder
has the operation, its language no wrapper), then one pass scales it by ``sm_scale`` and converts it to the
input dtype. The stats rows and the dQ buffer are padded per head to a multiple of ``BLOCK_M`` rows so that
every TMA coordinate along the innermost dimension is 16-byte aligned. See docs/codegen.md, "Attention backward".

The varlen backward (packed sequences, FlashAttention's varlen interface) is the same kernel over the packed
tensors' [1, heads, total, D] views: a CTA's key block and query blocks lie in one sequence, whose rows it reads
from ``cu_seqlens_*``, and the stats and dQ rows are padded per sequence (``pad_cu``; docs/codegen.md,
"Variable-length sequences").
"""

from __future__ import annotations

from twill.codegen.gluon.render import (ATTENTION_HOST, SM_COUNT, TORCH_DTYPES, VARLEN_OFFSETS, KernelBody, compute_def,
                                        heaviest_first_chunks, kv_shape_source)
from twill.codegen.plan import KernelPlan
from twill.kernels.flash_bwd.plan import FlashBwdDecisions

#: Parameters of the compute partition after the rings and barriers (the kernel passes the same names).
COMPUTE_PARAMS = ("k_smem", "v_smem", "kv_bar", "ds_smem", "dq_stage", "dq_ready", "dq_empty", "dk_ptr",
                  "dk_stride_b", "dk_stride_h", "dk_stride_s", "dv_ptr", "dv_stride_b", "dv_stride_h", "dv_stride_s",
                  "kv_heads", "bh_kv", "n_pos", "m_first", "n_m", "n_iters", "seq_q", "seq_k", "qk_scale",
                  "sm_scale")
#: Parameters of the split-query compute partition: P's tile, and what it reduces dQ chunks with.
SPLIT_COMPUTE_PARAMS = ("k_smem", "v_smem", "kv_bar", "p_smem", "ds_smem", "dq_stage", "dq_desc", "kv_h", "group",
                        *COMPUTE_PARAMS[COMPUTE_PARAMS.index("dk_ptr"):])
#: Query-block parameters the producer derives each iteration's query head and rows from.
BLOCK_ARGS = "bh_kv, kv_h, group, m_first, n_m, seq_q"
#: ... and of the varlen backward: the sequence's first query row, its first padded stats row, the rows per head.
VARLEN_BLOCK_ARGS = "bh_kv, kv_h, group, m_first, n_m, seq_q, q_base, pad_base, total_pad"
#: What the varlen backward's compute partition reads besides :data:`COMPUTE_PARAMS`: its sequence's first key
#: row (the split-query one also the dQ rows of its query blocks: :data:`VARLEN_BLOCK_ARGS`).
VARLEN_COMPUTE_PARAMS = ("k_base",)
VARLEN_SPLIT_COMPUTE_PARAMS = ("q_base", "pad_base", "total_pad")
#: The emitted module's own imports: what its TMA reduce-add wrapper (``tma_reduce_add``) builds on.
IMPORTS = """\
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
"""
#: Rows per program of the dO·O pre-pass and of the dQ conversion at head dim 128 or less; half as many at 256,
#: where 64 rows of O and dO in fp32 (128 registers per thread each) spill.
PRE_ROWS = 64


def pre_rows(head_dim: int) -> int:
    """Rows per program of the pre-pass and the dQ conversion: 64 x 128 elements of O and dO at most."""
    return PRE_ROWS * 128 // max(128, head_dim)

#: The query block of iteration i, the dense backward's.
QUERY_BLOCK = """
@gluon.jit
def query_block(i, bh_kv, kv_h, group, m_first, n_m, seq_q):
    \"\"\"Iteration i's query block: its query head (in its batch: the index into Q, dO [B, H, S, D]), its first
    row in the padded [B*H*S_pad] tensors (stats, dQ accumulator; S_pad = seq_q rounded up to BLOCK_M, so
    that every block starts 16-byte aligned, as TMA requires of the innermost coordinate) and its first
    position. The iterations run over the group's query heads (outer) and the query blocks from m_first
    (inner).\"\"\"
    m_start = (m_first + i % n_m) * BLOCK_M
    head = bh_kv * group + i // n_m  # batch * H + query head
    return kv_h * group + i // n_m, head * (gl.cdiv(seq_q, BLOCK_M) * BLOCK_M) + m_start, m_start
"""

#: The producer's dQ reduce (the backwards whose producer adds whole staged dQ tiles; the split-query
#: backward's compute warps reduce their chunks themselves).
DQ_REDUCE = """@gluon.jit
def dq_reduce(dq_stage, dq_ready, dq_empty, dq_desc, i, prow):
    \"\"\"dq_atomic of iteration i: wait for its staged fp32 dQ, add the whole [BLOCK_M, HEAD_DIM] tile to the
    padded accumulator at row prow with one TMA reduce-add, and release the staging buffer once the TMA has
    read it (cp.async.bulk.wait_group.read; the additions themselves complete asynchronously).\"\"\"
    buffer = i % DQ_DEPTH
    mbarrier.wait(dq_ready.index(buffer), (i // DQ_DEPTH) & 1)
    tma_reduce_add(dq_desc, [prow, 0], dq_stage.index(buffer))
    tma.store_wait(0)
    mbarrier.arrive(dq_empty.index(buffer))


"""

#: ... the varlen backward's, and its pre-pass and dQ conversion over packed sequences.
VARLEN_HELPERS = """
@gluon.jit
def query_block(i, bh_kv, kv_h, group, m_first, n_m, seq_q, q_base, pad_base, total_pad):
    \"\"\"Iteration i's query block: its query head, its first row in the padded [H * total_pad] tensors (stats,
    dQ accumulator: head h's rows from h * total_pad, the sequence's from pad_base, each sequence's length
    rounded up to BLOCK_M, so that every block starts 16-byte aligned, as TMA requires of the innermost
    coordinate) and its first position in the sequence (its packed row is q_base + m_start). The iterations run
    over the group's query heads (outer) and the query blocks from m_first (inner).\"\"\"
    m_start = (m_first + i % n_m) * BLOCK_M
    h = kv_h * group + i // n_m  # query head
    return h, h * total_pad + pad_base + m_start, m_start


@gluon.jit
def sequence_rows(cu_seqlens_q, pad_cu, layout: gl.constexpr):
    \"\"\"The PRE_ROWS positions m of program (m block, head h, sequence b) (a slice of ``layout``), h, and the
    sequence's first packed row, length, first padded row and padded length.\"\"\"
    m = gl.program_id(0) * PRE_ROWS + gl.arange(0, PRE_ROWS, gl.SliceLayout(1, layout))
    b = gl.program_id(2)
    q_base = gl.load(cu_seqlens_q + b)
    pad_base = gl.load(pad_cu + b)
    return (m, gl.program_id(1).to(gl.int64), q_base, gl.load(cu_seqlens_q + b + 1) - q_base, pad_base,
            gl.load(pad_cu + b + 1) - pad_base)


@gluon.jit
def preprocess_varlen_kernel(o_ptr, o_stride_s, o_stride_h, do_ptr, do_stride_s, do_stride_h, delta_ptr, lse_ptr,
                             lse_out_ptr, dq_acc_ptr, cu_seqlens_q, pad_cu, total_q, total_pad):
    \"\"\"The pre-pass over packed sequences, for the PRE_ROWS positions m of program (m block, head h, sequence
    b) below the sequence's padded length, at row h * total_pad + pad_cu[b] + m: delta = sum_d dO * O of packed
    row cu_seqlens_q[b] + m (0 from the sequence's length on), the row's LSE (lse [H, total_q], -inf -> 0) and
    the fp32 dQ accumulator's rows zeroed.\"\"\"
    layout: gl.constexpr = gl.BlockedLayout([1, HEAD_DIM // 32], [1, 32], [4, 1], [1, 0])
    m, h, q_base, seq_q, pad_base, s_pad = sequence_rows(cu_seqlens_q, pad_cu, layout)
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    rows = (q_base + m).to(gl.int64)
    mask = (m < seq_q)[:, None]
    o = gl.load(o_ptr + (rows * o_stride_s + h * o_stride_h)[:, None] + cols[None, :], mask=mask, other=0.0)
    do = gl.load(do_ptr + (rows * do_stride_s + h * do_stride_h)[:, None] + cols[None, :], mask=mask, other=0.0)
    out_rows = h * total_pad + pad_base + m
    gl.store(delta_ptr + out_rows, gl.sum(o.to(gl.float32) * do.to(gl.float32), 1), mask=m < s_pad)
    lse = gl.load(lse_ptr + h * total_q + rows, mask=m < seq_q, other=0.0)
    lse = gl.where(lse == float("-inf"), 0.0, lse)  # a row that saw no key (FA3): P = exp(-inf - 0) = 0
    gl.store(lse_out_ptr + out_rows, lse, mask=m < s_pad)
    gl.store(dq_acc_ptr + out_rows[:, None] * HEAD_DIM + cols[None, :],
             gl.zeros([PRE_ROWS, HEAD_DIM], gl.float32, layout), mask=(m < s_pad)[:, None])


@gluon.jit
def dq_convert_varlen_kernel(acc_ptr, dq_ptr, dq_stride_s, dq_stride_h, cu_seqlens_q, pad_cu, total_pad, sm_scale):
    \"\"\"dq[cu_seqlens_q[b] + m, h] = sm_scale * acc[h * total_pad + pad_cu[b] + m] in the operand dtype, stored
    through dq's strides, for the PRE_ROWS positions m < the sequence's length of program (m block, head h,
    sequence b).\"\"\"
    layout: gl.constexpr = gl.BlockedLayout([1, HEAD_DIM // 32], [1, 32], [4, 1], [1, 0])
    m, h, q_base, seq_q, pad_base, _ = sequence_rows(cu_seqlens_q, pad_cu, layout)
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    mask = (m < seq_q)[:, None]
    acc = gl.load(acc_ptr + (h * total_pad + pad_base + m)[:, None] * HEAD_DIM + cols[None, :], mask=mask)
    dq_offs = ((q_base + m).to(gl.int64) * dq_stride_s + h * dq_stride_h)[:, None] + cols[None, :]
    gl.store(dq_ptr + dq_offs, (acc * sm_scale).to(DTYPE), mask=mask)
"""

HELPERS = """
{query_block}


@gluon.jit
def mask_scores(s, n_pos, m_start, seq_q, s_layout: gl.constexpr):
    \"\"\"S^T [keys, queries] with -inf where the key or the query is past its sequence{causal_doc}. Keys are
    counted on the query axis from n_pos (key j at j - (seq_k - seq_q): causal is aligned bottom-right), so
    a key is past seq_k exactly when its position is past seq_q.\"\"\"
    keys = n_pos + gl.arange(0, BLOCK_N, gl.SliceLayout(1, s_layout))
    queries = m_start + gl.arange(0, BLOCK_M, gl.SliceLayout(0, s_layout))
    keep = (keys < seq_q)[:, None] & (queries < seq_q)[None, :]
{causal_keep}    return gl.where(keep, s, float("-inf"))


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    \"\"\"TMA reduce-add of the shared tile src into tensor_desc's tensor at coord (one
    cp.reduce.async.bulk.tensor ... .add, a bulk group of its own). Triton 3.6's Gluon builder has the
    operation but its language no wrapper; this is the wrapper, shaped like tma.async_copy_shared_to_global.\"\"\"
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


{dq_reduce}@gluon.jit
def preprocess_kernel(o_ptr, o_stride_b, o_stride_h, o_stride_s, do_ptr, do_stride_b, do_stride_h, do_stride_s,
                      delta_ptr, lse_ptr, lse_stride_b, lse_stride_h, lse_stride_s, lse_out_ptr, dq_acc_ptr, seq_q,
                      s_pad):
    \"\"\"For the PRE_ROWS positions m < s_pad of program (m block, head h, batch b), at bh * s_pad + m (bh = b * H
    + h): delta = sum_d dO[b, h, m, d] * O[b, h, m, d] in fp32 (the backward's D statistic), and, when lse_ptr
    is given, lse_out = LSE[b, h, m]; O, dO and LSE are read through their strides, and the positions from
    seq_q on get 0 (the padding of the stats rows). When dq_acc_ptr is given, the fp32 dQ accumulator's rows of
    these positions are zeroed (the backward adds into them; no separate fill).\"\"\"
    layout: gl.constexpr = gl.BlockedLayout([1, HEAD_DIM // 32], [1, 32], [4, 1], [1, 0])
    m = gl.program_id(0) * PRE_ROWS + gl.arange(0, PRE_ROWS, gl.SliceLayout(1, layout))
    h = gl.program_id(1).to(gl.int64)
    b = gl.program_id(2).to(gl.int64)
    bh = b * gl.num_programs(1) + h
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    rows = m.to(gl.int64)
    o_offs = (b * o_stride_b + h * o_stride_h + rows * o_stride_s)[:, None] + cols[None, :]
    do_offs = (b * do_stride_b + h * do_stride_h + rows * do_stride_s)[:, None] + cols[None, :]
    mask = (m < seq_q)[:, None]
    o = gl.load(o_ptr + o_offs, mask=mask, other=0.0).to(gl.float32)
    do = gl.load(do_ptr + do_offs, mask=mask, other=0.0).to(gl.float32)
    gl.store(delta_ptr + bh * s_pad + m, gl.sum(o * do, 1), mask=m < s_pad)
    if lse_ptr is not None:
        lse_offs = b * lse_stride_b + h * lse_stride_h + rows * lse_stride_s
        lse = gl.load(lse_ptr + lse_offs, mask=m < seq_q, other=0.0)
        lse = gl.where(lse == float("-inf"), 0.0, lse)  # a row that saw no key (FA3): P = exp(-inf - 0) = 0
        gl.store(lse_out_ptr + bh * s_pad + m, lse, mask=m < s_pad)
    if dq_acc_ptr is not None:
        acc_offs = (bh * s_pad + rows)[:, None] * HEAD_DIM + cols[None, :]
        gl.store(dq_acc_ptr + acc_offs, gl.zeros([PRE_ROWS, HEAD_DIM], gl.float32, layout), mask=(m < s_pad)[:, None])


@gluon.jit
def dq_convert_kernel(acc_ptr, dq_ptr, dq_stride_b, dq_stride_h, dq_stride_s, seq_q, s_pad, sm_scale):
    \"\"\"dq[b, h, m] = sm_scale * acc[bh * s_pad + m] in the operand dtype (the padded fp32 dQ the producers
    reduced; bh = b * H + h), stored through dq's strides, for the PRE_ROWS positions m of program (m block,
    head h, batch b).\"\"\"
    layout: gl.constexpr = gl.BlockedLayout([1, HEAD_DIM // 32], [1, 32], [4, 1], [1, 0])
    m = gl.program_id(0) * PRE_ROWS + gl.arange(0, PRE_ROWS, gl.SliceLayout(1, layout))
    h = gl.program_id(1).to(gl.int64)
    b = gl.program_id(2).to(gl.int64)
    bh = b * gl.num_programs(1) + h
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    mask = (m < seq_q)[:, None]
    acc = gl.load(acc_ptr + (bh * s_pad + m)[:, None] * HEAD_DIM + cols[None, :], mask=mask)
    dq_offs = (b * dq_stride_b + h * dq_stride_h + m.to(gl.int64) * dq_stride_s)[:, None] + cols[None, :]
    gl.store(dq_ptr + dq_offs, (acc * sm_scale).to(DTYPE), mask=mask)
"""

#: The launchers' shape and dtype check, and the stats ring's layout (format strings, as the launchers).
CHECK = """def _check(t, name, shape, dtype):
    \"\"\"``t`` itself (any strides: never copied), after checking its shape and dtype.\"\"\"
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"expected {{name}} of shape {{tuple(shape)}} and dtype {{dtype}}, got {{tuple(t.shape)}} "
                         f"{{t.dtype}}")
    return t


def _fp32_buffers(n, device, zeroed=False):
    \"\"\"The launcher's fp32 buffers, views of one allocation: the stats rows (LSE, D) [2, n], read by TMA with the
    query block along the innermost dimension, and the dQ accumulator [n, HEAD_DIM], for n padded rows (B*H*S_pad,
    or H*total_pad with varlen): a multiple of BLOCK_M, so the accumulator starts 16-byte aligned for TMA.\"\"\"
    import torch

    make = torch.zeros if zeroed else torch.empty
    buffer = make(n * (2 + HEAD_DIM.value), device=device, dtype=torch.float32)
    return buffer[:2 * n].view(2, n), buffer[2 * n:].view(n, HEAD_DIM.value)


def _check_rows(t, name, shape, dtype):
    \"\"\"``t`` itself (read or written through its strides, each row a vector), after checking its shape, its dtype
    and its contiguous last dimension.\"\"\"
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.stride(-1) != 1:
        raise ValueError(f"{{name}} must be a {{dtype}} tensor of shape {{tuple(shape)}} with a contiguous last "
                         f"dimension")
    return t
"""
STATS = """

#: The stats ring's shared layout: unswizzled, so that one row (LSE or D) reads back as a plain vector.
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
"""

LAUNCH = "\n" + CHECK + """

def padded_len(S):
    \"\"\"S rounded up to BLOCK_M: the per-head length of the stats rows and the fp32 dQ accumulator, so that
    every query block starts at a 16-byte aligned TMA coordinate (TMA requires it of the innermost one).\"\"\"
    return _cdiv(S, BLOCK_M.value) * BLOCK_M.value


def preprocess(o, do):
    \"\"\"delta [B, H, S] fp32: the row sums of dO * O (the dO·O pre-pass of the backward; o, do any strides).\"\"\"
    import torch

    B, H, S, D = o.shape
    delta = torch.empty((B, H, S), device=o.device, dtype=torch.float32)
    _preprocess(o, do, delta, S)
    return delta


def _preprocess(o, do, out, s_pad, lse=None, lse_out=None, dq_acc=None):
    \"\"\"The pre-pass into ``out`` with ``s_pad`` positions per (batch, head) (0 from S on); with ``lse``, it also
    writes lse's rows into ``lse_out`` laid out as ``out``; with ``dq_acc``, it zeroes the dQ accumulator.\"\"\"
    import torch

    B, H, S, D = o.shape
    for t, name in ((o, "o"), (do, "do")):   # their rows are read as vectors
        _check_rows(t, name, (B, H, S, HEAD_DIM.value), torch.{torch_dtype})
    lse_strides = (0, 0, 0) if lse is None else _check(lse, "lse", (B, H, S), torch.float32).stride()
    _launch(preprocess_kernel, (_cdiv(s_pad, PRE_ROWS.value), H, B), 4, o, *o.stride()[:3], do,
            *do.stride()[:3], out, lse, *lse_strides, lse_out, dq_acc, S, s_pad)


def launch(q, k, v, o, do, lse, sm_scale=None, dq=None, dk=None, dv=None, delta=None):
    \"\"\"Gradients (dq, dk, dv) of softmax(q k^T * sm_scale{mask}) v for q, o, do [B, H, S, D] and k, v
    [B, {kv}, Sk, D] ({dtype}, CUDA; the key length Sk may differ from S{sk_note}), each with any strides whose
    last dimension is contiguous (read where they lie, never copied), given lse [B, H, S] fp32 (natural log,
    as the forward's launch(..., return_lse=True) returns it; -inf for a row that sees no key). sm_scale
    defaults to 1/sqrt(D); delta (from preprocess) is computed when not given; dq, dk, dv are allocated like q,
    k, v (their strides) or, given, written through their strides.{gqa_doc}\"\"\"
    import math

    import torch

    B, H, S, D = q.shape
    Sk = k.shape[2]   # key length (may differ from S)
    dtype = torch.{torch_dtype}
{kv_check}
    for t, name, shape in ((q, "q", q.shape), (do, "do", q.shape), (k, "k", kv_shape), (v, "v", kv_shape)):
        _check(t, name, shape, dtype)
    q_desc = _tma_view(q, "q", [BLOCK_M.value, D])   # read where they lie: any strides, no copy
    k_desc = _tma_view(k, "k", [BLOCK_N.value, D])
    v_desc = _tma_view(v, "v", [BLOCK_N.value, D])
    do_desc = _tma_view(do, "do", [BLOCK_M.value, D])
    dq = torch.empty_like(q) if dq is None else dq   # the gradients take their inputs' strides
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    for t, name, shape in ((dq, "dq", q.shape), (dk, "dk", kv_shape), (dv, "dv", kv_shape)):
        _check_rows(t, name, shape, dtype)
    s_pad = padded_len(S)
    # the pre-pass writes both stats rows, padding included, and zeroes the dQ accumulator; a given delta
    # takes zeroed buffers instead
    stats, dq_acc = _fp32_buffers(B * H * s_pad, q.device, zeroed=delta is not None)
    if delta is None:
        _preprocess(o, do, stats[1], s_pad, lse, stats[0], dq_acc)
    else:
        lse = _check(lse, "lse", (B, H, S), torch.float32)   # -inf (a row that saw no key) -> 0, as the pre-pass
        stats[0].view(B, H, s_pad)[..., :S] = torch.where(lse == float("-inf"), 0.0, lse)
        stats[1].view(B, H, s_pad)[..., :S] = _check(delta, "delta", (B, H, S), torch.float32)
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    stats_desc = _tma_buffer(stats, [2, BLOCK_M.value], gl.float32, STATS_LAYOUT)
    dq_desc = _tma_buffer(dq_acc, [BLOCK_M.value, {dq_cols}], gl.float32)
    grid = (_cdiv(Sk, BLOCK_N.value), B * kv_shape[1])
    _launch(backward_kernel, grid, NUM_WARPS, q_desc, k_desc, v_desc, do_desc, stats_desc, dq_desc, dk,
            *dk.stride()[:3], dv, *dv.stride()[:3], S, Sk, kv_shape[1], sm_scale * LOG2E.value, sm_scale,
            H // kv_shape[1]{chunk_arg})
    _launch(dq_convert_kernel, (_cdiv(S, PRE_ROWS.value), H, B), 4, dq_acc, dq, *dq.stride()[:3], S, s_pad,
            sm_scale)
    return dq, dk, dv
""" + STATS

VARLEN_LAUNCH = "\n" + CHECK + """

def launch(q, k, v, o, do, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale=None, dq=None,
           dk=None, dv=None):
    \"\"\"Gradients (dq, dk, dv) of softmax(q k^T * sm_scale{mask}) v over variable-length packed sequences
    (FlashAttention's varlen interface): q, o, do [total_q, H, D] and k, v [total_k, {kv}, D] ({dtype}, CUDA)
    hold the sequences one after another, sequence b in rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v (cu_seqlens_* int32 [batch + 1] on q's device, non-decreasing
    from 0); max_seqlen_q and max_seqlen_k bound the lengths (the grids cover them). lse [H, total_q] fp32 is
    the varlen forward's (launch(..., return_lse=True); -inf for a row that sees no key). Every tensor is read
    where it lies (any strides whose last dimension is contiguous); dq, dk, dv are allocated like q, k, v or,
    given, written through their strides; the keys no query sees get dK = dV = 0.{{gqa_doc}}\"\"\"
    import math

    import torch

    T, H, D = q.shape
    Tk = k.shape[0]
    dtype = torch.{torch_dtype}
    B = cu_seqlens_q.numel() - 1
    kv_heads = {kv_value}
    if D != HEAD_DIM.value or H % kv_heads:
        raise ValueError(f"expected q of shape [total_q, H, {{HEAD_DIM.value}}] with H a multiple of {{kv_heads}}, "
                         f"got {{tuple(q.shape)}}")
    for t, name, shape in ((q, "q", q.shape), (o, "o", q.shape), (do, "do", q.shape), (k, "k", (Tk, kv_heads, D)),
                           (v, "v", (Tk, kv_heads, D))):
        _check_rows(t, name, shape, dtype)   # the pre-pass reads o and do's rows as vectors
    if not _check(lse, "lse", (H, T), torch.float32).is_contiguous():
        raise ValueError("lse must be contiguous ([H, total_q], as the varlen forward returns it)")
    _check_offsets(cu_seqlens_q, cu_seqlens_k, B, q.device)
    for t, name, like in ((dq, "dq", q), (dk, "dk", k), (dv, "dv", v)):
        if t is not None:   # checked before any is written
            _check_rows(t, name, like.shape, dtype)
    dq = torch.empty_like(q) if dq is None else dq   # the gradients take their inputs' strides
    dk = torch.zeros_like(k) if dk is None else dk.zero_()   # keys no query sees (and key blocks past a
    dv = torch.zeros_like(v) if dv is None else dv.zero_()   # sequence's end) are not written by the kernel
    if B <= 0 or T == 0 or Tk == 0 or max_seqlen_q <= 0 or max_seqlen_k <= 0:   # no query or no key: no gradient
        dq.zero_()
        return dq, dk, dv
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    # each sequence's stats and dQ rows padded to a multiple of BLOCK_M (16-byte aligned TMA rows): its first
    # padded row pad_cu[b], on the device (no host sync); total_pad bounds the padded rows of one head
    block = BLOCK_M.value
    lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    pad_cu = torch.zeros(B + 1, device=q.device, dtype=torch.int32)
    torch.cumsum((lens + block - 1) // block * block, 0, dtype=torch.int32, out=pad_cu[1:])
    total_pad = _cdiv(T + B * (block - 1), block) * block
    stats, dq_acc = _fp32_buffers(H * total_pad, q.device)
    rows = _cdiv(_cdiv(max_seqlen_q, block) * block, PRE_ROWS.value)
    _launch(preprocess_varlen_kernel, (rows, H, B), 4, o, o.stride(0), o.stride(1), do, do.stride(0),
            do.stride(1), stats[1], lse, stats[0], dq_acc, cu_seqlens_q, pad_cu, T, total_pad)
    # the packed tensors as [1, heads, total, D] views (no copy): one TMA descriptor each
    q_desc = _tma_view(q.unsqueeze(0).transpose(1, 2), "q", [block, D])
    k_desc = _tma_view(k.unsqueeze(0).transpose(1, 2), "k", [BLOCK_N.value, D])
    v_desc = _tma_view(v.unsqueeze(0).transpose(1, 2), "v", [BLOCK_N.value, D])
    do_desc = _tma_view(do.unsqueeze(0).transpose(1, 2), "do", [block, D])
    dk4, dv4 = dk.unsqueeze(0).transpose(1, 2), dv.unsqueeze(0).transpose(1, 2)
    stats_desc = _tma_buffer(stats, [2, block], gl.float32, STATS_LAYOUT)
    dq_desc = _tma_buffer(dq_acc, [block, {dq_cols}], gl.float32)
    grid = (_cdiv(max_seqlen_k, BLOCK_N.value), B * kv_heads)
    _launch(backward_kernel, grid, NUM_WARPS, q_desc, k_desc, v_desc, do_desc, stats_desc, dq_desc, dk,
            *dk4.stride()[:3], dv, *dv4.stride()[:3], cu_seqlens_q, cu_seqlens_k, pad_cu, total_pad, kv_heads,
            sm_scale * LOG2E.value, sm_scale, H // kv_heads)
    _launch(dq_convert_varlen_kernel, (_cdiv(max_seqlen_q, PRE_ROWS.value), H, B), 4, dq_acc, dq,
            dq.stride(0), dq.stride(1), cu_seqlens_q, pad_cu, total_pad, sm_scale)
    return dq, dk, dv
""" + STATS

#: Value and token names of each tensor-core op (``None``: an accumulator carried in place).
MMA_VALUES = {"qk": "st", "dp": "dpt", "dk": "dk", "dv": "dv", "dq": "dqv"}
#: Register A operands kept alive until their wgmma retires.
MMA_OPERANDS = {"dk": "ds16", "dv": "p16"}


class _Compute:
    """Renders the compute partition: the schedule's ops in steady-state order, each wgmma retired by the
    first op that reads it (``warpgroup_mma_wait`` with the wgmmas issued after it still in flight). With
    ops in two stages the loop runs the stage-0 ops of iteration ``j`` and the stage-1 ops of ``jp = j - 1``,
    after a prologue (stage 0 of iteration 0) and before an epilogue (stage 1 of the last iteration)."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.split = plan.decisions.split
        self.operands = {} if self.split else MMA_OPERANDS   # register A operands (none: P, dS in smem)
        self.part = plan.compute[0]
        self.role_of = {op: role for role, op in self.part.roles.items()}
        base = min(plan.placement(op).stage for op in self.part.ops)
        self.offset = {op: plan.placement(op).stage - base for op in self.part.ops}
        self.names: dict[int, str] = {}
        self.inflight: list[str] = []
        order = {op: (self.offset[op], self.part.ops.index(op)) for op in self.part.ops}
        self.waiter = {b.name: min((op for r in plan.rings if r.barrier == b.name for op in r.consumers),
                                   key=order.__getitem__) for b in plan.barriers}

    def it(self, role: str) -> str:
        """The iteration variable of ``role``'s op in the section being rendered."""
        return self.names[self.offset[self.part.roles[role]]]

    def ring_of(self, role: str) -> str:
        op = self.part.roles[role]
        return next(r.name for r in self.plan.rings if op in r.consumers)

    def buffer(self, ring: str, role: str) -> str:
        return f"{ring}_ring.index({self.it(role)} % {ring.upper()}_DEPTH)"

    def ready(self, role: str) -> list[str]:
        """Wait for the ring buffer ``role`` reads (its barrier's first reader in the schedule waits)."""
        op = self.part.roles[role]
        ring = next(r for r in self.plan.rings if op in r.consumers)
        if self.waiter[ring.barrier] != op:
            return []
        i, depth = self.it(role), f"{ring.name.upper()}_DEPTH"
        return [f"mbarrier.wait({ring.barrier}_ready.index({i} % {depth}), ({i} // {depth}) & 1)  # ready: "
                f"{self.plan.wait('ready', op).why}"]

    def retire(self, role: str) -> list[str]:
        """``warpgroup_mma_wait`` until ``role``'s wgmma (and every earlier one) retired."""
        if role not in self.inflight:
            return []
        k = self.inflight.index(role)
        done, self.inflight = self.inflight[: k + 1], self.inflight[k + 1:]
        values = [MMA_VALUES[r] for r in done] + [self.operands[r] for r in done if r in self.operands]
        deps = [f"{MMA_VALUES[r]}_tok" for r in done] + [self.operands[r] for r in done if r in self.operands]
        why = self.plan.retire(self.part.roles[role]).why
        return [f"{', '.join(values)} = warpgroup_mma_wait({len(self.inflight)}, deps=[{', '.join(deps)}])  # "
                f"{role} retired ({why})"]

    def issue(self, role: str, a: str, b: str, acc: str, use_acc: bool) -> list[str]:
        self.inflight.append(role)
        at = self.plan.placement(self.part.roles[role])
        flag = "" if use_acc else ", use_acc=False"
        return [f"# {at.name}: start {at.start}, stage {at.stage}",
                f"{MMA_VALUES[role]}_tok = warpgroup_mma({a}, {b}, {acc}{flag}, is_async=True)"]

    def op_lines(self, role: str) -> list[str]:
        """The lines of one op (unindented)."""
        if role == "qk":
            q = self.buffer("q", role)
            return self.ready(role) + self.issue(role, "k_smem", f"{q}.permute((1, 0))", "st_zero", False)
        if role == "dp":
            do = self.buffer("do", role)
            return self.ready(role) + self.issue(role, "v_smem", f"{do}.permute((1, 0))", "st_zero", False)
        if role == "exp":
            return [*self.ready(role), *self.retire("qk"),
                    "# stats row 0: LSE (natural log), one per query: a [1, BLOCK_M] row in the S^T layout",
                    f"lse = gl.max({self.buffer('stats', role)}.slice(0, 1).load(st_layout), 0) * LOG2E",
                    f"m_start = (m_first + {self.it(role)} % n_m) * BLOCK_M",
                    f"if {self.mask_condition()}:",
                    "    st = mask_scores(st, n_pos, m_start, seq_q, st_layout)",
                    "p = gl.exp2(st * qk_scale - lse[None, :])  # P^T = exp(S^T * sm_scale - LSE)"]
        if role == "ds":
            return [*self.ready(role), *self.retire("dp"),
                    f"delta = gl.max({self.buffer('stats', role)}.slice(1, 1).load(st_layout), 0)  # stats row 1: "
                    f"D = rowsum(dO O)",
                    "ds = p * (dpt - delta[None, :])  # dS^T = P^T * (dP^T - D); sm_scale folded in later"]
        if role == "p_cvt":
            return ["p16 = gl.convert_layout(p.to(DTYPE), op_layout)  # P^T: register A operand of dV"]
        if role == "p_store":   # split queries: each warp group holds half of P^T's queries, dV needs them all
            return [*self.retire("dv"),
                    "p_smem.store(p.to(DTYPE))  # P^T: shared A operand of dV",
                    "fence_async_shared()",
                    "gl.thread_barrier()  # both warp groups stored their P columns before either reads them"]
        if role == "ds_store":
            last_readers = [*self.retire("dk"), *self.retire("dq")] if self.split else []   # dK reads dS^T too
            return [*last_readers,
                    "ds_smem.store(ds.to(DTYPE))  # dS^T for dQ = dS K",
                    "fence_async_shared()",
                    "gl.thread_barrier()  # both warp groups stored their dS rows before either reads them"]
        if role == "dv":
            p = "p_smem" if self.split else "p16"
            return self.ready(role) + self.issue(role, p, self.buffer("do", role), "dv", True)
        if role == "dk":
            if self.split:
                return self.ready(role) + self.issue(role, "ds_smem", self.buffer("q", role), "dk", True)
            return ["ds16 = gl.convert_layout(ds.to(DTYPE), op_layout)  # dS^T: register A operand of dK",
                    *self.ready(role), *self.issue(role, "ds16", self.buffer("q", role), "dk", True)]
        if role == "dq":
            if self.split:
                return self.dq_chunks()
            return self.issue(role, "ds_smem.permute((1, 0))", "k_smem", "dq_zero", False)
        if self.split:   # dq_store: each chunk was staged and reduced with its wgmma (dq_chunks)
            return []
        i = self.it(role)
        return [*self.retire("dq"),
                f"mbarrier.wait(dq_empty.index({i} % DQ_DEPTH), (({i} // DQ_DEPTH) & 1) ^ 1)  # empty: "
                f"{self.plan.wait('empty', self.part.roles['dq_store']).why}",
                f"dq_stage.index({i} % DQ_DEPTH).store(dqv)  # fp32 dQ for the producer's dq_atomic",
                "fence_async_shared()  # the stores visible to the producer's TMA reduce",
                "gl.thread_barrier()  # every warp stored its dQ rows",
                f"mbarrier.arrive(dq_ready.index({i} % DQ_DEPTH))  # ready: dQ staged for dq_atomic, which may "
                f"start now (the schedule's dq_store -> dq_atomic)"]

    def dq_chunks(self) -> list[str]:
        """The split-query backward's dQ = dS K (the dq op) and its staging and reduce (dq_store), DQ_CHUNK columns
        at a time: every wgmma in flight retires first (a chunk's wait retires all earlier ones), then each
        chunk's wgmma reads dS^T and K's chunk columns; once a chunk retired, the next one's wgmma is issued
        and runs while the retired chunk's fp32 result waits for its slot's last reduce to have read the slot,
        is stored there and reduce-added at the query block's dQ rows by one TMA (issued for the partition by
        one thread). Staging with the wgmma moves dq_store no later than scheduled."""
        i = self.it("dq")
        at = self.plan.placement(self.part.roles["dq"])
        store = self.plan.placement(self.part.roles["dq_store"])
        lines = [*(self.retire(self.inflight[-1]) if self.inflight else []),
                 f"# {at.name}: start {at.start}, stage {at.stage}; {store.name} (start {store.start}, stage "
                 f"{store.stage}) with each chunk",
                 f"_, prow, _ = query_block({i}, {block_args(self.plan)})  # the query block's first row of the dQ "
                 f"accumulator",
                 "k_cols = k_smem.slice(0, DQ_CHUNK, 1)  # K's chunk columns (B of dQ = dS K)",
                 "dqv_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_cols, dq_zero, use_acc=False, is_async=True)",
                 "for c in gl.static_range(HEAD_DIM // DQ_CHUNK):",
                 "    dqv = warpgroup_mma_wait(0, deps=[dqv_tok])  # chunk c",
                 "    if c + 1 < HEAD_DIM // DQ_CHUNK:  # chunk c + 1 on the tensor core while chunk c is staged",
                 "        k_cols = k_smem.slice((c + 1) * DQ_CHUNK, DQ_CHUNK, 1)",
                 "        dqv_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_cols, dq_zero, use_acc=False,",
                 "                                is_async=True)",
                 "    tma.store_wait(DQ_SLOTS - 1)  # the reduce that last read this slot has read it",
                 "    gl.thread_barrier()",
                 "    dq_stage.index(c % DQ_SLOTS).store(dqv)",
                 "    fence_async_shared()  # the stores visible to the TMA reduce",
                 "    gl.thread_barrier()  # every warp stored its dQ rows",
                 "    tma_reduce_add(dq_desc, [prow, c * DQ_CHUNK], dq_stage.index(c % DQ_SLOTS))"]
        return lines

    def store_offsets(self) -> list[str]:
        """The epilogue's (batch, K/V head) and the offsets of the key block's dK and dV rows (varlen: the
        sequence's keys from its first packed row k_base)."""
        base, rows = ("", "k_base + keys + shift") if self.plan.decisions.varlen else ("b * {t}_stride_b + ",
                                                                                     "keys + shift")
        return [*([] if self.plan.decisions.varlen else ["    b = bh_kv.to(gl.int64) // kv_heads"]),
                "    kv_h = bh_kv.to(gl.int64) % kv_heads",
                "    # the key block's rows from n_pos, the query-axis position the loop kept (key = n_pos + seq_k - "
                "seq_q)",
                "    keys = (n_pos + rows).to(gl.int64)[:, None]",
                "    shift = (seq_k - seq_q).to(gl.int64)",
                "    mask = (n_pos + rows < seq_q)[:, None]  # key < seq_k",
                *(f"    {t}_offs = {base.format(t=t)}kv_h * {t}_stride_h + ({rows}) * {t}_stride_s + cols[None, :]"
                  for t in ("dk", "dv"))]

    def mask_condition(self) -> str:
        """When a tile needs the mask: a ragged key tail, or (causal) a query block reaching into the key block."""
        cond = "(n_pos + BLOCK_N > seq_q) | (m_start + BLOCK_M > seq_q)"   # keys on the query axis (mask_scores)
        return cond + (" | (m_start < n_pos + BLOCK_N)" if self.plan.decisions.causal else "")

    def section(self, names: dict[int, str], ind: str) -> list[str]:
        """The ops of the stages in ``names`` (stage offset -> iteration variable), then the retirement of
        every wgmma and the releases of the buffers whose last reader ran."""
        self.names, self.inflight = names, []
        lines = []
        for op in self.part.ops:
            if self.offset[op] in names:
                lines += self.op_lines(self.role_of[op])
        if self.inflight:
            lines += self.retire(self.inflight[-1])
        lines.append("gl.thread_barrier()  # every warp retired its wgmmas")
        for b in self.plan.barriers:
            release = next(r.release for r in self.plan.rings if r.name == b.rings[0])
            if self.offset[release] in names:
                i = names[self.offset[release]]
                lines.append(f"mbarrier.arrive({b.name}_empty.index({i} % {b.rings[0].upper()}_DEPTH))  # empty: "
                             f"ring {'/'.join(b.rings)} buffer read by its last reader, {release}")
        return [ind + line for line in lines]

    def loop(self) -> list[str]:
        if max(self.offset.values()) == 0:
            return ["    for j in range(0, n_iters):", *self.section({0: "j"}, " " * 8)]
        return ["    # prologue: the stage-0 ops of iteration 0", "    i0 = 0", *self.section({0: "i0"}, " " * 4),
                "    # steady state: stage 0 of iteration j, stage 1 of iteration jp = j - 1",
                "    for j in range(1, n_iters):", "        jp = j - 1", *self.section({0: "j", 1: "jp"}, " " * 8),
                "    # epilogue: the stage-1 ops of the last iteration", "    il = n_iters - 1",
                *self.section({1: "il"}, " " * 4)]

    def render(self) -> str:
        part = self.part
        dq_warps = dq_warps_of(self.plan)
        dq_cols = "DQ_CHUNK" if self.split else "HEAD_DIM"
        dq_n = dq_cols if dq_warps[1] == 1 else f"{dq_cols} // {dq_warps[1]}"
        head = compute_def(self.plan, compute_params(self.plan), (),
                           f"Warp group {part.group} ({part.num_warps} warps, two wgmma warp groups cooperating on "
                           f"every tile): dK and dV of the key block over its query blocks.")
        # 64 key rows (split queries): the warp groups split S^T's queries and dK's, dV's head dimension
        warps, half = ("[4, 2]", " // 2") if self.split else ("[COMPUTE_WARPS, 1]", "")
        layouts = [*_accumulator_layout("st_layout", warps, "BLOCK_M" + half),
                   *_accumulator_layout("kv_layout", warps, "HEAD_DIM" + half)]
        operand = ([] if self.split else
                   ["    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)"])
        drain = (["    tma.store_wait(0)  # the last dQ reduces have read their staging buffers"] if self.split
                 else [])
        lines = head + [
            *layouts,
            *_accumulator_layout("dq_layout", str(list(dq_warps)), dq_n),
            *operand,
            "    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)",
            "    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)",
            "    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)",
            f"    dq_zero = gl.zeros([BLOCK_M, {dq_cols}], gl.float32, dq_layout)",
            "    mbarrier.wait(kv_bar, 0)  # K and V of the key block loaded by load_partition",
            *self.loop(),
            *drain,
            "    # dK = sm_scale * sum dS^T Q, dV = sum P^T dO; keys past seq_k are not stored",
            "    rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, kv_layout))",
            "    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, kv_layout))",
            "    # through dK's and dV's strides; the (batch, K/V head) found here: nothing kept over the loop",
            "    # in 64 bits: the kernel's own 32-bit b (the producer's) is not reused, which would keep it in a",
            "    # register over the loop",
            *self.store_offsets(),
            "    gl.store(dk_ptr + dk_offs, (dk * sm_scale).to(DTYPE), mask=mask)",
            "    gl.store(dv_ptr + dv_offs, dv.to(DTYPE), mask=mask)",
        ]
        return "\n".join(lines) + "\n"


def _accumulator_layout(name: str, warps: str, n: str) -> list[str]:
    """The lines declaring the wgmma accumulator layout ``name`` with ``warps`` and instruction width ``n``."""
    return [f"    {name}: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta={warps},",
            f"{' ' * 56}instr_shape=[16, {n}, 16])"]


def dq_warps_of(plan: KernelPlan) -> tuple[int, int]:
    """The 8 compute warps of dQ = dS K [BLOCK_M, HEAD_DIM]: along M as far as its rows allow (a wgmma warp
    group takes 64 rows), the rest along the head dimension: [4, 2] at BLOCK_M 64, [8, 1] at 128."""
    along_m = min(8, plan.tile["block_m"] // 16)
    return along_m, 8 // along_m


def compute_params(plan: KernelPlan) -> tuple[str, ...]:
    """The compute partition's parameters (the kernel passes the same names)."""
    params = SPLIT_COMPUTE_PARAMS if plan.decisions.split else COMPUTE_PARAMS
    if plan.decisions.varlen:
        params += VARLEN_COMPUTE_PARAMS + (VARLEN_SPLIT_COMPUTE_PARAMS if plan.decisions.split else ())
    return params


def block_args(plan: KernelPlan) -> str:
    """The arguments of ``query_block`` after the iteration: :data:`BLOCK_ARGS`, :data:`VARLEN_BLOCK_ARGS`."""
    return VARLEN_BLOCK_ARGS if plan.decisions.varlen else BLOCK_ARGS


def helpers_source(plan: KernelPlan) -> str:
    """The helper kernels and functions: query blocks, the mask, the dQ reduce, the pre-pass, the conversion
    (varlen: their packed-sequence forms besides)."""
    causal_doc = ", or (causal) the key is after the query" if plan.decisions.causal else ""
    causal_keep = "    keep = keep & (keys[:, None] <= queries[None, :])\n" if plan.decisions.causal else ""
    query_block = (VARLEN_HELPERS if plan.decisions.varlen else QUERY_BLOCK).strip("\n")
    dq_reduce = "" if plan.decisions.split else DQ_REDUCE.format()
    return HELPERS.format(query_block=query_block, causal_doc=causal_doc, causal_keep=causal_keep,
                          dq_reduce=dq_reduce)


def launch_source(plan: KernelPlan) -> str:
    """The host launcher: pre-pass, shape and dtype checks, the stats rows, the kernel and the dQ conversion."""
    decided: FlashBwdDecisions = plan.decisions
    kv_check = kv_shape_source(decided.kv_heads, "HEAD_DIM.value")
    kv, gqa_doc = (("KV_HEADS", " dk, dv are summed over the query heads of each K/V head's group.")
                   if decided.kv_heads else ("H", ""))
    if decided.varlen:
        launch = VARLEN_LAUNCH.format(mask=", causal mask" if decided.causal else "", kv=kv, dtype=plan.dtype,
                                      torch_dtype=TORCH_DTYPES[plan.dtype],
                                      kv_value="KV_HEADS.value" if decided.kv_heads else "H",
                                      dq_cols="DQ_CHUNK.value" if decided.split else "D")
        return (ATTENTION_HOST + "\n\n\n" + VARLEN_OFFSETS.strip("\n") + "\n\n"
                + launch.replace("{gqa_doc}", gqa_doc))
    chunk_arg = (",\n            max(1, _sm_count(q.device.index) // grid[0])" if decided.causal else "")
    launch = LAUNCH.format(mask=", causal mask" if decided.causal else "", kv=kv, dtype=plan.dtype,
                           sk_note=": the mask is aligned bottom-right" if decided.causal else "",
                           torch_dtype=TORCH_DTYPES[plan.dtype], kv_check=kv_check, gqa_doc=gqa_doc,
                           chunk_arg=chunk_arg, dq_cols="DQ_CHUNK.value" if decided.split else "D")
    launch = ATTENTION_HOST + "\n\n" + launch  # LAUNCH opens with a newline
    return (SM_COUNT.strip("\n") + "\n\n" + launch) if decided.causal else launch


#: Where a CTA of the causal backward finds its key block and (batch, K/V head): key block ``n`` meets the query
#: blocks from its diagonal on, so key block 0 is the heaviest (:func:`heaviest_first_chunks`).
CAUSAL_ORDER = (
    "    # causal: chunks of heads_per_chunk heads, each chunk's key blocks heaviest first across its heads",
    "    n_blocks = gl.num_programs(0)",
    *heaviest_first_chunks("(gl.program_id(0) + gl.program_id(1) * n_blocks)", "n_blocks", "gl.num_programs(1)",
                           "key_block", "bh_kv"),
    "    n_start = key_block * BLOCK_N",
)


def _setup(plan: KernelPlan) -> tuple[str, ...]:
    """Program ids, the key block, the query blocks it meets, the resident and staging buffers."""
    first = ("    # causal: query blocks before the key block's first key position see none of its keys; every key\n"
             "    # is seen by some query, so n_m >= 1\n"
             "    m_first = gl.maximum(n_pos, 0) // BLOCK_M"
             if plan.decisions.causal else "    m_first = 0")
    plain = ("    n_start = gl.program_id(0) * BLOCK_N", "    bh_kv = gl.program_id(1)  # batch * K/V heads")
    order = CAUSAL_ORDER if plan.decisions.causal and not plan.decisions.varlen else plain
    return (
        *order,
        "    b = bh_kv // kv_heads  # batch",
        "    kv_h = bh_kv % kv_heads  # K/V head",
        *(VARLEN_SEQUENCE if plan.decisions.varlen else ()),
        "    # the key block's first key on the query axis: causal is aligned bottom-right (key j at j - (seq_k -",
        "    # seq_q)), so the compute partition masks keys and queries in one coordinate, and a key is past seq_k",
        "    # exactly when its position is past seq_q",
        "    n_pos = n_start - (seq_k - seq_q)",
        first,
        "    n_m = gl.cdiv(seq_q, BLOCK_M) - m_first",
        "    n_iters = group * n_m  # query heads of the group x query blocks",
        "    kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], DTYPE)",
        "    k_smem = gl.allocate_shared_memory(DTYPE, [BLOCK_N, HEAD_DIM], kv_smem_layout)",
        "    v_smem = gl.allocate_shared_memory(DTYPE, [BLOCK_N, HEAD_DIM], kv_smem_layout)",
        "    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
        "    mbarrier.init(kv_bar, count=1)",
        "    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], DTYPE)",
        "    ds_smem = gl.allocate_shared_memory(DTYPE, [BLOCK_N, BLOCK_M], ds_layout)",
        *(_SPLIT_STAGING if plan.decisions.split else _STAGING),
    )


#: The varlen backward's sequence: its rows in the packed tensors and its first padded stats row (b is the
#: sequence); a key block past the sequence's keys, or a sequence of no queries, has nothing to add (the launcher
#: zeroes dK and dV).
VARLEN_SEQUENCE = (
    "    # varlen: sequence b's first rows and lengths in the packed q and k/v, its first padded stats row",
    "    q_base = gl.load(cu_seqlens_q + b)",
    "    seq_q = gl.load(cu_seqlens_q + b + 1) - q_base",
    "    k_base = gl.load(cu_seqlens_k + b)",
    "    seq_k = gl.load(cu_seqlens_k + b + 1) - k_base",
    "    pad_base = gl.load(pad_cu + b)",
    "    if (n_start >= seq_k) | (seq_q == 0):  # the grid covers max_seqlen_k keys per sequence",
    "        return",
)

#: dQ staging of the backward whose producer reduces whole dQ tiles: DQ_DEPTH buffers and their barriers.
_STAGING = (
    "    dq_stage = gl.allocate_shared_memory(gl.float32, [DQ_DEPTH, BLOCK_M, HEAD_DIM], dq_desc.layout)",
    "    dq_ready = gl.allocate_shared_memory(gl.int64, [DQ_DEPTH, 1], mbarrier.MBarrierLayout())",
    "    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_DEPTH, 1], mbarrier.MBarrierLayout())",
    "    for s in gl.static_range(DQ_DEPTH):",
    "        mbarrier.init(dq_ready.index(s), count=1)  # the compute partition staged dQ",
    "        mbarrier.init(dq_empty.index(s), count=1)  # the producer reduced it",
)
#: The split-query backward's P^T tile and dQ chunk slots (the compute warps reduce them: no barriers).
_SPLIT_STAGING = (
    "    p_smem = gl.allocate_shared_memory(DTYPE, [BLOCK_N, BLOCK_M], ds_layout)",
    "    dq_stage = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS, BLOCK_M, DQ_CHUNK], dq_desc.layout)",
)


def _producer(plan: KernelPlan) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """The producer's ``dq_atomic`` lines (iteration ``j - DQ_LAG``) and the drain after its loop (none in the
    split-query backward, whose compute warps reduce dQ)."""
    if plan.decisions.split:
        return {}, ()
    (atomic,) = [n for n in plan.load.ops if plan.placement(n).role == "dq_atomic"]
    at = plan.placement(atomic)
    why = plan.wait("ready", atomic).why
    call = "dq_reduce(dq_stage, dq_ready, dq_empty, dq_desc, i, prow)"
    lag = plan.decisions.dq_lag
    lines = [f"        # {atomic}: start {at.start}, stage {at.stage} -> dQ of iteration j - DQ_LAG ({why})"]
    if lag:
        lines += ["        if j >= DQ_LAG:", "            i = j - DQ_LAG",
                  f"            _, prow, _ = query_block(i, {block_args(plan)})", f"            {call}"]
        after = ("    for i in range(gl.maximum(n_iters - DQ_LAG, 0), n_iters):  # drain: the last DQ_LAG dQ tiles",
                 f"        _, prow, _ = query_block(i, {block_args(plan)})", f"        {call}")
    else:
        lines += ["        i = j", f"        {call}"]
        after = ()
    return {atomic: tuple(lines)}, after


#: The backward kernel's docstring, and the varlen backward's.
KERNEL_DOC = ("dK, dV of one key block of one (batch, K/V head) and its dQ contributions (fp32, added to dq_desc's "
              "[B*H*S_pad, D]); Q, dO are [B, H, S, D], K, V [B, KV_HEADS, Sk, D], read by rank-4 TMA descriptors "
              "with their own strides; dK, dV stored through dk_stride_*, dv_stride_*; stats [2, B*H*S_pad] holds "
              "LSE and D (S_pad: seq_q rounded up to BLOCK_M).")
VARLEN_KERNEL_DOC = ("dK, dV of one key block of one (sequence, K/V head) and its dQ contributions (fp32, added to "
                     "dq_desc's [H*total_pad, D]); Q, dO are packed [total_q, H, D], K, V [total_k, KV_HEADS, D], "
                     "read as [1, heads, total, D] by rank-4 TMA descriptors, sequence b in rows "
                     "cu_seqlens_*[b]:cu_seqlens_*[b + 1]; dK, dV stored through dk_stride_*, dv_stride_*; stats "
                     "[2, H*total_pad] holds LSE and D, sequence b's rows of head h from h*total_pad + pad_cu[b] (each "
                     "sequence's length rounded up to BLOCK_M).")


def body(plan: KernelPlan) -> KernelBody:
    """The attention backward's part of the emitted module."""
    decided: FlashBwdDecisions = plan.decisions
    t, part = plan.tile, plan.compute[0]
    load_ops, load_after = _producer(plan)
    if decided.split:
        staging = [("DQ_CHUNK", decided.dq_chunk, "dQ columns per wgmma, staging buffer and TMA reduce-add (graph)"),
                   ("DQ_SLOTS", decided.dq_depth, "dQ chunk staging buffers, reduced by the compute warps")]
        dq_doc = (f"dQ in {t['head_dim'] // decided.dq_chunk} chunks of {decided.dq_chunk} columns, each staged in "
                  f"one of {decided.dq_depth} fp32 buffer(s) and reduce-added by the compute warps (one TMA)")
        operands = ("layouts: warp groups split S^T's queries and dK's, dV's head dimension (warps [4, 2]); P^T "
                    "and dS^T in shared memory, the A operands of dV and dK, and dS^T of dQ = dS K")
    else:
        staging = [("DQ_DEPTH", decided.dq_depth,
                    "dQ staging buffers: stage(dq_atomic) - stage(dq_store) + 1 (schedule)"),
                   ("DQ_LAG", decided.dq_lag, "the producer reduces the dQ of iteration j - DQ_LAG in iteration j: "
                                              "stage(dq_atomic) - stage(load_q) (schedule)")]
        dq_doc = (f"dQ staged in {decided.dq_depth} fp32 buffer(s), added by the producer warp with one TMA "
                  f"reduce-add per tile {decided.dq_lag} producer iteration(s) after its loads")
        operands = ("layouts: S^T, dP^T, dK, dV in the wgmma accumulator layout (warps along keys); P^T, dS^T as "
                    "register A operands of dV, dK; dS^T in shared memory for dQ = dS K")
    extra = [*staging,
             ("PRE_ROWS", pre_rows(t["head_dim"]), "rows per program of the dO.O pre-pass and the dQ conversion"),
             ("LOG2E", 1.4426950408889634, "the kernel runs in base 2; LSE is a natural log")]
    if decided.kv_heads:
        extra.append(("KV_HEADS", decided.kv_heads, "K/V heads (grouped-query: a CTA sums dK/dV over the query heads "
                                                    "h of its K/V head, h // (H // KV_HEADS))"))
    order = ", ".join(part.ops)
    decisions = [f"decisions: compute ops in the schedule's steady-state order ({order}), each wgmma retired by "
                 f"its first reader; {dq_doc}",
                 f"{operands} (warps {list(dq_warps_of(plan))})"]
    if decided.causal:
        decisions.append("causal: a key block meets the query blocks from its diagonal on (m_first); tiles "
                         "reaching into the key block are masked (key <= query)")
    if decided.kv_heads:
        decisions.append(f"grouped-query: {decided.kv_heads} K/V heads; a CTA loops over the query heads of its "
                         f"group")
    # varlen: the packed tensors as [1, heads, total, D] views, the sequence's rows from q_base and k_base
    q_coords = "[0, h, q_base + m_start, 0]" if decided.varlen else "[b, h, m_start, 0]"
    kv_block = ("[0, kv_h, k_base + n_start, 0]  # the key block of (sequence b, K/V head kv_h)" if decided.varlen
                else "[b, kv_h, n_start, 0]  # the key block of (batch b, K/V head kv_h)")
    lengths = ((("cu_seqlens_q", '"*i32"'), ("cu_seqlens_k", '"*i32"'), ("pad_cu", '"*i32"'),
                ("total_pad", '"i32"')) if decided.varlen else (("seq_q", '"i32"'), ("seq_k", '"i32"')))
    signature = (("q_desc", "_desc_type([1, 1, BLOCK_M.value, HEAD_DIM.value])"),
                 ("k_desc", "_desc_type([1, 1, BLOCK_N.value, HEAD_DIM.value])"),
                 ("v_desc", "_desc_type([1, 1, BLOCK_N.value, HEAD_DIM.value])"),
                 ("do_desc", "_desc_type([1, 1, BLOCK_M.value, HEAD_DIM.value])"),
                 ("stats_desc", "_desc_type([2, BLOCK_M.value], gl.float32, STATS_LAYOUT)"),
                 ("dq_desc", f"_desc_type([BLOCK_M.value, {'DQ_CHUNK' if decided.split else 'HEAD_DIM'}.value], "
                             "gl.float32)"),
                 ("dk_ptr", '"*" + str(DTYPE.value)'), ("dk_stride_b", '"i32"'), ("dk_stride_h", '"i32"'),
                 ("dk_stride_s", '"i32"'), ("dv_ptr", '"*" + str(DTYPE.value)'), ("dv_stride_b", '"i32"'),
                 ("dv_stride_h", '"i32"'), ("dv_stride_s", '"i32"'), *lengths, ("kv_heads", '"i32"'),
                 ("qk_scale", '"fp32"'), ("sm_scale", '"fp32"'), ("group", '"i32"'),
                 *((("heads_per_chunk", '"i32"'),) if decided.causal and not decided.varlen else ()))
    return KernelBody(
        title="Warp-specialized attention backward for Hopper (sm_90), Gluon / Triton 3.6.",
        summary="Generated warp-specialized Gluon attention backward; see the header comment.",
        decisions=tuple(decisions),
        tile_constants=(("BLOCK_M", t["block_m"], "query rows per iteration"),
                        ("BLOCK_N", t["block_n"], "keys of the CTA's resident K/V block"),
                        ("HEAD_DIM", t["head_dim"], "head dimension")),
        extra_constants=tuple(extra),
        functions=helpers_source(plan).strip("\n") + "\n\n\n" + _Compute(plan).render(),
        kernel="backward_kernel",
        kernel_params=", ".join(name for name, _ in signature),
        kernel_doc=VARLEN_KERNEL_DOC if decided.varlen else KERNEL_DOC,
        setup=_setup(plan),
        iv="j",
        trip="n_iters",
        buffer_shapes={"q": "BLOCK_M, HEAD_DIM", "do": "BLOCK_M, HEAD_DIM", "stats": "2, BLOCK_M"},
        coords={"q": q_coords, "do": q_coords, "stats": "[0, prow]"},
        tma_shapes={"q": "1, 1, BLOCK_M, HEAD_DIM", "do": "1, 1, BLOCK_M, HEAD_DIM"},
        load_params=("k_desc", "v_desc", "k_smem", "v_smem", "kv_bar",
                     *(() if decided.split else ("dq_stage", "dq_ready", "dq_empty", "dq_desc")),
                     "b", "n_start", "bh_kv", "kv_h", "group", "m_first", "n_m", "seq_q",
                     *(("q_base", "k_base", "pad_base", "total_pad") if decided.varlen else ())),
        load_setup=("    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)",
                    f"    kv_block = {kv_block}",
                    "    tma.async_copy_global_to_shared(k_desc, kv_block, kv_bar,",
                    "                                    k_smem.reshape([1, 1, BLOCK_N, HEAD_DIM]))",
                    "    tma.async_copy_global_to_shared(v_desc, kv_block, kv_bar,",
                    "                                    v_smem.reshape([1, 1, BLOCK_N, HEAD_DIM]))"),
        compute_params=compute_params(plan),
        constexprs=(),
        before_specialize=(),
        results="",
        epilogue=(),
        signature=signature,
        launch=launch_source(plan),
        buffer_dtypes={"stats": "gl.float32"},
        load_iteration=(f"        h, prow, m_start = query_block(j, {block_args(plan)})",),
        load_ops=load_ops,
        load_after=load_after,
        imports=IMPORTS,
    )
