"""``twill calibrate``: run the microbenchmarks of :mod:`twill.machine.microbench` on the local GPU and fit a
calibrated machine model (:class:`~twill.machine.calibration.Calibration`).

The plan (:func:`plan`) lists every measurement; :func:`run` executes it, keeping each raw result (or the
one-line reason it failed), and :func:`fit` turns the raw results into the model. Fitting is pure Python so
that it is tested on the CPU with recorded measurements.
"""

from __future__ import annotations

import datetime
import statistics
from dataclasses import replace
from typing import Any, Callable, Iterable

from twill.errors import TwillError
from twill.machine.calibration import (CLOCK_GHZ_RANGE, LAUNCH_US_RANGE, Calibration, backward_key,
                                       check_calibration, check_range, softmax_key)
from twill.machine.models import Machine, get_machine

#: wgmma instruction widths measured (``m64nNk16``).
MMA_WIDTHS = (64, 128, 256)
#: Warp groups issuing at once.
GROUPS = (1, 2, 3)
#: CTAs that add into the same dQ rows at once in the attention backward: the key blocks of one head
#: (S = 4096 over 128-key blocks).
SHARED_DQ = 32
#: Online-softmax steps measured: (4-warp groups running it at once, keys per tile, head dimension) - every
#: attention forward tile that ``twill tune`` sweeps: one to three groups, 64- and 128-key tiles at D = 64 and
#: 128; D = 256 runs 64-key tiles with one or two groups (three do not fit its registers).
SOFTMAX_STEPS = tuple((g, n, d) for d in (64, 128) for n in (64, 128) for g in (1, 2, 3)) + ((1, 64, 256),
                                                                                           (2, 64, 256))
#: Size of the L2-resident tile set the L2 rates are fitted from: about one wave's shared operand tiles.
L2_HOT_MB = 16
#: The hot set every SM reads for the ceiling on one SM's TMA intake (``tma_sm_bytes_per_clk``).
SHARED_HOT_MB = 1
#: (query rows, head dimension) of the attention-backward iterations measured (128 keys): the generated
#: backward's 64-row tiles at head dim 64 and 128, and FA3's 128-row tile at head dim 64.
BACKWARD_ITERATIONS = ((64, 64), (128, 64), (64, 128))


def plan(quick: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Every measurement as ``(microbenchmark, keyword arguments)``; ``quick`` trims widths and dtypes."""
    widths = (64, 256) if quick else MMA_WIDTHS  # arange needs powers of two: no n192
    steps: list[tuple[str, dict[str, Any]]] = []
    for dtype in ("fp16",) if quick else ("fp16", "bf16", "fp8"):   # fp8: e4m3 operands (microbench.measure_mma)
        for n in widths:
            for groups in GROUPS:
                steps.append(("mma", {"n": n, "dtype": dtype, "groups": groups, "lag": 1}))
    for n in widths:
        steps.append(("mma", {"n": n, "dtype": "fp16", "groups": 1, "lag": 0, "reps": 1024}))
    for op in ("exp2", "fma", "rowmax", "rowsum"):
        for groups in GROUPS:
            steps.append(("elementwise", {"op": op, "groups": groups}))
    for groups in (1, 2):  # one plain CTA of 4 or 8 warps (num_warps must be a power of two)
        steps.append(("smem", {"groups": groups}))
    # rates need data in flight: 4 tiles (64 KiB) over a ~1000-cycle L2 latency allow at most ~60 bytes per
    # clock, so the bandwidth rows go to 8 tiles (128 KiB), as deep as a GEMM ring keeps its loads (whether
    # the L2 or the ring limits the rate: docs/calibration.md, "Loads are not free")
    steps.append(("tma", {"depth": 1, "reps": 512}))
    for depth in (2, 4, 8):
        steps.append(("tma", {"depth": depth}))
    for hot_mb in (SHARED_HOT_MB, L2_HOT_MB):
        steps.append(("tma", {"depth": 1, "hot_mb": hot_mb, "reps": 512}))
        for depth in (4, 8):
            steps.append(("tma", {"depth": depth, "hot_mb": hot_mb}))
    for block_n in (64, 128):  # the attention backward's dQ tiles at D = 64 and 128
        steps.append(("tma_reduce", {"block_n": block_n, "share": 1}))
        for depth in (1, 2):
            steps.append(("tma_reduce", {"block_n": block_n, "share": SHARED_DQ, "depth": depth}))
        steps.append(("tma_reduce", {"block_n": block_n, "share": SHARED_DQ, "stagger": True}))
    for groups, block_n, head_dim in SOFTMAX_STEPS:
        for pv in (True, False):
            steps.append(("softmax", {"groups": groups, "block_n": block_n, "head_dim": head_dim, "pv": pv}))
        steps.append(("attention_iteration", {"groups": groups, "block_n": block_n, "head_dim": head_dim}))
    for block_m, head_dim in BACKWARD_ITERATIONS:
        steps.append(("bwd_iteration", {"block_m": block_m, "head_dim": head_dim}))
    steps.append(("handoff", {"worker_warps": 4}))
    steps.append(("handoff", {"worker_warps": 1}))
    steps.append(("launch", {}))
    steps.append(("clock", {}))
    return steps


def run(steps: Iterable[tuple[str, dict[str, Any]]],
        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Execute ``steps`` on the local GPU. Each row: ``bench``, ``args``, and ``result`` or ``error``."""
    from twill.machine import microbench

    functions = {"mma": microbench.measure_mma, "elementwise": microbench.measure_elementwise,
                 "smem": microbench.measure_smem, "tma": microbench.measure_tma,
                 "tma_reduce": microbench.measure_tma_reduce, "softmax": microbench.measure_softmax,
                 "attention_iteration": microbench.measure_attention_iteration,
                 "bwd_iteration": microbench.measure_bwd_iteration,
                 "handoff": microbench.measure_handoff, "launch": microbench.measure_launch,
                 "clock": microbench.measure_clock}
    steps = list(steps)
    rows = []
    for i, (bench, kwargs) in enumerate(steps, 1):
        row: dict[str, Any] = {"bench": bench, "args": kwargs}
        try:
            row["result"] = functions[bench](**kwargs)
        except Exception as exc:  # a failing microbenchmark is recorded, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(row)
        if progress:
            shown = row.get("error") or _summary(bench, row["result"])
            progress(f"[{i}/{len(steps)}] {bench} {kwargs}: {shown}")
    return rows


def _summary(bench: str, result: dict[str, Any]) -> str:
    keys = {"mma": ("flops_per_clk", "cycles_per_group", "clock_ghz"), "elementwise": ("elements_per_clk",),
            "smem": ("bytes_per_clk",), "tma": ("bytes_per_clk", "cycles_per_tile"),
            "tma_reduce": ("cycles_per_tile", "bytes_per_clk"), "softmax": ("cycles_per_step",),
            "attention_iteration": ("cycles_per_iteration",), "bwd_iteration": ("cycles_per_iteration",),
            "handoff": ("cycles_per_handoff",), "launch": ("launch_us",), "clock": ("clock_ghz", "wgmma_clock_ghz", "gemm_tflops")}[bench]
    return ", ".join(f"{k} {result[k]:.4g}" for k in keys)


def _results(rows: list[dict[str, Any]], bench: str, **match: Any) -> list[dict[str, Any]]:
    return [r["result"] for r in rows if r["bench"] == bench and "result" in r
            and all(r["args"].get(k, _DEFAULTS.get((bench, k))) == v for k, v in match.items())]


#: Defaults of the microbenchmark arguments that :func:`fit` matches on.
_DEFAULTS = {("mma", "lag"): 1, ("mma", "dtype"): "fp16", ("mma", "groups"): 1, ("elementwise", "groups"): 1,
             ("tma", "hot_mb"): 0, ("tma", "depth"): 2, ("handoff", "worker_warps"): 4,
             ("tma_reduce", "depth"): 1, ("tma_reduce", "stagger"): False}


def _need(values: list[float], what: str) -> list[float]:
    if not values:
        raise TwillError(f"calibration incomplete: no successful measurement of {what}")
    return values


def fit(rows: list[dict[str, Any]], base: Machine) -> Machine:
    """The calibrated machine: ``base`` with the rates the ``rows`` measured (see :class:`Calibration`)."""
    mma_best: dict[str, dict[int, float]] = {}
    mma_one: dict[str, dict[int, float]] = {}
    for r in _need(_results(rows, "mma", lag=1), "wgmma throughput"):
        best = mma_best.setdefault(r["dtype"], {})
        best[r["n"]] = max(best.get(r["n"], 0.0), r["flops_per_clk"])
        if r["groups"] == 1:
            mma_one.setdefault(r["dtype"], {})[r["n"]] = r["flops_per_clk"]
    if "fp16" not in mma_one:
        raise TwillError("calibration incomplete: no one-warp-group fp16 wgmma measurement")
    latency = {r["n"]: r["cycles_per_group"] for r in _need(_results(rows, "mma", lag=0), "wgmma latency")}

    def best_and_one(op: str) -> tuple[float, float]:
        found = _need(_results(rows, "elementwise", op=op), op)
        one = [r["elements_per_clk"] for r in found if r["groups"] == 1]
        return max(r["elements_per_clk"] for r in found), (one[0] if one else min(r["elements_per_clk"]
                                                                                  for r in found))

    ex2, ex2_one = best_and_one("exp2")
    fma, fma_one = best_and_one("fma")
    rowmax, _ = best_and_one("rowmax")
    rowsum, _ = best_and_one("rowsum")
    smem = max(r["bytes_per_clk"] for r in _need(_results(rows, "smem"), "shared-memory round trips"))
    tma_lat = _need([r["cycles_per_tile"] for r in _results(rows, "tma", depth=1, hot_mb=0)], "TMA latency")[0]
    tma_bw = max(_need([r["bytes_per_clk"] for r in _results(rows, "tma", hot_mb=0) if r["depth"] > 1],
                       "TMA bandwidth"))
    l2_lat = _need([r["cycles_per_tile"] for r in _results(rows, "tma", depth=1, hot_mb=L2_HOT_MB)],
                   "TMA latency from L2")[0]
    l2_bw = max(_need([r["bytes_per_clk"] for r in _results(rows, "tma", hot_mb=L2_HOT_MB) if r["depth"] > 1],
                      "TMA bandwidth from L2"))
    # optional (raw files of earlier versions lack it): every SM reading one hot MiB, tiles shared in flight
    sm_rate = [r["bytes_per_clk"] for r in _results(rows, "tma", hot_mb=SHARED_HOT_MB) if r["depth"] > 1]
    handoff = _need([r["cycles_per_handoff"] for r in _results(rows, "handoff", worker_warps=4)],
                    "mbarrier hand-off")[0]
    launch = _need([r["launch_us"] for r in _results(rows, "launch")], "launch cost")[0]
    # optional (raw files of earlier versions lack it): shared rows, one tile reading at a time
    reduce = [r["bytes_per_clk"] for r in _results(rows, "tma_reduce", share=SHARED_DQ, depth=1, stagger=False)]
    # optional as well: the online-softmax step with O += P V in flight, per (groups, keys, head dimension)
    steps = {softmax_key(r["groups"], r["block_n"], r["head_dim"]): r["cycles_per_step"]
             for r in _results(rows, "softmax", pv=True)}
    # optional as well: the compute side of a whole loop iteration, tensor-core turns included
    iterations = {softmax_key(r["groups"], r["block_n"], r["head_dim"]): r["cycles_per_iteration"]
                  for r in _results(rows, "attention_iteration")}
    # optional as well: the compute side of an attention-backward iteration, per (query rows, keys, head dim)
    backward = {backward_key(r["block_m"], r["block_n"], r["head_dim"]): r["cycles_per_iteration"]
                for r in _results(rows, "bwd_iteration")}
    # the SM's own cycle counter over event time under full tensor-core load; nvidia-smi's reading
    # (``clock_ghz`` of the row) can stay at the boost clock while the SM runs slower
    clocks = [r["wgmma_clock_ghz"] for r in _results(rows, "clock")]
    calibration = Calibration(
        mma_flops_per_clk=mma_best, mma_flops_per_clk_one_group=mma_one, mma_group_latency=latency,
        ex2_per_clk=ex2, ex2_per_clk_one_group=ex2_one, fma_per_clk=fma, fma_per_clk_one_group=fma_one,
        rowmax_per_clk=rowmax, rowsum_per_clk=rowsum, smem_bytes_per_clk=smem, barrier_handoff_cycles=handoff,
        tma_latency_cycles=tma_lat, tma_bytes_per_clk=tma_bw, tma_l2_latency_cycles=l2_lat,
        tma_l2_bytes_per_clk=l2_bw, tma_sm_bytes_per_clk=max(sm_rate) if sm_rate else None,
        tma_reduce_bytes_per_clk=statistics.median(reduce) if reduce else None,
        softmax_step_cycles=steps or None, attention_iteration_cycles=iterations or None,
        backward_iteration_cycles=backward or None)
    calibration = Calibration.from_dict(calibration.to_dict())  # normalised, validated mappings
    check_calibration(calibration, base)    # what --machine would refuse is refused here, before it is written
    clock = check_range("sustained_clock_ghz", statistics.median(_need(clocks, "the sustained clock")),
                    *CLOCK_GHZ_RANGE, "GHz")
    return replace(base, model=f"{base.name}-calibrated", calibration=calibration, sustained_clock_ghz=clock,
                   launch_us=check_range("launch_us", launch, *LAUNCH_US_RANGE, "us"))


#: Kernel-clock rows a clock model needs, and the spread of tensor-core duty among them.
CLOCK_FIT_MIN_ROWS = 3
CLOCK_FIT_MIN_SPREAD = 0.1


def measured_tensor_duty(row: dict[str, Any], machine: Machine) -> float:
    """Tensor-core duty of one measured kernel run: its FLOP over the cycles it ran (time x its own clock) on
    every SM at the calibrated fp16 wgmma rate (what the cost model prices a tensor-core cycle at)."""
    rate = machine.calibration.mma_rate("fp16", 256)
    cycles = row["ms"] * 1e-3 * row["clock_ghz"] * 1e9
    return row["flops"] / (cycles * machine.sms * rate)


def fit_clock_model(rows: list[dict[str, Any]], machine: Machine, kernels: tuple[str, ...] = ("gemm",),
                    source: str = "") -> dict[str, Any]:
    """The clock model (:attr:`Machine.clock_model`) that fits the ``kernels`` rows of a
    ``benchmarks/kernel_clock.py`` measurement: least squares of the nanoseconds per cycle, ``1 / clock``,
    on the tensor-core duty (:func:`measured_tensor_duty`). ``machine`` must be calibrated (its wgmma rate
    and SM count define the duty); ``source`` names the measurement in the model's ``fitted_on`` note."""
    if machine.calibration is None:
        raise TwillError("a clock model is fitted on top of a calibrated machine (twill calibrate first)")
    used = [r for r in rows if r.get("kernel") in kernels]
    if len(used) < CLOCK_FIT_MIN_ROWS:
        raise TwillError(f"a clock model needs at least {CLOCK_FIT_MIN_ROWS} measured {'/'.join(kernels)} "
                         f"kernels, got {len(used)}")
    xs = [measured_tensor_duty(r, machine) for r in used]
    ys = [1.0 / r["clock_ghz"] for r in used]
    if max(xs) - min(xs) < CLOCK_FIT_MIN_SPREAD:
        raise TwillError(f"the measured kernels' tensor-core duty spans {min(xs):.2f}..{max(xs):.2f}; a clock "
                         f"model needs kernels at least {CLOCK_FIT_MIN_SPREAD} apart (other tiles, ring depths)")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    if intercept <= 0 or slope < 0:
        raise TwillError(f"the measured clocks do not fall with tensor-core duty (fit {intercept:.3f} + "
                         f"{slope:.3f} u ns per cycle); no clock model")
    return {"ns_per_clk": intercept, "ns_per_tensor_clk": slope,
            "fitted_on": f"{len(used)} {'/'.join(kernels)} kernel runs, tensor-core duty "
                         f"{min(xs):.2f}..{max(xs):.2f}" + (f", {source}" if source else "")}


def software_versions() -> dict[str, str]:
    """Versions of what the measurements ran on."""
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__, "cuda": str(torch.version.cuda),
            "device": torch.cuda.get_device_name(0)}


def calibrate(arch: str, *, quick: bool = False,
              progress: Callable[[str], None] | None = None) -> tuple[Machine, dict[str, Any]]:
    """Measure the local GPU as a refinement of built-in machine ``arch``. Returns the calibrated machine
    and the raw record (every measurement, device, software, time) to keep beside it."""
    base = get_machine(arch)
    if base.capability != 90:
        raise TwillError(f"calibration microbenchmarks are written for Hopper (sm_90), not {base.name}; "
                         f"Blackwell models stay datasheet-derived")
    try:
        import torch
    except ImportError:
        raise TwillError("twill calibrate needs torch with CUDA (run it on the GPU machine)") from None
    if not torch.cuda.is_available():
        raise TwillError("twill calibrate needs a CUDA GPU; none is visible here")
    capability = torch.cuda.get_device_capability(0)
    if capability != (9, 0):
        raise TwillError(f"twill calibrate needs a Hopper GPU (sm_90); this one is sm_{capability[0]}{capability[1]}")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = run(plan(quick), progress)
    machine = fit(rows, base)
    raw = {"format": "twill-calibration-raw/1", "base": base.name, "measured": started,
           "software": software_versions(), "quick": quick, "measurements": rows}
    return machine, raw
