"""The attention-forward body of the shared Gluon module (:mod:`~twill.codegen.gluon.render`): one compute
partition function for every sub-tile, the online softmax, the Q loads and the launcher.

Shape of the emitted kernel: ``load_partition`` (TMA producer) loads each compute partition's Q sub-tile
once, then streams K and V tiles into their rings; ``compute_partition`` runs once per sub-tile (``SUB``, a
constexpr; sub-tile 0 is the default partition) with S and O accumulators in registers and P kept in
registers as the A operand of the second wgmma. When the schedule puts ``pv`` one stage after ``qk`` the
steady state issues ``S(j+1)`` together with ``O += P(j) V(j)`` and runs the softmax of ``j+1`` while that
PV runs; with two or three compute partitions each wgmma turn is guarded by a ``turn`` mbarrier per
partition: a partition waits on its own barrier and passes the tensor core on by arriving on the barrier of
the next turn's partition (ping-pong with two, a round robin in the schedule's order with three).

Causal kernels (``causal`` of the plan's :class:`~twill.kernels.flash_fwd.plan.FlashDecisions`) stop each
query block's loop at its diagonal, mask the scores of the diagonal iterations per sub-tile inside
``online_softmax`` and take query blocks heaviest first; grouped-query kernels (``kv_heads``) read K/V head
``h // group``; every kernel stores the natural-log LSE when ``lse_ptr`` is not ``None`` (docs/codegen.md,
"Causal attention, grouped K/V heads, LSE").

Decisions that differ between the partitions become constexpr parameters of ``compute_partition`` (and
static ``if``\\ s); decisions they share are rendered directly.

Layout policy: S and O use the wgmma accumulator layout (``NVMMADistributedLayout`` v3, warps along M);
row statistics (max, sum, alpha) live in ``SliceLayout(1, ·)`` of S and are converted to O's slice layout
for the rescale; P is converted to ``DotOperandLayout(0, O layout, k_width=2)`` and never leaves registers.
"""

from __future__ import annotations

from collections.abc import Callable

from twill.codegen.gluon.render import (ATTENTION_HOST, GL_DTYPES, SM_COUNT, TORCH_DTYPES, VARLEN_OFFSETS, KernelBody,
                                        compute_def, heaviest_first_chunks, kv_shape_source, wrap)
from twill.codegen.plan import KernelPlan
from twill.kernels.flash_fwd.plan import FP8_DTYPES, PROGRAM_ORDER

#: Parameters of the compute partition after the rings and barriers (the kernel passes the same names).
COMPUTE_PARAMS = ("q_smem", "q_bar", "turn_bars", "o_head", "o_stride_s", "lse_ptr", "q_row", "q_start", "seq_q",
                  "seq_k", "n_tiles", "qk_scale")
#: The same for the persistent kernel, which finds each query block's rows and trip count itself.
PERSISTENT_COMPUTE_PARAMS = ("q_smem", "q_bar", "q_empty", "item_smem", "turn_bars", "o_ptr", "o_stride_b",
                             "o_stride_h", "o_stride_s", "lse_ptr", "n_m", "n_items", "seq_q", "seq_k",
                             "heads", "qk_scale")

#: Parameters the fp8 kernel adds to the compute partition: the per-(batch, query head) descale factors.
FP8_COMPUTE_PARAMS = ("qk_descale_ptr", "v_descale_ptr")
#: fp8: P = exp2(S*scale - m + P_OFFSET) lies in [0, 2^P_OFFSET], where e4m3 keeps more of its precision than
#: in [0, 1] (FA3's max offset); the row sums carry the same factor, so O = (sum P V) / l is unchanged and the
#: LSE subtracts it.
FP8_P_OFFSET = 8.0

#: Head dims from which the steady loop puts a scheduling fence before its ``wgmma`` wait for ``O += P V``
#: (:meth:`_Compute.pv_wait_fence`). Without it ptxas hoists that wait above the softmax it should overlap;
#: the fence pays where the P V is long (D = 128 and 256), not at D = 64, whose loop is bound by the softmax
#: chain, not by the P V (docs/codegen.md, "From schedule to kernel", the P V wait fence; docs/performance.md,
#: "The P V wait and ptxas").
PV_WAIT_FENCE_MIN_HEAD_DIM = 128

SOFTMAX = """
@gluon.jit
def online_softmax(s, m_i, l_i, kv_start, seq_k, qk_scale, col_layout: gl.constexpr):
    \"\"\"One online-softmax step on S (fp32, wgmma layout): returns P = exp2(S*scale - m_new), alpha =
    exp2(m_old - m_new), m_new and l_new = l*alpha + rowsum(P). Keys past seq_k are masked to -inf.\"\"\"
    if kv_start + BLOCK_N > seq_k:
        cols = gl.arange(0, BLOCK_N, col_layout)
        s = gl.where((kv_start + cols < seq_k)[None, :], s, float("-inf"))
{STEP}
"""

CAUSAL_SOFTMAX = """
@gluon.jit
def online_softmax(s, m_i, l_i, kv_start, q_first, qk_scale, s_layout: gl.constexpr):
    \"\"\"One online-softmax step on S (fp32, wgmma layout): returns P = exp2(S*scale - m_new), alpha =
    exp2(m_old - m_new), m_new and l_new = l*alpha + rowsum(P). Causal, aligned bottom-right: q_first is the
    last key the sub-tile's first query sees (its position + seq_k - seq_q); on a diagonal tile (one holding a
    key after q_first) keys after each row's last key are masked to -inf; the tiles before the diagonal take
    no mask. No key past seq_k is unmasked for a row below seq_q (key <= query + seq_k - seq_q), and rows past
    seq_q are never stored. A row that has seen no key yet (seq_k < seq_q: its first seq_q - seq_k rows see
    none) keeps m = -inf and gets P = 0 and alpha = 0, not NaN (m_use).\"\"\"
    if kv_start + BLOCK_N > q_first + 1:
        cols = kv_start + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        rows = q_first + gl.arange(0, SUB_M, gl.SliceLayout(1, s_layout))
        s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
{STEP}
"""

STEP = """\
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # rowmax (m kept in scaled log2 units)
    alpha = gl.exp2(m_i - m_new)                      # alpha
    p = gl.exp2(s * qk_scale - m_new[:, None])        # exp: one FMA + ex2 per element
    l_new = l_i * alpha + gl.sum(p, 1)                # rowsum
    return p, alpha, m_new, l_new"""

#: The persistent kernel's hand-over of a work item from the producer to the compute partitions.
ITEM_SOURCE = """
@gluon.jit
def write_item(item_smem, item):
    \"\"\"Store work item ``item`` in the one-slot ``item_smem`` (the producer, before its arrive on q_bar).\"\"\"
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    item_smem.store(gl.full([1], item, gl.int32, layout))


@gluon.jit
def read_item(item_smem):
    \"\"\"The work item in ``item_smem`` (a compute partition, after its wait on q_bar).\"\"\"
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.max(item_smem.load(layout), 0)
"""

#: The launchers' shape and dtype checks (16-bit and fp8 alike), formatted with the launcher.
LAUNCH_CHECKS = """    import math

    import torch

    B, H, S, D = q.shape
    Sk = k.shape[2]   # key length (may differ from S)
    if D != HEAD_DIM.value or q.dtype != torch.{torch_dtype}:
        raise ValueError(f"expected q of shape [B, H, S, {{HEAD_DIM.value}}] and dtype {torch_dtype}, got "
                         f"{{tuple(q.shape)}} {{q.dtype}}")
{kv_check}
    if k.shape != kv_shape or v.shape != kv_shape or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"expected k, v of shape {{kv_shape}} and dtype {{q.dtype}}, got {{tuple(k.shape)}} "
                         f"{{tuple(v.shape)}}")
"""

LAUNCH = """
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the softmax runs in base 2


def launch(q, k, v, sm_scale=None, out=None, lse=None, return_lse=False):
    \"\"\"softmax(q k^T * sm_scale{mask}) v for q [B, H, S, D] and k, v [B, {kv}, Sk, D] ({dtype}, CUDA; the key
    length Sk may differ from S{sk_note}), each with any strides whose last dimension is contiguous (a [B, S, H,
    D] tensor's transpose(1, 2) included: read where it lies, never copied); sm_scale defaults to 1/sqrt(D). out (allocated like q: q's strides) is written
    through its strides. Returns out, or (out, lse) with return_lse: lse [B, H, S] fp32 (contiguous) is the
    natural-log log-sum-exp of each row's scaled scores (what the backward reads); a given lse is written.\"\"\"
""" + LAUNCH_CHECKS + """    q_desc = _tma_view(q, "q", [SUB_M.value, D])   # read where they lie: any strides, no copy
    k_desc = _tma_view(k, "k", [BLOCK_N.value, D])
    v_desc = _tma_view(v, "v", [BLOCK_N.value, D])
    if out is None:
        out = torch.empty_like(q)   # q's strides (a dense q's layout)
    if out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {{q.dtype}} tensor of shape {{tuple(q.shape)}} with a contiguous last "
                         f"dimension")
    if lse is None and return_lse:
        lse = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
    if lse is not None and (lse.shape != (B, H, S) or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {{(B, H, S)}}")
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
{grid}
    _launch(attention_kernel, grid, NUM_WARPS, q_desc, k_desc, v_desc, out, *out.stride()[:3], lse, S, Sk, H,
            sm_scale * LOG2E{extra_args})
    return (out, lse) if return_lse else out
"""


FP8_STEP = """\
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # rowmax (m kept in scaled log2 units)
    alpha = gl.exp2(m_i - m_new)                      # alpha
    p = gl.exp2(s * qk_scale - (m_new - P_OFFSET)[:, None])  # exp: P in [0, 2^P_OFFSET] for the fp8 convert
    l_new = l_i * alpha + gl.sum(p, 1)                # rowsum (fp32 P)
    return p, alpha, m_new, l_new"""


def fp8(plan: KernelPlan) -> bool:
    """The plan's operands are fp8 (V read as the pre-pass's V^T, P converted to fp8, O stored in 16 bits)."""
    return plan.dtype in FP8_DTYPES


FP8_LAUNCH = """
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the softmax runs in base 2


def _descale(x, B, KVH, group, device):
    \"\"\"A descale factor (None, a number, or a tensor of one value or of shape [B, KV heads]) as fp32 [B * H]:
    one value per (batch, query head), the value of its K/V head.\"\"\"
    import torch

    t = torch.as_tensor(1.0 if x is None else x, dtype=torch.float32, device=device)
    if t.numel() != 1 and tuple(t.shape) != (B, KVH):
        raise ValueError(f"a descale factor must be one value or of shape {{(B, KVH)}}, got {{tuple(t.shape)}}")
    t = t.reshape(1, 1) if t.numel() == 1 else t
    return t.expand(B, KVH).repeat_interleave(group, dim=1).contiguous().view(-1)


def transpose_v(v):
    \"\"\"The pre-pass: V [B, KV heads, S, D] (any strides) -> V^T [B, KV heads, D, S padded to a multiple of 32],
    zero in the padding, the keys of each 32-key group in the order the kernel's P operand takes them (key
    32b + 16h + 8i + 2q + j at column 32b + 16h + 4q + 2i + j: fp8_p_operand). The fp8 wgmma reads its B operand
    K-major only.\"\"\"
    import torch

    B, KVH, S, D = v.shape
    padded = _cdiv(S, 32) * 32
    if padded != S:  # zero keys up to the next group of 32
        vp = torch.zeros((B, KVH, padded, D), dtype=v.dtype, device=v.device)
        vp[:, :, :S] = v
        v = vp
    # keys as (b, h, i, q, j) -> columns as (b, h, q, i, j): one copy (splitting the key axis is a view)
    vt = v.reshape(B, KVH, padded // 32, 2, 2, 4, 2, D).permute(0, 1, 7, 2, 3, 5, 4, 6)
    return vt.reshape(B, KVH, D, padded)


def launch(q, k, v, sm_scale=None, out=None, lse=None, return_lse=False, q_descale=None, k_descale=None,
           v_descale=None, out_dtype=None):
    \"\"\"softmax(q k^T * sm_scale{mask}) v for fp8 q [B, H, S, D] and k, v [B, {kv}, Sk, D] ({dtype}, CUDA; the key
    length Sk may differ from S{sk_note}), with
    q, k, v standing for q * q_descale, k * k_descale, v * v_descale (each None, one value, or per (batch, K/V
    head) [B, {kv}]); sm_scale defaults to 1/sqrt(D). O is bf16 (out_dtype=torch.float16 for fp16). Returns
    out, or (out, lse) with return_lse: lse [B, H, S] fp32 is the natural-log log-sum-exp of each row's scaled
    scores; a given lse is written. q and k are read where they lie (any strides whose last dimension is
    contiguous), out is written through its strides; V is transposed by a pre-pass (transpose_v).\"\"\"
""" + LAUNCH_CHECKS + """    q_desc = _tma_view(q, "q", [SUB_M.value, D])   # read where they lie: any strides, no copy
    k_desc = _tma_view(k, "k", [BLOCK_N.value, D])
    v_desc = _tma_view(transpose_v(v), "v", [D, BLOCK_N.value])
    out_dtype = out_dtype or (out.dtype if out is not None else torch.bfloat16)
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float16, got {{out_dtype}}")
    if out is None:
        out = torch.empty_like(q, dtype=out_dtype)   # q's strides (a dense q's layout)
    if out.shape != q.shape or out.dtype != out_dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {{out_dtype}} tensor of shape {{tuple(q.shape)}} with a contiguous last "
                         f"dimension")
    if lse is None and return_lse:
        lse = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
    if lse is not None and (lse.shape != (B, H, S) or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {{(B, H, S)}}")
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    qk_descale = v_scale = None
    if q_descale is not None or k_descale is not None or v_descale is not None:
        KVH, group = kv_shape[1], H // kv_shape[1]
        qk_descale = _descale(q_descale, B, KVH, group, q.device) * _descale(k_descale, B, KVH, group, q.device)
        v_scale = _descale(v_descale, B, KVH, group, q.device)
{grid}
    _launch(attention_kernel, grid, NUM_WARPS, q_desc, k_desc, v_desc, out, *out.stride()[:3], lse, S, Sk, H,
            sm_scale * LOG2E{extra_args}, qk_descale, v_scale)
    return (out, lse) if return_lse else out
"""


VARLEN_LAUNCH = """
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the softmax runs in base 2


def launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale=None, out=None, lse=None,
           return_lse=False):
    \"\"\"softmax(q k^T * sm_scale{mask}) v over variable-length packed sequences (FlashAttention's varlen
    interface): q [total_q, H, D] and k, v [total_k, {kv}, D] ({dtype}, CUDA) hold the sequences one after
    another, sequence b in rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and cu_seqlens_k[b]:cu_seqlens_k[b + 1]
    of k and v (cu_seqlens_* int32 [batch + 1] on q's device, non-decreasing from 0); max_seqlen_q bounds the
    query lengths (the grid covers it: a longer sequence's rows past it are never computed), max_seqlen_k is
    taken for FlashAttention's signature.{seq_note} q, k, v are read where
    they lie (any strides whose last dimension is contiguous), out (allocated like q) is written through its
    strides. Returns out, or (out, lse) with return_lse: lse [H, total_q] fp32 (FlashAttention's varlen
    layout) is the natural-log log-sum-exp of each row's scaled scores (-inf for a row that sees no key).\"\"\"
    import math

    import torch

    T, H, D = q.shape
    if D != HEAD_DIM.value or q.dtype != torch.{torch_dtype}:
        raise ValueError(f"expected q of shape [total_q, H, {{HEAD_DIM.value}}] and dtype {torch_dtype}, got "
                         f"{{tuple(q.shape)}} {{q.dtype}}")
    B = cu_seqlens_q.numel() - 1
    kv_heads = {kv_value}
    if H % kv_heads:
        raise ValueError(f"{{H}} query heads are not a multiple of {{kv_heads}} K/V heads")
    kv_shape = (k.shape[0], kv_heads, D)
    if k.shape != kv_shape or v.shape != kv_shape or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"expected k, v of shape [total_k, {{kv_heads}}, {{D}}] and dtype {{q.dtype}}, got "
                         f"{{tuple(k.shape)}} {{tuple(v.shape)}}")
    _check_offsets(cu_seqlens_q, cu_seqlens_k, B, q.device)
    if out is None:
        out = torch.empty_like(q)   # q's strides (a dense q's layout)
    if out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {{q.dtype}} tensor of shape {{tuple(q.shape)}} with a contiguous last "
                         f"dimension")
    if lse is None and return_lse:
        lse = torch.empty((H, T), device=q.device, dtype=torch.float32)
    if lse is not None and (lse.shape != (H, T) or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {{(H, T)}}")
    if B <= 0 or T == 0 or max_seqlen_q <= 0:   # no query row: nothing to compute
        return (out, lse) if return_lse else out
    if k.shape[0] == 0:   # no key in any sequence: every row sees none (FA3: O = 0, LSE = -inf)
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    # the packed tensors as [1, heads, total, D] views (no copy): one TMA descriptor each, the CTA of sequence b
    # reads from its first row; rows past the sequence (the next one's, or zero fill past total) are masked
    q_desc = _tma_view(q.unsqueeze(0).transpose(1, 2), "q", [SUB_M.value, D])
    k_desc = _tma_view(k.unsqueeze(0).transpose(1, 2), "k", [BLOCK_N.value, D])
    v_desc = _tma_view(v.unsqueeze(0).transpose(1, 2), "v", [BLOCK_N.value, D])
    o4 = out.unsqueeze(0).transpose(1, 2)
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    grid = (_cdiv(max_seqlen_q, BLOCK_M.value), H, B)
    _launch(attention_kernel, grid, NUM_WARPS, q_desc, k_desc, v_desc, out, *o4.stride()[:3], lse, cu_seqlens_q,
            cu_seqlens_k, T, H, sm_scale * LOG2E{extra_args})
    return (out, lse) if return_lse else out
"""


#: The launchers' note on the key length: how the causal mask aligns when it differs from the query length.
SK_NOTE = {False: "", True: ": the mask is aligned bottom-right, query i sees keys 0..i + Sk - S"}


def softmax_source(plan: KernelPlan) -> str:
    """The ``online_softmax`` helper: key-tail mask, or (causal) the diagonal mask, whose rows may have seen no
    key yet when seq_k < seq_q: their maximum stays -inf and the step subtracts 0 instead (``m_use``, FA3's).
    fp8 adds ``fp8_p_operand``."""
    step = FP8_STEP if fp8(plan) else STEP
    if plan.decisions.causal or plan.decisions.varlen:   # varlen: a sequence of no keys (seq_k 0) too
        step = step.replace(CAUSAL_GUARD[0], CAUSAL_GUARD[0] + CAUSAL_GUARD[1])
        step = step.replace("m_i - m_new", "m_i - m_use").replace("m_new[:, None]", "m_use[:, None]")
        step = step.replace("(m_new - P_OFFSET)", "(m_use - P_OFFSET)")
    source = (CAUSAL_SOFTMAX if plan.decisions.causal else SOFTMAX).replace("{STEP}", step)
    if not fp8(plan):
        return source
    fmt = plan.dtype.removeprefix("fp8")    # e4m3 or e5m2: the cvt format and the operand's Gluon dtype
    return source + FP8_P_OPERAND.replace("FMTx2", f"{fmt}x2").replace("GL_FP8", GL_DTYPES[plan.dtype])


#: fp8: P to the k32 wgmma's A operand without moving bytes between threads. In the accumulator layout a thread
#: holds keys 8i + 2q + {0, 1} of each 32-key group (q = lane % 4); the A operand's thread q takes k = 4q + {0..3}
#: and 16 + 4q + {0..3}. Read as the A operand, the thread's own keys 32b + 16h + 8i + 2q + j go to column
#: 32b + 16h + 4q + 2i + j (a reshape and a permute, which Triton lowers within the thread); the launcher's
#: pre-pass (``transpose_v``) writes V^T's keys in the same order, so P V sums the same products. The fp8 values
#: travel as 32-bit registers of four (``fp8_p_operand``: two ``cvt.rn.satfinite.e4m3x2.f32`` (``e5m2x2``) in one
#: register, the rounding of Triton's own conversion) and become the operand only at the wgmma (``fp8_operand``):
#: a tensor of 8-bit elements carried over the loop is one register per byte to Triton 3.6's lowering, which
#: unpacks and repacks it with about 200 PRMT/LOP3 per warp and iteration at D = 128 (docs/codegen.md, "fp8
#: attention forward").
FP8_P_OPERAND = """
@gluon.jit
def fp8_p_operand(p, p_layout: gl.constexpr):
    \"\"\"P (fp32, wgmma accumulator layout) as the fp8 A operand of O += P V, with the keys of each 32-key group
    in the order the pre-pass's V^T holds them (key 32b + 16h + 8i + 2q + j at column 32b + 16h + 4q + 2i + j),
    packed four columns 4g..4g + 3 to an int32 [SUB_M, BLOCK_N // 4] (column 4g + k in byte k): fp8_operand
    makes it the operand.\"\"\"
    p = gl.reshape(p, [SUB_M, BLOCK_N // 32, 2, 2, 4, 2])  # key = 32b + 16h + 8i + 2q + j
    p = gl.reshape(gl.permute(p, [0, 1, 2, 4, 3, 5]), [SUB_M, BLOCK_N])  # column = 32b + 16h + 4q + 2i + j
    p = gl.reshape(gl.convert_layout(p, p_layout), [SUB_M, BLOCK_N // 4, 2, 2])  # within the thread
    even, odd = gl.split(p)  # columns 4g + {0, 2}, 4g + {1, 3}
    c0, c2 = gl.split(even)
    c1, c3 = gl.split(odd)
    # cvt.rn.satfinite.FMTx2.f32 d, a, b puts a in the upper byte of d
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.FMTx2.f32 lo, $2, $1; cvt.rn.satfinite.FMTx2.f32 hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [c0, c1, c2, c3], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def fp8_operand(packed, p_layout: gl.constexpr):
    \"\"\"The fp8 A operand [SUB_M, BLOCK_N] in p_layout of fp8_p_operand's packed P: each column 4g + k reads
    byte k of its group's register, four consecutive columns per operand register (k_width 4), so the
    register is the operand's as it is.\"\"\"
    pair = gl.join(packed, packed)
    packed = gl.convert_layout(gl.reshape(gl.join(pair, pair), [SUB_M, BLOCK_N]), p_layout)
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [packed], dtype=gl.GL_FP8, is_pure=True,
                                     pack=4)
"""


#: The causal step's guard, after its row-max line: a row with no key seen yet subtracts 0, not -inf.
CAUSAL_GUARD = ("m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # rowmax (m kept in scaled log2 units)\n",
                "    m_use = gl.where(m_new == float(\"-inf\"), 0.0, m_new)  # no key seen yet: P = 0, not NaN\n")


def launch_source(plan: KernelPlan) -> str:
    """The host launcher: shape and dtype checks, the optional LSE output, the K/V head grouping."""
    kv_check = kv_shape_source(plan.decisions.kv_heads, "D")
    kv, group_arg = ("KV_HEADS", ", H // KV_HEADS.value") if plan.decisions.kv_heads else ("H", "")
    if plan.decisions.varlen:
        chunks = (",\n            max(1, _sm_count(q.device.index) // grid[0])"
                  if plan.decisions.causal else "")   # heads_per_chunk: about one wave of heads
        return ATTENTION_HOST + "\n\n\n" + VARLEN_OFFSETS.strip("\n") + "\n\n\n" + VARLEN_LAUNCH.format(
            mask=", causal mask" if plan.decisions.causal else "", kv=kv, dtype=plan.dtype,
            seq_note=" The mask is aligned bottom-right in each sequence." if plan.decisions.causal else "",
            torch_dtype=TORCH_DTYPES[plan.dtype], kv_value="KV_HEADS.value" if plan.decisions.kv_heads else "H",
            extra_args=group_arg + chunks).lstrip("\n")
    grid = ("    blocks = _cdiv(S, BLOCK_M.value) * B * H\n"
            "    grid = (min(blocks, _sm_count(q.device.index)),)  # persistent: at most one CTA per SM\n"
            "    # work items claimed after each CTA's first, and CTAs done claiming: zero before each launch (the\n"
            "    # kernel's last CTA zeroes them for the next), one pair per device and stream\n"
            "    work_counter = _work_counter(q.device)"
            if plan.persistent else "    grid = (_cdiv(S, BLOCK_M.value), H, B)")
    chunks = (",\n            max(1, _sm_count(q.device.index) // _cdiv(S, BLOCK_M.value))"
              if plan.decisions.causal else "")   # heads_per_chunk: about one wave of heads
    launch = FP8_LAUNCH if fp8(plan) else LAUNCH
    return ATTENTION_HOST + "\n\n\n" + launch.format(
        mask=", causal mask" if plan.decisions.causal else "", kv=kv, dtype=plan.dtype,
        sk_note=SK_NOTE[plan.decisions.causal],
        torch_dtype=TORCH_DTYPES[plan.dtype], kv_check=kv_check, grid=grid,
        extra_args=(", B * H, work_counter" if plan.persistent else "") + group_arg + chunks).lstrip("\n")


class _Knobs:
    """Per-partition decisions of the compute partitions: ``SUB`` (the sub-tile), ``AHEAD`` (``stage(pv) -
    stage(qk)``) and, with ping-pong, ``TURNS`` (turns per iteration), ``QK_TURN``/``PV_TURN`` (the turn waited for before the op, -1: none)
    and ``QK_PASS``/``PV_PASS`` (K > 0: pass the tensor core to partition ``(SUB + K) % NUM_COMPUTE`` after
    it; 0: none). A knob with one value for every partition is rendered as that value; the others (and
    ``SUB``) become constexpr parameters."""

    def __init__(self, plan: KernelPlan):
        comp = plan.compute
        self.values: dict[str, tuple[int, ...]] = {"SUB": tuple(p.subtile for p in comp),
                                                   "AHEAD": plan.decisions.qk_ahead}
        if plan.turns:
            self.values["TURNS"] = plan.turn_counts
            for role in PROGRAM_ORDER:
                self.values[f"{role.upper()}_TURN"] = tuple(p.turn_waits.get(p.roles[role], -1) for p in comp)
                self.values[f"{role.upper()}_PASS"] = tuple(
                    (p.turn_passes[p.roles[role]] - p.subtile) % len(comp) if p.roles[role] in p.turn_passes
                    else 0 for p in comp)
        self.params = tuple(n for n, v in self.values.items() if n == "SUB" or len(set(v)) > 1)

    def value(self, name: str) -> str:
        """The knob as emitted: its parameter name, or its one value."""
        return name if name in self.params else str(self.values[name][0])

    def when(self, name: str, condition: str, holds: Callable[[int], bool], lines: list[str]) -> list[str]:
        """``lines`` when ``holds`` for the knob's value in every partition, nothing when in none, else
        ``lines`` under a static ``if <condition>``."""
        verdicts = {holds(v) for v in self.values[name]}
        if verdicts != {True, False}:
            return lines if True in verdicts else []
        ind = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
        return [f"{ind}if {condition}:"] + ["    " + line for line in lines]


class _Compute:
    """Renders the compute partition of an attention plan (one function for every sub-tile)."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.knobs = _Knobs(plan)
        self.fp8 = fp8(plan)
        #: the softmax scale the loop reads: fp8 folds the block's q_descale * k_descale into it
        self.scale = "block_scale" if self.fp8 else "qk_scale"
        #: ``, p_op`` in a wgmma wait's deps (P's registers stay live while O += P V reads them); none for
        #: fp8, whose 8-bit registers Triton 3.6's wgmma wait does not take (ptxas still orders the reuse)
        self.p = "" if self.fp8 else ", p_op"

    def ring(self, j: str) -> str:
        """The ring iteration of the block's key tile ``j``: ``j``, or in a persistent kernel ``first + j``
        (the rings run on across the CTA's query blocks)."""
        if not self.plan.persistent:
            return j
        return "first" if j == "0" else f"(first + {j})"

    def slot(self, j: str, ring: str) -> tuple[str, str]:
        """(buffer index, phase) of key tile ``j`` in ring ``ring`` (``k``, ``v``): ``j % DEPTH`` and
        ``(j // DEPTH) & 1`` of its ring iteration; ``0, 0`` for the first tile of a kernel with one CTA per
        block."""
        r, depth = self.ring(j), f"{ring.upper()}_DEPTH"
        return ("0", "0") if r == "0" else (f"{r} % {depth}", f"({r} // {depth}) & 1")

    @staticmethod
    def qk_issue(ind: str, index: str) -> list[str]:
        """``s_tok = warpgroup_mma(q, K(index)ᵀ, ...)``, wrapped at 110 columns."""
        return wrap(f"{ind}s_tok = warpgroup_mma", ["q", f"k_ring.index({index}).permute((1, 0))", "s_zero",
                                                    "use_acc=False", "is_async=True"], "", ind + " " * 22)

    def turn_count(self, counter: str) -> str:
        """The steady-state iteration whose turns are taken: ``counter``, or in a persistent kernel the
        count run on across the CTA's query blocks: block ``t`` of ``n_tiles`` key tiles has ``n_tiles − AHEAD``
        steady-state iterations, so ``first − t·AHEAD`` came before it (no register kept for it)."""
        if not self.plan.persistent:
            return counter
        ahead = self.knobs.value("AHEAD")
        before = {"0": "first", "1": "first - t"}.get(ahead, "first - t * AHEAD")
        return f"({before} + {counter})"

    def ops(self, role: str) -> str:
        """``qk_a | qk_b``: the op of ``role`` in each partition."""
        return " | ".join(p.roles[role] for p in self.plan.compute)

    def placed(self, role: str) -> str:
        """``qk_a: start 0, stage 0 | qk_b: ...``."""
        at = [self.plan.placement(p.roles[role]) for p in self.plan.compute]
        return " | ".join(f"{a.name}: start {a.start}, stage {a.stage}" for a in at)

    def whys(self, kind: str, role: str) -> str:
        """The dependences behind the ``kind`` wait of ``role``'s op in each partition."""
        plan = self.plan
        if kind == "wgmma":
            return " | ".join(plan.retire(p.roles[role]).why for p in plan.compute)
        return " | ".join(plan.wait(kind, p.roles[role]).why for p in plan.compute
                          if any(w.kind == kind and w.op == p.roles[role] for w in plan.waits))

    def turn_before(self, role: str, ind: str, counter: str | None) -> list[str]:
        """Wait for the tensor-core turn before ``role``'s op (steady state only: ``counter`` is not None)."""
        name = f"{role.upper()}_TURN"
        if counter is None or name not in self.knobs.values:
            return []
        lines = [f"{ind}# turn: wait until the previous turn's partition issued its wgmma ({self.whys('turn', role)})",
                 f"{ind}mbarrier.wait(turn_bars.index(SUB), ({self.turn_count(counter)} * TURNS"
                 f"{self._plus(name)}) & 1)"]
        return self.knobs.when(name, f"{name} >= 0", lambda k: k >= 0, lines)

    def _plus(self, name: str) -> str:
        """`` + K`` for the turn index knob ``name`` (nothing when it is 0 for every partition)."""
        value = self.knobs.value(name)
        return "" if value == "0" else f" + {value}"

    def turn_after(self, role: str, ind: str, counter: str | None) -> list[str]:
        """Pass the tensor core on after ``role``'s op (steady state only)."""
        name = f"{role.upper()}_PASS"
        if counter is None or name not in self.knobs.values:
            return []
        lines = [f"{ind}mbarrier.arrive(turn_bars.index((SUB + {self.knobs.value(name)}) % NUM_COMPUTE))  # pass the "
                 f"tensor core on"]
        return self.knobs.when(name, name, lambda k: k > 0, lines)

    def issue_qk(self, j: str, ind: str, counter: str) -> list[str]:
        index, phase = self.slot(j, "k")
        return [
            f"{ind}mbarrier.wait(k_ready.index({index}), {phase})  # ready: K tile {j} ({self.whys('ready', 'qk')})",
            *self.turn_before("qk", ind, counter),
            f"{ind}# {self.placed('qk')}",
            *self.qk_issue(ind, index),
            *self.turn_after("qk", ind, counter),
        ]

    def softmax(self, j: str, kv_start: str, ind: str) -> list[str]:
        stages = "/".join(str(self.plan.placement(p.roles["exp"]).stage) for p in self.plan.compute)
        return [
            f"{ind}# rowmax/alpha/exp/rowsum of iteration {j} (stage {stages})",
            *self._softmax_call(kv_start, ind),
        ]

    def _softmax_call(self, kv_start: str, ind: str) -> list[str]:
        if self.plan.decisions.causal:
            return [f"{ind}p, alpha, m_i, l_i = online_softmax(s_cur, m_i, l_i, {kv_start}, q_first, {self.scale}, "
                    f"s_layout)"]
        return [f"{ind}p, alpha, m_i, l_i = online_softmax(s_cur, m_i, l_i, {kv_start}, seq_k, {self.scale},",
                f"{ind}                                    gl.SliceLayout(0, s_layout))"]

    def convert_p(self, ind: str, when: str = "") -> list[str]:
        """P to the register A operand of ``O += P V`` (it never leaves registers; fp8: ``fp8_p_operand``)."""
        convert = "fp8_p_operand(p, p_layout)" if self.fp8 else "gl.convert_layout(p.to(DTYPE), p_layout)"
        return [f"{ind}p_op = {convert}  # P stays in registers: wgmma A operand" + (f"; {when}" if when else "")]

    def issue_pv(self, j: str, ind: str, counter: str | None, convert: bool = True) -> list[str]:
        """``counter`` None: outside the steady state, where tensor-core turns are not taken. ``convert``:
        convert P to the wgmma operand first (the loop with S issued ahead converts it earlier)."""
        index, phase = self.slot(j, "v")
        return [
            *(self.convert_p(ind) if convert else []),
            f"{ind}mbarrier.wait(v_ready.index({index}), {phase})  # ready: V tile {j} ({self.whys('ready', 'pv')})",
            *self.turn_before("pv", ind, counter),
            f"{ind}# {self.placed('pv')}",
            f"{ind}o_tok = warpgroup_mma({self.p_operand()}, {self.v_operand(index)}, o, is_async=True)",
            *self.turn_after("pv", ind, counter),
        ]

    def p_operand(self) -> str:
        """The A operand of ``O += P V``: ``p_op``, or (fp8) its packed registers as the fp8 operand."""
        return "fp8_operand(p_op, p_layout)" if self.fp8 else "p_op"

    def v_operand(self, index: str) -> str:
        """The B operand of ``O += P V``: the V tile, or (fp8) the transposed view of the pre-pass's V^T tile,
        K-major as the fp8 wgmma requires."""
        return f"v_ring.index({index}).permute((1, 0))" if self.fp8 else f"v_ring.index({index})"

    def descale(self, ind: str) -> list[str]:
        """fp8: the block's softmax scale with q_descale * k_descale of its (batch, query head) folded in, and
        its v_descale (FA3); nothing for 16-bit operands."""
        if not self.fp8:
            return []
        return [f"{ind}bh = (q_row - q_start) // seq_q  # the block's batch * H + query head",
                f"{ind}block_scale = qk_scale",
                f"{ind}v_scale = 1.0",
                f"{ind}if qk_descale_ptr is not None:  # fp8 descale: q_descale * k_descale folded into the scale",
                f"{ind}    block_scale = qk_scale * gl.load(qk_descale_ptr + bh)",
                f"{ind}    v_scale = gl.load(v_descale_ptr + bh)  # v_descale, folded into 1 / l"]

    def body_ahead(self, ind: str, q_done: list[str]) -> list[str]:
        """``qk`` one stage ahead of ``pv``: S(j+1) issued with O += P(j) V(j), loop rotated. ``q_done``: lines
        after the last ``qk`` has completed (the persistent kernel hands Q back there)."""
        i2 = ind + "    "
        rescale = "o = o * gl.convert_layout(alpha, row_o)[:, None]  # rescale"
        first, phase = self.slot("0", "k")
        return [
            f"{ind}# qk runs one stage ahead of pv. The loop is rotated so that no wgmma is in flight across the",
            f"{ind}# back-edge (ptxas would serialize every wgmma otherwise, C7514): body j issues S(j+1) and",
            f"{ind}# O += P(j) V(j), runs the softmax of j+1 while O += P V runs, then retires it and rescales O.",
            f"{ind}# prologue: qk and softmax of iteration 0",
            f"{ind}mbarrier.wait(k_ready.index({first}), {phase})  # ready: K tile 0",
            *self.qk_issue(ind, first),
            f"{ind}s_cur = warpgroup_mma_wait(0, deps=[s_tok])",
            f"{ind}mbarrier.arrive(k_empty.index({first}))  # empty: K tile 0 consumed",
            *self.softmax("0", "0", ind),
            *self.convert_p(ind),
            f"{ind}for j in range(0, n_tiles - 1):",
            f"{i2}jn = j + 1",
            *self.issue_qk("jn", i2, "j"),
            *self.issue_pv("j", i2, "j", convert=False),
            f"{i2}# S(j+1) complete (wgmma groups retire in order; {self.whys('wgmma', 'qk')});",
            f"{i2}# O += P(j) V(j) still in flight",
            f"{i2}s_cur, o{self.p} = warpgroup_mma_wait(1, deps=[s_tok, o_tok{self.p}])",
            f"{i2}mbarrier.arrive(k_empty.index({self.slot('jn', 'k')[0]}))  # empty: K tile j+1 consumed",
            *self.softmax("jn", "jn * BLOCK_N", i2),
            *self.pv_wait_fence(i2),
            f"{i2}o{self.p} = warpgroup_mma_wait(0, deps=[o{self.p}])  # O += P(j) V(j) complete "
            f"({self.whys('wgmma', 'pv')})",
            f"{i2}mbarrier.arrive(v_empty.index({self.slot('j', 'v')[0]}))  # empty: V tile j consumed",
            f"{i2}{rescale}",
            *self.convert_p(i2, "P(j+1), once P(j) V(j) retired: its fp32 copy dies before S(j+2) is "
                                "issued"),
            *(ind + line for line in q_done),
            f"{ind}# epilogue: pv of the last iteration",
            f"{ind}j = n_tiles - 1",
            *self.issue_pv("j", ind, None, convert=False),
            f"{ind}o{self.p} = warpgroup_mma_wait(0, deps=[o_tok{self.p}])",
            f"{ind}mbarrier.arrive(v_empty.index({self.slot('j', 'v')[0]}))  # empty: V tile consumed",
        ]

    def pv_wait_fence(self, ind: str) -> list[str]:
        """At D >= :data:`PV_WAIT_FENCE_MIN_HEAD_DIM`, an mbarrier wait that always passes (this block's phase
        of ``q_bar`` is complete, and the next one cannot complete before this partition's ``q_empty`` arrive
        after the loop) between the softmax and the ``wgmma`` wait for ``O += P(j) V(j)``. ptxas otherwise
        moves that wait above the softmax, so the softmax would start only once the P V is done; it keeps the
        wait after an mbarrier try-wait loop."""
        if self.plan.tile["head_dim"] < PV_WAIT_FENCE_MIN_HEAD_DIM:
            return []
        parity = "t & 1" if self.plan.persistent else "0"
        return [f"{ind}# fence: passes at once; keeps ptxas from moving the wait below above the softmax",
                f"{ind}mbarrier.wait(q_bar, {parity})"]

    def body_serial(self, ind: str, q_done: list[str]) -> list[str]:
        """``qk``, softmax and ``pv`` of one iteration in one stage: no overlap inside the partition."""
        i2 = ind + "    "
        return [
            f"{ind}# qk, softmax and pv of one iteration share a stage: no overlap inside the partition",
            f"{ind}for j in range(0, n_tiles):",
            *self.issue_qk("j", i2, "j"),
            f"{i2}s_cur = warpgroup_mma_wait(0, deps=[s_tok])  # {self.whys('wgmma', 'qk')}",
            f"{i2}mbarrier.arrive(k_empty.index({self.slot('j', 'k')[0]}))  # empty: K tile j consumed",
            *self.softmax("j", "j * BLOCK_N", i2),
            f"{i2}o = o * gl.convert_layout(alpha, row_o)[:, None]  # rescale",
            *self.issue_pv("j", i2, "j"),
            f"{i2}o{self.p} = warpgroup_mma_wait(0, deps=[o_tok{self.p}])  # {self.whys('wgmma', 'pv')}",
            f"{i2}mbarrier.arrive(v_empty.index({self.slot('j', 'v')[0]}))  # empty: V tile j consumed",
            *(ind + line for line in q_done),
        ]

    def body(self, ind: str = "    ", q_done: tuple[str, ...] = ()) -> list[str]:
        """The main loop at ``ind``: one form when every partition has the same ``AHEAD``, else both under a
        static if. ``q_done``: lines for the point where the block's last ``qk`` has completed."""
        done = list(q_done)
        if "AHEAD" not in self.knobs.params:
            return (self.body_ahead(ind, done) if self.knobs.values["AHEAD"][0] else self.body_serial(ind, done))
        i2 = ind + "    "
        return [f"{ind}if AHEAD:", *self.body_ahead(i2, done), f"{ind}else:", *self.body_serial(i2, done)]

    def store(self, ind: str) -> list[str]:
        """Normalise O and store it (and the LSE) for the sub-tile's rows below seq_q."""
        # causal: a row that saw no key (seq_k < seq_q) has l = 0 and O = 0: divide by 1 (O stays 0, the LSE is
        # -inf, FA3's convention)
        l_div = ("gl.where(l_i == 0.0, 1.0, l_i)" if self.plan.decisions.causal or self.plan.decisions.varlen
                 else "l_i")
        if self.fp8:
            normalise = [f"{ind}o = o * gl.convert_layout(v_scale / {l_div}, row_o)[:, None]  # v_descale / l",
                         f"{ind}out_dtype: gl.constexpr = o_head.dtype.element_ty  # bf16 (or fp16) output"]
            out, lse = "o.to(out_dtype)", "(m_i - P_OFFSET + gl.log2(l_i)) * LN2  # l carries 2^P_OFFSET"
        else:
            normalise = [f"{ind}o = o / gl.convert_layout({l_div}, row_o)[:, None]"]
            out, lse = "o.to(DTYPE)", "(m_i + gl.log2(l_i)) * LN2"
        return [
            f"{ind}# normalise and store (rows past seq_q masked)",
            *([f"{ind}bh = (q_row - q_start) // seq_q  # the block's batch * H + query head (nothing more kept "
               f"over the loop)", f"{ind}b = bh // heads", f"{ind}h = bh % heads", ind + O_HEAD]
              if self.plan.persistent else []),
            *normalise,
            f"{ind}rows = gl.arange(0, SUB_M, row_o)",
            f"{ind}cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))",
            f"{ind}row0 = q_start + SUB * SUB_M  # the sub-tile's first query",
            f"{ind}ptrs = o_head + (row0 + rows).to(gl.int64)[:, None] * o_stride_s + cols[None, :]  # O's strides",
            f"{ind}gl.store(ptrs, {out}, mask=(row0 + rows < seq_q)[:, None])",
            f"{ind}if lse_ptr is not None:  # log-sum-exp for the backward: ln(sum exp(s*scale)) = (m + log2 l) ln 2",
            f"{ind}    rows_s = gl.arange(0, SUB_M, gl.SliceLayout(1, s_layout))",
            f"{ind}    lse = {lse}",
            f"{ind}    lse_mask = row0 + rows_s < seq_q",
            f"{ind}    gl.store(lse_ptr + (q_row + SUB * SUB_M + rows_s).to(gl.int64), lse, mask=lse_mask)",
        ]

    def accumulators(self, ind: str) -> list[str]:
        """The row statistics and the O accumulator, zeroed (once per query block)."""
        return [f"{ind}m_i = gl.full([SUB_M], float(\"-inf\"), gl.float32, gl.SliceLayout(1, s_layout))",
                f"{ind}l_i = gl.full([SUB_M], 0.0, gl.float32, gl.SliceLayout(1, s_layout))",
                f"{ind}o = gl.zeros([SUB_M, HEAD_DIM], gl.float32, o_layout)"]

    def render(self) -> str:
        plan = self.plan
        comp = plan.compute
        groups = ", ".join(f"{p.subtile}: warp group {p.group}" for p in comp)
        if plan.persistent:
            params = (PERSISTENT_COMPUTE_PARAMS + (("group",) if plan.decisions.kv_heads else ())
                      + (("n_bh", "heads_per_chunk") if plan.decisions.causal else ()))
            doc = (f"Sub-tile SUB ({groups}; {comp[0].num_warps} warps each): for each query block of this CTA, "
                   f"online softmax over its K/V tiles, then its O (and LSE) rows.")
        else:
            params, doc = COMPUTE_PARAMS, (f"Sub-tile SUB ({groups}; {comp[0].num_warps} warps each): online "
                                           f"softmax over the K/V tiles.")
        params += FP8_COMPUTE_PARAMS if self.fp8 else ()
        head = compute_def(plan, params, self.knobs.params, doc)
        k, k_width = (32, 4) if self.fp8 else (16, 2)      # wgmma m64nNk32 and 4-byte P fragments for fp8
        lines = head + [
            "    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
            f"                                                       instr_shape=[16, BLOCK_N, {k}])",
            "    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
            f"                                                       instr_shape=[16, HEAD_DIM, {k}])",
            f"    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width={k_width})",
            "    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)",
        ]
        diagonal = ("q_first = q_start + SUB * SUB_M + seq_k - seq_q  # the last key the sub-tile's first query sees "
                    "(its diagonal, bottom-right aligned)")
        if not plan.persistent:
            lines += [
                *self.accumulators("    "),
                "    s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, s_layout)",
                "    q = q_smem.index(SUB)",
                *(["    " + diagonal] if plan.decisions.causal else []),
                *self.descale("    "),
                "    mbarrier.wait(q_bar, 0)  # Q sub-tile loaded by load_partition",
                *self.body(),
                *self.store("    "),
            ]
            return softmax_source(plan).strip("\n") + "\n\n" + "\n".join(lines) + "\n"
        lines += [
            "    s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, s_layout)",
            "    q = q_smem.index(SUB)",
            "    first = 0  # ring iteration of the block's first K/V tile: the rings and turns run on across blocks",
            "    t = 0  # blocks done: the parity of q_bar",
            "    mbarrier.wait(q_bar, 0)  # the first block's Q sub-tile and work item (load_partition)",
            "    item = read_item(item_smem)",
            "    while item < n_items:",
            _block_coords_call(plan),
            *(["        " + diagonal] if plan.decisions.causal else []),
            *self.descale("        "),
            *self.accumulators("        "),
            *self.body("        ", ("mbarrier.arrive(q_empty)  # Q and its item consumed (the block's last qk "
                                    "completed): the producer loads the next block's",)),
            *self.store("        "),
            "        first += n_tiles",
            "        t += 1",
            "        # the next block's Q sub-tile and work item, or an item past the last: the CTA is done",
            "        mbarrier.wait(q_bar, t & 1)",
            "        item = read_item(item_smem)",
        ]
        return softmax_source(plan).strip("\n") + "\n\n" + "\n".join(lines) + "\n"


#: varlen: the sequence's first row of O (packed [total_q, H, D]) in head h.
VARLEN_O_HEAD = ("o_head = o_ptr + q_base.to(gl.int64) * o_stride_s + h.to(gl.int64) * o_stride_h  # O of (sequence "
                 "b, head h)")
#: The (batch, head)'s first element of O, whose rows the compute partitions store through O's row stride.
O_HEAD = "o_head = o_ptr + b.to(gl.int64) * o_stride_b + h.to(gl.int64) * o_stride_h  # O of (batch b, head h)"


def body(plan: KernelPlan) -> KernelBody:
    """The attention forward's part of the emitted module."""
    t, comp = plan.tile, plan.compute
    compute = _Compute(plan)
    turns = " -> ".join(f"compute{t.partition}: {'/'.join(t.ops)}" for t in plan.turns) or "none (one compute group)"
    before = ["    turn_bars = gl.allocate_shared_memory(gl.int64, [NUM_COMPUTE, 1], mbarrier.MBarrierLayout())",
              "    for s in gl.static_range(NUM_COMPUTE):",
              "        mbarrier.init(turn_bars.index(s), count=1)"]
    if plan.turns:
        first = plan.turns[0]
        before.append(f"    mbarrier.arrive(turn_bars.index({first.partition}))  # compute{first.partition} takes the "
                      f"first tensor-core turn ({'/'.join(first.ops)})")
    extra = [("NUM_COMPUTE", len(comp), "compute partitions = sub-tiles"),
             ("LN2", 0.6931471805599453, "ln(2): the softmax runs in base 2, the LSE output is a natural log")]
    if plan.decisions.kv_heads:
        extra.append(("KV_HEADS", plan.decisions.kv_heads, "K/V heads (grouped-query: query head h reads K/V head "
                                                  "h // (H // KV_HEADS))"))
    if plan.turns and "TURNS" not in compute.knobs.params:
        extra.append(("TURNS", plan.turn_counts[0], "tensor-core turns per partition per iteration"))
    if compute.fp8:
        extra.append(("P_OFFSET", FP8_P_OFFSET, "fp8: P = exp2(S*scale - m + P_OFFSET) in [0, 2^P_OFFSET] (FA3)"))
    fp8_params = FP8_COMPUTE_PARAMS if compute.fp8 else ()
    group = (("group",) if plan.decisions.kv_heads else ())
    chunked = (("n_bh", "heads_per_chunk") if plan.decisions.causal else ())   # block_coords' causal order
    # the kernel's parameters and their types for compile_signature, in the order the launcher passes them
    v_block = "HEAD_DIM.value, BLOCK_N.value" if compute.fp8 else "BLOCK_N.value, HEAD_DIM.value"  # fp8: V^T
    signature = (("q_desc", "_desc_type([1, 1, SUB_M.value, HEAD_DIM.value])"),
                 ("k_desc", "_desc_type([1, 1, BLOCK_N.value, HEAD_DIM.value])"),
                 ("v_desc", f"_desc_type([1, 1, {v_block}])"),
                 ("o_ptr", '"*bf16"' if compute.fp8 else '"*" + str(DTYPE.value)'),
                 ("o_stride_b", '"i32"'), ("o_stride_h", '"i32"'), ("o_stride_s", '"i32"'), ("lse_ptr", '"*fp32"'),
                 *((("cu_seqlens_q", '"*i32"'), ("cu_seqlens_k", '"*i32"'), ("total_q", '"i32"'))
                   if plan.decisions.varlen else (("seq_q", '"i32"'), ("seq_k", '"i32"'))),
                 ("heads", '"i32"'), ("qk_scale", '"fp32"'),
                 *((("n_bh", '"i32"'), ("work_counter", '"*i32"')) if plan.persistent else ()),
                 *((("group", '"i32"'),) if plan.decisions.kv_heads else ()),
                 *((("heads_per_chunk", '"i32"'),) if plan.decisions.causal else ()),
                 *((name, '"*fp32"') for name in fp8_params))
    # varlen: the packed [1, H, total, D] view, the sequence's rows from q_base (docs/codegen.md, "Variable-length")
    q_coords = ("[0, h, q_base + q_start + sub * SUB_M, 0]" if plan.decisions.varlen
                else "[b, h, q_start + sub * SUB_M, 0]")
    q_load = ("mbarrier.expect(q_bar, NUM_COMPUTE * q_desc.block_type.nbytes)",
              "for sub in gl.static_range(NUM_COMPUTE):",
              f"    tma.async_copy_global_to_shared(q_desc, {q_coords}, q_bar,",
              "                                    q_smem.index(sub).reshape([1, 1, SUB_M, HEAD_DIM]))")
    q_smem = ("    q_smem = gl.allocate_shared_memory(DTYPE, [NUM_COMPUTE, SUB_M, HEAD_DIM],",
              "                                       gl.NVMMASharedLayout.get_default_for([SUB_M, HEAD_DIM], DTYPE))",
              "    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
              "    mbarrier.init(q_bar, count=1)")
    if plan.persistent:
        walk = dict(
            functions=block_coords_source(plan) + "\n\n" + ITEM_SOURCE.strip("\n") + "\n\n" + compute.render(),
            setup=("    n_m = gl.cdiv(seq_q, BLOCK_M)  # query blocks per (batch, head)",
                   "    n_items = n_m * n_bh  # work items: the query blocks in block_coords order",
                   *q_smem,
                   "    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
                   "    mbarrier.init(q_empty, count=NUM_COMPUTE)  # one arrive per compute partition per block",
                   "    # the work item of the block whose Q q_bar announces (written by the producer before its "
                   "arrive)",
                   "    item_smem = gl.allocate_shared_memory(gl.int32, [1], "
                   "gl.SwizzledSharedLayout(1, 1, 1, order=[0]))"),
            trip="n_items",
            coords={"k": "[b, kv_h, (j - first) * BLOCK_N, 0]",
                    "v": _v_coords(compute.fp8, "(j - first) * BLOCK_N")},
            load_params=("q_desc", "q_smem", "q_bar", "q_empty", "item_smem", "work_counter", "n_m", "seq_q", "seq_k",
                         "heads", *group, *chunked),
            load_setup=("    first = 0  # ring iteration of the block's first K/V tile: the rings run on across "
                        "query blocks",
                        "    t = 0  # blocks done: the parity of q_empty",
                        "    item = gl.program_id(0)  # the first work item; the next ones are claimed from "
                        "work_counter"),
            load_loop=("    while item < n_items:",
                       _block_coords_call(plan),
                       "        # Q: every compute partition handed the previous block's Q and item back (first pass "
                       "free)",
                       "        mbarrier.wait(q_empty, (t & 1) ^ 1)",
                       "        write_item(item_smem, item)  # released to the compute partitions by the arrive of "
                       "expect",
                       *("        " + line for line in q_load),
                       "        for j in range(first, first + n_tiles):"),
            load_after=("        # claim the next work item once the block's loads are issued: Triton's scalar atomic",
                        "        # waits for its result, which arrives while the compute partitions finish the block",
                        "        item = gl.atomic_add(work_counter, 1, sem=\"relaxed\") + gl.num_programs(0)",
                        "        first += n_tiles",
                        "        t += 1",
                        "    # exit: hand the compute partitions an item past the last (no Q load: a plain arrive",
                        "    # completes q_bar's phase) once they are done with the last block's item",
                        "    mbarrier.wait(q_empty, (t & 1) ^ 1)",
                        "    write_item(item_smem, item)",
                        "    mbarrier.arrive(q_bar)",
                        "    # every CTA claims past the last item exactly once; the last CTA to do so zeroes both",
                        "    # counters for the launch after it (no claim of this launch follows: acq_rel orders each",
                        "    # CTA's claims before its count), so the launcher zeroes nothing",
                        "    done = gl.atomic_add(work_counter + 1, 1, sem=\"acq_rel\")",
                        "    if done == gl.num_programs(0) - 1:",
                        "        gl.atomic_xchg(work_counter, 0, sem=\"relaxed\")",
                        "        gl.atomic_xchg(work_counter + 1, 0, sem=\"relaxed\")"),
            compute_params=PERSISTENT_COMPUTE_PARAMS + group + chunked + fp8_params,
            launch=SM_COUNT.strip("\n") + "\n\n" + WORK_COUNTER.strip("\n") + "\n\n" + launch_source(plan),
        )
    else:
        walk = dict(
            functions=compute.render(),
            setup=(*_setup(plan), *q_smem),
            trip="n_tiles",
            coords=_kv_coords(plan, compute.fp8),
            load_params=("q_desc", "q_smem", "q_bar", "b", "h", "kv_h", "q_start",
                         *(("q_base", "k_base") if plan.decisions.varlen else ())),
            load_setup=tuple("    " + line for line in q_load),
            load_loop=(),
            compute_params=COMPUTE_PARAMS + fp8_params,
            launch=(SM_COUNT.strip("\n") + "\n\n" if plan.decisions.causal else "") + launch_source(plan),
        )
    return KernelBody(
        title="Warp-specialized attention forward for Hopper (sm_90), Gluon / Triton 3.6.",
        summary="Generated warp-specialized Gluon attention forward; see the header comment.",
        decisions=(f"decisions: stage(pv) - stage(qk) per compute partition {list(plan.decisions.qk_ahead)} (1: "
                   f"S(j+1) "
                   f"issued with PV(j), softmax overlaps PV); tensor-core turns in order (each passes to the next, the last to the first): {turns}; "
                   f"compute_partition constexprs {', '.join(compute.knobs.params)}",
                   "layouts: S, O in the wgmma accumulator layout; row max/sum in SliceLayout(1, S); P in registers "
                   "as the A operand (DotOperandLayout) of O += P V", *_fp8_decisions(plan), *_mask_decisions(plan),
                   *_persistent_decisions(plan)),
        tile_constants=(("BLOCK_M", t["block_m"], f"query rows per CTA = {len(comp)} sub-tile(s) x SUB_M"),
                        ("SUB_M", t["sub_m"], "query rows per compute partition (16 per warp: one wgmma row block)"),
                        ("BLOCK_N", t["block_n"], "keys per loop iteration"),
                        ("HEAD_DIM", t["head_dim"], "head dimension")),
        extra_constants=tuple(extra),
        kernel="attention_kernel",
        kernel_params=", ".join(name for name, _ in signature),
        kernel_doc=_kernel_doc(plan),
        iv="j",
        buffer_shapes={"k": "BLOCK_N, HEAD_DIM", "v": "HEAD_DIM, BLOCK_N" if compute.fp8 else "BLOCK_N, HEAD_DIM"},
        tma_shapes={"k": "1, 1, BLOCK_N, HEAD_DIM",
                    "v": "1, 1, HEAD_DIM, BLOCK_N" if compute.fp8 else "1, 1, BLOCK_N, HEAD_DIM"},
        constexprs=tuple((n, compute.knobs.values[n]) for n in compute.knobs.params),
        before_specialize=tuple(before),
        results="",
        epilogue=(),
        signature=signature,
        **walk,
    )


def _kv_coords(plan: KernelPlan, fp8_v: bool) -> dict[str, str]:
    """TMA coordinates of the K and V tiles of iteration ``j`` in the kernel with one CTA per query block; varlen:
    in the packed [1, KV heads, total_k, D] views, from the sequence's first key row k_base (rows past the
    sequence, of the next one, are read and masked as keys past seq_k)."""
    if plan.decisions.varlen:
        return {"k": "[0, kv_h, k_base + j * BLOCK_N, 0]", "v": "[0, kv_h, k_base + j * BLOCK_N, 0]"}
    return {"k": "[b, kv_h, j * BLOCK_N, 0]", "v": _v_coords(fp8_v, "j * BLOCK_N")}


def _v_coords(fp8_v: bool, key: str) -> str:
    """TMA coordinates (batch, K/V head, row, column) of the V tile at key ``key``: V rows from ``key``, or
    (fp8) the pre-pass's V^T columns from ``key``."""
    return f"[b, kv_h, 0, {key}]" if fp8_v else f"[b, kv_h, {key}, 0]"


def _fp8_decisions(plan: KernelPlan) -> tuple[str, ...]:
    """Header lines of the fp8 kernel (none for 16-bit operands)."""
    if not fp8(plan):
        return ()
    return (f"fp8 ({plan.dtype}): S = Q K^T and O += P V are wgmma m64nNk32; the fp8 wgmma reads B K-major only, "
            "so the launcher's pre-pass writes V^T [B, KV_HEADS, D, S padded to 32] and O += P V reads its tiles "
            "through a transposed view; P = exp2(S*scale - m + P_OFFSET) is converted to fp8 in registers and "
            "taken as the A operand with the keys of each 32-key group reordered so that no byte moves between "
            "threads (fp8_p_operand), the order in which the pre-pass writes V^T's keys; "
            "q_descale * k_descale is folded into the softmax scale and v_descale into 1 / l per (batch, head); "
            "O is stored in o_ptr's dtype (bf16, or fp16 on request)",)


def _mask_decisions(plan: KernelPlan) -> tuple[str, ...]:
    """Header lines for the causal mask and grouped K/V heads (none for plain attention)."""
    lines = []
    if plan.decisions.causal:
        lines.append("causal: the loop of a query block stops at its diagonal (key tiles after it are never loaded); "
                     "the steady state is the scheduled loop, the diagonal tiles are its last iterations with the "
                     "scores masked per sub-tile (key <= query); query blocks run heaviest first")
    if plan.decisions.kv_heads:
        lines.append(f"grouped-query: {plan.decisions.kv_heads} K/V heads; query head h reads K/V head "
                     f"h // (H // KV_HEADS)")
    if plan.decisions.varlen:
        lines.append("varlen: q [total_q, H, D], k, v [total_k, KV heads, D] packed; the CTA of (query block, "
                     "sequence b * H + head) reads the sequence's first rows and lengths from cu_seqlens_q/k and "
                     "returns when its block starts past the sequence; TMA reads the packed [1, heads, total, D] "
                     "views from the sequence's first row (rows of the next sequence are masked as keys past "
                     "seq_k, query rows past seq_q never stored); LSE [H, total_q]")
    return tuple(lines)


def _kernel_doc(plan: KernelPlan) -> str:
    """The kernel's docstring: what it computes and the shapes of its operands."""
    mask = " with the causal mask" if plan.decisions.causal else ""
    if plan.decisions.varlen:
        return (f"O = softmax(Q K^T * scale) V{mask} for one (query block, sequence*head) of packed sequences: Q, "
                f"O [total_q, H, D], K, V [total_k, KV heads, D] (read by rank-4 TMA descriptors of their [1, "
                f"heads, total, D] views from row cu_seqlens_*[b]); LSE [H, total_q] fp32 when lse_ptr is given.")
    shapes = ("Q, O are [B, H, S_q, D], K, V [B, KV_HEADS, S_k, D]" if plan.decisions.kv_heads
              else "Q, O are [B, H, S_q, D], K, V [B, H, S_k, D]")
    what = ("for the query blocks of the n_bh = B*H heads, claimed from work_counter (persistent)" if plan.persistent
            else "for one (query block, batch*head)")
    return (f"O = softmax(Q K^T * scale) V{mask} {what}; {shapes} (Q, K, V read by rank-4 TMA descriptors with "
            f"their own strides, O stored through o_stride_*); LSE [B*H*S_q] fp32 when lse_ptr is given.")


#: The (batch, head) of a CTA of the grid (query blocks, heads, batch) as one index, batch * heads + head: the
#: grid's order is that of (query blocks, batch * heads), each dimension within CUDA's limits.
BH = "(gl.program_id(1) + gl.program_id(2) * gl.num_programs(1))"


def _setup(plan: KernelPlan) -> tuple[str, ...]:
    """Program ids, the Q and K/V rows of the CTA and its trip count (see docs/codegen.md for causal and GQA)."""
    if plan.decisions.causal:
        pid = ["    # causal: chunks of heads_per_chunk heads, each chunk's query blocks heaviest (most key tiles) "
               "first across its heads",
               "    n_m = gl.num_programs(0)",
               "    n_bh = gl.num_programs(1) * gl.num_programs(2)  # batch * heads",
               f"    linear = gl.program_id(0) + {BH} * n_m  # launch order",
               *heaviest_first_chunks("linear", "n_m", "n_bh", "heavy", "bh"),
               "    pid_m = n_m - 1 - heavy"]
    else:
        pid = ["    pid_m = gl.program_id(0)", f"    bh = {BH}"]
    return tuple(pid + _rows(plan) + ["    " + (VARLEN_O_HEAD if plan.decisions.varlen else O_HEAD)] + _trip(plan))


def _rows(plan: KernelPlan) -> list[str]:
    """The batch ``b``, query head ``h`` and K/V head ``kv_h`` of ``bh`` (batch * heads + head), the block's first
    query ``q_start`` and ``q_row``, its first row of the LSE [B*H*S]."""
    kv_h = ("    kv_h = h // group  # grouped-query: query head h reads K/V head h // group" if plan.decisions.kv_heads
            else "    kv_h = h")
    if plan.decisions.varlen:
        return ["    b = bh // heads  # sequence",
                "    h = bh % heads  # query head",
                kv_h,
                "    # varlen: the sequence's first rows and lengths in the packed q and k/v",
                "    q_base = gl.load(cu_seqlens_q + b)",
                "    seq_q = gl.load(cu_seqlens_q + b + 1) - q_base",
                "    k_base = gl.load(cu_seqlens_k + b)",
                "    seq_k = gl.load(cu_seqlens_k + b + 1) - k_base",
                "    q_start = pid_m * BLOCK_M",
                "    if q_start >= seq_q:  # the grid covers max_seqlen_q: this block is past its sequence's end",
                "        return",
                "    q_row = h * total_q + q_base + q_start  # the block's first LSE row (LSE [H, total_q])"]
    return ["    b = bh // heads  # batch",
            "    h = bh % heads  # query head",
            kv_h,
            "    q_start = pid_m * BLOCK_M",
            "    q_row = bh * seq_q + q_start  # the block's first LSE row"]


def _trip(plan: KernelPlan) -> list[str]:
    """``n_tiles``: the key tiles of the query block (causal: up to its diagonal)."""
    if plan.decisions.causal:
        return ["    # causal: key tiles up to the CTA's diagonal; the fully masked tiles after it are never loaded",
                "    # (bottom-right aligned: query i sees keys 0..i + seq_k - seq_q); at least one tile, so a block",
                "    # whose queries see no key (seq_k < seq_q) runs one fully masked tile: O = 0, LSE = -inf",
                "    n_tiles = gl.maximum(gl.cdiv(gl.minimum(q_start + BLOCK_M + seq_k - seq_q, seq_k), BLOCK_N), 1)"]
    if plan.decisions.varlen:   # a sequence of no keys runs one fully masked tile: O = 0, LSE = -inf
        return ["    n_tiles = gl.maximum(gl.cdiv(seq_k, BLOCK_N), 1)"]
    return ["    n_tiles = gl.cdiv(seq_k, BLOCK_N)"]


def block_coords_source(plan: KernelPlan) -> str:
    """The persistent kernel's ``block_coords``: the query block of one work item, shared by the producer and
    the compute partitions."""
    order = ("chunks of heads_per_chunk heads, each chunk's heaviest query blocks first" if plan.decisions.causal
             else "query blocks of one (batch, head) after another")
    lines = ["@gluon.jit",
             f"def block_coords(item, n_m, seq_q, seq_k{_coords_args(plan)}):",
             '    """The query block of work item ``item`` in the order of the kernel with one CTA per block',
             f'    ({order}): its first query, its Q and K/V rows and its key tiles."""']
    if plan.decisions.causal:
        lines += [*heaviest_first_chunks("item", "n_m", "n_bh", "heavy", "bh"), "    pid_m = n_m - 1 - heavy"]
    else:
        lines += ["    pid_m = item % n_m", "    bh = item // n_m"]
    lines += _rows(plan) + _trip(plan) + ["    return q_start, q_row, b, h, kv_h, n_tiles"]
    return "\n".join(lines) + "\n"


def _block_coords_call(plan: KernelPlan) -> str:
    """The persistent kernel's line (in the loop over the CTA's blocks) that finds the block of work item
    ``item``."""
    return f"        q_start, q_row, b, h, kv_h, n_tiles = block_coords(item, n_m, seq_q, seq_k{_coords_args(plan)})"


def _coords_args(plan: KernelPlan) -> str:
    """``block_coords``'s parameters after ``seq_k``: the query heads, the heads and their chunks (causal), the
    K/V grouping."""
    return (", heads" + (", n_bh, heads_per_chunk" if plan.decisions.causal else "")
            + (", group" if plan.decisions.kv_heads else ""))


#: Host helper of the persistent attention launchers: the work counters, kept per device and stream.
WORK_COUNTER = '''
_WORK_COUNTERS = {}


def _work_counter(device):
    """The persistent kernel's two int32 counters on ``device`` for the current stream: work items claimed and
    CTAs done claiming. Zeroed when made, and every launch leaves them zeroed (its last CTA to finish claiming
    resets them), so the launches of one stream, or of one CUDA graph, take turns on one pair with no zeroing
    launch; launches that may run at once, in different streams, have different pairs."""
    import torch

    key = (device.index, _driver.active.get_current_stream(device.index))
    counter = _WORK_COUNTERS.get(key)
    if counter is None:
        counter = _WORK_COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return counter
'''


def _persistent_decisions(plan: KernelPlan) -> tuple[str, ...]:
    """Header lines of the persistent kernel: how it walks its query blocks."""
    if not plan.persistent:
        return ()
    return ("persistent: the launcher starts min(query blocks, SMs) CTAs and a zeroed work_counter (its pair of",
            "  counters per device and stream, which the kernel's last CTA to finish claiming zeroes again); CTA pid",
            "  takes work item pid first, then the producer claims the next one (atomic add on work_counter, plus",
            "  grid) once it has issued the block's loads: items are handed out in block_coords order (the",
            "  one-CTA-per-block order), so the CTAs running at a time work on neighbouring blocks of one head;",
            "  every partition loops while its item is below n_items. The K/V ring iteration first + j and the",
            "  tensor-core turn count (first - t * AHEAD + j) run on across blocks (never reset), so the producer",
            "  loads the next block's K/V while the compute partitions finish this one; Q has one buffer: each",
            "  compute partition hands it back (q_empty) once the block's last qk completed, and the producer",
            "  loads the next block's Q while the last P V, the normalisation and the stores run",
            "item hand-over: one slot, item_smem. The producer writes block t's item after its wait on q_empty",
            "  (phase t - 1) and before its arrive on q_bar (the expect of block t's Q; at the exit a plain arrive",
            "  with an item past the last); a compute partition reads it after its wait on q_bar (phase t), so",
            "  the arrive's release orders the write before the read; it reads it before its arrive on q_empty",
            "  (phase t), which the producer waits for before it writes the slot again")
