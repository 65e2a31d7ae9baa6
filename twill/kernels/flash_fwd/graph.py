"""Flash attention forward, the KV loop of the Triton fused-attention tutorial, optionally sub-tiled.

One iteration processes one K/V block of ``block_n`` keys against the CTA's ``block_m`` queries. With
``subtiles=2`` the Q block is split into two halves ``_a``/``_b`` (``attrs["subtile"]`` 0/1) that share
the K/V loads; ``subtiles=3`` (Hopper, FA3's BLOCK_M = 192 at head dim 64) into three, ``_a``/``_b``/``_c`` (paper §1.2: sub-tiling to tensor-core instruction size is what makes ping-pong and FA4's
schedule expressible).

Per sub-tile (roles):
  ``qk``      S = Q K^T                          tensor core (wgmma -> registers | tcgen05 -> TMEM)
  ``s_load``  S: TMEM -> registers               Blackwell only
  ``rowmax``  m_new = max(m_old, rowmax(S))      ALU; m carried to the next iteration
  ``alpha``   alpha = exp2(m_old - m_new)        MUFU (one value per row)
  ``exp``     P = exp2(S*scale - m_new)          MUFU; P kept as fp16
  ``rowsum``  l = l*alpha + rowsum(P)            ALU; l carried
  ``p_store`` P: registers -> TMEM               Blackwell only (FA4 aliases P over S)
  ``o_load``  O: TMEM -> registers (32-column chunks, as FA4's correction warps)   Blackwell only
  ``rescale`` O *= alpha                         ALU
  ``o_store`` O: registers -> TMEM               Blackwell only
  ``pv``      O += P V                           tensor core; O is the loop-carried accumulator
Shared: ``load_k``, ``load_v`` (streaming TMA loads).

fp8 (``dtype`` ``fp8e4m3`` or ``fp8e5m2``, Hopper; FA3's fp8 forward, ../docs/kernels.md): Q, K, V are one
byte per element and both wgmmas run at the ``fp8`` rate of the machine tables
(:func:`twill.machine.costs.rate_dtype`), ``k = 32`` per instruction (graph attribute ``instr_k``). Two ops
more:
  ``convert``     P (fp32, written over S by ``exp``) -> fp8 register A operand of ``pv``   ALU
  ``v_transpose`` V tile -> V^T in shared memory (``v_transpose="kernel"``)               shared-memory pipe
The fp8 wgmma reads its B operand from shared memory K-major only, so ``O += P V`` needs V^T: either the
kernel transposes each V tile after its load (``v_transpose="kernel"``, what FA3's producer warp group does:
a transposed ``ldmatrix`` read and an ``stmatrix`` write of the tile), or a pre-pass transposes the whole V
before the kernel (``"prepass"``: ``load_v`` then loads V^T tiles; the pass, one read and one write of V, is
outside the loop and priced by the tuner, :func:`twill.kernels.flash_fwd.tune.extra_passes`). The descale
factors do not change the loop: ``q_descale * k_descale`` is folded into the softmax scale, ``v_descale``
into the final ``1 / l`` (FA3).

Every edge out of an asynchronous tensor-core op, and every edge into an MMA from another warp's TMEM
write, is ``blocking`` (the consumer waits on wgmma.wait_group or an mbarrier).

The graph attribute ``reg_limit`` is the per-thread register budget of register-holding warp groups that
the solver uses when none is given (docs/model.md, "Registers"): on Hopper the register file split over
the compute warp groups beside a producer warp group at the ``setmaxnreg`` minimum, at most 240 (FA3's
consumer warp groups): 240 with one or two sub-tiles, 160 with three ((65536/32 - 4*24) / 12 = 162 -> 160,
FA3's budget at BLOCK_M = 192); 160 on Blackwell (the uniform budget at which FA4's three 4-warp register groups fit the register
file: (65536/32 - 2*24) / 12 = 166 -> 160; FA4 itself gives 192 to softmax and 80 to correction).
"""

from __future__ import annotations

from twill.errors import TwillError
from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.kernels import KernelOption
from twill.kernels import _common as k
from twill.machine.models import Machine

#: The fp8 Q/K/V formats (``--dtype``); the machine tables price both at the ``fp8`` rate.
FP8_DTYPES = ("fp8e4m3", "fp8e5m2")
#: K per wgmma instruction by operand bytes: ``m64nNk16`` for fp16/bf16, ``m64nNk32`` for fp8.
INSTR_K = {1: 32, 2: 16}
#: ALU operations per element of the fp8 conversion of P: half a ``cvt.rn.satfinite.e4m3x2.f32`` (two
#: elements per instruction) and the byte permutes that put the packed bytes in the A-operand order (FA3's
#: ``permute_Cregs_fp8``); an estimate, one op per element.
FP8_CONVERT_OPS = 1.0

OPTIONS = {
    "subtiles": KernelOption(int, 0, "split the Q block into this many sub-tiles sharing K/V (3: Hopper only; "
                                     "0 = 1, or 2 at head dim 256 on Hopper)", (0, 1, 2, 3)),
    "head_dim": KernelOption(int, 128, "head dimension", (64, 128, 256)),
    "block_m": KernelOption(int, 0, "query rows per CTA (0 = 64 per sub-tile, at least 128, on Hopper; 256 on "
                                    "Blackwell)", (0, 64, 128, 192, 256)),
    "block_n": KernelOption(int, 0, "keys per iteration (0 = 128, or 64 at head dim 256 on Hopper)", (0, 64, 128)),
    "dtype": KernelOption(str, "fp16", "Q/K/V dtype (fp8e4m3, fp8e5m2: Hopper, output bf16)",
                          ("fp16", "bf16", *FP8_DTYPES)),
    "v_transpose": KernelOption(str, "", "fp8 only: where V becomes K-major for the fp8 P V wgmma: 'kernel' "
                                         "(each tile in the loop, FA3) or 'prepass' (a transpose pass before the "
                                         "kernel, the form the Gluon generator emits); '' = prepass",
                                ("", "kernel", "prepass")),
    "causal": KernelOption(bool, False, "causal mask: each query attends to keys at or before its position "
                                        "(the loop stops at the diagonal)", (False, True)),
    "kv_heads": KernelOption(int, 0, "K/V heads (0: as many as the query heads; N: grouped-query attention, "
                                     "N divides the query heads, 1 = multi-query)"),
    "varlen": KernelOption(bool, False, "variable-length packed sequences: q [total_q, H, D], k, v [total_k, "
                                        "KV heads, D] with cu_seqlens_q / cu_seqlens_k (FlashAttention's varlen "
                                        "interface; Gluon forward, one CTA per query block)", (False, True)),
}

#: Per-thread register budget of Blackwell's register-holding warp groups (see module doc).
TMEM_REG_LIMIT = 160
#: Most registers per thread a Hopper compute warp group asks for (FA3's consumer warp groups).
HOPPER_MAX_REGS = 240
#: Sub-tiles on Blackwell (one or two 128-row tcgen05 tiles).
TMEM_SUBTILES = (1, 2)

#: Columns of O that FA4's correction warps load from TMEM at a time.
CORRECTION_CHUNK = 32


#: Head dimension at which the Hopper defaults change to 64-key blocks on two sub-tiles (:func:`default_tile`).
WIDE_HEAD_DIM = 256


def default_tile(machine: Machine, head_dim: int) -> tuple[int, int]:
    """``(subtiles, block_n)`` when the options leave them 0: ``(1, 128)``, but ``(2, 64)`` at head dim 256 on
    Hopper, the tile ``twill.ops.attention`` runs there: two 128-key K/V stages of 256 columns beside the Q tile
    leave no schedule within shared memory and the registers of one coarse tile, and 64-key blocks split over
    two compute warp groups fit."""
    if head_dim >= WIDE_HEAD_DIM and machine.mma_accumulates_in != "tmem":
        return 2, 64
    return 1, 128


def default_block_m(machine: Machine, subtiles: int = 1) -> int:
    """Hopper: 64 query rows per sub-tile (one wgmma row block per 4-warp group), at least 128; Blackwell:
    256 (two 128-row tcgen05). Without sub-tiling the CTA tile is one coarse tile on 8 warps (two groups
    cooperating on every op)."""
    return 256 if machine.mma_accumulates_in == "tmem" else 64 * max(2, subtiles)


def default_reg_limit(machine: Machine, subtiles: int) -> int:
    """The ``reg_limit`` graph attribute (see the module docstring). Hopper: the register file less a 4-warp
    producer group at ``setmaxnreg_min`` (``setmaxnreg`` sets a whole warp group), split over the compute
    warps (one 4-warp group per sub-tile, 8 warps without sub-tiling) and rounded down to a ``setmaxnreg``
    step."""
    if machine.mma_accumulates_in == "tmem":
        return TMEM_REG_LIMIT
    groups = max(2, subtiles)
    per_thread = (machine.regs_per_sm // 32 - 4 * machine.setmaxnreg_min) // (4 * groups)
    return min(HOPPER_MAX_REGS, per_thread // machine.setmaxnreg_step * machine.setmaxnreg_step)


def build(machine: Machine, *, subtiles: int = 0, head_dim: int = 128, block_m: int = 0, block_n: int = 0,
          dtype: str = "fp16", causal: bool = False, kv_heads: int = 0, v_transpose: str = "",
          varlen: bool = False) -> LoopGraph:
    """The forward KV-loop body for ``machine`` (see the module docstring); ``subtiles`` and ``block_n`` left 0
    take :func:`default_tile`. ``causal``, ``kv_heads`` and ``varlen`` do not change the loop body (the unmasked steady
    state is the scheduled loop; grouped K/V heads only move the K/V rows a CTA reads); they are graph
    attributes for the code generators. ``v_transpose`` (fp8 only): ``kernel`` or ``prepass``."""
    fp8 = dtype in FP8_DTYPES
    if v_transpose and not fp8:
        raise TwillError(f"kernel 'flash-fwd': v_transpose applies to the fp8 dtypes {', '.join(FP8_DTYPES)} "
                         f"only (a {dtype} V is read as it is stored)")
    if fp8 and machine.mma_accumulates_in == "tmem":
        raise TwillError(f"kernel 'flash-fwd': dtype {dtype} is built for Hopper only, not {machine.name}")
    v_transpose = v_transpose or ("prepass" if fp8 else "")
    tile = default_tile(machine, head_dim)
    subtiles = subtiles or tile[0]
    block_n = block_n or tile[1]
    if kv_heads < 0:
        raise TwillError(f"kernel 'flash-fwd': kv_heads must be 0 (as many as the query heads) or positive, "
                         f"got {kv_heads}")
    if machine.mma_accumulates_in == "tmem" and subtiles not in TMEM_SUBTILES:
        raise TwillError(f"kernel 'flash-fwd': subtiles must be one of {list(TMEM_SUBTILES)} on {machine.name}, "
                         f"got {subtiles}")
    block_m = block_m or default_block_m(machine, subtiles)
    if block_m % subtiles:
        raise TwillError(f"kernel 'flash-fwd': block_m {block_m} does not split into {subtiles} sub-tiles")
    smem_resident = k.tile_bytes(block_m, head_dim, dtype)   # the Q tile, loaded once before the loop
    tmem = machine.mma_accumulates_in == "tmem"
    fp8_attrs = {"instr_k": INSTR_K[1], "v_transpose": v_transpose} if fp8 else {}
    b = GraphBuilder("flash-fwd", attrs={
        "kernel": "flash-fwd", "arch": machine.name, "block_m": block_m, "block_n": block_n,
        "head_dim": head_dim, "dtype": dtype, "subtiles": subtiles,
        "reg_limit": default_reg_limit(machine, subtiles), "smem_resident": smem_resident,
        **({"causal": True} if causal else {}), **({"kv_heads": kv_heads} if kv_heads else {}),
        **({"varlen": True} if varlen else {}), **fp8_attrs})
    load_k = k.tma_load(b, machine, "load_k", "load_k", block_n, head_dim, dtype)
    if v_transpose == "prepass":     # V^T tiles [head_dim, block_n] of the pre-pass's output: the same bytes
        load_v = k.tma_load(b, machine, "load_v", "load_v", head_dim, block_n, dtype)
    else:
        load_v = k.tma_load(b, machine, "load_v", "load_v", block_n, head_dim, dtype)
    if v_transpose == "kernel":
        load_v = k.smem_transpose(b, machine, "v_transpose", "v_transpose", block_n, head_dim, dtype,
                                  source=load_v)
    rows = block_m // subtiles
    for s in range(subtiles):
        if tmem:
            _blackwell_subtile(b, machine, s, subtiles, rows, block_n, head_dim, dtype, load_k, load_v)
        else:
            _hopper_subtile(b, machine, s, subtiles, rows, block_n, head_dim, dtype, load_k, load_v)
    return b.build()


def _softmax_chain(b: GraphBuilder, machine: Machine, x: str, s: int | None, rows: int, block_n: int,
                   dtype: str, scores: str, scores_delay: int, scores_blocking: bool) -> tuple[str, str]:
    """rowmax, alpha, exp, rowsum of one sub-tile reading the scores ``scores``; returns (alpha, exp)."""
    w = k.group_warps(machine, rows)
    rowmax = k.row_reduce(b, machine, f"rowmax{x}", "rowmax", rows, block_n, subtile=s, warps=w)
    alpha = k.exp2(b, machine, f"alpha{x}", "alpha", rows, 1, "fp32", subtile=s, warps=w)
    # Hopper: P is the register A operand of an RS wgmma, materialised in fp16 after the fp32 exp2, so S and
    # P are both live while exp runs. Blackwell: P goes to TMEM fragment by fragment (FA4), written over S.
    # fp8: exp writes the fp32 P over S and the ``convert`` op packs it to fp8 (FA3).
    fp8 = dtype in FP8_DTYPES
    p = k.exp2(b, machine, f"exp{x}", "exp", rows, block_n, "fp32" if fp8 else dtype, subtile=s,
               in_place=machine.mma_accumulates_in == "tmem" or fp8, warps=w)
    rowsum = k.row_reduce(b, machine, f"rowsum{x}", "rowsum", rows, block_n, subtile=s, warps=w)
    b.edge(scores, rowmax, delay=scores_delay, blocking=scores_blocking)
    b.edge(scores, p, delay=scores_delay, blocking=scores_blocking)
    b.edge(rowmax, rowmax, distance=1)
    b.edge(rowmax, alpha)
    b.edge(rowmax, p)
    b.edge(p, rowsum)
    b.edge(alpha, rowsum)
    b.edge(rowsum, rowsum, distance=1)
    return alpha, p


def _hopper_subtile(b: GraphBuilder, machine: Machine, s: int, subtiles: int, rows: int, block_n: int,
                    head_dim: int, dtype: str, load_k: str, load_v: str) -> None:
    """wgmma sub-tile: S and O accumulate in the registers of the issuing warp group."""
    x = k.suffix(subtiles, s)
    sub = s if subtiles > 1 else None
    w = k.group_warps(machine, rows)
    qk = k.mma(b, machine, f"qk{x}", "qk", rows, block_n, head_dim, dtype, subtile=sub, warps=w)
    qk_cycles = b.build().op(qk).issue_latency
    alpha, p = _softmax_chain(b, machine, x, sub, rows, block_n, dtype, qk, qk_cycles, True)
    if dtype in FP8_DTYPES:
        convert = k.elementwise(b, machine, f"convert{x}", "convert", rows, block_n, dtype, subtile=sub,
                                ops_per_element=FP8_CONVERT_OPS, warps=w)
        b.edge(p, convert)
        p = convert
    rescale = k.elementwise(b, machine, f"rescale{x}", "rescale", rows, head_dim, "fp32", subtile=sub,
                            in_place=True, warps=w)
    pv = k.mma(b, machine, f"pv{x}", "pv", rows, head_dim, block_n, dtype, subtile=sub, accumulator=True,
               warps=w)
    pv_cycles = b.build().op(pv).issue_latency
    b.edge(load_k, qk, delay=0)
    if load_v == "load_v":
        b.edge(load_v, pv, delay=0)
    else:                   # the V^T of the in-kernel transpose: in shared memory once its op has run
        b.edge(load_v, pv, blocking=True)
    b.edge(alpha, rescale)
    b.edge(pv, rescale, delay=pv_cycles, distance=1, blocking=True)
    b.edge(rescale, pv)
    b.edge(p, pv)


def _blackwell_subtile(b: GraphBuilder, machine: Machine, s: int, subtiles: int, rows: int, block_n: int,
                       head_dim: int, dtype: str, load_k: str, load_v: str) -> None:
    """tcgen05 sub-tile: S, P and O live in TMEM; softmax and correction move them through registers."""
    x = k.suffix(subtiles, s)
    sub = s if subtiles > 1 else None
    w = k.group_warps(machine, rows)
    qk = k.mma(b, machine, f"qk{x}", "qk", rows, block_n, head_dim, dtype, subtile=sub)
    qk_cycles = b.build().op(qk).issue_latency
    s_load = k.tmem_load(b, machine, f"s_load{x}", "s_load", rows, block_n, subtile=sub, warps=w)
    b.edge(qk, s_load, delay=qk_cycles, blocking=True)
    s_cycles = b.build().op(s_load).issue_latency
    alpha, p = _softmax_chain(b, machine, x, sub, rows, block_n, dtype, s_load, s_cycles, False)
    p_store = k.tmem_store(b, machine, f"p_store{x}", "p_store", rows, block_n, dtype, subtile=sub,
                           warps=w)
    o_load = k.tmem_load(b, machine, f"o_load{x}", "o_load", rows, head_dim, subtile=sub,
                         chunk_cols=CORRECTION_CHUNK, warps=w)
    rescale = k.elementwise(b, machine, f"rescale{x}", "rescale", rows, CORRECTION_CHUNK, "fp32", subtile=sub,
                            ops_per_element=head_dim / CORRECTION_CHUNK, in_place=True,
                            warps=w)
    o_store = k.tmem_store(b, machine, f"o_store{x}", "o_store", rows, head_dim, "fp32", subtile=sub,
                           warps=w)
    pv = k.mma(b, machine, f"pv{x}", "pv", rows, head_dim, block_n, dtype, subtile=sub, accumulator=True)
    pv_cycles = b.build().op(pv).issue_latency
    b.edge(load_k, qk, delay=0)
    b.edge(load_v, pv, delay=0)
    b.edge(p, p_store)
    b.edge(p_store, pv, blocking=True)
    b.edge(pv, o_load, delay=pv_cycles, distance=1, blocking=True)
    b.edge(o_load, rescale)
    b.edge(alpha, rescale)
    b.edge(rescale, o_store)
    b.edge(o_store, pv, blocking=True)
