"""The attention forward's cost hooks for the tuner (:mod:`twill.tune.space`, :mod:`twill.tune.predict`): its
problem and default sweep, the register floor of a compute partition, which CTAs of a wave read the same K/V
tiles, the causal blocks' trip counts, the O store, the fp8 V transpose pre-pass, and the per-group chain bound
of the online softmax."""

from __future__ import annotations

import math
from typing import Any

from twill.ir.graph import LoopGraph
from twill.machine.calibration import softmax_key
from twill.machine.costs import ASYNC_ISSUE_CYCLES, DTYPE_BYTES
from twill.machine.models import Machine
from twill.schedule.result import Schedule

#: The problem the forward is tuned for (:data:`twill.tune.predict.PROBLEMS`).
PROBLEM = "attention"
#: ``twill tune`` takes ``--causal`` (a causal problem) for this kernel.
CAUSAL = True
#: A persistent CTA restarts its pipeline for every query block (the softmax state restarts) and stores each
#: block's O from registers.
RESTARTS_PER_BLOCK = True

#: Default sweep on Hopper (:func:`twill.tune.space.default_axes`).
DEFAULT_AXES: dict[str, tuple[Any, ...]] = {
    "subtiles": (1, 2, 3), "block_n": (64, 128), "streaming_depth": (2, 3, 4), "reg_limit": (0, -40, -80),
    "persistent": (False, True)}


def register_floor(graph: LoopGraph, machine: Machine) -> int:
    """Registers per thread that a compute partition needs at least on Hopper: its 64-row S tile (``block_n /
    2`` fp32 per thread of a warp group; P replaces S as it is computed) and O (``head_dim / 2``), plus the
    bookkeeping registers every warp keeps (``machine.setmaxnreg_min``, as the warp-specialization verifier
    reserves); 0 on Blackwell (accumulators in tensor memory)."""
    if machine.mma_accumulates_in == "tmem":
        return 0
    attrs = graph.attrs
    return int(attrs["block_n"]) // 2 + int(attrs["head_dim"]) // 2 + machine.setmaxnreg_min


def shared_readers(graph: LoopGraph, shape: Any, wave: int, tiles: int) -> dict[str, float]:
    """Role -> CTAs of a wave of ``wave`` that read each of its tiles at the same loop step: the grid's fastest
    index is the query block of one (batch, head), so the CTAs of one head read its K/V tiles together."""
    per_head = tiles // (shape["B"] * shape["H"])
    together = wave / len({t // per_head for t in range(wave)})
    return dict.fromkeys(("load_k", "load_v"), together)


def causal_blocks(graph: LoopGraph, shape: Any, group: int) -> list[int]:
    """Loop iterations of one head's query blocks, heaviest first: block ``i`` runs its key tiles up to its last
    query, ``⌈min(S, (i + 1)·block_m) / block_n⌉`` (the loop stops at the diagonal)."""
    seq, block_m, block_n = shape["S"], graph.attrs["block_m"], graph.attrs["block_n"]
    blocks = math.ceil(seq / block_m)
    return [math.ceil(min(seq, (i + 1) * block_m) / block_n) for i in reversed(range(blocks))]


def extra_passes(graph: LoopGraph, shape: Any, machine: Machine) -> dict[str, float]:
    """``{"passes_us": …}``: the fp8 V transpose pre-pass (graph attribute ``v_transpose`` ``prepass``), one
    read and one write of V (``B · kv_heads · S · D`` bytes each, one byte per element) at
    ``machine.dram_bytes_per_s``, plus its launch; ``{}`` for every other forward (the in-kernel transpose is
    an op of the loop)."""
    if graph.attrs.get("v_transpose") != "prepass":
        return {}
    heads = int(graph.attrs.get("kv_heads", 0)) or shape["H"]
    moved = 2 * shape["B"] * heads * shape["S"] * shape["D"] * DTYPE_BYTES[str(graph.attrs["dtype"])]
    return {"passes_us": moved / machine.dram_bytes_per_s * 1e6 + machine.launch_us}


def stored_from_registers(graph: LoopGraph, esize: int) -> int | None:
    """Bytes of the O tile each block stores from registers (no staging), or None without the tile sizes. An
    fp8 forward stores a 16-bit O (bf16), whatever the operand bytes ``esize``."""
    attrs = graph.attrs
    if "v_transpose" in attrs:      # fp8
        esize = 2
    if "block_m" in attrs and "head_dim" in attrs:
        return attrs["block_m"] * attrs["head_dim"] * esize
    return None


def plan(schedule: Schedule) -> Any:
    """The forward's kernel plan (its turns and, in its decisions, each group's ``qk_ahead``), or ``None`` for
    a schedule the code generator does not emit."""
    from twill.errors import UnsupportedFeatureError
    from twill.kernels.flash_fwd.plan import plan as flash_plan

    try:
        return flash_plan(schedule, "gluon")
    except UnsupportedFeatureError:
        return None


def chain(schedule: Schedule, machine: Machine, plan: Any, scale: float, turns: float) -> dict[str, float]:
    """Raw cycles per iteration below which a compute warp group cannot finish its own chain, on a calibrated
    machine that measured the online-softmax step; ``{}`` otherwise (:func:`twill.tune.predict.chain_bound`).
    ``scale``: raw cycles per schedule unit; ``turns``: the tensor-core hand-off cycles per iteration."""
    cal = machine.calibration
    graph = schedule.graph
    if cal is None or not cal.softmax_step_cycles or not schedule.warps:
        return {}
    compute = [g for g in schedule.warps if any(graph.op(n).kind == "mma" for n in g.ops)]
    groups = sum(g.num_warps for g in compute) // 4
    step = softmax_step(cal.softmax_step_cycles, groups, int(graph.attrs["block_n"]), int(graph.attrs["head_dim"]))
    if step is None:
        return {}
    turn = turns / len(compute)
    apart = ({p.group for p, ahead in zip(plan.compute, plan.decisions.qk_ahead) if ahead == 0}
             if plan is not None else set())
    chains = []
    for g in compute:
        mine = set(g.ops)
        waits = [e.delay * scale for e in graph.edges if e.src in mine and e.dst in mine and e.distance == 0
                 and graph.op(e.src).kind == "mma" and graph.op(e.dst).kind != "mma"]
        wait = max(waits, default=0.0)
        if g.id in apart:
            pv = [graph.op(n) for n in g.ops if graph.op(n).attrs.get("role") == "pv"]
            wait += sum((op.latency if op.latency is not None else op.cycles) * scale for op in pv)
        issue = sum(ASYNC_ISSUE_CYCLES for n in g.ops if graph.op(n).kind == "mma")
        chains.append(step + wait + issue + turn)
    return {"chain_ii": max(chains)}


def softmax_step(steps: dict[str, float], groups: int, block_n: int, head_dim: int) -> float | None:
    """The measured online-softmax step of ``groups`` x ``block_n`` keys x ``head_dim``; a tile the machine
    file did not measure is estimated from the measured one with the same groups and head dimension and the
    nearest key count, in proportion to the keys (its exponentials and row sums); ``None`` if there is none.
    Without the estimate the chain bound would vanish for that tile and the prediction fall back to the
    optimistic per-op rates."""
    exact = steps.get(softmax_key(groups, block_n, head_dim))
    if exact is not None:
        return exact
    near = []
    for key, cycles in steps.items():
        g, n, d = (int(v) for v in key.split("x"))
        if g == groups and d == head_dim:
            near.append((abs(n - block_n), n, cycles))
    if not near:
        return None
    _, n, cycles = min(near)
    return cycles * block_n / n
