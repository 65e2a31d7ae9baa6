"""Calibrated machine models: the ``twill-machine/1`` file that ``twill calibrate`` writes and ``--machine``
reads.

A file names a built-in machine as its ``base`` (``h100``, ``h200``) and carries what the microbenchmarks of
:mod:`twill.machine.microbench` measured on a real GPU of that kind (:class:`Calibration`): sustained rates per
SM in *cycles*, so they do not depend on the clock, plus the sustained clock and the launch cost that turn
cycles into time. The cost model (:mod:`twill.machine.costs`) uses a machine's calibration wherever one is
present and the datasheet rates otherwise. Format (every rate per SM; see docs/machine-format.md)::

    {"format": "twill-machine/1", "name": "h200-calibrated", "base": "h200",
     "gpu": "NVIDIA H200", "measured": "2026-12-01T12:00:00Z", "software": {...},
     "sustained_clock_ghz": 1.76, "launch_us": 2.9,
     "clock_model": {"ns_per_clk": 0.43, "ns_per_tensor_clk": 0.37, "fitted_on": "..."},   # optional
     "calibration": {"mma_flops_per_clk": {"fp16": {"64": 3500.0, "128": ..., "256": ...}, "bf16": {...}},
                     "mma_flops_per_clk_one_group": {...}, "mma_group_latency": {"64": 140.0, ...},
                     "ex2_per_clk": 15.8, "ex2_per_clk_one_group": 15.1, "fma_per_clk": 120.3,
                     "fma_per_clk_one_group": ..., "rowmax_per_clk": ..., "rowsum_per_clk": ...,
                     "smem_bytes_per_clk": ..., "barrier_handoff_cycles": ..., "tma_latency_cycles": ...,
                     "tma_bytes_per_clk": ..., "tma_l2_latency_cycles": ..., "tma_l2_bytes_per_clk": ...}}
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Mapping

from twill.errors import FormatError
from twill.files import read_json_file
from twill.machine.models import BARRIER_HANDOFF_CYCLES, MACHINES

MACHINE_FORMAT = "twill-machine/1"


#: The SM clocks (GHz) a machine file may give (``sustained_clock_ghz``, and the clock model's at every duty).
CLOCK_GHZ_RANGE = (0.1, 10.0)
#: The launch costs (microseconds) a machine file may give.
LAUNCH_US_RANGE = (0.001, 1000.0)
#: A measured per-clock rate lies between these multiples of its datasheet reference (:func:`rate_references`).
RATE_FACTOR_RANGE = (0.001, 4.0)
#: The cycle counts (latencies, hand-offs, measured steps and iterations) a machine file may give.
CYCLES_RANGE = (1.0, 1e6)
#: The instruction widths N of wgmma / tcgen05 (``m64nNk16``): multiples of 8 up to 256.
INSTRUCTION_NS = range(8, 257, 8)
#: The sizes in a step-table key (groups, query rows, keys, head dimension) are at most this.
MAX_STEP_SIZE = 4096


def _positive(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise FormatError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def check_range(where: str, value: float, low: float, high: float, unit: str, why: str = "") -> float:
    """``value`` when it lies in ``[low, high]``, else a :class:`FormatError` naming ``where`` and the range."""
    if not low <= value <= high:
        raise FormatError(f"{where} must be between {low:g} and {high:g} {unit}{f' ({why})' if why else ''}, "
                          f"got {value!r}")
    return value


def _instruction_n(where: str, key: Any) -> int:
    """A rate table's key: an instruction width N in :data:`INSTRUCTION_NS` (``"64"`` or 64)."""
    text = str(key) if isinstance(key, int) and not isinstance(key, bool) else key
    if not isinstance(text, str) or not re.fullmatch(r"[0-9]{1,3}", text) or int(text) not in INSTRUCTION_NS:
        raise FormatError(f"{where}: key {key!r} is not an instruction N (a multiple of 8 from 8 to 256)")
    return int(text)


def _rate_table(where: str, value: Any) -> Mapping[int, float]:
    """``{"64": rate, ...}`` -> ``{64: rate, ...}`` (instruction N -> rate)."""
    if not isinstance(value, Mapping) or not value:
        raise FormatError(f"{where} must be a non-empty object of instruction N -> rate")
    out = {}
    for key, rate in value.items():
        out[_instruction_n(where, key)] = _positive(f"{where}[{key}]", rate)
    return MappingProxyType(dict(sorted(out.items())))


def _step_table(where: str, value: Any) -> Mapping[str, float]:
    """``{"2x128x128": cycles, ...}`` validated (keys of :func:`softmax_key` or :func:`backward_key`)."""
    sizes = ("query rows x keys x head dimension (e.g. '64x128x64')" if where.endswith("backward_iteration_cycles")
             else "groups x keys x head dimension (e.g. '2x128x128')")
    if not isinstance(value, Mapping) or not value:
        raise FormatError(f"{where} must be a non-empty object of {sizes.split(' (')[0]} -> cycles")
    out = {}
    for key, cycles in value.items():
        parts = key.split("x") if isinstance(key, str) else []
        if len(parts) != 3 or not all(re.fullmatch(r"[1-9][0-9]{0,3}", p) and int(p) <= MAX_STEP_SIZE
                                      for p in parts):
            raise FormatError(f"{where}: key {key!r} is not {sizes}, each at most {MAX_STEP_SIZE}")
        out[str(key)] = _positive(f"{where}[{key}]", cycles)
    return MappingProxyType(dict(sorted(out.items())))


def lookup_n(table: Mapping[int, float], n: int) -> float:
    """The rate of the widest measured instruction N not above ``n`` (the narrowest when ``n`` is below all)."""
    below = [k for k in table if k <= n]
    return table[max(below)] if below else table[min(table)]


#: Calibration fields a machine file may leave out (measured by later versions of ``twill calibrate``).
OPTIONAL_FIELDS = frozenset({"tma_sm_bytes_per_clk", "tma_reduce_bytes_per_clk", "softmax_step_cycles",
                             "attention_iteration_cycles", "backward_iteration_cycles"})
#: Calibration fields keyed by three sizes: :func:`softmax_key` (groups x keys x head dimension -> cycles), and
#: :func:`backward_key` (query rows x keys x head dimension) for ``backward_iteration_cycles``.
STEP_TABLES = ("softmax_step_cycles", "attention_iteration_cycles", "backward_iteration_cycles")


def softmax_key(groups: int, block_n: int, head_dim: int) -> str:
    """The key of one measured online-softmax step: ``"2x128x128"`` (groups x keys x head dimension)."""
    return f"{groups}x{block_n}x{head_dim}"


def backward_key(block_m: int, block_n: int, head_dim: int) -> str:
    """The key of one measured attention-backward iteration: ``"64x128x64"`` (query rows x keys x head
    dimension)."""
    return f"{block_m}x{block_n}x{head_dim}"


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Rates measured on a GPU by ``twill calibrate``, per SM, in units per clock (clock-independent).

    Attributes:
        mma_flops_per_clk: dtype -> wgmma instruction N -> dense FLOP per clock per SM, the best over 1-3
            issuing warp groups (what the tensor core sustains; an MMA op holds it for work / this rate).
        mma_flops_per_clk_one_group: the same with one warp group issuing (an op issued by one warp group
            finishes no sooner than work / this rate).
        mma_group_latency: wgmma instruction N -> cycles from issuing one K=64 group of ``m64nNk16`` (fp16)
            to its ``wgmma.wait_group 0`` returning, one warp group.
        ex2_per_clk / ex2_per_clk_one_group: ``exp2`` results per clock, best over 1-3 warp groups / one group.
        fma_per_clk / fma_per_clk_one_group: FP32 FMA results per clock on an accumulator-layout tile.
        rowmax_per_clk / rowsum_per_clk: elements per clock of a row max / row sum (with the broadcast FMA
            that uses it) over a 64 x 128 accumulator tile per warp group, best over 1-3 groups.
        smem_bytes_per_clk: bytes per clock of fp16 register <-> shared-memory round trips (store + load).
        barrier_handoff_cycles: cycles for an mbarrier arrive in one partition to release a wait in another.
        tma_latency_cycles: cycles per 128x64 fp16 TMA tile load from DRAM with one load in flight per SM and
            every SM loading (the loaded latency a ring must cover).
        tma_bytes_per_clk: bytes per clock per SM of TMA tile loads streaming from DRAM with every SM loading.
        tma_l2_latency_cycles / tma_l2_bytes_per_clk: the same for tiles that every SM reads from one
            L2-resident set of 16 MiB (operand tiles shared by the CTAs of a wave).
        tma_sm_bytes_per_clk: bytes per clock one SM's TMA loads received when every SM reads from one
            L2-resident MiB, best over the ring depths measured: the ceiling on what one SM takes in when the
            CTAs of a wave read the same tiles together (a lower bound on the SM's own port; the L2 delivers
            each tile once to many readers). Optional: without it the prediction prices every tile an SM
            loads at ``tma_l2_bytes_per_clk``, shared or not.
        tma_reduce_bytes_per_clk: bytes per clock per SM of fp32 TMA reduce-adds from shared memory, every SM
            adding, 32 CTAs at a time into the same L2-resident rows (the attention backward's dQ), counted
            until the TMA has read each tile (when its staging buffer may be reused). Optional: machine files
            written before it was measured lack it, and TMA reduce-adds are then priced as stores.
        softmax_step_cycles: :func:`softmax_key` -> cycles one warp group takes for one online-softmax step of
            the attention forward (row max, alpha, exp, row sum, ``O *= alpha``, P converted to the wgmma
            operand) on its 64 query rows while its ``O += P V`` wgmma is in flight and ``groups`` warp
            groups run the same step at once (the contention inside the kernel). Optional, like
            ``tma_reduce_bytes_per_clk``; without it the prediction has no per-group chain bound.
        attention_iteration_cycles: :func:`softmax_key` -> cycles per loop iteration of each of ``groups``
            compute warp groups running the attention forward's whole compute side at once, tensor-core turns
            included: wait for the turn, issue ``S = Q K^T`` and ``O += P V``, pass the turn on, the online
            softmax with ``O += P V`` in flight, the rescale, and the ring waits and releases, with K/V
            resident in shared memory (so no load ever waits). Optional, and a diagnostic: the prediction
            does not use it (docs/calibration.md says why: on the kernels measured it ranks the tiles the
            wrong way round, so the gap is in the kernels' own instruction stream, not in this mechanism).
        backward_iteration_cycles: :func:`backward_key` -> cycles per loop iteration of the attention
            backward's compute side as the generator emits it in FA3's order (one 8-warp partition: S and dP
            issued and retired, P, dS, their fp16 operands, dS stored behind a barrier, dV, dK and dQ issued and
            retired, dQ staged behind a barrier, the ring waits and releases) with Q, dO, K and V resident in
            shared memory. Optional: the attention backward's chain bound in the prediction
            (``chain`` in twill/kernels/flash_bwd/tune.py); without it, or for a tile it lacks, there is none.
    """

    mma_flops_per_clk: Mapping[str, Mapping[int, float]]
    mma_flops_per_clk_one_group: Mapping[str, Mapping[int, float]]
    mma_group_latency: Mapping[int, float]
    ex2_per_clk: float
    ex2_per_clk_one_group: float
    fma_per_clk: float
    fma_per_clk_one_group: float
    rowmax_per_clk: float
    rowsum_per_clk: float
    smem_bytes_per_clk: float
    barrier_handoff_cycles: float
    tma_latency_cycles: float
    tma_bytes_per_clk: float
    tma_l2_latency_cycles: float
    tma_l2_bytes_per_clk: float
    tma_sm_bytes_per_clk: float | None = None
    tma_reduce_bytes_per_clk: float | None = None
    softmax_step_cycles: Mapping[str, float] | None = None
    attention_iteration_cycles: Mapping[str, float] | None = None
    backward_iteration_cycles: Mapping[str, float] | None = None

    def mma_rate(self, dtype: str, n: int, *, one_group: bool = False) -> float | None:
        """FLOP per clock for a ``dtype`` wgmma of width ``n``, or None when ``dtype`` was not measured."""
        table = (self.mma_flops_per_clk_one_group if one_group else self.mma_flops_per_clk).get(dtype)
        return None if table is None else lookup_n(table, min(n, 256))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("mma_flops_per_clk", "mma_flops_per_clk_one_group"):
                value = {dt: {str(n): r for n, r in t.items()} for dt, t in value.items()}
            elif f.name in ("mma_group_latency", *STEP_TABLES) and value is not None:
                value = {str(n): r for n, r in value.items()}
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "calibration") -> "Calibration":
        if not isinstance(data, Mapping):
            raise FormatError(f"{where} must be an object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise FormatError(f"{where}: unknown field {unknown[0]!r}")
        missing = sorted(names - set(data) - OPTIONAL_FIELDS)
        if missing:
            raise FormatError(f"{where}: missing field {missing[0]!r}")
        kwargs: dict[str, Any] = {}
        for name in names & set(data):
            value = data[name]
            if name in ("mma_flops_per_clk", "mma_flops_per_clk_one_group"):
                if not isinstance(value, Mapping) or not value:
                    raise FormatError(f"{where}.{name} must be a non-empty object of dtype -> rates")
                kwargs[name] = MappingProxyType({str(dt): _rate_table(f"{where}.{name}.{dt}", t)
                                                 for dt, t in value.items()})
            elif name == "mma_group_latency":
                kwargs[name] = _rate_table(f"{where}.{name}", value)
            elif name in STEP_TABLES:
                kwargs[name] = _step_table(f"{where}.{name}", value)
            else:
                kwargs[name] = _positive(f"{where}.{name}", value)
        return cls(**kwargs)


def rate_references(base: Any) -> dict[str, tuple[float, str]]:
    """Calibration field -> (the ``base`` machine's datasheet rate it is checked against, that rate's name):
    MUFU and FP32 rates against theirs, row reductions against the FP32 pipe they run on, and shared-memory and
    TMA bytes per clock against the shared-memory bandwidth (every TMA byte lands in or leaves shared memory)."""
    smem = (base.smem_bytes_per_clk, "smem_bytes_per_clk")
    return {"ex2_per_clk": (base.mufu_ex2_per_clk, "mufu_ex2_per_clk"),
            "ex2_per_clk_one_group": (base.mufu_ex2_per_clk, "mufu_ex2_per_clk"),
            **{name: (base.fma_per_clk, "fma_per_clk")
               for name in ("fma_per_clk", "fma_per_clk_one_group", "rowmax_per_clk", "rowsum_per_clk")},
            **{name: smem for name in ("smem_bytes_per_clk", "tma_bytes_per_clk", "tma_l2_bytes_per_clk",
                                       "tma_sm_bytes_per_clk", "tma_reduce_bytes_per_clk")}}


#: Calibration fields that count cycles (checked against :data:`CYCLES_RANGE`).
CYCLE_FIELDS = ("barrier_handoff_cycles", "tma_latency_cycles", "tma_l2_latency_cycles")


def _check_rate(where: str, value: float, reference: float, name: str, base: Any) -> None:
    low, high = RATE_FACTOR_RANGE
    check_range(where, value, reference * low, reference * high, "per clock",
            f"{low:g}x to {high:g}x the {base.name} datasheet's {name} {reference:g}")


def check_calibration(calibration: Calibration, base: Any, where: str = "calibration") -> None:
    """Check that ``calibration`` is a plausible measurement of the built-in machine ``base``: the two wgmma
    tables measure the same dtypes (fp16 among them, each one ``base`` has a tensor-core rate for) at the same
    instruction widths, no one-group rate exceeds the best over 1-3 groups (which includes one group), every
    per-clock rate lies within :data:`RATE_FACTOR_RANGE` of its datasheet reference and every cycle count
    within :data:`CYCLES_RANGE`. Raises a one-line :class:`FormatError` naming the first field that is not."""
    best, one = calibration.mma_flops_per_clk, calibration.mma_flops_per_clk_one_group
    if set(best) != set(one):
        raise FormatError(f"{where}.mma_flops_per_clk_one_group measures dtypes {sorted(one)}, "
                          f"mma_flops_per_clk {sorted(best)}: the two tables must measure the same")
    if "fp16" not in best:
        raise FormatError(f"{where}.mma_flops_per_clk has no 'fp16' table (the wgmma pipeline fill is priced "
                          f"from it)")
    for dtype in best:
        if dtype not in base.tc_flops_per_clk:
            raise FormatError(f"{where}.mma_flops_per_clk: dtype {dtype!r} has no tensor-core rate on "
                              f"{base.name} (known: {', '.join(base.tc_flops_per_clk)})")
        if set(best[dtype]) != set(one[dtype]):
            raise FormatError(f"{where}.mma_flops_per_clk_one_group.{dtype} measures instruction N "
                              f"{sorted(one[dtype])}, mma_flops_per_clk.{dtype} {sorted(best[dtype])}: the two "
                              f"tables must measure the same")
        reference = base.tc_flops_per_clk[dtype]
        for n, rate in best[dtype].items():
            _check_rate(f"{where}.mma_flops_per_clk.{dtype}[{n}]", rate, reference, f"{dtype} FLOP/clk", base)
            _check_rate(f"{where}.mma_flops_per_clk_one_group.{dtype}[{n}]", one[dtype][n], reference,
                        f"{dtype} FLOP/clk", base)
            if one[dtype][n] > rate:
                raise FormatError(f"{where}.mma_flops_per_clk_one_group.{dtype}[{n}] ({one[dtype][n]!r}) exceeds "
                                  f"mma_flops_per_clk.{dtype}[{n}] ({rate!r}), the best over 1-3 warp groups")
    for name, (reference, ref_name) in rate_references(base).items():
        value = getattr(calibration, name)
        if value is not None:
            _check_rate(f"{where}.{name}", value, reference, ref_name, base)
    for name in ("ex2_per_clk", "fma_per_clk"):
        if getattr(calibration, f"{name}_one_group") > getattr(calibration, name):
            raise FormatError(f"{where}.{name}_one_group ({getattr(calibration, f'{name}_one_group')!r}) exceeds "
                              f"{name} ({getattr(calibration, name)!r}), the best over 1-3 warp groups")
    low, high = CYCLES_RANGE
    counts = [(f"{where}.{name}", getattr(calibration, name)) for name in CYCLE_FIELDS]
    counts += [(f"{where}.mma_group_latency[{n}]", c) for n, c in calibration.mma_group_latency.items()]
    counts += [(f"{where}.{name}[{key}]", c) for name in STEP_TABLES
               for key, c in (getattr(calibration, name) or {}).items()]
    for field_name, cycles in counts:
        check_range(field_name, cycles, low, high, "cycles")


#: The fields of a ``clock_model`` (:attr:`~twill.machine.models.Machine.clock_model`).
CLOCK_MODEL_FIELDS = ("ns_per_clk", "ns_per_tensor_clk")


def clock_model_from_dict(data: Any, where: str) -> Mapping[str, Any]:
    """A validated ``clock_model``: positive ``ns_per_clk``, non-negative ``ns_per_tensor_clk`` and an
    optional ``fitted_on`` note (what the coefficients were fitted on)."""
    if not isinstance(data, Mapping):
        raise FormatError(f"{where} must be an object with {' and '.join(CLOCK_MODEL_FIELDS)}")
    unknown = sorted(set(data) - {*CLOCK_MODEL_FIELDS, "fitted_on"})
    if unknown:
        raise FormatError(f"{where}: unknown field {unknown[0]!r}")
    out: dict[str, Any] = {"ns_per_clk": _positive(f"{where}.ns_per_clk", data.get("ns_per_clk"))}
    tensor = data.get("ns_per_tensor_clk")
    if isinstance(tensor, bool) or tensor != 0:
        tensor = _positive(f"{where}.ns_per_tensor_clk", tensor)
    out["ns_per_tensor_clk"] = float(tensor)
    low, high = CLOCK_GHZ_RANGE
    check_range(f"{where}.ns_per_clk", out["ns_per_clk"], 1 / high, 1 / low, "ns",
            f"an idle clock of {low:g} to {high:g} GHz")
    check_range(f"{where}.ns_per_clk + ns_per_tensor_clk", out["ns_per_clk"] + out["ns_per_tensor_clk"], 1 / high,
            1 / low, "ns", f"a clock at full tensor-core duty of {low:g} to {high:g} GHz")
    if "fitted_on" in data:
        if not isinstance(data["fitted_on"], str):
            raise FormatError(f"{where}.fitted_on must be a string")
        out["fitted_on"] = data["fitted_on"]
    return MappingProxyType(out)


def machine_to_dict(machine: Any, *, gpu: str = "", measured: str = "", software: Mapping[str, str] | None = None,
                    name: str | None = None) -> dict[str, Any]:
    """The ``twill-machine/1`` document of a calibrated ``machine`` (its base is ``machine.name``)."""
    if machine.calibration is None:
        raise FormatError(f"machine {machine.name!r} has no calibration to write")
    return {"format": MACHINE_FORMAT, "name": name or machine.model, "base": machine.name,
            "gpu": gpu, "measured": measured, "software": dict(software or {}),
            "sustained_clock_ghz": machine.sustained_clock_ghz, "launch_us": machine.launch_us,
            **({"clock_model": dict(machine.clock_model)} if machine.clock_model else {}),
            "calibration": machine.calibration.to_dict()}


def machine_from_dict(data: Any, where: str = "machine file") -> Any:
    """The calibrated :class:`~twill.machine.models.Machine` a ``twill-machine/1`` document describes."""
    if not isinstance(data, Mapping):
        raise FormatError(f"{where}: not a JSON object")
    if data.get("format") != MACHINE_FORMAT:
        raise FormatError(f"{where}: format must be {MACHINE_FORMAT!r}, got {data.get('format')!r}")
    base = data.get("base")
    if base not in MACHINES:
        raise FormatError(f"{where}: base must be one of {', '.join(MACHINES)}, got {base!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"{where}: name must be a non-empty string")
    for note in ("gpu", "measured"):
        if not isinstance(data.get(note, ""), str):
            raise FormatError(f"{where}: {note} must be a string, got {data[note]!r}")
    calibration = Calibration.from_dict(data.get("calibration"), f"{where}: calibration")
    check_calibration(calibration, MACHINES[base], f"{where}: calibration")
    clock_model = (clock_model_from_dict(data["clock_model"], f"{where}: clock_model")
                   if "clock_model" in data else None)
    clock = check_range(f"{where}: sustained_clock_ghz", _positive(f"{where}: sustained_clock_ghz",
                                                                data.get("sustained_clock_ghz")),
                    *CLOCK_GHZ_RANGE, "GHz")
    launch = check_range(f"{where}: launch_us", _positive(f"{where}: launch_us", data.get("launch_us")),
                     *LAUNCH_US_RANGE, "us")
    return replace(MACHINES[base], model=name, clock_model=clock_model, sustained_clock_ghz=clock,
                   launch_us=launch, calibration=calibration,
                   notes={"gpu": data.get("gpu", ""), "measured": data.get("measured", "")})


def load_machine(path: str) -> Any:
    """Read a ``twill-machine/1`` file (the project's JSON reader: size, UTF-8 and nesting limits); any
    problem is one :class:`FormatError` line."""
    return machine_from_dict(read_json_file(path, "machine"), path)


def read_raw_calibration(path: str) -> dict:
    """The measurements recorded by ``twill calibrate --raw`` (a ``twill-calibration-raw/1`` file)."""
    raw = read_json_file(path, "raw calibration")
    if not isinstance(raw, dict) or raw.get("format") != "twill-calibration-raw/1" \
            or not isinstance(raw.get("measurements"), list):
        raise FormatError(f"{path}: not a 'twill-calibration-raw/1' file written by 'twill calibrate --raw'")
    return raw


def read_kernel_clock(path: str) -> dict:
    """A ``twill-kernel-clock/1`` file written by ``benchmarks/kernel_clock.py``: rows with each kernel's time,
    clock and FLOP count, checked."""
    doc = read_json_file(path, "kernel clock")
    rows = doc.get("rows") if isinstance(doc, dict) else None

    def valid(row: object) -> bool:
        return isinstance(row, dict) and isinstance(row.get("kernel"), str) and all(
            isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool) and row[k] > 0
            for k in ("ms", "clock_ghz", "flops"))

    if not isinstance(doc, dict) or doc.get("format") != "twill-kernel-clock/1" or not isinstance(rows, list) \
            or not all(valid(r) for r in rows):
        raise FormatError(f"{path}: not a 'twill-kernel-clock/1' file written by benchmarks/kernel_clock.py")
    return doc


def _softmax_estimate(machine: Any, groups: int, block_n: int, head_dim: int) -> float:
    """What the per-op rates say one group's softmax step takes: its row max, exp, row sum and rescale at the
    one-group rates, or at the SM's rates shared by ``groups`` when that is slower."""
    cal = machine.calibration
    n, o = 64 * block_n, 64 * head_dim
    alone = n / cal.rowmax_per_clk + n / cal.ex2_per_clk_one_group + n / cal.rowsum_per_clk + o / cal.fma_per_clk_one_group
    shared = groups * (n / cal.ex2_per_clk)
    return max(alone, shared)


def _tensor_core_cycles(machine: Any, groups: int, block_n: int, head_dim: int) -> float:
    """Cycles the tensor core needs for one iteration of ``groups`` warp groups: each group's ``S = Q K^T``
    and ``O += P V`` (2 x 2 x 64 x keys x head dimension FLOP) at the measured fp16 rate."""
    flops = groups * 2 * 2 * 64 * block_n * head_dim
    return flops / machine.calibration.mma_rate("fp16", max(block_n, head_dim))


def format_calibration(machine: Any) -> str:
    """A Markdown table of a calibrated machine's rates beside its datasheet values (per SM, per clock)."""
    cal = machine.calibration
    if cal is None:
        raise FormatError(f"machine {machine.name!r} has no calibration")
    rows = [("quantity", "measured", "datasheet / estimate")]
    for dtype, table in cal.mma_flops_per_clk.items():
        for n, rate in table.items():
            one = cal.mma_flops_per_clk_one_group[dtype].get(n)
            rows.append((f"{dtype} wgmma m64n{n}k{32 if dtype == 'fp8' else 16} FLOP/clk (1 warp group)",
                         f"{rate:.0f} ({one:.0f})" if one else f"{rate:.0f}", f"{machine.tc_flops_per_clk[dtype]}"))
    for n, cycles in cal.mma_group_latency.items():
        rows.append((f"wgmma K=64 group latency, n{n} (clk)", f"{cycles:.0f}", f"{2 * 64 * n * 64 // 4096}"))
    rows += [
        ("exp2 results/clk (1 warp group)", f"{cal.ex2_per_clk:.1f} ({cal.ex2_per_clk_one_group:.1f})",
         f"{machine.mufu_ex2_per_clk}"),
        ("FP32 FMA results/clk (1 warp group)", f"{cal.fma_per_clk:.1f} ({cal.fma_per_clk_one_group:.1f})",
         f"{machine.fma_per_clk}"),
        ("row max / row sum elements/clk (with the broadcast FMA)",
         f"{cal.rowmax_per_clk:.1f} / {cal.rowsum_per_clk:.1f}", "-"),
        ("register <-> shared memory bytes/clk", f"{cal.smem_bytes_per_clk:.1f}", f"{machine.smem_bytes_per_clk}"),
        ("mbarrier hand-off between partitions (clk)", f"{cal.barrier_handoff_cycles:.0f}",
         f"{BARRIER_HANDOFF_CYCLES} (estimate)"),
        ("TMA 16 KiB tile latency, DRAM / L2 (clk)",
         f"{cal.tma_latency_cycles:.0f} / {cal.tma_l2_latency_cycles:.0f}", "-"),
        ("TMA bytes/clk per SM, DRAM / L2", f"{cal.tma_bytes_per_clk:.1f} / {cal.tma_l2_bytes_per_clk:.1f}",
         f"{machine.dram_bytes_per_s / (machine.sms * machine.clock_ghz * 1e9):.1f} / -"),
        *([("TMA bytes/clk one SM takes in, every SM reading one hot MiB", f"{cal.tma_sm_bytes_per_clk:.1f}",
            "-")] if cal.tma_sm_bytes_per_clk else []),
        *([("TMA fp32 reduce-add bytes/clk per SM, 32 SMs into the same rows",
            f"{cal.tma_reduce_bytes_per_clk:.1f}", "priced as a store")] if cal.tma_reduce_bytes_per_clk else []),
        *[(f"online-softmax step, {g} warp group(s), N={n} D={d}, P V in flight (clk)", f"{c:.0f}",
           f"{_softmax_estimate(machine, int(g), int(n), int(d)):.0f} (sum of the rates)")
          for key, c in (cal.softmax_step_cycles or {}).items() for g, n, d in [key.split("x")]],
        *[(f"attention iteration, {g} warp group(s) taking turns, N={n} D={d} (clk)", f"{c:.0f}",
           f"{_tensor_core_cycles(machine, int(g), int(n), int(d)):.0f} (tensor core)")
          for key, c in (cal.attention_iteration_cycles or {}).items() for g, n, d in [key.split("x")]],
        *[(f"attention backward iteration, M={m} N={n} D={d}, loads resident (clk)", f"{c:.0f}",
           f"{5 * 2 * int(m) * int(n) * int(d) / machine.tc_flops_per_clk['fp16']:.0f} (tensor core)")
          for key, c in (cal.backward_iteration_cycles or {}).items() for m, n, d in [key.split("x")]],
        ("sustained SM clock under tensor-core load (GHz)", f"{machine.sustained_clock_ghz:.3f}",
         f"{machine.clock_ghz}"),
        *([("SM clock at tensor-core duty 0.4 / 0.7 / 1.0, clock model (GHz)",
            " / ".join(f"{machine.clock_at(u):.3f}" for u in (0.4, 0.7, 1.0)), f"{machine.clock_ghz}")]
          if machine.clock_model else []),
        ("launch, back to back (us)", f"{machine.launch_us:.2f}", "4.0 (estimate)"),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["| " + " | ".join(cell.ljust(width[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in width) + "|")
    return "\n".join(lines)
