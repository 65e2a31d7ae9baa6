"""Microbenchmarks behind ``twill calibrate``: Gluon kernels that time one SM resource each (GPU only).

Every kernel reads the SM's cycle counter (``%clock64``) around its timed loop and records the SM it ran on
(``%smid``), so each result is in *cycles*, independent of the (power-capped, moving) clock; the clock itself
is measured separately as cycles over event time. CTAs that share an SM are added up per SM, so a result is
always "per SM" whatever the occupancy.

Each ``measure_*`` function launches one configuration on the current CUDA device, checks that the kernel
computed something (the output is compared against a torch reference or at least checked finite), and returns
a plain dict of numbers. Torch and Triton are imported when a function runs, never at import time of
:mod:`twill.machine`.

The kernels (all ``@gluon.jit``, sm_90):

* :func:`_mma_kernel` - chained ``wgmma`` (``m64nNk16``, or ``m64nNk32`` on fp8 e4m3 operands; K = 64 per
  group) from 1, 2 or 3 warp groups on operands resident in shared memory; ``LAG`` groups left in flight
  (1 = throughput, 0 = latency).
* :func:`_elementwise_kernel` - ``exp2``, FMA, row max and row sum over an fp32 tile in the wgmma
  accumulator layout (the layout attention's softmax works in), from 1, 2 or 3 warp groups.
* :func:`_softmax_kernel` - the attention forward's online-softmax step on an accumulator-layout tile, with
  or without ``O += P V`` in flight, from 1, 2 or 3 warp groups.
* :func:`_iteration_kernel` - the compute side of one attention-forward loop iteration: 1, 2 or 3 warp
  groups taking tensor-core turns, each issuing ``S = Q K^T`` and ``O += P V`` and running the online
  softmax in between, on K/V tiles resident in shared memory.
* :func:`_smem_kernel` - fp16 register -> shared memory -> register round trips of an accumulator tile.
* :func:`_tma_kernel` - TMA tile loads into a ring of ``DEPTH`` buffers completed on mbarriers.
* :func:`_tma_reduce_kernel` - TMA reduce-adds of an fp32 tile from shared memory into global memory, with
  ``DEPTH`` in flight, from CTAs that add into their own rows or, in groups, into the same rows.
* :func:`_handoff_kernel` - mbarrier ping-pong between two ``warp_specialize`` partitions.
"""

from __future__ import annotations

import statistics
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

#: Elementwise operations of :func:`_elementwise_kernel` (its ``OP`` constexpr).
ELEMENTWISE_OPS = {"exp2": 0, "fma": 1, "rowmax": 2, "rowsum": 3}


@gluon.constexpr_function
def _acc_layout(n, k=16):
    """The wgmma accumulator layout of one warp group's [64, n] tile (``m64nNk16``, ``m64nNk32`` for fp8
    operands with ``k`` 32; warps along M)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, k])


@gluon.jit
def _clock(anchor):
    """The SM cycle counter; ``anchor`` only gives the asm a scalar operand."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [anchor], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def _smid(anchor):
    """The SM this CTA runs on."""
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [anchor], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _record(stats_ptr, pid, t0, t1):
    """stats[pid] = (cycles, smid)."""
    gl.store(stats_ptr + pid * 2, t1 - t0)
    gl.store(stats_ptr + pid * 2 + 1, _smid(pid).to(gl.int64))


@gluon.jit
def _mma_loop(a_smem, b_smem, out_ptr, stats_ptr, reps, PART: gl.constexpr, GROUPS: gl.constexpr,
              BLOCK_N: gl.constexpr, LAG: gl.constexpr):
    """One warp group: acc[64, BLOCK_N] += A @ B ``reps`` times (BLOCK_K/16 ``m64nNk16`` per group, BLOCK_K/32
    ``m64nNk32`` for fp8), timed."""
    pid = gl.program_id(0)
    acc_layout: gl.constexpr = _acc_layout(BLOCK_N, 256 // a_smem.dtype.primitive_bitwidth)
    acc = gl.zeros([64, BLOCK_N], gl.float32, acc_layout)
    t0 = _clock(pid)
    for _ in range(reps):
        acc = warpgroup_mma(a_smem, b_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(LAG, deps=[acc])
    acc = warpgroup_mma_wait(0, deps=[acc])
    t1 = _clock(pid)
    _record(stats_ptr, pid * GROUPS + PART, t0, t1)
    om = gl.arange(0, 64, gl.SliceLayout(1, acc_layout))
    on = gl.arange(0, BLOCK_N, gl.SliceLayout(0, acc_layout))
    gl.store(out_ptr + (pid * GROUPS + PART) * 64 * BLOCK_N + om[:, None] * BLOCK_N + on[None, :], acc)


@gluon.jit
def _mma_kernel(a_ptr, b_ptr, out_ptr, stats_ptr, reps, GROUPS: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_K: gl.constexpr, LAG: gl.constexpr, WORKER_REGS: gl.constexpr):
    """GROUPS warp groups (the default partition and GROUPS-1 four-warp workers) each run :func:`_mma_loop`
    on A [64, BLOCK_K] and B [BLOCK_K, BLOCK_N] resident in shared memory; ``LAG`` wgmma groups stay in
    flight (1: throughput; 0: each group waited, its latency)."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    am = gl.arange(0, 64, gl.SliceLayout(1, blocked))
    ak = gl.arange(0, BLOCK_K, gl.SliceLayout(0, blocked))
    a = gl.load(a_ptr + am[:, None] * BLOCK_K + ak[None, :])
    a_smem = gl.allocate_shared_memory(dtype, [64, BLOCK_K],
                                       gl.NVMMASharedLayout.get_default_for([64, BLOCK_K], dtype), a)
    if dtype.primitive_bitwidth == 8:
        # the fp8 wgmma reads B K-major only: b_ptr holds B^T [BLOCK_N, BLOCK_K], B is its transposed view
        bn = gl.arange(0, BLOCK_N, gl.SliceLayout(1, blocked))
        bk = gl.arange(0, BLOCK_K, gl.SliceLayout(0, blocked))
        bt = gl.load(b_ptr + bn[:, None] * BLOCK_K + bk[None, :])
        b_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_K],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], dtype),
                                           bt).permute((1, 0))
    else:
        bk = gl.arange(0, BLOCK_K, gl.SliceLayout(1, blocked))
        bn = gl.arange(0, BLOCK_N, gl.SliceLayout(0, blocked))
        b = gl.load(b_ptr + bk[:, None] * BLOCK_N + bn[None, :])
        b_smem = gl.allocate_shared_memory(dtype, [BLOCK_K, BLOCK_N],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], dtype), b)
    fence_async_shared()
    gl.thread_barrier()
    if GROUPS == 1:
        _mma_loop(a_smem, b_smem, out_ptr, stats_ptr, reps, 0, 1, BLOCK_N, LAG)
    elif GROUPS == 2:
        gl.warp_specialize([
            (_mma_loop, (a_smem, b_smem, out_ptr, stats_ptr, reps, 0, 2, BLOCK_N, LAG)),
            (_mma_loop, (a_smem, b_smem, out_ptr, stats_ptr, reps, 1, 2, BLOCK_N, LAG)),
        ], [4], [WORKER_REGS])
    else:
        gl.warp_specialize([
            (_mma_loop, (a_smem, b_smem, out_ptr, stats_ptr, reps, 0, 3, BLOCK_N, LAG)),
            (_mma_loop, (a_smem, b_smem, out_ptr, stats_ptr, reps, 1, 3, BLOCK_N, LAG)),
            (_mma_loop, (a_smem, b_smem, out_ptr, stats_ptr, reps, 2, 3, BLOCK_N, LAG)),
        ], [4, 4], [WORKER_REGS, WORKER_REGS])


@gluon.jit
def _elementwise_loop(x_ptr, out_ptr, stats_ptr, reps, PART: gl.constexpr, GROUPS: gl.constexpr,
                      OP: gl.constexpr, COLS: gl.constexpr):
    """One warp group: ``reps`` rounds of one elementwise operation over a [64, COLS] fp32 tile in the
    wgmma accumulator layout: OP 0 ``x = exp2(-x)``; 1 ``x = x*a + b``; 2 ``x = x - rowmax(x)*a``;
    3 ``x = x - rowsum(x)*a``; timed."""
    pid = gl.program_id(0)
    layout: gl.constexpr = _acc_layout(COLS)
    rows = gl.arange(0, 64, gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, gl.SliceLayout(0, layout))
    offs = rows[:, None] * COLS + cols[None, :]
    x = gl.load(x_ptr + offs)
    t0 = _clock(pid)
    for _ in range(reps):
        if OP == 0:
            x = gl.exp2(-x)
        elif OP == 1:
            x = x * 0.999 + 0.0005
        elif OP == 2:
            x = x - gl.max(x, 1)[:, None] * 0.001
        else:
            x = x - gl.sum(x, 1)[:, None] * 0.0001
    t1 = _clock(pid)
    _record(stats_ptr, pid * GROUPS + PART, t0, t1)
    gl.store(out_ptr + (pid * GROUPS + PART) * 64 * COLS + offs, x)


@gluon.jit
def _elementwise_kernel(x_ptr, out_ptr, stats_ptr, reps, GROUPS: gl.constexpr, OP: gl.constexpr,
                        COLS: gl.constexpr):
    """GROUPS warp groups each run :func:`_elementwise_loop` (contention for MUFU and the FP32 pipes)."""
    if GROUPS == 1:
        _elementwise_loop(x_ptr, out_ptr, stats_ptr, reps, 0, 1, OP, COLS)
    elif GROUPS == 2:
        gl.warp_specialize([
            (_elementwise_loop, (x_ptr, out_ptr, stats_ptr, reps, 0, 2, OP, COLS)),
            (_elementwise_loop, (x_ptr, out_ptr, stats_ptr, reps, 1, 2, OP, COLS)),
        ], [4], [168])
    else:
        gl.warp_specialize([
            (_elementwise_loop, (x_ptr, out_ptr, stats_ptr, reps, 0, 3, OP, COLS)),
            (_elementwise_loop, (x_ptr, out_ptr, stats_ptr, reps, 1, 3, OP, COLS)),
            (_elementwise_loop, (x_ptr, out_ptr, stats_ptr, reps, 2, 3, OP, COLS)),
        ], [4, 4], [152, 152])


@gluon.jit
def _online_step(s, m_i, l_i, SCALE: gl.constexpr):
    """One online-softmax step on scores ``s`` scaled by ``SCALE`` in base 2: P, alpha, the new row max and
    the new row sum (what the generated attention forward's ``online_softmax`` computes)."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * SCALE)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * SCALE - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _store_group_output(out_ptr, slot, o, l_i, HEAD_DIM: gl.constexpr, o_layout: gl.constexpr,
                        s_layout: gl.constexpr):
    """Row ``slot`` of ``out`` ([.., 64 * HEAD_DIM + 64] fp32): one warp group's O tile, then its row sums."""
    orow = gl.arange(0, 64, gl.SliceLayout(1, o_layout))
    ocol = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    base = out_ptr + slot * (64 * HEAD_DIM + 64)
    gl.store(base + orow[:, None] * HEAD_DIM + ocol[None, :], o)
    gl.store(base + 64 * HEAD_DIM + gl.arange(0, 64, gl.SliceLayout(1, s_layout)), l_i)


@gluon.jit
def _softmax_loop(s_ptr, v_smem, out_ptr, stats_ptr, reps, PART: gl.constexpr, GROUPS: gl.constexpr,
                  BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, PV: gl.constexpr):
    """One warp group: ``reps`` online-softmax steps as the generated attention forward runs them, on a
    [64, BLOCK_N] fp32 score tile in the wgmma accumulator layout (row max, alpha, ``P = exp2(S*c - m)``,
    row sum) followed by ``O *= alpha`` on a [64, HEAD_DIM] accumulator; each step's P is the next step's S
    (no extra work, nothing loop-invariant). With PV the step also converts P to the fp16 wgmma operand and
    keeps ``O += P V`` (A from registers, V in shared memory) in flight while the softmax runs, as the
    kernel does; timed."""
    pid = gl.program_id(0)
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = gl.arange(0, 64, gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    s = gl.load(s_ptr + rows[:, None] * BLOCK_N + cols[None, :])
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.full([64], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
    o = gl.full([64, HEAD_DIM], 1.0, gl.float32, o_layout)
    p = s
    t0 = _clock(pid)
    for _ in range(reps):
        if PV:
            p_op = gl.convert_layout(p.to(gl.float16), p_layout)
            o_tok = warpgroup_mma(p_op, v_smem, o, is_async=True)
        p, alpha, m_i, l_i = _online_step(s, m_i, l_i, 0.5)
        if PV:
            o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        s = p
    t1 = _clock(pid)
    _record(stats_ptr, pid * GROUPS + PART, t0, t1)
    _store_group_output(out_ptr, pid * GROUPS + PART, o, l_i, HEAD_DIM, o_layout, s_layout)


@gluon.jit
def _softmax_kernel(s_ptr, v_ptr, out_ptr, stats_ptr, reps, GROUPS: gl.constexpr, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr, PV: gl.constexpr, WORKER_REGS: gl.constexpr):
    """GROUPS warp groups each run :func:`_softmax_loop` (V [BLOCK_N, HEAD_DIM] fp16 in shared memory)."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    vk = gl.arange(0, BLOCK_N, gl.SliceLayout(1, blocked))
    vn = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, blocked))
    v = gl.load(v_ptr + vk[:, None] * HEAD_DIM + vn[None, :])
    v_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, HEAD_DIM],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.float16), v)
    fence_async_shared()
    gl.thread_barrier()
    if GROUPS == 1:
        _softmax_loop(s_ptr, v_smem, out_ptr, stats_ptr, reps, 0, 1, BLOCK_N, HEAD_DIM, PV)
    elif GROUPS == 2:
        gl.warp_specialize([
            (_softmax_loop, (s_ptr, v_smem, out_ptr, stats_ptr, reps, 0, 2, BLOCK_N, HEAD_DIM, PV)),
            (_softmax_loop, (s_ptr, v_smem, out_ptr, stats_ptr, reps, 1, 2, BLOCK_N, HEAD_DIM, PV)),
        ], [4], [WORKER_REGS])
    else:
        gl.warp_specialize([
            (_softmax_loop, (s_ptr, v_smem, out_ptr, stats_ptr, reps, 0, 3, BLOCK_N, HEAD_DIM, PV)),
            (_softmax_loop, (s_ptr, v_smem, out_ptr, stats_ptr, reps, 1, 3, BLOCK_N, HEAD_DIM, PV)),
            (_softmax_loop, (s_ptr, v_smem, out_ptr, stats_ptr, reps, 2, 3, BLOCK_N, HEAD_DIM, PV)),
        ], [4, 4], [WORKER_REGS, WORKER_REGS])


@gluon.jit
def _iteration_loop(q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, PART: gl.constexpr,
                    GROUPS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """One compute warp group of the generated attention forward with its loads taken away: ``reps``
    iterations of the loop body the generator emits when S runs one stage ahead of P V, on K and V tiles
    resident in shared memory. Per iteration: wait for the K and V tiles (``ready``: always complete), wait
    for the tensor-core turn (``turns``, the ping-pong of ``GROUPS`` groups), issue ``S = Q K^T`` and
    ``O += P V`` (P converted to the fp16 register operand), pass the turn on, retire S, release K
    (``empty``), run the online softmax while ``O += P V`` is in flight, retire it, release V and rescale O;
    timed."""
    pid = gl.program_id(0)
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q = q_smem.index(PART)
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
    o = gl.zeros([64, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.full([64], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
    s_tok = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    p, alpha, m_i, l_i = _online_step(s, m_i, l_i, 0.0625)
    t0 = _clock(pid)
    for j in range(reps):
        mbarrier.wait(ready, 0)  # K tile j + 1
        if GROUPS > 1:
            mbarrier.wait(turns.index(PART), j & 1)
        s_tok = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        p_op = gl.convert_layout(p.to(gl.float16), p_layout)
        mbarrier.wait(ready, 0)  # V tile j
        o_tok = warpgroup_mma(p_op, v_smem, o, is_async=True)
        if GROUPS > 1:
            mbarrier.arrive(turns.index((PART + 1) % GROUPS))
        s, o, p_op = warpgroup_mma_wait(1, deps=[s_tok, o_tok, p_op])
        mbarrier.arrive(empty)  # K tile released
        p, alpha, m_i, l_i = _online_step(s, m_i, l_i, 0.0625)
        o, p_op = warpgroup_mma_wait(0, deps=[o, p_op])
        mbarrier.arrive(empty)  # V tile released
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    t1 = _clock(pid)
    _record(stats_ptr, pid * GROUPS + PART, t0, t1)
    _store_group_output(out_ptr, pid * GROUPS + PART, o, l_i, HEAD_DIM, o_layout, s_layout)


@gluon.jit
def _iteration_kernel(q_ptr, k_ptr, v_ptr, out_ptr, stats_ptr, reps, GROUPS: gl.constexpr, BLOCK_N: gl.constexpr,
                      HEAD_DIM: gl.constexpr, WORKER_REGS: gl.constexpr):
    """GROUPS warp groups each run :func:`_iteration_loop` on their own 64 query rows (Q [GROUPS * 64,
    HEAD_DIM]) against one K and one V tile ([BLOCK_N, HEAD_DIM], fp16), all in shared memory."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, blocked))
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.float16)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, HEAD_DIM], gl.float16)
    kv_rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, blocked))
    k_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, HEAD_DIM], tile_layout,
                                       gl.load(k_ptr + kv_rows[:, None] * HEAD_DIM + cols[None, :]))
    v_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, HEAD_DIM], tile_layout,
                                       gl.load(v_ptr + kv_rows[:, None] * HEAD_DIM + cols[None, :]))
    q_smem = gl.allocate_shared_memory(gl.float16, [GROUPS, 64, HEAD_DIM], q_layout)
    q_rows = gl.arange(0, 64, gl.SliceLayout(1, blocked))
    for g in gl.static_range(GROUPS):
        q_smem.index(g).store(gl.load(q_ptr + (g * 64 + q_rows)[:, None] * HEAD_DIM + cols[None, :]))
    turns = gl.allocate_shared_memory(gl.int64, [GROUPS, 1], mbarrier.MBarrierLayout())
    for g in gl.static_range(GROUPS):
        mbarrier.init(turns.index(g), count=1)
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    mbarrier.init(empty, count=1)
    mbarrier.arrive(ready)  # phase 0 complete: every wait on it returns at once, as on a tile already loaded
    mbarrier.arrive(turns.index(0))  # group 0 takes the first tensor-core turn
    fence_async_shared()
    gl.thread_barrier()
    if GROUPS == 1:
        _iteration_loop(q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, 0, 1, BLOCK_N,
                        HEAD_DIM)
    elif GROUPS == 2:
        gl.warp_specialize([
            (_iteration_loop, (q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, 0, 2,
                               BLOCK_N, HEAD_DIM)),
            (_iteration_loop, (q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, 1, 2,
                               BLOCK_N, HEAD_DIM)),
        ], [4], [WORKER_REGS])
    else:
        gl.warp_specialize([
            (_iteration_loop, (q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, 0, 3,
                               BLOCK_N, HEAD_DIM)),
            (_iteration_loop, (q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, 1, 3,
                               BLOCK_N, HEAD_DIM)),
            (_iteration_loop, (q_smem, k_smem, v_smem, turns, ready, empty, out_ptr, stats_ptr, reps, 2, 3,
                               BLOCK_N, HEAD_DIM)),
        ], [4, 4], [WORKER_REGS, WORKER_REGS])


@gluon.jit
def _smem_kernel(x_ptr, out_ptr, stats_ptr, reps, ROWS: gl.constexpr, COLS: gl.constexpr,
                 num_warps: gl.constexpr):
    """``reps`` round trips of an fp16 [ROWS, COLS] accumulator-layout tile through (swizzled) shared memory,
    as when a result crosses warp groups or is staged for a store."""
    pid = gl.program_id(0)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, COLS, 16])
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, gl.SliceLayout(0, layout))
    offs = rows[:, None] * COLS + cols[None, :]
    x = gl.load(x_ptr + offs)
    smem = gl.allocate_shared_memory(gl.float16, [ROWS, COLS],
                                     gl.NVMMASharedLayout.get_default_for([ROWS, COLS], gl.float16))
    gl.thread_barrier()
    t0 = _clock(pid)
    for _ in range(reps):
        smem.store(x)
        x = smem.load(layout) * 0.999
    gl.thread_barrier()
    t1 = _clock(pid)
    _record(stats_ptr, pid, t0, t1)
    gl.store(out_ptr + pid * ROWS * COLS + offs, x)


@gluon.jit
def _tma_kernel(desc, out_ptr, stats_ptr, reps, rows_total, DEPTH: gl.constexpr, L2_ROWS: gl.constexpr,
                num_warps: gl.constexpr):
    """``reps`` TMA tile loads through a ring of DEPTH buffers: the load of iteration i + DEPTH is issued as
    soon as iteration i's tile has landed. Tiles walk through ``rows_total`` rows (DRAM streaming) or, with
    L2_ROWS > 0, through the first L2_ROWS rows only (L2-resident)."""
    pid = gl.program_id(0)
    BM: gl.constexpr = desc.block_type.shape[0]
    BK: gl.constexpr = desc.block_type.shape[1]
    ring = gl.allocate_shared_memory(desc.dtype, [DEPTH, BM, BK], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(DEPTH):
        mbarrier.init(ready.index(j), count=1)
    if L2_ROWS > 0:
        span = L2_ROWS // BM + rows_total * 0
    else:
        span = rows_total // BM
    first = pid * reps
    gl.thread_barrier()
    t0 = _clock(pid)
    for j in gl.static_range(DEPTH):
        mbarrier.expect(ready.index(j), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [((first + j) % span) * BM, 0], ready.index(j), ring.index(j))
    for i in range(reps):
        buf = i % DEPTH
        mbarrier.wait(ready.index(buf), (i // DEPTH) & 1)
        if i + DEPTH < reps:
            mbarrier.expect(ready.index(buf), desc.block_type.nbytes)
            tma.async_copy_global_to_shared(desc, [((first + i + DEPTH) % span) * BM, 0], ready.index(buf),
                                            ring.index(buf))
    gl.thread_barrier()
    t1 = _clock(pid)
    _record(stats_ptr, pid, t0, t1)
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    tile = ring.index(0).load(blocked)
    r = gl.arange(0, BM, gl.SliceLayout(1, blocked))
    c = gl.arange(0, BK, gl.SliceLayout(0, blocked))
    gl.store(out_ptr + pid * BM * BK + r[:, None] * BK + c[None, :], tile)


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA reduce-add of the shared tile ``src`` into ``tensor_desc``'s tensor at ``coord`` (one
    ``cp.reduce.async.bulk.tensor ... .add``): Triton 3.6's Gluon builder has the operation, its language
    no wrapper (the generated attention backward emits the same one)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _tma_reduce_kernel(desc, stats_ptr, reps, span, SHARE: gl.constexpr, STAGGER: gl.constexpr,
                       DEPTH: gl.constexpr, num_warps: gl.constexpr):
    """``reps`` TMA reduce-adds of an fp32 tile of ones from a ring of DEPTH shared buffers, DEPTH left
    reading (a buffer is reused once ``cp.async.bulk.wait_group.read`` says the TMA has read it, as the
    attention backward's dQ staging is). CTAs ``SHARE`` at a time walk the same ``span`` tiles: in step
    (all at tile ``i % span`` together, as the key blocks of one head add dQ), or with STAGGER each from its
    own starting tile."""
    pid = gl.program_id(0)
    BM: gl.constexpr = desc.block_type.shape[0]
    BN: gl.constexpr = desc.block_type.shape[1]
    blocked: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    ring = gl.allocate_shared_memory(gl.float32, [DEPTH, BM, BN], desc.layout)
    for d in gl.static_range(DEPTH):
        ring.index(d).store(gl.full([BM, BN], 1.0, gl.float32, blocked))
    fence_async_shared()
    gl.thread_barrier()
    base = (pid // SHARE) * span
    offset = (pid % SHARE) * STAGGER
    t0 = _clock(pid)
    for i in range(reps):
        _tma_reduce_add(desc, [(base + (i + offset) % span) * BM, 0], ring.index(i % DEPTH))
        tma.store_wait(DEPTH - 1)
    tma.store_wait(0)
    t1 = _clock(pid)
    _record(stats_ptr, pid, t0, t1)


@gluon.jit
def _ping_partition(ping, pong, stats_ptr, reps):
    """Default partition: arrive on ``ping``, wait for ``pong``; timed."""
    pid = gl.program_id(0)
    gl.thread_barrier()
    t0 = _clock(pid)
    for i in range(reps):
        mbarrier.arrive(ping)
        mbarrier.wait(pong, i & 1)
    t1 = _clock(pid)
    _record(stats_ptr, pid, t0, t1)


@gluon.jit
def _pong_partition(ping, pong, reps):
    """Worker partition: wait for ``ping``, arrive on ``pong``."""
    for i in range(reps):
        mbarrier.wait(ping, i & 1)
        mbarrier.arrive(pong)


@gluon.jit
def _handoff_kernel(stats_ptr, reps, WORKER_WARPS: gl.constexpr, num_warps: gl.constexpr):
    """Two partitions hand a token back and forth through two mbarriers ``reps`` times (2 hand-offs each)."""
    ping = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pong = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ping, count=1)
    mbarrier.init(pong, count=1)
    gl.warp_specialize([
        (_ping_partition, (ping, pong, stats_ptr, reps)),
        (_pong_partition, (ping, pong, reps)),
    ], [WORKER_WARPS], [48])


@gluon.jit
def _empty_kernel(x_ptr):
    """Does nothing: times a launch."""
    pass


# ----------------------------------------------------------------------------------------------------------
# Host side: launch, check, reduce per SM.
# ----------------------------------------------------------------------------------------------------------

def _torch():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: 'twill calibrate' runs on the GPU machine")
    return torch


def sm_count() -> int:
    return _torch().cuda.get_device_properties(0).multi_processor_count


def _per_sm(stats: Any, work_per_cta: float) -> dict[str, float]:
    """Reduce per-CTA (cycles, smid) rows to per-SM rates: the work of the CTAs that shared an SM over the
    longest of their cycle counts, as a median over SMs; also the median per-CTA cycles."""
    rows = stats.view(-1, 2).cpu().tolist()
    by_sm: dict[int, list[int]] = {}
    for cycles, sm in rows:
        by_sm.setdefault(int(sm), []).append(int(cycles))
    rates = [len(c) * work_per_cta / max(c) for c in by_sm.values()]
    return {"per_clk": statistics.median(rates), "cycles": statistics.median(c for v in by_sm.values() for c in v),
            "ctas_per_sm": statistics.median(len(c) for c in by_sm.values())}


def _group_buffers(groups: int, *shape: int) -> tuple[int, Any, Any]:
    """One CTA per SM with ``groups`` warp groups: (grid, an output of ``shape`` per group poisoned with NaN,
    the zeroed (cycles, smid) stats of every group)."""
    torch = _torch()
    grid = sm_count()
    out = torch.full((grid * groups, *shape), float("nan"), device="cuda")
    return grid, out, torch.zeros(grid * groups * 2, dtype=torch.int64, device="cuda")


def _elapsed_ms(fn) -> float:
    torch = _torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _worker_regs(groups: int) -> int:
    """Registers per thread of each 4-warp worker partition: the register file split over the groups,
    rounded down to a ``setmaxnreg`` multiple of 8, at most 240."""
    return min(240, (65536 // (128 * groups)) // 8 * 8)


def measure_mma(n: int, dtype: str = "fp16", groups: int = 1, lag: int = 1, reps: int = 4096) -> dict[str, float]:
    """wgmma ``m64nNk16`` from ``groups`` warp groups per CTA: SM-wide FLOP per clock (``lag`` 1: one group of
    BLOCK_K/16 instructions left in flight) or cycles per K=64 group (``lag`` 0: each group waited). Checked
    against torch first. Also returns the sustained clock (cycles / event time) of the long run. ``dtype``
    ``fp8`` (the machine tables' rate class, :data:`twill.machine.costs.FP8_FORMATS`) runs ``m64nNk32`` on
    e4m3 operands, B K-major."""
    torch = _torch()
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[dtype]
    block_k = 64
    a = (torch.randn(64, block_k, device="cuda") / 8).to(tdt)
    b = (torch.randn(block_k, n, device="cuda") / 8).to(tdt)
    b_arg = b.t().contiguous() if dtype == "fp8" else b   # the kernel reads an fp8 B as B^T (K-major)
    grid, out, stats = _group_buffers(groups, 64, n)

    def launch(r):
        _mma_kernel[(grid,)](a, b_arg, out, stats, r, GROUPS=groups, BLOCK_N=n, BLOCK_K=block_k, LAG=lag,
                             WORKER_REGS=_worker_regs(groups), num_warps=4)

    launch(3)
    ref = 3 * (a.float() @ b.float())
    err = max(((out[i] - ref).norm() / ref.norm()).item() for i in range(groups))
    if not err < 1e-2:
        raise RuntimeError(f"mma microbenchmark wrong: relative error {err:.3g}")
    launch(reps)  # warm-up at full length
    ms = _elapsed_ms(lambda: launch(reps))
    per_sm = _per_sm(stats, 2.0 * 64 * n * block_k * reps)
    return {"n": n, "dtype": dtype, "groups": groups, "lag": lag, "flops_per_clk": per_sm["per_clk"],
            "cycles_per_group": per_sm["cycles"] / reps, "ctas_per_sm": per_sm["ctas_per_sm"],
            "clock_ghz": per_sm["cycles"] / (ms * 1e6), "ms": ms, "rel_error": err}


def measure_elementwise(op: str, groups: int = 1, cols: int = 128, reps: int = 2048) -> dict[str, float]:
    """An elementwise op over a [64, cols] fp32 accumulator-layout tile in each of ``groups`` warp groups:
    SM-wide elements per clock. Checked against float64 torch first."""
    torch = _torch()
    x = torch.rand(64, cols, device="cuda") * 0.5 + 0.25
    grid, out, stats = _group_buffers(groups, 64, cols)

    def launch(r):
        _elementwise_kernel[(grid,)](x, out, stats, r, GROUPS=groups, OP=ELEMENTWISE_OPS[op], COLS=cols,
                                     num_warps=4)

    launch(2)
    ref = x.double()
    for _ in range(2):
        if op == "exp2":
            ref = torch.exp2(-ref)
        elif op == "fma":
            ref = ref * 0.999 + 0.0005
        elif op == "rowmax":
            ref = ref - ref.amax(1, keepdim=True) * 0.001
        else:
            ref = ref - ref.sum(1, keepdim=True) * 0.0001
    err = max(((out[i].double() - ref).norm() / ref.norm()).item() for i in range(groups))
    if not err < 1e-4:
        raise RuntimeError(f"{op} microbenchmark wrong: relative error {err:.3g}")
    launch(reps)
    per_sm = _per_sm(stats, float(64 * cols * reps))
    return {"op": op, "groups": groups, "cols": cols, "elements_per_clk": per_sm["per_clk"],
            "ctas_per_sm": per_sm["ctas_per_sm"], "rel_error": err}


def measure_softmax(groups: int = 1, block_n: int = 128, head_dim: int = 128, pv: bool = False,
                    reps: int = 1024) -> dict[str, float]:
    """The attention forward's online-softmax step (:func:`_softmax_loop`) in each of ``groups`` warp groups,
    with or without ``O += P V`` in flight: cycles per step (median over CTAs). Checked against a float64
    torch replay of the same steps first."""
    torch = _torch()
    s = torch.rand(64, block_n, device="cuda")
    v = (torch.rand(block_n, head_dim, device="cuda") / block_n).half()
    grid, out, stats = _group_buffers(groups, 64 * head_dim + 64)

    def launch(r):
        _softmax_kernel[(grid,)](s, v, out, stats, r, GROUPS=groups, BLOCK_N=block_n, HEAD_DIM=head_dim, PV=pv,
                                 WORKER_REGS=_worker_regs(groups), num_warps=4)

    launch(3)
    sd, vd = s.double(), v.double()
    m = torch.full((64,), float("-inf"), dtype=torch.float64, device="cuda")
    l = torch.zeros(64, dtype=torch.float64, device="cuda")
    o = torch.ones(64, head_dim, dtype=torch.float64, device="cuda")
    p = sd
    for _ in range(3):
        if pv:
            o = o + p.half().double() @ vd
        m_new = torch.maximum(m, sd.amax(1) * 0.5)
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(sd * 0.5 - m_new[:, None])
        l, m = l * alpha + p.sum(1), m_new
        o = o * alpha[:, None]
        sd = p
    ref = torch.cat([o.flatten(), l])
    err = max(((out[i].double() - ref).norm() / ref.norm()).item() for i in range(groups))
    if not err < 1e-3:
        raise RuntimeError(f"softmax microbenchmark wrong: relative error {err:.3g}")
    launch(reps)
    per_sm = _per_sm(stats, float(reps))
    return {"groups": groups, "block_n": block_n, "head_dim": head_dim, "pv": pv,
            "cycles_per_step": per_sm["cycles"] / reps, "steps_per_clk": per_sm["per_clk"],
            "ctas_per_sm": per_sm["ctas_per_sm"], "rel_error": err}


def measure_attention_iteration(groups: int = 2, block_n: int = 128, head_dim: int = 128,
                                reps: int = 1024) -> dict[str, float]:
    """The compute side of one attention-forward loop iteration (:func:`_iteration_loop`): cycles per
    iteration of each of ``groups`` warp groups taking tensor-core turns (median over CTAs), one CTA per SM.
    Checked against a float64 torch replay of the same iterations first."""
    torch = _torch()
    q = (torch.rand(64 * groups, head_dim, device="cuda") / 2).half()
    k = (torch.rand(block_n, head_dim, device="cuda") / 2).half()
    v = (torch.rand(block_n, head_dim, device="cuda") / block_n).half()
    grid, out, stats = _group_buffers(groups, 64 * head_dim + 64)

    def launch(r):
        _iteration_kernel[(grid,)](q, k, v, out, stats, r, GROUPS=groups, BLOCK_N=block_n, HEAD_DIM=head_dim,
                                   WORKER_REGS=_worker_regs(groups), num_warps=4)

    checked = 3
    launch(checked)
    err = 0.0
    for g in range(groups):
        s = q[64 * g:64 * (g + 1)].double() @ k.double().T
        m = (s.amax(1) * 0.0625)
        p = torch.exp2(s * 0.0625 - m[:, None])
        l = p.sum(1)
        o = torch.zeros(64, head_dim, dtype=torch.float64, device="cuda")
        for _ in range(checked):  # the scores repeat: alpha stays 1 after the first step
            o = o + p.half().double() @ v.double()
            p = torch.exp2(s * 0.0625 - m[:, None])
            l = l + p.sum(1)
        ref = torch.cat([o.flatten(), l])
        err = max(err, ((out[g].double() - ref).norm() / ref.norm()).item())
    return _timed_iteration(launch, stats, reps, err, 1e-3, "attention iteration",
                            groups=groups, block_n=block_n, head_dim=head_dim)


def _timed_iteration(launch: Any, stats: Any, reps: int, err: float, tolerance: float, what: str,
                     **keys: Any) -> dict[str, Any]:
    """The end of an iteration microbenchmark whose checked launch gave relative error ``err``: refuse it over
    ``tolerance``, else time ``reps`` iterations; ``keys`` (the tile), then cycles per iteration, CTAs per SM
    and the error."""
    if not err < tolerance:
        raise RuntimeError(f"{what} microbenchmark wrong: relative error {err:.3g}")
    launch(reps)
    per_sm = _per_sm(stats, float(reps))
    return {**keys, "cycles_per_iteration": per_sm["cycles"] / reps, "ctas_per_sm": per_sm["ctas_per_sm"],
            "rel_error": err}


@gluon.jit
def _bwd_iteration_loop(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_stage, stats_smem, ready, empty, out_ptr,
                        stats_ptr, reps, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        HEAD_DIM: gl.constexpr, DQ_WARPS_M: gl.constexpr):
    """The timed loop of :func:`_bwd_iteration_kernel`, in the default partition as in the generated kernel
    (so that it gets the same register budget)."""
    pid = gl.program_id(0)
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[DQ_WARPS_M, 8 // DQ_WARPS_M],
                                                        instr_shape=[16, HEAD_DIM * DQ_WARPS_M // 8, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    gl.store(stats_ptr + pid * 2, _clock(pid))  # the start, kept in memory: no register held over the loop
    for j in range(reps):
        mbarrier.wait(ready, 0)  # the Q tile
        st_tok = warpgroup_mma(k_smem, q_smem.index(j % 2).permute((1, 0)), st_zero, use_acc=False, is_async=True)
        mbarrier.wait(ready, 0)  # the dO tile
        dpt_tok = warpgroup_mma(v_smem, do_smem.index(j % 2).permute((1, 0)), st_zero, use_acc=False, is_async=True)
        mbarrier.wait(ready, 0)  # the LSE and D rows
        st = warpgroup_mma_wait(1, deps=[st_tok])
        lse = gl.max(stats_smem.slice(0, 1).load(st_layout), 0)  # read per iteration, as the kernel's ring
        p = gl.exp2(st * qk_scale - lse[None, :])
        dpt = warpgroup_mma_wait(0, deps=[dpt_tok])
        delta = gl.max(stats_smem.slice(1, 1).load(st_layout), 0)
        ds = p * (dpt - delta[None, :])
        p16 = gl.convert_layout(p.to(gl.float16), op_layout)
        ds_smem.store(ds.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        dv_tok = warpgroup_mma(p16, do_smem.index(j % 2), dv, is_async=True)
        ds16 = gl.convert_layout(ds.to(gl.float16), op_layout)
        dk_tok = warpgroup_mma(ds16, q_smem.index(j % 2), dk, is_async=True)
        dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zero, use_acc=False, is_async=True)
        dv, dk, dqv, p16, ds16 = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok, p16, ds16])
        mbarrier.wait(ready, 0)  # the dQ staging tile is free
        dq_stage.store(dqv)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(empty)  # dQ staged
        gl.thread_barrier()
        mbarrier.arrive(empty)  # the Q, dO and stats buffers released
        mbarrier.arrive(empty)
        mbarrier.arrive(empty)
    t1 = _clock(pid)
    _record(stats_ptr, pid, gl.load(stats_ptr + pid * 2), t1)
    base = out_ptr + pid * (2 * BLOCK_N + BLOCK_M) * HEAD_DIM
    kr = gl.arange(0, BLOCK_N, gl.SliceLayout(1, kv_layout))
    kc = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, kv_layout))
    gl.store(base + kr[:, None] * HEAD_DIM + kc[None, :], dk)
    gl.store(base + (BLOCK_N + kr[:, None]) * HEAD_DIM + kc[None, :], dv)
    # the last dQ, from its staging tile (kept out of the loop's registers, as in the kernel)
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, blocked))
    m_rows = gl.arange(0, BLOCK_M, gl.SliceLayout(1, blocked))
    gl.store(base + (2 * BLOCK_N + m_rows[:, None]) * HEAD_DIM + cols[None, :], dq_stage.load(blocked))


@gluon.jit
def _idle_worker(ready):
    """A one-warp partition with nothing to do: the generated backward's producer warp, without its loads."""
    pass


@gluon.jit
def _bwd_iteration_kernel(q_ptr, k_ptr, v_ptr, do_ptr, rows_ptr, out_ptr, stats_ptr, reps, qk_scale,
                          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                          DQ_WARPS_M: gl.constexpr):
    """The compute side of one loop iteration of the generated attention backward (FA3's order, one 8-warp
    partition, every wgmma retired before the back edge) with its loads taken away: Q and dO [BLOCK_M,
    HEAD_DIM] (two copies each, used in turn as the kernel's 2-deep rings) and K, V [BLOCK_N, HEAD_DIM]
    resident in shared memory, the LSE and D rows too (``rows_ptr``: [2, BLOCK_M], read each iteration as
    from the kernel's stats ring), and each ring wait on a barrier that is always complete. Per iteration:
    S^T = K Q^T and dP^T = V dO^T issued, S^T retired, P^T = exp2(S^T * scale - LSE), dP^T retired,
    dS^T = P^T * (dP^T - D), P^T and dS^T converted to fp16 register operands, dS^T stored to shared memory
    behind a fence and a partition barrier, dV += P^T dO, dK += dS^T Q and dQ = dS K issued and retired,
    dQ stored to its fp32 staging tile behind a fence and a barrier (no producer reduces it), the buffers
    released; timed. A one-warp partition beside it does nothing (the kernel's producer, without its loads),
    so that the loop runs with the register budget the kernel's compute partition gets."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, blocked))
    n_rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, blocked))
    m_rows = gl.arange(0, BLOCK_M, gl.SliceLayout(1, blocked))
    n_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.float16)
    m_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float16)
    k_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, HEAD_DIM], n_layout,
                                       gl.load(k_ptr + n_rows[:, None] * HEAD_DIM + cols[None, :]))
    v_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, HEAD_DIM], n_layout,
                                       gl.load(v_ptr + n_rows[:, None] * HEAD_DIM + cols[None, :]))
    # two copies of Q and dO, taken in turn, as the kernel's 2-deep rings (the wgmma operands then change
    # every iteration, as in the kernel, instead of being hoisted out of the loop)
    q_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_M, HEAD_DIM], m_layout)
    do_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_M, HEAD_DIM], m_layout)
    q_tile = gl.load(q_ptr + m_rows[:, None] * HEAD_DIM + cols[None, :])
    do_tile = gl.load(do_ptr + m_rows[:, None] * HEAD_DIM + cols[None, :])
    for b in gl.static_range(2):
        q_smem.index(b).store(q_tile)
        do_smem.index(b).store(do_tile)
    ds_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], gl.float16))
    dq_stage = gl.allocate_shared_memory(gl.float32, [BLOCK_M, HEAD_DIM],
                                         gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float32))
    stats_blocked: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 8], [1, 0])
    stat_rows = gl.arange(0, 2, gl.SliceLayout(1, stats_blocked))
    stat_cols = gl.arange(0, BLOCK_M, gl.SliceLayout(0, stats_blocked))
    stats_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M],
                                           gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2),
                                           gl.load(rows_ptr + stat_rows[:, None] * BLOCK_M + stat_cols[None, :]))
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    mbarrier.init(empty, count=1)
    mbarrier.arrive(ready)  # phase 0 complete: every wait on it returns at once, as on a tile already loaded
    fence_async_shared()
    gl.thread_barrier()
    gl.warp_specialize([
        (_bwd_iteration_loop, (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_stage, stats_smem, ready, empty,
                               out_ptr, stats_ptr, reps, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, DQ_WARPS_M)),
        (_idle_worker, (ready,)),
    ], [1], [24])


def measure_bwd_iteration(block_m: int = 64, head_dim: int = 64, reps: int = 512) -> dict[str, float]:
    """The compute side of one attention-backward loop iteration (:func:`_bwd_iteration_kernel`, 128 keys,
    ``block_m`` query rows): cycles per iteration, median over SMs, one CTA per SM. Checked against a float64
    torch replay of the same iterations first."""
    torch = _torch()
    block_n, scale = 128, 0.125
    q, k = ((torch.rand(n, head_dim, device="cuda") - 0.5).half() for n in (block_m, block_n))
    v, do = ((torch.rand(n, head_dim, device="cuda") - 0.5).half() for n in (block_n, block_m))
    s = (k.double() @ q.double().T) * scale                       # S^T [keys, queries], base-2 scores
    rows = torch.stack([s.amax(0), (torch.rand(block_m, device="cuda") - 0.5).double()]).float()
    grid = sm_count()
    out = torch.full((grid, (2 * block_n + block_m) * head_dim), float("nan"), device="cuda")
    stats = torch.zeros(grid * 2, dtype=torch.int64, device="cuda")

    def launch(r):
        _bwd_iteration_kernel[(grid,)](q, k, v, do, rows, out, stats, r, scale, BLOCK_M=block_m, BLOCK_N=block_n,
                                       HEAD_DIM=head_dim, DQ_WARPS_M=min(8, block_m // 16), num_warps=8)

    checked = 3
    launch(checked)
    p = torch.exp2(s - rows[0].double()[None, :])
    dp = v.double() @ do.double().T
    ds = p * (dp - rows[1].double()[None, :])
    ref = torch.cat([(checked * (ds.half().double() @ q.double())).flatten(),
                     (checked * (p.half().double() @ do.double())).flatten(),
                     (ds.half().double().T @ k.double()).flatten()])
    err = ((out.double() - ref[None, :]).norm(dim=1) / ref.norm()).max().item()
    return _timed_iteration(launch, stats, reps, err, 1e-2, "backward iteration",
                            block_m=block_m, block_n=block_n, head_dim=head_dim)


def measure_smem(groups: int = 1, cols: int = 128, reps: int = 2048) -> dict[str, float]:
    """fp16 register <-> shared-memory round trips: SM-wide bytes moved (store + load) per clock."""
    torch = _torch()
    rows = 64 * groups
    x = (torch.rand(rows, cols, device="cuda") + 0.5).half()
    grid = sm_count()
    out = torch.full((grid, rows, cols), float("nan"), device="cuda", dtype=torch.float16)
    stats = torch.zeros(grid * 2, dtype=torch.int64, device="cuda")

    def launch(r):
        _smem_kernel[(grid,)](x, out, stats, r, ROWS=rows, COLS=cols, num_warps=4 * groups)

    launch(1)
    err = ((out[0].float() - (x.float() * 0.999)).norm() / x.float().norm()).item()
    if not err < 1e-2:
        raise RuntimeError(f"smem microbenchmark wrong: relative error {err:.3g}")
    launch(reps)
    per_sm = _per_sm(stats, float(rows * cols * 2 * 2 * reps))
    return {"groups": groups, "cols": cols, "bytes_per_clk": per_sm["per_clk"], "rel_error": err}


def measure_tma(block_m: int = 128, block_k: int = 64, depth: int = 2, hot_mb: int = 0,
                reps: int = 960) -> dict[str, float]:
    """TMA loads of [block_m, block_k] fp16 tiles through a ``depth``-buffer ring, from every SM at once:
    bytes per clock per SM and cycles per tile (with depth 1, the load latency). With ``hot_mb`` 0 every CTA
    streams its own tiles of a 2 GiB tensor from DRAM (no tile is read twice, so the L2 does not help); with
    ``hot_mb`` > 0 all CTAs walk, each from its own starting tile, through the same first ``hot_mb`` MiB
    (L2-resident, as the operand tiles that the CTAs of one GEMM or attention wave share)."""
    torch = _torch()
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows_total = 1 << 24  # 16M rows x 64 fp16 = 2 GiB, 30x the L2
    reps = min(reps, rows_total // block_m // sm_count())
    src = torch.empty(rows_total, block_k, device="cuda", dtype=torch.float16).normal_()
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.float16)
    desc = TensorDescriptor.from_tensor(src, [block_m, block_k], layout)
    grid = sm_count()
    out = torch.full((grid, block_m, block_k), float("nan"), device="cuda", dtype=torch.float16)
    stats = torch.zeros(grid * 2, dtype=torch.int64, device="cuda")
    l2_rows = (hot_mb << 20) // (block_k * 2) // block_m * block_m

    def launch(r):
        _tma_kernel[(grid,)](desc, out, stats, r, rows_total, DEPTH=depth, L2_ROWS=l2_rows, num_warps=4)

    launch(1)
    if not torch.equal(out[0], src[:block_m]):
        raise RuntimeError("tma microbenchmark wrong: the first tile differs from the source")
    launch(reps)
    tile_bytes = block_m * block_k * 2
    per_sm = _per_sm(stats, float(tile_bytes * reps))
    return {"block_m": block_m, "block_k": block_k, "depth": depth, "hot_mb": hot_mb,
            "bytes_per_clk": per_sm["per_clk"], "cycles_per_tile": per_sm["cycles"] / reps}


def measure_tma_reduce(block_m: int = 64, block_n: int = 64, depth: int = 1, share: int = 1,
                       stagger: bool = False, span: int = 64, reps: int = 2048) -> dict[str, float]:
    """TMA reduce-adds of fp32 [block_m, block_n] tiles from every SM at once (one CTA each), ``depth`` in
    flight: cycles per tile until its shared buffer may be reused. ``share`` CTAs add into the same ``span``
    tiles, in step unless ``stagger`` (``share`` 1: every CTA into rows of its own). Checked: the sum of
    the destination is the number of ones added."""
    torch = _torch()
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    grid = sm_count()
    groups = -(-grid // share)
    dst = torch.zeros(groups * span * block_m, block_n, device="cuda", dtype=torch.float32)
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_n], gl.float32)
    desc = TensorDescriptor.from_tensor(dst, [block_m, block_n], layout)
    stats = torch.zeros(grid * 2, dtype=torch.int64, device="cuda")

    def launch(r):
        _tma_reduce_kernel[(grid,)](desc, stats, r, span, SHARE=share, STAGGER=int(stagger), DEPTH=depth,
                                    num_warps=4)

    launch(3)
    torch.cuda.synchronize()
    if dst.double().sum().item() != 3.0 * grid * block_m * block_n:
        raise RuntimeError("tma reduce microbenchmark wrong: the destination does not sum to the ones added")
    launch(reps)
    per_sm = _per_sm(stats, float(block_m * block_n * 4 * reps))
    return {"block_m": block_m, "block_n": block_n, "depth": depth, "share": share, "stagger": stagger,
            "cycles_per_tile": per_sm["cycles"] / reps, "bytes_per_clk": per_sm["per_clk"]}


def measure_handoff(worker_warps: int = 4, reps: int = 4096) -> dict[str, float]:
    """mbarrier ping-pong between two partitions: cycles of one hand-off (half a round trip)."""
    torch = _torch()
    grid = sm_count()
    stats = torch.zeros(grid * 2, dtype=torch.int64, device="cuda")
    _handoff_kernel[(grid,)](stats, 16, WORKER_WARPS=worker_warps, num_warps=4)
    _handoff_kernel[(grid,)](stats, reps, WORKER_WARPS=worker_warps, num_warps=4)
    torch.cuda.synchronize()
    per_sm = _per_sm(stats, 1.0)
    return {"worker_warps": worker_warps, "cycles_per_handoff": per_sm["cycles"] / (2 * reps)}


def measure_launch(launches: int = 200) -> dict[str, float]:
    """Microseconds per launch of an empty kernel over every SM, back to back on the GPU: ``launches``
    launches captured in a CUDA graph and replayed, so the host's launch overhead is not counted."""
    torch = _torch()
    x = torch.zeros(1, device="cuda")
    grid = sm_count()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            _empty_kernel[(grid,)](x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(launches):
            _empty_kernel[(grid,)](x)
    graph.replay()
    torch.cuda.synchronize()
    times = [_elapsed_ms(graph.replay) for _ in range(7)]
    return {"launch_us": statistics.median(times) * 1e3 / launches}


class ClockSampler:
    """Samples the SM clock with ``nvidia-smi`` every ``interval_ms`` while the ``with`` block runs.

    ``samples`` holds ``(unix time, MHz)`` readings; :meth:`median_ghz` is their median over a time window
    (the whole block by default; ``None`` when nvidia-smi is missing or gave nothing in the window). Used to
    record the clock beside every timed measurement: the GPU is power-capped and its clock moves with load.
    """

    def __init__(self, interval_ms: int = 50):
        self.interval_ms = interval_ms
        self.samples: list[tuple[float, float]] = []
        self._proc: Any = None
        self._log: Any = None

    def __enter__(self) -> "ClockSampler":
        import shutil
        import subprocess
        import tempfile

        # Line-buffered: nvidia-smi's block-buffered output loses its last readings when it is stopped. Into a
        # file, not a pipe: nobody reads the pipe until the end, and once its 64 KB filled (about 80 s of
        # readings) nvidia-smi blocked and every later window had no sample.
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        self._log = tempfile.TemporaryFile(mode="w+")
        try:
            self._proc = subprocess.Popen(
                [*line_buffered, "nvidia-smi", "--query-gpu=timestamp,clocks.sm", "--format=csv,noheader,nounits",
                 "-i", "0", f"-lms={self.interval_ms}"], stdout=self._log, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
        return self

    def __exit__(self, *exc: Any) -> None:
        import datetime
        import signal
        import subprocess

        if self._proc is not None:
            self._proc.send_signal(signal.SIGINT)  # lets nvidia-smi flush what it has read
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.seek(0)
        out = self._log.read()
        self._log.close()
        for line in out.splitlines():
            stamp, _, mhz = line.partition(",")
            try:
                when = datetime.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((when, float(mhz)))
            except ValueError:
                continue

    def median_ghz(self, start: float | None = None, end: float | None = None) -> float | None:
        """Median SM clock in GHz of the samples between unix times ``start`` and ``end``."""
        window = [mhz for when, mhz in self.samples
                  if (start is None or when >= start) and (end is None or when <= end)]
        return statistics.median(window) / 1e3 if window else None


def measure_clock(seconds: float = 2.0, size: int = 8192) -> dict[str, float]:
    """The SM clock sustained under tensor-core load, two ways:

    * ``wgmma_clock_ghz``: cycles over event time of a ~300 ms wgmma loop on shared-memory operands
      (little memory traffic, so little power);
    * ``clock_ghz``: nvidia-smi's SM clock, median over ``seconds`` of back-to-back cuBLAS fp16
      ``size``-cubed matrix products on random data (a full GEMM's power draw; the number the model uses).
    """
    torch = _torch()
    probe = measure_mma(256, "fp16", groups=2, lag=1, reps=4096)
    reps = int(4096 * 300.0 / probe["ms"])
    wgmma = measure_mma(256, "fp16", groups=2, lag=1, reps=reps)
    a = torch.randn(size, size, device="cuda", dtype=torch.float16)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16)
    one_ms = _elapsed_ms(lambda: a @ b)
    count = max(1, int(seconds * 1e3 / max(one_ms, 1e-3)))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    with ClockSampler() as sampler:
        ms = _elapsed_ms(lambda: [a @ b for _ in range(count)])
    mhz = [m for _, m in sampler.samples]
    return {"clock_ghz": sampler.median_ghz() or wgmma["clock_ghz"], "wgmma_clock_ghz": wgmma["clock_ghz"],
            "gemm_tflops": 2 * size**3 * count / (ms * 1e-3) / 1e12, "samples": len(mhz),
            "clock_min_ghz": min(mhz) / 1e3 if mhz else None}


def device_name() -> str:
    return _torch().cuda.get_device_name(0)


__all__ = ["ELEMENTWISE_OPS", "device_name", "measure_elementwise", "measure_handoff", "measure_launch",
           "measure_tma_reduce",
           "ClockSampler", "measure_clock", "measure_mma", "measure_smem", "measure_tma", "sm_count"]
