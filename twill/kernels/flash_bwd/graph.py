"""Flash attention backward, single pass (FA3's algorithm): the loop over query blocks of one K/V block.

One iteration takes a ``block_m``-row query block (Q, dO, and the row statistics LSE and D) against the
CTA's resident K/V block of ``block_n`` keys, accumulates dK and dV (in place, across iterations) and
adds its dQ contribution to global memory with a TMA reduce-add (the "atomic add").

Ops (roles):
  ``load_q``, ``load_do``, ``load_stats``   streaming TMA loads (Q, dO, LSE/D rows)
  ``qk``       S  = Q K^T                    tensor core
  ``dp``       dP = dO V^T                   tensor core
  ``s_load``   S: TMEM -> registers          Blackwell only
  ``exp``      P  = exp2(S*scale - LSE)      MUFU (Hopper: fp32, in place over S, as FA3)
  ``p_cvt``    P -> fp16 registers           Hopper: the register A operand of the dV wgmma
  ``p_store``  P -> fp16 TMEM over S         Blackwell; Hopper at 64-key blocks: P -> shared memory (dV's A)
  ``dp_load``  dP: TMEM -> registers         Blackwell only
  ``ds``       dS = P * (dP - D), fp16       ALU (reads the fp32 P)
  ``ds_store`` dS -> SMEM (operand of dQ; of dK on Blackwell)
  ``dv``       dV += P^T dO                  tensor core, in-place accumulator
  ``dk``       dK += dS^T Q                  tensor core, in-place accumulator (Hopper: dS from registers)
  ``dq``       dQ  = dS K                    tensor core
  ``dq_load``  dQ: TMEM -> registers         Blackwell only
  ``dq_store`` dQ -> SMEM staging tile (Hopper at 64-key blocks: chunk by chunk, each reduce-added by the
               compute warps themselves)
  ``dq_atomic`` TMA reduce-add of dQ into global memory (variable latency, not streaming)

Hopper (FA3 ``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp`` at hdim 128: ``kBlockM`` 64, ``kBlockN`` 128, two
MMA warp groups, ``SdP_swapAB`` and ``AtomLayoutNdKV`` = 2, hence ``Mma_dKV_is_RS``): every GEMM is an
8-warp wgmma (the two MMA warp groups cooperate on every tile), dK and dV live in registers for the whole
loop (64 + 64 per thread), S/P and dP are fp32 register tiles (32 each), P and dS are converted to fp16
register operands of the dV and dK wgmmas (16 each; only dS is stored to shared memory, for dQ), and dQ
(32) is staged to shared memory for the producer warp's TMA reduce-add (``block_m`` 64).

Hopper at head dim 256 (FA3's hdim-256 configuration as powers of two: 64 query rows, 64 keys, dK and dV
split by head-dimension halves between the warp groups, P and dS through shared memory): 64 keys are too few
rows for eight warps, so the warp groups split S^T's queries; each then holds half of P's queries, while dV
needs them all, so P goes to shared memory (``p_store``) and dV and dK read P and dS from there. dQ
(64 rows x 256 fp32) is computed ``dq_chunk`` columns at a time (FA3 gives up the TMA reduce of a whole dQ
tile at hdim 256 for lack of shared memory); each chunk is staged in one of ``DQ_SLOTS`` buffers and
reduce-added by the compute warps right away (``dq_store``), so there is no ``dq_atomic`` op.

Blackwell follows FA4 (``flash_attn/cute/flash_bwd_sm100.py``, ``block_m`` 128): see :func:`_blackwell`.
Sub-tiled ops carry the suffixes ``_a``/``_b`` (``s_load``, ``exp``, ``p_store``, ``dp_load``, ``ds``,
``ds_store``); Q keeps two shared-memory stages and dO one (``ring_depth``, FA4's ``Q_stage``/``dO_stage``).

``reg_limit`` (graph attribute, docs/model.md "Registers"): 240 — the architectural budget FA3 gives its
MMA warp groups; the paper's "Twill-LR" experiment passes a reduced ``--reg-limit``.
"""

from __future__ import annotations

from twill.errors import TwillError
from twill.ir.builder import GraphBuilder
from twill.ir.graph import LoopGraph
from twill.kernels import KernelOption
from twill.kernels import _common as k
from twill.machine.models import Machine

OPTIONS = {
    "head_dim": KernelOption(int, 128, "head dimension", (64, 128, 256)),
    "block_m": KernelOption(int, 0, "query rows per iteration (0 = 64 on Hopper, 128 on Blackwell)", (0, 64, 128)),
    "block_n": KernelOption(int, 0, "keys of the resident K/V block (0 = 128, 64 at head dim 256)", (0, 64, 128)),
    "dtype": KernelOption(str, "fp16", "Q/K/V dtype", ("fp16", "bf16")),
    "causal": KernelOption(bool, False, "causal mask: a key block meets the query blocks from its diagonal on",
                           (False, True)),
    "kv_heads": KernelOption(int, 0, "K/V heads (0: as many as the query heads; N: grouped-query attention, "
                                     "dK/dV summed over each group's query heads)"),
    "varlen": KernelOption(bool, False, "variable-length packed sequences: q, o, do [total_q, H, D], k, v "
                                        "[total_k, KV heads, D] with cu_seqlens_q / cu_seqlens_k (FlashAttention's "
                                        "varlen interface; Gluon only)", (False, True)),
}

#: Per-thread budget of register-holding groups when none is given.
DEFAULT_REG_LIMIT = 240

#: Columns of dQ that Blackwell stages through registers and shared memory at a time (FA4 reduces dQ in
#: chunks; the staging buffer holds one chunk).
DQ_CHUNK = 32

#: FA4's shared-memory stages of the Blackwell streaming loads (``Q_stage``, ``dO_stage``).
Q_STAGES, DO_STAGES = 2, 1

#: FP32 -> fp16 conversion cost per element (F2FP packs two values per instruction).
CVT_OPS_PER_ELEMENT = 0.5

#: Warps cooperating on each Hopper op (FA3's two MMA warp groups).
HOPPER_WARPS = 8

#: Columns of dQ per wgmma and staging chunk on Hopper when the whole fp32 dQ tile would not fit shared memory
#: beside the resident K/V and the rings (head dim 256), and the staging buffers the chunks cycle through.
HOPPER_DQ_CHUNK, DQ_SLOTS = 64, 1


def build(machine: Machine, *, head_dim: int = 128, block_m: int = 0, block_n: int = 0,
          dtype: str = "fp16", causal: bool = False, kv_heads: int = 0, varlen: bool = False) -> LoopGraph:
    """The backward loop body for ``machine`` (see the module docstring). ``causal``, ``kv_heads`` and
    ``varlen`` do not change the loop body (the unmasked steady state is the scheduled loop; grouped K/V heads
    make a CTA loop over its group's query heads too; packed sequences change where the tiles are read and
    written); they are graph attributes for the code generators."""
    if kv_heads < 0:
        raise TwillError(f"kernel 'flash-bwd': kv_heads must be 0 (as many as the query heads) or positive, "
                         f"got {kv_heads}")
    tmem = machine.mma_accumulates_in == "tmem"
    block_m = block_m or (128 if tmem else 64)
    block_n = block_n or (64 if head_dim == 256 else 128)
    resident = 2 * block_n * head_dim * 2                 # K and V tiles, loaded once
    b = GraphBuilder("flash-bwd", attrs={
        "kernel": "flash-bwd", "arch": machine.name, "block_m": block_m, "block_n": block_n,
        "head_dim": head_dim, "dtype": dtype, "subtiles": 2 if tmem else 1, "reg_limit": DEFAULT_REG_LIMIT,
        "smem_resident": resident, **({"causal": True} if causal else {}),
        **({"kv_heads": kv_heads} if kv_heads else {}), **({"varlen": True} if varlen else {})})
    # Blackwell: FA4's stage counts (Q_stage 2, dO_stage 1; LSE follows Q).
    q_depth, do_depth = (Q_STAGES, DO_STAGES) if tmem else (None, None)
    load_q = k.tma_load(b, machine, "load_q", "load_q", block_m, head_dim, dtype, ring_depth=q_depth)
    load_do = k.tma_load(b, machine, "load_do", "load_do", block_m, head_dim, dtype, ring_depth=do_depth)
    load_stats = k.tma_load(b, machine, "load_stats", "load_stats", block_m, 2, "fp32", ring_depth=q_depth)
    if tmem:
        _blackwell(b, machine, block_m, block_n, head_dim, dtype, load_q, load_do, load_stats)
    else:
        _hopper(b, machine, block_m, block_n, head_dim, dtype, load_q, load_do, load_stats)
    return b.build()


def _latency(b: GraphBuilder, name: str) -> int:
    return b.build().op(name).issue_latency


def _hopper(b: GraphBuilder, m: Machine, bm: int, bn: int, d: int, dtype: str, load_q: str, load_do: str,
            load_stats: str) -> None:
    """FA3's hdim-128 configuration (``SdP_swapAB``, ``AtomLayoutNdKV`` = 2 warp groups, so
    ``Mma_dKV_is_RS``): dV and dK read P and dS as fp16 register operands; only dS goes to shared memory
    (for dQ). Per MMA thread (two 4-warp groups, 256 threads): dK, dV 64 each, S/P and dP 32 each (fp32),
    P and dS in fp16 16 each, dQ 32.

    With fewer keys than the eight warps' 128 rows (64 at head dim 256) the warp groups split S^T's queries,
    so P goes through shared memory (``p_store``), dV and dK read P and dS from there, and dQ is computed,
    staged and reduce-added ``dq_chunk`` columns at a time by the compute warps (module docstring)."""
    w = HOPPER_WARPS
    split = bn < 16 * w    # the warp groups split S^T's queries: P and dS in shared memory, dQ in chunks
    chunk = min(d, HOPPER_DQ_CHUNK) if split else None
    if split:
        b.attrs["dq_chunk"] = chunk
    qk = k.mma(b, m, "qk", "qk", bm, bn, d, dtype, warps=w)
    dp = k.mma(b, m, "dp", "dp", bm, bn, d, dtype, warps=w)
    p = k.exp2(b, m, "exp", "exp", bm, bn, "fp32", in_place=True, warps=w)
    ds = k.elementwise(b, m, "ds", "ds", bm, bn, dtype, ops_per_element=2.0, warps=w)
    if split:   # P^T to shared memory, the A operand of dV there
        p_op = k.smem_store(b, m, "p_store", "p_store", bm, bn, dtype, warps=w)
    else:       # P^T to fp16 registers, the register A operand of dV
        p_op = k.elementwise(b, m, "p_cvt", "p_cvt", bm, bn, dtype, ops_per_element=CVT_OPS_PER_ELEMENT, warps=w)
    ds_store = k.smem_store(b, m, "ds_store", "ds_store", bm, bn, dtype, warps=w)
    dv = k.mma(b, m, "dv", "dv", bn, d, bm, dtype, accumulator=True, warps=w)
    dk = k.mma(b, m, "dk", "dk", bn, d, bm, dtype, accumulator=True, warps=w)
    dq = k.mma(b, m, "dq", "dq", bm, d, bn, dtype, warps=w, chunk_cols=chunk)
    dq_store = k.smem_store(b, m, "dq_store", "dq_store", bm, d, "fp32", warps=w,
                            smem_bytes=DQ_SLOTS * k.tile_bytes(bm, chunk, "fp32") if split else None)
    dq_atomic = None if split else k.tma_reduce(b, m, "dq_atomic", "dq_atomic", bm, d, "fp32")
    b.edge(load_q, qk, delay=0)
    b.edge(load_do, dp, delay=0)
    b.edge(load_stats, p, delay=0)
    b.edge(load_stats, ds, delay=0)
    b.edge(qk, p, delay=_latency(b, qk), blocking=True)
    b.edge(dp, ds, delay=_latency(b, dp), blocking=True)
    b.edge(p, ds)
    b.edge(p, p_op)
    b.edge(ds, ds_store)
    b.edge(p_op, dv)
    b.edge(load_do, dv, delay=0)
    b.edge(dv, dv, distance=1)
    b.edge(ds_store if split else ds, dk)    # dS^T from shared memory, or as a register operand
    b.edge(load_q, dk, delay=0)
    b.edge(dk, dk, distance=1)
    b.edge(ds_store, dq)
    b.edge(dq, dq_store, delay=_latency(b, dq), blocking=True)
    if dq_atomic is not None:
        b.edge(dq_store, dq_atomic, blocking=True)
    if split:   # the single P and dS buffers: the next iteration overwrites them once dV, dK, dQ have read them
        b.edge(dv, p_op, delay=_latency(b, dv), distance=1)
        b.edge(dk, ds_store, delay=_latency(b, dk), distance=1)
        b.edge(dq, ds_store, delay=_latency(b, dq), distance=1)


def _blackwell(b: GraphBuilder, m: Machine, bm: int, bn: int, d: int, dtype: str, load_q: str, load_do: str,
               load_stats: str) -> None:
    """FA4's layout (``flash_attn/cute/flash_bwd_sm100.py``): S^T = K Q^T and dP^T = V dO^T are ``bn x bm``
    TMEM tiles whose ``bm`` query columns two 4-warp compute groups split (sub-tiles ``_a``, ``_b``); each
    loads its half of S, applies exp2 in place (fp32 P kept for dS) and writes fp16 P over S; it then works
    through its half of dP ``DQ_CHUNK`` columns at a time, computing dS in place over each chunk and storing
    it to shared memory. dQ = dS K is written over dP and staged to shared memory ``DQ_CHUNK`` columns at a
    time for the TMA reduce-add. TMEM holds S | dV | dP | dK; the write-after-read edges of the aliases:
    ``dv -> qk`` (distance 1: the next S overwrites P once dV has read it), ``dk -> dp`` (distance 1: the
    next dP overwrites dS once dK has read it), ``dk -> dq`` (dQ is written over dS; FA4 issues dK first)
    and ``dq_load -> dp`` (distance 1: the next dP overwrites dQ once it is staged)."""
    half = bm // 2
    qk = k.mma(b, m, "qk", "qk", bn, bm, d, dtype)
    dp = k.mma(b, m, "dp", "dp", bn, bm, d, dtype)
    dv = k.mma(b, m, "dv", "dv", bn, d, bm, dtype, accumulator=True)
    dk = k.mma(b, m, "dk", "dk", bn, d, bm, dtype, accumulator=True)
    dq = k.mma(b, m, "dq", "dq", bm, d, bn, dtype, owns_tmem=False)
    for edge in ((load_q, qk), (load_do, dp), (load_do, dv), (load_q, dk)):
        b.edge(*edge, delay=0)
    b.edge(dv, dv, distance=1)
    b.edge(dk, dk, distance=1)
    for s, x in enumerate("ab"):
        s_load = k.tmem_load(b, m, f"s_load_{x}", "s_load", bn, half, subtile=s)
        p = k.exp2(b, m, f"exp_{x}", "exp", bn, half, "fp32", subtile=s, in_place=True)
        p_store = k.tmem_store(b, m, f"p_store_{x}", "p_store", bn, half, dtype, subtile=s)
        dp_load = k.tmem_load(b, m, f"dp_load_{x}", "dp_load", bn, half, subtile=s, chunk_cols=DQ_CHUNK)
        ds = k.elementwise(b, m, f"ds_{x}", "ds", bn, half, "fp32", subtile=s, ops_per_element=2.0,
                           in_place=True, chunk_cols=DQ_CHUNK)
        ds_store = k.smem_store(b, m, f"ds_store_{x}", "ds_store", bn, half, dtype, subtile=s)
        b.edge(qk, s_load, delay=_latency(b, qk), blocking=True)
        b.edge(s_load, p)
        b.edge(load_stats, p, delay=0)
        b.edge(p, p_store)
        b.edge(p_store, dv, blocking=True)
        b.edge(dp, dp_load, delay=_latency(b, dp), blocking=True)
        b.edge(dp_load, ds)
        b.edge(p, ds)
        b.edge(load_stats, ds, delay=0)
        b.edge(ds, ds_store)
        b.edge(ds_store, dk, blocking=True)
        b.edge(ds_store, dq, blocking=True)
    dq_load = k.tmem_load(b, m, "dq_load", "dq_load", bm, d, chunk_cols=DQ_CHUNK)
    dq_store = k.smem_store(b, m, "dq_store", "dq_store", bm, d, "fp32",
                            smem_bytes=k.tile_bytes(bm, DQ_CHUNK, "fp32"))
    dq_atomic = k.tma_reduce(b, m, "dq_atomic", "dq_atomic", bm, d, "fp32")
    b.edge(dq, dq_load, delay=_latency(b, dq), blocking=True)
    b.edge(dq_load, dq_store)
    b.edge(dq_store, dq_atomic, blocking=True)
    b.edge(dq_load, dp, distance=1)
    b.edge(dv, qk, delay=_latency(b, dv), distance=1)
    b.edge(dk, dp, delay=_latency(b, dk), distance=1)
    b.edge(dk, dq)
