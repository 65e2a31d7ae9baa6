"""Ahead-of-time compilation of emitted kernels for sm_90 (no GPU needed) and the PTX facts tests check.

``compile_sm90(module)`` builds a :class:`GluonASTSource` from the emitted module's ``KERNEL_FN`` and
``compile_signature()`` and compiles it with ``GPUTarget("cuda", 90, 32)``; :func:`ptx_facts` counts what
the schedule asked for: wgmma instructions and shapes, ``wgmma.wait_group`` depths, ``setmaxnreg`` values,
TMA copies, mbarrier waits, and the shared memory the kernel reserves. :func:`sass` disassembles a compiled
kernel and :func:`sass_loops` cuts its loops out, for tests of where ptxas put an instruction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from twill.errors import UnsupportedFeatureError


@dataclass(frozen=True)
class PtxFacts:
    """Counts read off the PTX of a compiled kernel.

    Attributes:
        shared: bytes of shared memory the kernel reserves (``metadata.shared``).
        num_warps: the kernel's ``num_warps`` (default partition).
        wgmma: number of ``wgmma.mma_async`` instructions.
        wgmma_shapes: distinct ``mNnNkN`` shapes.
        wait_depths: distinct ``wgmma.wait_group`` arguments.
        setmaxnreg: distinct ``(inc|dec, value)`` pairs.
        tma_loads: ``cp.async.bulk.tensor`` global->shared instructions.
        tma_load_ranks: distinct ranks of those loads (``cp.async.bulk.tensor.4d``: 4; an attention kernel
            reads ``[B, H, S, D]`` tensors through rank-4 descriptors).
        tma_stores: ``cp.async.bulk.tensor`` shared->global instructions.
        mbarrier_waits: ``mbarrier.try_wait`` instructions.
    """

    shared: int
    num_warps: int
    wgmma: int
    wgmma_shapes: tuple[str, ...]
    wait_depths: tuple[int, ...]
    setmaxnreg: tuple[tuple[str, int], ...]
    tma_loads: int
    tma_load_ranks: tuple[int, ...]
    tma_stores: int
    mbarrier_waits: int


def compile_sm90(module: ModuleType, constexprs: dict[str, Any] | None = None) -> Any:
    """Compile the emitted module's kernel for sm_90; returns Triton's ``CompiledKernel``. ``constexprs``
    fixes kernel parameters at compile time, as Triton's launcher does for ``None`` arguments (an attention
    kernel launched without an LSE output gets ``{"lse_ptr": None}``)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.experimental.gluon._runtime import GluonASTSource
    except ImportError as exc:
        raise UnsupportedFeatureError(f"cannot compile: Triton 3.6 with Gluon is needed ({exc})") from None
    signature, fixed = module.compile_signature()
    fixed = {**fixed, **(constexprs or {})}
    signature = {name: "constexpr" if name in fixed else ty for name, ty in signature.items()}
    pointer_args = [i for i, ty in enumerate(signature.values()) if ty.startswith("*")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointer_args}
    src = GluonASTSource(module.KERNEL_FN, signature, constexprs=fixed, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": module.NUM_WARPS})


def ptx_facts(compiled: Any) -> PtxFacts:
    """The :class:`PtxFacts` of a compiled kernel."""
    ptx = compiled.asm["ptx"]
    return PtxFacts(
        shared=int(compiled.metadata.shared),
        num_warps=int(compiled.metadata.num_warps),
        wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
        wgmma_shapes=tuple(sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))),
        wait_depths=tuple(sorted({int(d) for d in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)})),
        setmaxnreg=tuple(sorted({(k, int(v)) for k, v in
                                 re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)})),
        tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        tma_load_ranks=tuple(sorted({int(r) for r in
                                     re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.shared::cluster\.global", ptx)})),
        tma_stores=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        mbarrier_waits=len(re.findall(r"mbarrier\.try_wait", ptx)),
    )


def sass(compiled: Any) -> str:
    """The SASS of a compiled kernel, disassembled with the ``nvdisasm`` that ships next to Triton's ptxas."""
    import os
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    nvdisasm = os.path.join(os.path.dirname(get_ptxas(90).path), "nvdisasm")
    if not os.path.exists(nvdisasm):
        raise UnsupportedFeatureError(f"cannot disassemble: no nvdisasm at {nvdisasm}")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        return subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout


def sass_instructions(text: str) -> list[tuple[int, tuple[str, ...], str]]:
    """The instructions of ``text`` (SASS from :func:`sass`) in address order: ``(address, labels, instruction)``
    with the labels (``L_x_12``) that point at the instruction."""
    out: list[tuple[int, tuple[str, ...], str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        label = re.match(r"^\.(L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        inst = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if inst:
            out.append((int(inst.group(1), 16), tuple(pending), inst.group(2)))
            pending = []
    return out


def _loop_ranges(parsed: list[tuple[int, tuple[str, ...], str]]) -> list[tuple[int, int]]:
    """The ``(first, last)`` addresses of every loop in ``parsed`` (:func:`sass_instructions`): for each
    backward branch, its target label's address and its own."""
    label_at = {name: address for address, labels, _ in parsed for name in labels}
    ranges = []
    for address, _, inst in parsed:
        target = re.search(r"BRA `\(\.(L_x_\d+)\)", inst)
        if target and label_at.get(target.group(1), address + 1) <= address:
            ranges.append((label_at[target.group(1)], address))
    return ranges


def sass_loops(text: str) -> list[list[str]]:
    """The instructions of every loop in ``text`` (SASS from :func:`sass`): for each backward branch, the
    instructions from its target label to the branch, in address order."""
    parsed = sass_instructions(text)
    return [[inst for a, _, inst in parsed if lo <= a <= hi] for lo, hi in _loop_ranges(parsed)]


def wgmma_loops(text: str) -> list[list[str]]:
    """The opcodes (predicates dropped) of each innermost loop of ``text`` (SASS from :func:`sass`) that issues a
    wgmma (``HGMMA``, ``QGMMA``): a backward branch's range with one and no shorter such range inside, in
    address order. A compute partition's main loop is one; they come first in the kernels Twill emits."""
    parsed = sass_instructions(text)
    ops = [(address, re.sub(r"^@!?U?P\w+\s+", "", inst).split(" ")[0]) for address, _, inst in parsed]
    ranges = []
    for lo, hi in _loop_ranges(parsed):
        body = [op for a, op in ops if lo <= a <= hi]
        if any("GMMA" in op for op in body):
            ranges.append((lo, hi, body))
    return [body for lo, hi, body in ranges
            if not any((lo, hi) != (l2, h2) and lo <= l2 and h2 <= hi for l2, h2, _ in ranges)]
