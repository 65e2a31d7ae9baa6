"""The attention backward's cost hooks for the tuner (:mod:`twill.tune.space`, :mod:`twill.tune.predict`):
its problem, FLOPs and default sweep, its grid (a resident key block, a loop over query blocks; grouped K/V
heads), which CTAs of a wave read the same Q/dO/statistics tiles, the causal blocks' trip counts, its other
launches, and its measured iteration as the chain bound."""

from __future__ import annotations

import math
from typing import Any

from twill.ir.graph import LoopGraph
from twill.machine.calibration import backward_key
from twill.machine.models import Machine
from twill.schedule.result import Schedule

#: The problem the backward is tuned for (:data:`twill.tune.predict.PROBLEMS`).
PROBLEM = "attention"
#: Useful FLOPs relative to the forward's on the same shape (5 GEMMs, not 2).
FLOPS_SCALE = 2.5

#: Default sweep on Hopper (:func:`twill.tune.space.default_axes`).
DEFAULT_AXES: dict[str, tuple[Any, ...]] = {"block_m": (64, 128), "streaming_depth": (2, 3)}
#: Default axis values that only a sweep with spills checked can use: the model's register count refuses them
#: on Hopper, so without the ptxas-checked search each would be an infeasibility proof and nothing else.
CHECKED_ONLY: dict[str, tuple[Any, ...]] = {"block_m": (128,)}
#: Axes not swept on Blackwell (FA4's 128 rows are the backward's only tile there).
TMEM_DROPPED = ("block_m",)

#: Launches of the generated backward besides its main kernel (twill/kernels/flash_bwd/gluon.py): the dO·O
#: pre-pass, the zeroed statistics and fp32 dQ accumulator, and the dQ conversion.
BACKWARD_PASSES = 4
#: Bytes per (row, head-dim element) those launches move: the pre-pass reads O and dO (2 + 2), the dQ
#: accumulator is zeroed (4), the conversion reads it (4) and writes dQ (2).
BACKWARD_PASS_BYTES = 14


def grid_heads(graph: LoopGraph, shape: Any) -> tuple[int, int]:
    """``(heads, group)``: a grouped-query backward CTA (``kv_heads``) takes a key block of one K/V head and
    loops over the ``H / kv_heads`` query heads that read it; otherwise one (batch, head) each."""
    from twill.errors import TwillError

    kv_heads = int(graph.attrs.get("kv_heads") or 0)
    if not kv_heads:
        return shape["B"] * shape["H"], 1
    if shape["H"] % kv_heads:
        raise TwillError(f"shape H={shape['H']} is not a multiple of the kernel's {kv_heads} K/V heads")
    return shape["B"] * kv_heads, shape["H"] // kv_heads


def loop_extent(graph: LoopGraph, shape: Any) -> tuple[int, int]:
    """``(tiles, iterations per tile)``: ``heads·⌈S/block_n⌉`` key blocks of ``group·⌈S/block_m⌉`` iterations."""
    (heads, group), seq = grid_heads(graph, shape), shape["S"]
    return heads * math.ceil(seq / graph.attrs["block_n"]), group * math.ceil(seq / graph.attrs["block_m"])


def shared_readers(graph: LoopGraph, shape: Any, wave: int, tiles: int) -> dict[str, float]:
    """Role -> CTAs of a wave of ``wave`` that read each of its tiles at the same loop step: the grid's fastest
    index is the key block of one (batch, head), so the CTAs of one head read its Q/dO/statistics together."""
    per_head = tiles // grid_heads(graph, shape)[0]
    together = wave / len({t // per_head for t in range(wave)})
    return dict.fromkeys(("load_q", "load_do", "load_stats"), together)


def causal_blocks(graph: LoopGraph, shape: Any, group: int) -> list[int]:
    """Loop iterations of one head's key blocks, heaviest first: key block ``k`` meets the query blocks from
    its diagonal on, ``group·(⌈S / block_m⌉ − ⌊k·block_n / block_m⌋)`` iterations."""
    seq, block_m, block_n = shape["S"], graph.attrs["block_m"], graph.attrs["block_n"]
    blocks = math.ceil(seq / block_n)
    return [group * (math.ceil(seq / block_m) - k * block_n // block_m) for k in range(blocks)]


def extra_passes(graph: LoopGraph, shape: Any, machine: Machine) -> dict[str, float]:
    """``{"passes_us": …}``: what the generated backward's other launches cost beside its main kernel, each a
    streaming pass over device memory (:data:`BACKWARD_PASS_BYTES` per query row and head-dim element at
    ``machine.dram_bytes_per_s``) plus its launch."""
    moved = BACKWARD_PASS_BYTES * shape["B"] * shape["H"] * shape["S"] * shape["D"]
    return {"passes_us": moved / machine.dram_bytes_per_s * 1e6 + BACKWARD_PASSES * machine.launch_us}


def chain(schedule: Schedule, machine: Machine, plan: Any, scale: float, turns: float) -> dict[str, float]:
    """Raw cycles per iteration below which the compute partition cannot finish its iteration, on a calibrated
    machine that measured its tile; ``{}`` otherwise: ``chain_ii`` is the measured iteration
    (``Calibration.backward_iteration_cycles`` of ``block_m x block_n x head_dim``), the generated loop's
    compute side with its loads taken away. The generated backward runs every compute op on one 8-warp
    partition and retires every wgmma before the loop's back edge, so an iteration pays its whole chain (S and
    dP, the exponentials, dS, the fp16 operands, the dS and dQ stores behind partition barriers, dV, dK and
    dQ) whatever the schedule overlaps across iterations; a tile the machine file did not measure gets no
    bound (the per-op rates, optimistic)."""
    cal, attrs = machine.calibration, schedule.graph.attrs
    if cal is None or not cal.backward_iteration_cycles:
        return {}
    measured = cal.backward_iteration_cycles.get(
        backward_key(int(attrs.get("block_m", 64)), int(attrs.get("block_n", 128)), int(attrs.get("head_dim", 128))))
    return {"chain_ii": measured} if measured else {}
