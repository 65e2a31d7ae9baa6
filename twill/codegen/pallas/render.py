"""What every emitted Pallas module shares: the header, the mapping of plan decisions onto Pallas's
warp-specialized pipeline (:func:`pipeline_knobs`), the "cannot emit" checks, constants and imports.

Pallas (``jax.experimental.pallas.mosaic_gpu``) runs a fixed template: one memory warpgroup issues the TMA
copies of ``plgpu.emit_pipeline_warp_specialized`` into one ring per input, ``num_compute_wgs`` compute
warpgroups run the pipeline body once per step. The plan's decisions map onto its knobs; a decision the
template cannot carry raises ``cannot emit: ... (Pallas ...)`` instead of being dropped. Only the kernel
families' bodies (``twill/kernels/<family>/pallas.py``) differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.codegen.chart import render_chart
from twill.codegen.plan import KernelPlan
from twill.errors import UnsupportedFeatureError

#: Rows of one Pallas compute warpgroup (a 4-warp wgmma issues m64 instructions).
WG_ROWS = 64
#: Registers per thread the SM's register file gives one warpgroup alone (64K / 128 threads).
REGS_PER_THREAD = 512
#: The largest setmaxnreg budget.
REGS_MAX = 256
#: Pallas / jnp dtype of each plan dtype.
JNP_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}

IMPORTS = """\
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
"""


def cannot_emit(what: str, why: str) -> UnsupportedFeatureError:
    """``cannot emit: <what> (Pallas <why>)``: a schedule decision the Pallas template cannot carry."""
    return UnsupportedFeatureError(f"cannot emit: {what} (Pallas {why})")


@dataclass(frozen=True)
class PipelineKnobs:
    """The knobs of ``plgpu.emit_pipeline_warp_specialized`` a plan sets, each with the fact behind it.

    Attributes:
        max_concurrent_steps: ring depth (every ring of the plan has it).
        delay_release: steps a buffer is held after the body that read it (GEMM: the wgmma wait lag).
        compute_wgs: Pallas compute warpgroups (``num_compute_wgs``): 4 warps each.
        memory_registers: setmaxnreg budget of the memory (TMA) warpgroup = the load partition's.
        compute_registers: what Pallas gives each compute warpgroup, ``(512 - memory_registers) /
            compute_wgs`` rounded down to 8 (at most 256); at least the schedule's budget.
        why: the fact behind each knob, by knob name.
    """

    max_concurrent_steps: int
    delay_release: int
    compute_wgs: int
    memory_registers: int
    compute_registers: int
    why: dict[str, str]


def pipeline_knobs(plan: KernelPlan, delay_release: int, delay_why: str) -> PipelineKnobs:
    """Map the plan's rings, partitions and budgets onto the pipeline's knobs, or raise ``cannot emit``."""
    depths = {r.depth for r in plan.rings}
    if len(depths) != 1:
        rings = ", ".join(f"{r.name} {r.depth}" for r in plan.rings)
        raise cannot_emit(f"rings of different depths ({rings})",
                          "emit_pipeline_warp_specialized has one max_concurrent_steps for every input")
    depth = depths.pop()
    if delay_release >= depth:
        raise cannot_emit(f"delay_release {delay_release} with ring depth {depth}",
                          "needs max_concurrent_steps > delay_release")
    load = plan.load
    if load.regs % 8 or not 24 <= load.regs <= REGS_MAX:
        raise cannot_emit(f"memory warpgroup budget {load.regs} registers",
                          "set_max_registers takes a multiple of 8 in [24, 256]")
    compute_wgs = sum(p.num_warps for p in plan.compute) // 4
    granted = int(min(REGS_MAX, (REGS_PER_THREAD - load.regs) / compute_wgs) // 8 * 8)
    asked = max(p.regs for p in plan.compute)
    if asked > granted:
        raise cannot_emit(f"compute budget {asked} registers with {compute_wgs} compute warpgroups",
                          f"gives compute warpgroups (512 - memory_registers {load.regs}) / {compute_wgs} "
                          f"= {granted}")
    ring = plan.rings[0]
    why = {
        "max_concurrent_steps": f"ring depth of every ring ({', '.join(r.name for r in plan.rings)}): {ring.why}",
        "delay_release": delay_why,
        "num_compute_wgs": " + ".join(f"{p.name} (warp group {p.group}, {p.num_warps} warps)"
                                      for p in plan.compute) + " = " + f"{compute_wgs} x 4 warps",
        "memory_registers": f"load partition (warp group {load.group}) budget {load.regs}",
        "compute_registers": f"Pallas: (512 - {load.regs}) / {compute_wgs} rounded down to 8 = {granted} >= "
                             f"schedule budget {asked}",
    }
    return PipelineKnobs(depth, delay_release, compute_wgs, load.regs, granted, why)


def constant_lines(items: list[tuple[str, object, str]]) -> str:
    """``NAME = value  # why`` lines."""
    width = max(len(n) for n, _, _ in items)
    return "\n".join(f"{name:<{width}s} = {value!r}  # {why}" for name, value, why in items) + "\n"


def knob_constants(plan: KernelPlan, knobs: PipelineKnobs) -> list[tuple[str, object, str]]:
    """The pipeline knobs as module constants, each with its schedule fact."""
    return [("MAX_CONCURRENT_STEPS", knobs.max_concurrent_steps, knobs.why["max_concurrent_steps"]),
            ("DELAY_RELEASE", knobs.delay_release, knobs.why["delay_release"]),
            ("COMPUTE_WGS", knobs.compute_wgs, knobs.why["num_compute_wgs"]),
            ("MEMORY_REGISTERS", knobs.memory_registers, knobs.why["memory_registers"]),
            ("COMPUTE_REGISTERS", knobs.compute_registers, knobs.why["compute_registers"])]


def render_header(plan: KernelPlan, title: str, decisions: list[str]) -> str:
    """The header comment: the schedule, the partitions as warpgroups, the rings, the decisions, the chart."""
    tile = " ".join(f"{k}={v}" for k, v in plan.tile.items())
    lines = [
        title,
        "",
        "GENERATED by `twill emit pallas` from a Twill schedule -- do not edit by hand.",
        f"schedule: graph {plan.graph!r}, arch {plan.arch}, solver {plan.solver}, status {plan.status}",
        f"II = {plan.ii} (lower bound {plan.ii_lower_bound}), length L = {plan.length}, "
        f"stages = {plan.num_stages}, dtype {plan.dtype}, tile {tile}",
        "",
        "partitions -> Pallas warpgroups (plgpu.kernel num_threads; the memory warpgroup is the last):",
    ]
    first = 0
    for p in plan.compute:
        wgs = p.num_warps // 4
        lines.append(f"  {p.name:8s} warp group {p.group} ({p.group_role}): {p.num_warps} warps -> compute "
                     f"warpgroup(s) {', '.join(str(first + i) for i in range(wgs))}, sub-tile {p.subtile}; "
                     f"ops {', '.join(p.ops)}")
        first += wgs
    load = plan.load
    lines.append(f"  {load.name:8s} warp group {load.group} ({load.group_role}) -> memory warpgroup {first}; "
                 f"ops {', '.join(load.ops)}")
    lines.append("rings (emit_pipeline_warp_specialized in_specs):")
    for r in plan.rings:
        lines.append(f"  {r.name}: {r.producer} -> {', '.join(r.consumers)}, {r.depth} buffers, released after "
                     f"{r.release}; depth = {r.why}")
    lines += ["", *decisions, "", "steady-state chart (digit = stage; cycles scaled onto [0, II)):"]
    lines += ["  " + line for line in render_chart(plan)]
    return "\n".join(("# " + line).rstrip() for line in lines) + "\n"


def render_module(header: str, summary: str, constants: str, body: str, extra_imports: str = "") -> str:
    """The complete module: header, docstring, imports (standard-library ``extra_imports`` first), constants,
    kernel and wrapper."""
    parts = [header, f'"""{summary}"""\n', extra_imports + IMPORTS, constants, body]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"
