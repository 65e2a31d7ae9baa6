"""Cost model: a tile operation (kind, shape, dtype) on a machine -> cycles and resource reservation table.

Costs are first-order throughput estimates from the per-SM rates of :mod:`twill.machine.models`; the paper
derives them the same way from public specifications (§1.5, §7.2). Examples on H100: a 128x128x128 fp16
GEMM is 2*128^3 / 4096 = 1024 clk on the tensor core; exp2 over a 128x128 tile is 16384 / 16 = 1024 clk on
MUFU — "GEMM and EXP on a tile have roughly the same cost" (paper, Fig. 1).

A calibrated machine (``--machine FILE``, :mod:`twill.machine.calibration`) replaces the datasheet rates with
the rates ``twill calibrate`` measured, and models contention between warp groups: an op holds its unit for
``work / (rate the whole SM sustains)`` cycles (its RRT), but its issuing warp group is busy, and its result
late, for ``work / (rate one warp group reaches alone)`` cycles (``warp_busy``, ``latency``). Two warp
groups can therefore overlap on a unit exactly as far as the measured rates allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from twill.errors import UnsupportedFeatureError
from twill.machine.calibration import lookup_n
from twill.machine.models import BARRIER_HANDOFF_CYCLES, Machine

DTYPE_BYTES = {"fp8": 1, "fp8e4m3": 1, "fp8e5m2": 1, "i8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4,
               "i32": 4}

#: fp8 element formats (the kernels' ``--dtype``, e.g. ``flash-fwd --dtype fp8e4m3``) -> the rate class the
#: machine tables (``Machine.tc_flops_per_clk``, a calibration's ``mma_flops_per_clk``) price them at: the
#: tensor cores of sm_90 and sm_100 run e4m3 and e5m2 at one rate, ``"fp8"``. Every other dtype is its own
#: rate class.
FP8_FORMATS = {"fp8e4m3": "fp8", "fp8e5m2": "fp8"}

#: Cycles an asynchronous op (wgmma, tcgen05, TMA) keeps its issuing warp busy: one instruction stream.
ASYNC_ISSUE_CYCLES = 32


@dataclass(frozen=True)
class OpCost:
    """What the cost model says about one tile op.

    ``cycles`` rows of ``uses`` form the RRT; ``latency`` is when the result is usable; ``warp_busy`` is how
    long the issuing warp is occupied (``None`` = the whole op, for synchronous ops).
    """

    cycles: int
    uses: dict[str, int]
    latency: int
    warp_busy: int | None = None

    def rrt(self) -> tuple[dict[str, int], ...]:
        return tuple(dict(self.uses) for _ in range(self.cycles))


def rate_dtype(dtype: str) -> str:
    """The machine tables' name of ``dtype``'s tensor-core rate: ``"fp8"`` for an fp8 format
    (:data:`FP8_FORMATS`), else ``dtype`` itself."""
    return FP8_FORMATS.get(dtype, dtype)


def _ceil(x: float) -> int:
    return max(1, math.ceil(x))


def mma_cost(m: Machine, M: int, N: int, K: int, dtype: str = "fp16", warps: int = 4) -> OpCost:
    """Tensor-core GEMM tile ``[M,K] x [K,N]``: ``2*M*N*K / tc_flops_per_clk`` cycles on ``tc``.

    Calibrated: ``2MNK / mma_flops_per_clk[dtype][N]`` cycles on ``tc``; the result is ready after
    ``2MNK / rate`` with the rate of the issuing warp groups (one group for a 4-warp op, the SM's best for
    wider ones) plus the pipeline fill of one K=64 instruction group (``mma_group_latency`` minus its own
    issue time). An fp8 format (``fp8e4m3``, ``fp8e5m2``) is priced at the ``fp8`` rate (:func:`rate_dtype`)."""
    dtype = rate_dtype(dtype)
    try:
        rate = m.tc_flops_per_clk[dtype]
    except KeyError:
        raise UnsupportedFeatureError(f"no tensor-core rate for dtype {dtype!r} on {m.name}") from None
    work = 2 * M * N * K
    cal = m.calibration
    best = cal.mma_rate(dtype, N) if cal is not None else None
    if best is None:
        c = _ceil(work / rate)
        return OpCost(c, {"tc": 1}, c, warp_busy=ASYNC_ISSUE_CYCLES)
    own = best if warps > 4 else cal.mma_rate(dtype, N, one_group=True)
    n = min(N, 256)
    group_work = 2 * 64 * n * 64
    fill = max(0.0, lookup_n(cal.mma_group_latency, n) - group_work / cal.mma_rate("fp16", n, one_group=True))
    return OpCost(_ceil(work / best), {"tc": 1}, _ceil(work / own + fill), warp_busy=ASYNC_ISSUE_CYCLES)


def _shared_unit_cost(unit: str, work: float, best: float, own: float, warps: int) -> OpCost:
    """A synchronous op on a unit shared by warp groups: it holds ``unit`` for ``work / best`` cycles and its
    warp group for ``work / own`` (``own`` = the rate one 4-warp group reaches; wider ops reach ``best``)."""
    busy = _ceil(work / (best if warps > 4 else min(own, best)))
    return OpCost(_ceil(work / best), {unit: 1}, busy, warp_busy=busy)


def exp2_cost(m: Machine, elements: int, warps: int = 4) -> OpCost:
    """``exp2`` over a tile: ``elements / mufu_ex2_per_clk`` cycles on ``mufu`` (calibrated: the measured
    ``ex2_per_clk``, and ``ex2_per_clk_one_group`` for the issuing group)."""
    cal = m.calibration
    if cal is not None:
        return _shared_unit_cost("mufu", elements, cal.ex2_per_clk, cal.ex2_per_clk_one_group, warps)
    c = _ceil(elements / m.mufu_ex2_per_clk)
    return OpCost(c, {"mufu": 1}, c)


def alu_cost(m: Machine, elements: int, ops_per_element: float = 1.0, warps: int = 4) -> OpCost:
    """Elementwise FP32 arithmetic: ``elements * ops / fma_per_clk`` cycles on ``alu`` (calibrated: the
    measured ``fma_per_clk`` and ``fma_per_clk_one_group``)."""
    cal = m.calibration
    if cal is not None:
        return _shared_unit_cost("alu", elements * ops_per_element, cal.fma_per_clk, cal.fma_per_clk_one_group,
                                 warps)
    c = _ceil(elements * ops_per_element / m.fma_per_clk)
    return OpCost(c, {"alu": 1}, c)


def reduce_cost(m: Machine, rows: int, cols: int) -> OpCost:
    """Row reduction (max/sum) of a ``rows x cols`` tile: one op per element plus a log2 shuffle tree per row.

    Calibrated: the measured row max/sum rate less the broadcast FMA the microbenchmark pairs it with,
    ``1 / (1/rowmax_per_clk - 1/fma_per_clk)`` elements per clock (the slower of max and sum)."""
    cal = m.calibration
    if cal is not None:
        per_element = 1 / min(cal.rowmax_per_clk, cal.rowsum_per_clk) - 1 / cal.fma_per_clk
        rate = 1 / per_element if per_element > 0 else min(cal.rowmax_per_clk, cal.rowsum_per_clk)
        c = _ceil(rows * cols / rate)
        return OpCost(c, {"alu": 1}, c)
    c = _ceil((rows * cols + rows * 5 * 32) / m.fma_per_clk)
    return OpCost(c, {"alu": 1}, c)


def tma_load_cost(m: Machine, nbytes: int) -> OpCost:
    """A TMA tile load. It is variable-latency and, with no incoming dependence, *streaming*: the solver
    gives it zero latency (paper §5.3); it holds the TMA engine for one issue cycle."""
    return OpCost(1, {"tma": 1}, 0, warp_busy=1)


def _tma_out_cost(nbytes: int, bytes_per_clk: float) -> OpCost:
    """A TMA transfer out of shared memory at ``bytes_per_clk``: holds ``tma`` for its bytes, the issuing
    warp only for the issue."""
    c = _ceil(nbytes / bytes_per_clk)
    return OpCost(c, {"tma": 1}, c, warp_busy=ASYNC_ISSUE_CYCLES)


def tma_store_cost(m: Machine, nbytes: int) -> OpCost:
    """A TMA tile store: bytes over the per-SM share of DRAM bandwidth, on ``tma``."""
    return _tma_out_cost(nbytes, m.dram_bytes_per_s / (m.sms * m.clock_ghz * 1e9))


def tma_reduce_cost(m: Machine, nbytes: int) -> OpCost:
    """A TMA reduce-add of a shared tile into global memory, on ``tma``: the calibrated reduce-add rate
    (``Calibration.tma_reduce_bytes_per_clk``: tiles of many SMs added into the same L2-resident rows) when
    the machine has one, else priced as a store (:func:`tma_store_cost`)."""
    rate = m.calibration.tma_reduce_bytes_per_clk if m.calibration is not None else None
    return tma_store_cost(m, nbytes) if rate is None else _tma_out_cost(nbytes, rate)


def smem_bytes_per_clk(m: Machine) -> float:
    """Register <-> shared-memory bytes per clock: measured when calibrated, else the datasheet's."""
    return m.calibration.smem_bytes_per_clk if m.calibration is not None else m.smem_bytes_per_clk


def smem_cost(m: Machine, nbytes: int) -> OpCost:
    """A register <-> shared-memory transfer of ``nbytes`` on the ``smem`` pipe."""
    c = _ceil(nbytes / smem_bytes_per_clk(m))
    return OpCost(c, {"smem": 1}, c)


def tmem_cost(m: Machine, nbytes: int) -> OpCost:
    """A register <-> tensor-memory transfer (tcgen05.ld/st) of ``nbytes`` on the ``tmem`` path."""
    if not m.tmem_bytes_per_clk:
        raise UnsupportedFeatureError(f"{m.name} has no tensor memory")
    c = _ceil(nbytes / m.tmem_bytes_per_clk)
    return OpCost(c, {"tmem": 1}, c)


def regs_per_thread(rows: int, cols: int, dtype: str, warps: int) -> int:
    """32-bit registers per thread for a ``rows x cols`` tile of ``dtype`` spread over ``warps`` warps."""
    nbytes = rows * cols * DTYPE_BYTES[dtype]
    return math.ceil(nbytes / 4 / (32 * warps))


def handoff_cycles(m: Machine) -> int:
    """Cycles of one mbarrier hand-off between partitions: measured when calibrated, else the estimate."""
    return round(m.calibration.barrier_handoff_cycles) if m.calibration is not None else BARRIER_HANDOFF_CYCLES


def spill_cost(m: Machine, nbytes: int) -> int:
    """Extra delay of moving a register value of ``nbytes`` to another warp group (paper ``spillcost(u)``):
    a shared-memory store and load (``2 * nbytes / smem_bytes_per_clk``) plus one barrier hand-off."""
    return 2 * _ceil(nbytes / smem_bytes_per_clk(m)) + handoff_cycles(m)
