"""Machine descriptions of the GPUs Twill targets: one SM of an H100 SXM, an H200 and a B200.

Twill models a single SM (paper §1.4): tile operations occupy SM-wide functional units for a number of
cycles. Every unit here has capacity 1 at tile granularity; an op's RRT says for how many cycles it holds the
unit, which is its work divided by the unit's per-SM rate.

Sources (cited per field below):
  [H100-WP]  NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), tables 1-3.
  [H100-DS]  NVIDIA H100 datasheet: SXM5 989.4 TFLOP/s dense FP16/BF16, 1979 TFLOP/s dense FP8, 3.35 TB/s.
  [H200-DS]  NVIDIA H200 datasheet: same GH100 SM and clocks as H100 SXM, 141 GB HBM3e, 4.8 TB/s.
  [B200-DS]  NVIDIA HGX B200 datasheet: 2.25 PFLOP/s dense FP16/BF16, 4.5 PFLOP/s dense FP8 per GPU, 8 TB/s.
  [CUDA-PG]  CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table and "Compute
             Capabilities" table (cc 9.0 and 10.0): 64 K 32-bit registers per SM, 255 per thread, 64 warps
             per SM, 4 warp schedulers, 227 KB shared memory per block (228 KB per SM), 16 results/clk/SM for
             ex2 (MUFU), 128 results/clk/SM for FP32 FMA.
  [PTX-ISA]  PTX ISA 8.x, ``setmaxnreg``: register count in [24, 256], a multiple of 8.
  [TCGEN05]  PTX ISA 8.7, Tensor Memory: 128 lanes x 512 columns of 32-bit cells per CTA (256 KB) on sm_100.
  [ANCHOR]   Our derivation: 989.4e12 / (132 SMs x 1.83 GHz) = 4096
             FP16 FLOP/clk/SM, so a 128x128x128 GEMM takes 1024 clk on H100, as the paper's "≈ 1000".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from twill.errors import MachineError

#: Cycles of the mbarrier hand-off that a cross-warp transfer pays on top of the data movement: the
#: producer's ``mbarrier.arrive`` becomes visible to the consumer's ``try_wait`` loop. An estimate (no
#: public figure): a few shared-memory round trips of ~30 clk each, the shared-memory load latency that the
#: CUDA C++ Best Practices Guide calls "roughly 100x lower than global memory" (global ~ 500 clk).
BARRIER_HANDOFF_CYCLES = 64

#: Functional units every machine model defines (tile granularity, capacity 1 each).
#: tc = tensor core; tma = bulk-copy engine; mufu = special-function unit (ex2); alu = FP32 FMA/ALU pipe;
#: smem = shared-memory load/store pipe; tmem = tensor-memory load/store path (Blackwell only).
UNIT_DOC = {
    "tc": "tensor core (wgmma / tcgen05)",
    "tma": "tensor memory accelerator (bulk global<->shared copies)",
    "mufu": "special-function unit (ex2, rcp)",
    "alu": "FP32 FMA/ALU pipe",
    "smem": "shared-memory load/store pipe",
    "tmem": "tensor-memory load/store path",
}


@dataclass(frozen=True, kw_only=True)
class Machine:
    """One SM of a GPU, as Twill models it.

    Attributes:
        name: short name used on the command line (``h100``).
        full_name: marketing name.
        arch: compute capability as a Triton target string (``sm_90``).
        capability: compute capability as an integer (90, 100).
        sms: number of SMs (for TFLOP/s arithmetic only; the model is one SM).
        clock_ghz: SM clock used to turn per-SM rates into peak numbers.
        units: functional unit -> capacity (instances) at tile granularity.
        tc_flops_per_clk: dense tensor-core FLOP per clock per SM, by operand dtype.
        mufu_ex2_per_clk: ex2 results per clock per SM.
        fma_per_clk: FP32 FMA results per clock per SM.
        smem_bytes_per_clk: shared-memory bandwidth per SM (bytes/clk).
        tmem_bytes_per_clk: tensor-memory load/store bandwidth per SM (bytes/clk); 0 if no TMEM.
        dram_bytes_per_s: device memory bandwidth.
        regs_per_sm: 32-bit registers per SM.
        max_regs_per_thread: per-thread register cap.
        setmaxnreg_min / setmaxnreg_max / setmaxnreg_step: legal ``setmaxnreg`` values.
        max_warps_per_sm: resident warps per SM.
        max_warps_per_cta: warps per thread block (1024 threads).
        warp_schedulers: instructions issued per clock (4 execution contexts).
        smem_per_block: opt-in dynamic shared memory per block (bytes).
        smem_per_sm: shared memory per SM (bytes).
        tmem_bytes: tensor memory per SM (bytes); 0 if none.
        mma_accumulates_in: ``"registers"`` (wgmma) or ``"tmem"`` (tcgen05).
        sustained_clock_ghz: SM clock the GPU holds under sustained tensor-core load (power-capped parts run
            below ``clock_ghz``); used to turn cycles into time. ``None`` = ``clock_ghz``.
        clock_model: the power-capped clock as a function of the tensor-core duty ``u`` (tensor-core busy
            cycles over all cycles, averaged over the SMs): ``1 / f = ns_per_clk + ns_per_tensor_clk · u``
            nanoseconds per cycle, at most ``clock_ghz`` (:meth:`clock_at`). Fitted by ``twill calibrate
            --clock-fit`` from the clocks generated kernels measured on themselves; ``None`` = one clock,
            ``sustained_clock_ghz``, for every kernel.
        launch_us: fixed cost of one kernel launch in microseconds (launch latency plus the grid's ramp-up),
            added once per launch when cycles are turned into time.
        model: where the rates come from: ``"datasheet"`` for the built-in models, else the name of the
            ``twill-machine/1`` file's model (``name`` stays the built-in machine it refines, e.g. ``h200``).
        calibration: rates measured by ``twill calibrate`` (:class:`~twill.machine.calibration.Calibration`);
            the cost model prefers them to the datasheet rates above. ``None`` = datasheet only.
    """

    name: str
    full_name: str
    arch: str
    capability: int
    sms: int
    clock_ghz: float
    units: Mapping[str, int]
    tc_flops_per_clk: Mapping[str, int]
    mufu_ex2_per_clk: int
    fma_per_clk: int
    smem_bytes_per_clk: int
    tmem_bytes_per_clk: int
    dram_bytes_per_s: float
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    setmaxnreg_min: int = 24
    setmaxnreg_max: int = 256
    setmaxnreg_step: int = 8
    max_warps_per_sm: int = 64
    max_warps_per_cta: int = 32
    warp_schedulers: int = 4
    smem_per_block: int = 232448
    smem_per_sm: int = 233472
    tmem_bytes: int = 0
    mma_accumulates_in: str = "registers"
    sustained_clock_ghz: float | None = None
    launch_us: float = 4.0
    clock_model: Mapping[str, float] | None = None
    model: str = "datasheet"
    calibration: Any = None
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "units", MappingProxyType(dict(self.units)))
        object.__setattr__(self, "tc_flops_per_clk", MappingProxyType(dict(self.tc_flops_per_clk)))
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))

    def peak_tflops(self, dtype: str = "fp16") -> float:
        """Dense tensor-core peak of the whole GPU in TFLOP/s."""
        return self.tc_flops_per_clk[dtype] * self.sms * self.clock_ghz * 1e9 / 1e12

    @property
    def time_clock_ghz(self) -> float:
        """The clock that turns cycles into time: the sustained clock when known, else the nominal one."""
        return self.sustained_clock_ghz or self.clock_ghz

    def clock_at(self, tensor_duty: float) -> float:
        """The SM clock (GHz) a kernel runs at whose tensor core is busy ``tensor_duty`` (0..1) of its cycles:
        under the power cap each cycle costs ``ns_per_clk + ns_per_tensor_clk · duty`` nanoseconds, and the
        clock never exceeds ``clock_ghz``. Without a clock model: :attr:`time_clock_ghz`."""
        if not self.clock_model:
            return self.time_clock_ghz
        duty = min(max(tensor_duty, 0.0), 1.0)
        ns = self.clock_model["ns_per_clk"] + self.clock_model["ns_per_tensor_clk"] * duty
        return min(self.clock_ghz, 1.0 / ns)

    def reserved_regs(self, attrs: Mapping[str, Any]) -> int:
        """Registers per thread that REGISTER LIMIT keeps out of a group's budget for the bookkeeping every warp
        does (addresses, loop counters, barrier phases): the loop graph's ``reserved_regs`` attribute, else
        ``setmaxnreg_min``, the budget a producer warp runs on (docs/model.md, "Registers")."""
        return int(attrs.get("reserved_regs", self.setmaxnreg_min))

    def round_regs(self, regs: int) -> int:
        """Round a per-thread register count up to a legal ``setmaxnreg`` value."""
        step = self.setmaxnreg_step
        r = max(self.setmaxnreg_min, -(-regs // step) * step)
        return min(r, self.setmaxnreg_max)


H100 = Machine(
    name="h100", full_name="NVIDIA H100 SXM5 80GB", arch="sm_90", capability=90,
    sms=132,                       # [H100-WP] table 1: 132 SMs on SXM5
    clock_ghz=1.83,                # [ANCHOR] clock implied by the 989.4 TFLOP/s dense FP16 figure
    units={"tc": 1, "tma": 1, "mufu": 1, "alu": 1, "smem": 1},
    # [H100-DS] / [ANCHOR]; dense INT8 1979 TOPS = the fp8 rate
    tc_flops_per_clk={"fp16": 4096, "bf16": 4096, "fp8": 8192, "i8": 8192, "tf32": 2048},
    mufu_ex2_per_clk=16,           # [CUDA-PG] cc 9.0: 16 ex2 per clk per SM
    fma_per_clk=128,               # [CUDA-PG] cc 9.0: 128 FP32 FMA per clk per SM
    smem_bytes_per_clk=128,        # [H100-WP] 32 banks x 4 B per clk per SM
    tmem_bytes_per_clk=0,
    dram_bytes_per_s=3.35e12,      # [H100-DS]
    smem_per_block=232448,         # [CUDA-PG] 227 KB opt-in per block
    smem_per_sm=233472,            # [CUDA-PG] 228 KB per SM
)

H200 = Machine(
    name="h200", full_name="NVIDIA H200 SXM 141GB", arch="sm_90", capability=90,
    sms=132, clock_ghz=1.83,       # [H200-DS] same GH100 die and SM configuration as H100 SXM
    units={"tc": 1, "tma": 1, "mufu": 1, "alu": 1, "smem": 1},
    tc_flops_per_clk={"fp16": 4096, "bf16": 4096, "fp8": 8192, "i8": 8192, "tf32": 2048},
    mufu_ex2_per_clk=16, fma_per_clk=128, smem_bytes_per_clk=128, tmem_bytes_per_clk=0,
    dram_bytes_per_s=4.8e12,       # [H200-DS]
)

B200 = Machine(
    name="b200", full_name="NVIDIA B200 180GB", arch="sm_100", capability=100,
    sms=148,                       # [B200-DS] 148 SMs
    clock_ghz=1.86,                # [B200-DS] 2.25 PFLOP/s / (148 SMs x 8192 FLOP/clk)
    units={"tc": 1, "tma": 1, "mufu": 1, "alu": 1, "smem": 1, "tmem": 1},
    # [B200-DS] 2x H100 per SM; dense INT8 4.5 POPS = the fp8 rate
    tc_flops_per_clk={"fp16": 8192, "bf16": 8192, "fp8": 16384, "i8": 16384, "tf32": 4096},
    mufu_ex2_per_clk=16,           # [CUDA-PG] cc 10.0: 16 ex2 per clk per SM (unchanged from Hopper)
    fma_per_clk=128,               # [CUDA-PG] cc 10.0
    smem_bytes_per_clk=128,
    tmem_bytes_per_clk=512,        # [TCGEN05] tcgen05.ld 32x32b: 4 warps x 32 lanes x 32 bit per clk (estimate)
    dram_bytes_per_s=8.0e12,       # [B200-DS]
    smem_per_block=232448, smem_per_sm=233472,
    tmem_bytes=128 * 512 * 4,      # [TCGEN05] 128 lanes x 512 columns x 4 B
    mma_accumulates_in="tmem",
)

MACHINES: dict[str, Machine] = {m.name: m for m in (H100, H200, B200)}


def get_machine(name: str) -> Machine:
    """Look up a machine by name (``h100``, ``h200``, ``b200``), case-insensitively."""
    try:
        return MACHINES[name.lower()]
    except KeyError:
        raise MachineError(f"unknown architecture {name!r} (known: {', '.join(MACHINES)})") from None
