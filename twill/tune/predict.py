"""Predicted kernel time of a schedule on a problem shape: the number ``twill tune`` ranks candidates by.

A schedule describes one CTA's main loop; the problem shape says how many loop iterations one CTA runs and
how many CTAs (tiles) the grid has. The prediction, in raw cycles of one SM:

* ``II`` and ``L`` are read off the schedule and turned into raw cycles with the normalization record
  (``schedule.stats["normalization"]["cycles_per_unit"]``; 1 when normalization is off).
* **Streaming loads** (calibrated machines only, :func:`stream_bound`): the solver treats TMA loads as
  free (paper §5.3); the hardware does not. The loop runs no faster than the load latency over the ring
  buffers that hide it, nor than its bytes per iteration over the L2 bandwidth per SM, so the effective
  ``II_eff = max(II, latency / (depth − 1), bytes / bandwidth)``. The CTAs of a wave that read the same
  tile at the same step (:func:`wave_readers`: a GEMM's row and column of output tiles, the query blocks of
  one attention head) share its L2 traffic, up to what one SM can take in.
* **Per-group chains** (attention forward on a calibrated machine that measured the softmax step,
  :func:`chain_bound`): each compute warp group must wait for its S, run its online-softmax step at the speed
  measured with the other groups running theirs, and pass the tensor core on, every iteration; ``II_eff``
  is at least the slowest group's chain, and the partial first and last iterations run at its pace too:
  ``L`` becomes ``L · chain_ii / II`` when the chain binds. The attention backward's chain is its measured
  iteration (the generated loop's compute side with the loads taken away, on a machine that measured the
  tile).
* **Per tile**: a modulo-scheduled loop of ``n`` iterations starts iteration ``i`` at ``i·II_eff`` and each
  iteration takes ``L``, so the tile takes ``(n − 1)·II_eff + L`` cycles: ``n·II_eff`` in the steady state
  plus the prologue/epilogue overhead ``L − II`` (the ``stages − 1`` partially filled iterations at each end).
* **CTAs per SM** ``c`` = how many CTAs fit together on one SM: the least of shared memory
  (``machine.smem_per_sm //`` :func:`shared_memory`), warps (``machine.max_warps_per_sm // warps``) and
  registers over the schedule's warp groups (``setmaxnreg`` needs one register count for the whole CTA at
  launch, so a warp-specialized CTA reserves its warps, rounded up to whole warp groups, times the largest
  budget any group asks for: ``regs_per_sm // (⌈Σ warps⌉₄ · 32 · max regs)``); a schedule without
  warp groups (a Triton kernel) counts the graph's ``num_warps``. A kernel the sweep compiled
  (``stats["compiled"]``) counts its compiled shared memory and, without warp groups, ptxas's registers per
  thread (in steps of 8): ``regs_per_sm // (num_warps · 32 · regs)``. Co-resident CTAs share
  the SM's units and its L2 bandwidth, so a wave of ``c`` CTAs takes ``max(tile, c·n·max(ResMII,
  bandwidth bound))`` cycles: the busiest unit is busy ``ResMII`` raw cycles per iteration of every CTA.
* **Tile ends** (calibrated machines only, :func:`tile_ends`): a tile's first loads arrive ``fill`` cycles
  after it starts (the solver prices loads as free), and a GEMM tile's output is staged through shared memory
  and stored with TMA before the CTA exits (an attention forward's O tile is stored from registers):
  ``tile = fill + (n − 1)·II_eff + L + staging + store``.
* **Waves**: ``⌈tiles / (machine.sms · c)⌉`` (wave quantization over the SMs).
* **Persistent GEMM** (``persistent``): ``min(tiles, machine.sms)`` CTAs, one per SM, each running
  ``w = ⌈tiles / grid⌉`` tiles back to back with one ring over (tile, k): the pipeline's prologue/epilogue
  ``L − II``, the fill and the store are paid once per CTA (the ring runs on into the next tile, a tile's
  store drains during the next loop), the staging once per tile, so the grid takes
  ``fill + w·(n·II_eff + staging) + L − II + store`` cycles (at least ``w·n·max(ResMII, bandwidth bound)``);
  ``waves`` is then ``w``.
* **Persistent attention forward** (``persistent``): ``min(tiles, machine.sms)`` CTAs each take ``w`` query
  blocks one after another. The producer loads the next block while the current one runs, so the fill is
  paid once per CTA; each block's loop fills and drains its own pipeline (its softmax state restarts) and
  stores its O, so the grid takes ``fill + w·((n − 1)·II_eff + L + store)`` cycles (at least
  ``w·n·max(ResMII, bandwidth bound)``).
* **Causal attention** (:func:`causal_iterations`): forward query block ``i`` runs its key tiles up to its
  last query, ``n_i = ⌈min(S, (i + 1)·block_m) / block_n⌉`` iterations; backward key block ``k`` its group's
  query blocks from its diagonal on. The blocks differ in length; the kernel launches them in chunks of about
  one wave of heads, heaviest first across each chunk, and the block scheduler (one CTA per block) or the
  persistent kernel's work counter hands them in that order to whichever CTA slot frees first
  (:func:`list_schedule`): each block takes ``fill + (n_i − 1)·II_eff + L + store`` (persistent: the fill once
  per CTA), and the grid the makespan (at least ``Σ n_i · max(ResMII, bandwidth bound)`` per SM). The masked
  diagonal tiles cost what the others do.
* **Clock** (:func:`tensor_duty`): the GPU is power-capped, so its clock falls as its tensor cores work
  harder. The tensor-core duty ``u`` is the launch's tensor-core busy cycles (every tile's iterations at the
  cost model's wgmma cycles) over ``cycles · machine.sms``; on a machine with a clock model the clock is
  :meth:`Machine.clock_at(u) <twill.machine.models.Machine.clock_at>` (``1 / f = a + b·u`` ns per cycle,
  fitted to generated GEMMs' own clock readings), otherwise the one sustained clock.
* **Time**: ``waves · wave cycles / clock + machine.launch_us``; the generated backward adds its other launches
  (:func:`backward_passes`).

Problems (:data:`PROBLEMS`): ``gemm`` (``M, N, K``; tiles ``⌈M/block_m⌉·⌈N/block_n⌉``, ``⌈K/block_k⌉``
iterations), ``attention`` (``B, H, S, D``; causal when the kernel's graph is). The attention loop depends on
the kernel: the forward pass (Triton attention kernels too) has ``B·H·⌈S/block_m⌉`` tiles of ``⌈S/block_n⌉`` iterations;
the backward pass (a resident K/V block, a loop over query blocks) has ``B·H·⌈S/block_n⌉`` tiles of
``⌈S/block_m⌉`` iterations, and with grouped K/V heads ``B·H_kv·⌈S/block_n⌉`` tiles of ``(H/H_kv)·⌈S/block_m⌉``
(:func:`grid_heads`). What depends on the kernel family comes from its cost hooks
(``twill/kernels/<family>/tune.py``, :func:`hooks`): FLOPs, loop extent and grid, the CTAs that read a tile
together, the causal blocks, the tile's store, other launches and the chain bound.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any, Mapping

from twill.errors import TwillError
from twill.ir.graph import LoopGraph
from twill.machine.costs import DTYPE_BYTES, handoff_cycles
from twill.machine.models import Machine
from twill.schedule.result import Schedule

#: Bytes of the tile the calibration's TMA latency was measured with (128 x 64 fp16).
MICROBENCH_TILE_BYTES = 128 * 64 * 2

#: Problem -> the names of its sizes, in the order ``--shape`` takes them.
PROBLEMS: dict[str, tuple[str, ...]] = {"gemm": ("M", "N", "K"), "attention": ("B", "H", "S", "D")}

#: Default sizes per problem (attention's ``D`` comes from the kernel's ``head_dim``).
DEFAULT_SIZES: dict[str, dict[str, int]] = {"gemm": {"M": 4096, "N": 4096, "K": 4096},
                                            "attention": {"B": 4, "H": 32, "S": 4096}}


def hooks(kernel: Any) -> ModuleType | None:
    """The cost hooks (``twill/kernels/<family>/tune.py``) of the kernel family called ``kernel`` (a graph's
    ``attrs["kernel"]``), or None for a loop of no tuned family (a Triton kernel, a graph file)."""
    from twill.kernels import find_family

    family = find_family(kernel)
    return family.hooks() if family is not None else None


def graph_hooks(graph: LoopGraph) -> ModuleType | None:
    """:func:`hooks` of the family ``graph`` was built by."""
    return hooks(graph.attrs.get("kernel"))


def kernel_problem(kernel: str) -> str | None:
    """The problem (a key of :data:`PROBLEMS`) built-in ``kernel`` is tuned for, or None for a kernel without
    cost hooks."""
    family = hooks(kernel)
    return getattr(family, "PROBLEM", None)


@dataclass(frozen=True)
class Shape:
    """A problem size: ``problem`` (a key of :data:`PROBLEMS`) and its sizes in that problem's order."""

    problem: str
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        names = PROBLEMS.get(self.problem)
        if names is None:
            raise TwillError(f"unknown problem {self.problem!r} (known: {', '.join(PROBLEMS)})")
        if len(self.sizes) != len(names) or any(int(s) < 1 for s in self.sizes):
            raise TwillError(f"a {self.problem} shape is {len(names)} positive integers "
                             f"{','.join(names)}, got {self.sizes}")

    def __getitem__(self, name: str) -> int:
        """The size called ``name`` (``shape["K"]``)."""
        return self.sizes[PROBLEMS[self.problem].index(name)]

    def as_dict(self) -> dict[str, int]:
        """``{"M": 4096, ...}``."""
        return dict(zip(PROBLEMS[self.problem], self.sizes))

    def text(self) -> str:
        """``M=4096,N=4096,K=4096``."""
        return ",".join(f"{k}={v}" for k, v in self.as_dict().items())

    def flops(self, kernel: str = "", causal: bool = False) -> float:
        """Useful FLOPs: ``2·M·N·K``; attention ``4·B·H·S²·D`` times the kernel family's ``FLOPS_SCALE``
        (the backward's 2.5: 5 GEMMs, not 2), half of it with a causal mask (the convention of FlashAttention's
        and cuDNN's benchmarks)."""
        if self.problem == "gemm":
            return 2.0 * self["M"] * self["N"] * self["K"]
        forward = 4.0 * self["B"] * self["H"] * self["S"] ** 2 * self["D"]
        return forward * float(getattr(hooks(kernel), "FLOPS_SCALE", 1.0)) / (2.0 if causal else 1.0)

    def flops_of(self, graph: LoopGraph) -> float:
        """:meth:`flops` of the kernel ``graph`` is a loop of (its ``kernel`` and ``causal`` attributes)."""
        return self.flops(str(graph.attrs.get("kernel", "")), causal=bool(graph.attrs.get("causal")))


def problem_of(graph: LoopGraph) -> str:
    """The problem a loop graph belongs to, read from its attributes: ``head_dim`` means attention,
    ``block_k`` GEMM."""
    if "head_dim" in graph.attrs:
        return "attention"
    if "block_k" in graph.attrs:
        return "gemm"
    raise TwillError(f"graph {graph.name!r} names no problem (its attrs have neither block_k nor head_dim); "
                     f"twill tune predicts GEMM and attention loops only")


def default_shape(problem: str, head_dim: int | None = None) -> Shape:
    """The default shape of ``problem``: GEMM 4096³; attention B=4, H=32, S=4096, D=``head_dim`` (128)."""
    sizes = dict(DEFAULT_SIZES[problem])
    if problem == "attention":
        sizes["D"] = head_dim or 128
    return Shape(problem, tuple(sizes[n] for n in PROBLEMS[problem]))


def parse_shape(text: str, problem: str) -> Shape:
    """``--shape 4096,4096,4096`` (or ``M=4096,N=4096,K=4096``) for ``problem``; a bad shape is a TwillError."""
    names = PROBLEMS[problem]
    parts = [p.strip() for p in text.split(",") if p.strip()]
    values: list[int] = []
    for i, part in enumerate(parts):
        name, _, value = part.rpartition("=")
        if name and (i >= len(names) or name.upper() != names[i]):
            raise TwillError(f"bad --shape {text!r}: a {problem} shape is {','.join(names)}")
        try:
            values.append(int(value))
        except ValueError:
            raise TwillError(f"bad --shape {text!r}: {value!r} is not an integer") from None
    return Shape(problem, tuple(values))


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one kernel launch.

    Attributes:
        seconds: predicted wall time of the launch.
        cycles: raw SM cycles of the whole grid (``waves`` × wave cycles), without the launch cost.
        iterations: loop iterations per tile (CTA); of the longest query block of a causal forward.
        tiles: CTAs of the grid.
        waves: ``⌈tiles / (sms · ctas_per_sm)⌉``; of a causal forward, the most blocks one CTA slot ran.
        breakdown: the terms of the formula (module docstring): ``ii_raw``, ``ii_effective`` (with the
            streaming bounds ``latency_ii`` and ``bandwidth_ii`` and the attention chain bound ``chain_ii``
            on a calibrated machine), the tile ends ``fill_cycles``, ``staging_cycles``, ``store_cycles``
            (calibrated machine), ``length_raw``,
            ``tile_cycles``,
            ``overhead_cycles`` (``L − II``), ``ctas_per_sm``, ``wave_cycles``, ``clock_ghz``, ``launch_us``.
    """

    seconds: float
    cycles: float
    iterations: int
    tiles: int
    waves: int
    breakdown: Mapping[str, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "breakdown", MappingProxyType(dict(self.breakdown)))

    @property
    def microseconds(self) -> float:
        """``seconds`` in microseconds."""
        return self.seconds * 1e6

    def to_dict(self) -> dict[str, Any]:
        """The prediction as JSON (the sweep document's ``prediction``)."""
        return {"seconds": self.seconds, "us": round(self.microseconds, 3), "cycles": self.cycles,
                "iterations": self.iterations, "tiles": self.tiles, "waves": self.waves,
                "breakdown": dict(self.breakdown)}


def cycles_per_unit(schedule: Schedule) -> float:
    """Raw cycles per schedule time unit: the normalization scale, or 1 when normalization is off."""
    norm = schedule.stats.get("normalization") or {}
    return float(norm.get("cycles_per_unit", 1.0)) if norm.get("enabled") else 1.0


def loop_extent(graph: LoopGraph, shape: Shape) -> tuple[int, int]:
    """``(tiles, iterations per tile)`` of ``graph``'s loop on ``shape`` (module docstring)."""
    attrs = graph.attrs
    if shape.problem == "gemm":
        return (math.ceil(shape["M"] / attrs["block_m"]) * math.ceil(shape["N"] / attrs["block_n"]),
                math.ceil(shape["K"] / attrs["block_k"]))
    if int(attrs["head_dim"]) != shape["D"]:
        raise TwillError(f"shape D={shape['D']} does not match the kernel's head_dim {attrs['head_dim']}")
    family = graph_hooks(graph)
    if hasattr(family, "loop_extent"):
        return family.loop_extent(graph, shape)
    seq = shape["S"]
    return grid_heads(graph, shape)[0] * math.ceil(seq / attrs["block_m"]), math.ceil(seq / attrs["block_n"])


def grid_heads(graph: LoopGraph, shape: Shape) -> tuple[int, int]:
    """``(heads, group)``: the (batch, head) pairs an attention grid spans and the query heads each CTA's loop
    runs over: one query head per CTA, unless the kernel family's ``grid_heads`` hook says otherwise (a
    grouped-query backward CTA takes a key block of one K/V head and loops over the query heads that read it)."""
    family = graph_hooks(graph)
    if hasattr(family, "grid_heads"):
        return family.grid_heads(graph, shape)
    return shape["B"] * shape["H"], 1


def causal_iterations(graph: LoopGraph, shape: Shape, sms: int) -> list[int] | None:
    """Loop iterations of each CTA of a causal attention kernel, in launch order, or None for any other loop.
    The kernel family's ``causal_blocks`` hook gives one head's blocks, heaviest first (forward: query block
    ``i`` runs its key tiles up to its diagonal; backward: key block ``k`` meets the query blocks from its
    diagonal on, :func:`grid_heads`). Both kernels hand their blocks out in chunks of ``max(1, sms // blocks
    per head)`` heads, each chunk block by block from the heaviest, every head's block before any lighter one
    (``heaviest_first_chunks`` in twill/codegen/gluon/render.py)."""
    family = graph_hooks(graph)
    if not graph.attrs.get("causal") or not hasattr(family, "causal_blocks") or shape.problem != "attention":
        return None
    heads, group = grid_heads(graph, shape)
    heaviest_first = family.causal_blocks(graph, shape, group)
    chunk = max(1, sms // len(heaviest_first))
    return [n for first in range(0, heads, chunk) for n in heaviest_first for _ in range(min(chunk, heads - first))]


def backward_passes(graph: LoopGraph, shape: Shape, machine: Machine) -> dict[str, float]:
    """``{"passes_us": …}``: what a generated kernel's other launches cost beside its main kernel (the
    backward's pre-pass, zeroing and dQ conversion: the family's ``extra_passes`` hook); ``{}`` for a kernel
    without."""
    family = graph_hooks(graph)
    if not hasattr(family, "extra_passes") or shape.problem != "attention":
        return {}
    return family.extra_passes(graph, shape, machine)


def list_schedule(durations: list[float], slots: int) -> tuple[float, list[int]]:
    """Greedy list scheduling, as the block scheduler (one CTA per block) or the persistent kernel's work
    counter hands out work: each item in order goes to the slot that frees first. Returns the makespan and
    the number of items each slot ran."""
    heap = [(0.0, k) for k in range(slots)]
    counts = [0] * slots
    for d in durations:
        free, k = heapq.heappop(heap)
        counts[k] += 1
        heapq.heappush(heap, (free + d, k))
    return max(t for t, _ in heap), counts


def shared_memory(schedule: Schedule) -> int:
    """Shared-memory bytes of one CTA: ``stats["smem_bytes"]`` when the joint solver reports it, else every
    op's buffer times the copies the schedule keeps (``Schedule.result_depth``) plus the resident tiles
    (``attrs["smem_resident"]``)."""
    if schedule.stats.get("smem_bytes"):
        return int(schedule.stats["smem_bytes"])
    graph = schedule.graph
    buffers = sum(op.smem * schedule.result_depth(op.name) for op in graph.ops if op.smem)
    return buffers + int(graph.attrs.get("smem_resident", 0))


#: Registers are allocated to a warp in units of 256, so a thread's count is taken in steps of 8.
REGISTER_STEP = 8


def ctas_per_sm(schedule: Schedule, machine: Machine) -> int:
    """CTAs that fit on one SM together (module docstring). Warps and registers come from the warp groups;
    a schedule without warp groups (a Triton kernel) counts ``attrs["num_warps"]``. When the sweep compiled the
    kernel (``stats["compiled"]``: ptxas's registers per thread and the shared memory the compiled kernel
    asks for), those are counted instead of the model's: Triton's pipeliner allocates buffers the loop graph
    does not show, and a kernel without warp groups has no register budget in the model."""
    compiled = schedule.stats.get("compiled") or {}
    limits = []
    if schedule.warps:
        warps = -(-sum(g.num_warps for g in schedule.warps) // 4) * 4
        limits.append(machine.regs_per_sm // (warps * 32 * max(g.regs for g in schedule.warps)))
    else:
        warps = int(schedule.graph.attrs.get("num_warps", 0))
        regs = -(-int(compiled.get("registers") or 0) // REGISTER_STEP) * REGISTER_STEP
        if warps and regs:
            limits.append(machine.regs_per_sm // (warps * 32 * regs))
    if warps:
        limits.append(machine.max_warps_per_sm // warps)
    smem = int(compiled.get("shared_bytes") or 0) or shared_memory(schedule)
    if smem:
        limits.append(machine.smem_per_sm // smem)
    return max(1, min(limits, default=1))


def _release_stage(schedule: Schedule, consumer: str) -> int:
    """The stage at which a consumer of a streaming load frees its ring buffer: an asynchronous MMA reads the
    buffer until its result is waited for, which happens before the first op that uses the result (its
    earliest successor: the ``mma_wait`` of a GEMM, the row max of attention); any other consumer frees it
    in its own stage."""
    graph = schedule.graph
    if graph.op(consumer).kind != "mma":
        return schedule.stage(consumer)
    later = [schedule.stage(e.dst) + e.distance for e in graph.out_edges(consumer) if e.dst != consumer]
    return min(later) if later else schedule.stage(consumer)


def first_byte_latency(cal: Any) -> float:
    """Loaded latency of a TMA tile's first byte from L2: the calibrated tile latency less the calibration
    tile's own transfer at the L2 rate."""
    return max(0.0, cal.tma_l2_latency_cycles - MICROBENCH_TILE_BYTES / cal.tma_l2_bytes_per_clk)


def wave_readers(graph: LoopGraph, shape: Shape, wave: int) -> dict[str, float]:
    """Streaming load -> how many CTAs of a wave of ``wave`` resident CTAs read each of its tiles at the same
    loop step (module docstring): the first ``wave`` tiles in launch order, over how many distinct tiles of
    the load they read, by role, from the kernel family's ``shared_readers`` hook (GEMM, grouped order: an A
    tile is read by the CTAs on its row of output tiles, a B tile by those on its column; attention: the CTAs
    of one head read its K/V, or Q/dO/statistics, tiles together). The loads of any other kernel (a Triton
    kernel's, whose launch order its own source sets) count 1 reader each, as do loads of any other role."""
    family = graph_hooks(graph)
    if not hasattr(family, "shared_readers"):
        return {op.name: 1.0 for op in graph.ops if graph.is_streaming(op.name)}
    tiles, _ = loop_extent(graph, shape)
    wave = max(1, min(wave, tiles))
    shared = family.shared_readers(graph, shape, wave, tiles)
    return {op.name: shared.get(str(op.attrs.get("role", "")), 1.0)
            for op in graph.ops if graph.is_streaming(op.name)}


def stream_bound(schedule: Schedule, machine: Machine, readers: Mapping[str, float] | None = None
                 ) -> dict[str, float]:
    """Raw cycles per iteration below which the streaming loads cannot keep up, on a calibrated machine;
    ``{}`` on a datasheet one (whose loads are free, as in the solver's model):

    * ``latency_ii``: a ring buffer holds its tile from the load's stage until the stage that frees it, ``s``
      stages, so with ``d`` buffers a load is issued ``d − s + 1`` iterations before its data is used, and an
      iteration's tiles take ``fill = base + bytes / tma_l2_bytes_per_clk`` cycles to land: the loaded
      latency of the first byte (the calibrated L2 tile latency less that tile's own transfer) plus the
      iteration's bytes at the rate one SM streams them when every SM streams its own. The loop runs no
      faster than ``fill / (d − s + 1)``.
    * ``bandwidth_ii``: the L2 delivers a tile that ``r`` CTAs of a wave read at the same loop step
      (``readers``, :func:`wave_readers`) once for all of them, so each SM's share of the L2's traffic is
      ``Σ bytes / r`` per iteration, at ``tma_l2_bytes_per_clk``; and no SM takes in more than
      ``tma_sm_bytes_per_clk``: ``bandwidth_ii = max(Σ bytes / r / tma_l2_bytes_per_clk, Σ bytes /
      tma_sm_bytes_per_clk)``. A machine file without ``tma_sm_bytes_per_clk``, or no ``readers``, prices
      every byte at ``tma_l2_bytes_per_clk``.
    """
    cal = machine.calibration
    graph = schedule.graph
    loads = [op for op in graph.ops if graph.is_streaming(op.name)]
    if cal is None or not loads:
        return {}
    nbytes = sum(op.smem for op in loads)
    transfer = nbytes / cal.tma_l2_bytes_per_clk
    bandwidth_ii = transfer
    if readers and cal.tma_sm_bytes_per_clk:
        unique = sum(op.smem / readers.get(op.name, 1.0) for op in loads)
        bandwidth_ii = max(unique / cal.tma_l2_bytes_per_clk, nbytes / cal.tma_sm_bytes_per_clk)
    base = first_byte_latency(cal)
    lookahead = []
    for op in loads:
        consumers = [e.dst for e in graph.out_edges(op.name) if e.dst != op.name]
        span = max((_release_stage(schedule, c) - schedule.stage(op.name) + 1 for c in consumers), default=1)
        lookahead.append(max(1, schedule.result_depth(op.name) - span + 1))
    return {"latency_ii": (base + transfer) / min(lookahead), "bandwidth_ii": bandwidth_ii}


def tile_ends(schedule: Schedule, machine: Machine) -> dict[str, float]:
    """Raw cycles a tile spends outside its modulo-scheduled loop, on a calibrated machine (``{}`` on a
    datasheet one, whose loads are free as in the solver's model):

    * ``fill_cycles``: before its first iteration can start, the tile's first streaming tiles must arrive:
      ``base``, the loaded latency of their first byte (as in :func:`stream_bound`; their transfer is one
      of the loop's iterations under the bandwidth bound);
    * ``staging_cycles`` and ``store_cycles`` (GEMM): after the loop, the output tile goes from registers to
      shared memory (``bytes / smem_bytes_per_clk``) and out with a TMA store (``bytes /
      tma_l2_bytes_per_clk``), which the CTA waits for before it exits; the attention forward stores its O
      tile from registers (``store_cycles`` only, at the same rate).

    A persistent kernel hides the fill of every tile but its first (the ring runs on into the next tile)
    and every store but its last (the next tile's loop runs while it drains); the staging it keeps."""
    cal = machine.calibration
    graph = schedule.graph
    if cal is None:
        return {}
    loads = [op for op in graph.ops if graph.is_streaming(op.name)]
    base = first_byte_latency(cal)
    ends = {"fill_cycles": base} if loads else {}
    attrs = graph.attrs
    esize = DTYPE_BYTES.get(str(attrs.get("dtype", "fp16")), 2)
    if "block_k" in attrs:
        out = attrs["block_m"] * attrs["block_n"] * esize
        ends.update(staging_cycles=out / cal.smem_bytes_per_clk, store_cycles=out / cal.tma_l2_bytes_per_clk)
    elif hasattr(family := graph_hooks(graph), "stored_from_registers"):
        out = family.stored_from_registers(graph, esize)   # O, stored from registers (no staging)
        if out is not None:
            ends.update(store_cycles=out / cal.tma_l2_bytes_per_clk)
    return ends


def chain_bound(schedule: Schedule, machine: Machine) -> dict[str, float]:
    """Raw cycles per iteration below which a compute warp group cannot finish its own chain, from the kernel
    family's ``chain`` hook on a calibrated machine; ``{}`` otherwise.

    Attention forward (a machine that measured the online-softmax step): ``chain_ii = step + wait + issue +
    turn`` for the slowest compute group, where ``step`` is the measured online-softmax step of one 64-row warp
    group (``Calibration.softmax_step_cycles``: row max, exp, row sum, rescale and the P conversion, measured
    with ``O += P V`` in flight and as many warp groups running it at once as the kernel has, ``Σ compute warps
    / 4``), ``wait`` the latency of the MMA whose result the group waits for in the same iteration (S = Q Kᵀ
    before the row max; a group that issues S and P V apart, ``qk_ahead`` 0 in its kernel plan, also waits for
    ``O += P V`` before its next iteration, so its latency is added), ``issue`` the issue cycles of the group's
    asynchronous ops and ``turn`` its share of the tensor-core hand-offs. The solver's schedule keeps the
    groups' softmax ops apart on MUFU and the FP32 pipes, but nothing in the kernel enforces that: the groups
    run them at once and slow each other down, which the measured step includes.

    Attention backward (a machine that measured the tile): the measured iteration
    (``Calibration.backward_iteration_cycles``), the generated loop's compute side with its loads taken away.
    """
    return _chain_bound(schedule, machine, _kernel_plan(schedule))


def _chain_bound(schedule: Schedule, machine: Machine, plan: Any) -> dict[str, float]:
    """:func:`chain_bound` with the schedule's kernel plan (:func:`_kernel_plan`) already made."""
    family = graph_hooks(schedule.graph)
    if not hasattr(family, "chain"):
        return {}
    turns = _turn_count(schedule, plan) * handoff_cycles(machine)
    return family.chain(schedule, machine, plan, cycles_per_unit(schedule), turns)


def _kernel_plan(schedule: Schedule) -> Any:
    """The kernel plan the prediction reads (the attention forward's turns and waits: the family's ``plan``
    hook), or ``None`` for another kernel or a schedule the code generator does not emit."""
    family = graph_hooks(schedule.graph)
    return family.plan(schedule) if hasattr(family, "plan") else None


def tensor_core_turns(schedule: Schedule) -> int:
    """How often per iteration the tensor core passes from one warp group to another: the steady-state
    order of the ops that use it, read around the cycle, changes warp group this many times. Each change is
    an mbarrier hand-off during which the tensor core waits (the ping-pong of two compute groups: 2). For the
    attention forward, the turns of its kernel plan: a group that issues S ahead takes one turn per iteration
    (:func:`_kernel_plan`)."""
    return _turn_count(schedule, _kernel_plan(schedule))


def _turn_count(schedule: Schedule, plan: Any) -> int:
    """:func:`tensor_core_turns` with the schedule's kernel plan (:func:`_kernel_plan`) already made."""
    if not schedule.warps:
        return 0
    if plan is not None:
        return len(plan.turns) if len(plan.turns) > 1 else 0
    groups = [schedule.assignment.get(op.name) for op in sorted(
        (o for o in schedule.graph.ops if o.usage("tc")), key=lambda o: schedule.residue(o.name))]
    return sum(1 for i, g in enumerate(groups) if g != groups[i - 1]) if len(groups) > 1 else 0


def tensor_duty(schedule: Schedule, iterations: int, cycles: float, machine: Machine) -> float:
    """The share of the SMs' cycles their tensor cores are busy when ``iterations`` loop iterations (over all
    tiles) take ``cycles`` on each SM: each iteration holds the tensor core for its ops' ``tc`` usage."""
    busy = sum(op.usage("tc") for op in schedule.graph.ops) * cycles_per_unit(schedule)
    return min(1.0, iterations * busy / (cycles * machine.sms)) if cycles > 0 else 0.0


def predict(schedule: Schedule, shape: Shape, machine: Machine, persistent: bool = False) -> Prediction:
    """The predicted time of one launch of ``schedule``'s kernel on ``shape`` (formula: module docstring);
    ``persistent``: the persistent kernel of the same schedule (GEMM or attention forward)."""
    scale = cycles_per_unit(schedule)
    ii_raw, length_raw = schedule.ii * scale, schedule.length * scale
    tiles, iterations = loop_extent(schedule.graph, shape)
    per_sm = 1 if persistent else ctas_per_sm(schedule, machine)      # resident CTAs per SM
    memory = stream_bound(schedule, machine, wave_readers(schedule.graph, shape, machine.sms * per_sm))
    plan = _kernel_plan(schedule)    # an attention forward's kernel: its turns and waits (made once)
    # the hand-offs of the tensor core between warp groups, on a calibrated machine (measured cost)
    turns = _turn_count(schedule, plan) * handoff_cycles(machine) if machine.calibration is not None else 0
    chain = _chain_bound(schedule, machine, plan)
    ii_eff = max([ii_raw + turns, *memory.values(), *chain.values()])
    ends = tile_ends(schedule, machine)
    fill, staging, store = (ends.get(k, 0.0) for k in ("fill_cycles", "staging_cycles", "store_cycles"))
    # a chain-bound loop runs its partial first and last iterations at the chain's pace too
    length_eff = length_raw * chain["chain_ii"] / ii_raw if chain and chain["chain_ii"] > ii_raw else length_raw
    tile_cycles = fill + (iterations - 1) * ii_eff + length_eff + staging + store
    shared_ii = max(float(schedule.stats.get("res_mii", 0)) * scale, memory.get("bandwidth_ii", 0.0))
    worked = tiles * iterations          # loop iterations over the whole grid
    blocks = causal_iterations(schedule.graph, shape, machine.sms)
    if blocks is not None:
        # query blocks of unequal length, handed out in launch order to the SMs' CTA slots
        body = [(n - 1) * ii_eff + length_eff + store for n in blocks]
        slots = min(tiles, machine.sms * per_sm)
        if persistent:              # the producer runs on into the next block: one fill per CTA
            cycles, counts = list_schedule(body, slots)
            cycles += fill
        else:
            cycles, counts = list_schedule([fill + b for b in body], slots)
        # co-resident CTAs share their SM's units and L2 bandwidth
        cycles = wave_cycles = max(cycles, sum(blocks) * shared_ii * per_sm / slots)
        waves, iterations, worked = max(counts), max(blocks), sum(blocks)
        tile_cycles = fill + (iterations - 1) * ii_eff + length_eff + store
    elif persistent:
        waves = math.ceil(tiles / min(tiles, machine.sms))
        if getattr(graph_hooks(schedule.graph), "RESTARTS_PER_BLOCK", False):
            # one CTA per SM takes query blocks one after another: the producer loads the next block while
            # the current one runs, so only the first block waits for its loads; each block's loop still
            # fills and drains its own pipeline (the softmax state restarts) and stores its O from registers
            loop = waves * ((iterations - 1) * ii_eff + length_eff + store)
            wave_cycles = max(fill + loop, waves * iterations * shared_ii)
        else:
            # one CTA per SM runs its tiles back to back: the pipeline fills and drains once per CTA, the
            # ring runs on into the next tile and a tile's store drains while the next one's loop runs
            loop = waves * (iterations * ii_eff + staging) + length_raw - ii_raw
            wave_cycles = max(fill + loop + store, waves * iterations * shared_ii)
        cycles = wave_cycles
    else:
        # co-resident CTAs (as many as fit, and as the grid has per SM) share the units and the L2 bandwidth
        resident = min(per_sm, math.ceil(tiles / machine.sms))
        wave_cycles = max(tile_cycles, resident * iterations * shared_ii)
        waves = math.ceil(tiles / (machine.sms * per_sm))
        cycles = waves * wave_cycles
    duty = tensor_duty(schedule, worked, cycles, machine)
    clock = machine.clock_at(duty)
    passes = backward_passes(schedule.graph, shape, machine)
    seconds = cycles / (clock * 1e9) + machine.launch_us * 1e-6 + passes.get("passes_us", 0.0) * 1e-6
    breakdown = {"ii_raw": ii_raw, "ii_effective": ii_eff, "turn_cycles": turns, **memory, **chain, **ends, **passes,
                 "length_raw": length_raw, "tile_cycles": tile_cycles, "overhead_cycles": length_raw - ii_raw,
                 "ctas_per_sm": per_sm, "wave_cycles": wave_cycles, "persistent": float(persistent),
                 **({"causal": 1.0} if blocks is not None else {}),
                 "tensor_duty": duty, "clock_ghz": clock, "launch_us": machine.launch_us}
    return Prediction(seconds=seconds, cycles=cycles, iterations=iterations, tiles=tiles, waves=waves,
                      breakdown=breakdown)
