"""Register spills of a compiled kernel, from ptxas's own report (no GPU needed).

Triton 3.6 runs ``ptxas -v`` while compiling but discards its log, and fills ``CompiledKernel.n_spills`` only
when the kernel is loaded on a GPU. So the kernel's PTX (``kernel.asm["ptx"]``) is assembled again here with
the ptxas that Triton ships, and the ``-v`` lines are read: ``Used N registers`` and
``N bytes spill stores, M bytes spill loads``, and the warning that wgmmas were serialized.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import tempfile
from typing import Any

from twill.errors import TwillError
from twill.machine.models import Machine

_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
#: ptxas's warning (C7510, C7514, ...) that it serialized the kernel's wgmmas: each one then waits for the one
#: before it, which costs a pipelined attention forward about a quarter of its speed.
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized")


def parse_ptxas_log(log: str) -> dict[str, int]:
    """``{"registers", "spill_stores", "spill_loads", "spill_bytes", "serialized_wgmma"}`` summed over the
    kernels in a ``ptxas -v`` log (registers: the largest; serialized_wgmma: 1 if ptxas warned that it
    serialized wgmma instructions, else 0)."""
    stores = sum(int(m.group(1)) for m in _SPILLS.finditer(log))
    loads = sum(int(m.group(2)) for m in _SPILLS.finditer(log))
    regs = max((int(m.group(1)) for m in _REGISTERS.finditer(log)), default=0)
    return {"registers": regs, "spill_stores": stores, "spill_loads": loads, "spill_bytes": stores + loads,
            "serialized_wgmma": int(bool(_SERIALIZED.search(log)))}


def ptxas_report(ptx: str, capability: int) -> dict[str, int]:
    """Assemble ``ptx`` for ``sm_<capability>a`` with Triton's ptxas and parse its ``-v`` report."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError as exc:
        raise TwillError(f"reading spills needs Triton's ptxas ({exc})") from None
    ptxas = get_ptxas(capability).path
    suffix = "a" if capability >= 90 else ""
    with tempfile.TemporaryDirectory(prefix="twill-ptxas-") as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as fh:
            fh.write(ptx)
        proc = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{capability}{suffix}", src, "-o", out],
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no output"])[0][:200]
        raise TwillError(f"ptxas failed ({proc.returncode}): {first}")
    return parse_ptxas_log(proc.stderr + proc.stdout)


def gluon_spills(schedule: Any, machine: Machine, persistent: bool = False) -> dict[str, Any]:
    """:func:`ptxas_report` of the Gluon kernel emitted from ``schedule`` (``persistent``: its persistent form),
    compiled for sm_90 on the CPU. When ptxas fails on the kernel inside Triton's compile (it does when the
    register budget cannot hold the wgmma operands), the report's ``ptxas_error`` holds ptxas's reason."""
    from twill.codegen.gluon import load_emitted, write_gluon
    from twill.codegen.gluon.aot import compile_sm90

    if machine.capability // 10 != 9:
        raise TwillError(f"spill check compiles for sm_90 only, not {machine.arch}")
    with tempfile.TemporaryDirectory(prefix="twill-spills-") as tmp:
        path = os.path.join(tmp, "candidate.py")
        write_gluon(schedule, path, persistent)
        try:
            # Triton prints the whole PTX to stdout before it raises PTXASError: it is not this command's output
            with contextlib.redirect_stdout(io.StringIO()):
                kernel = compile_sm90(load_emitted(path, f"twill_spills_{os.getpid()}_{abs(hash(path))}"))
        except Exception as exc:  # noqa: BLE001 - Triton's PTXASError, without importing Triton's internals
            if type(exc).__name__ != "PTXASError":
                raise
            return {**parse_ptxas_log(""), "ptxas_error": ptxas_reason(str(exc))}   # the report's keys, all 0
    return ptxas_report(kernel.asm["ptx"], 90)


def ptxas_reason(message: str) -> str:
    """The line of a failed ptxas run that says why (its ``error`` or ``fatal`` line), else the first line,
    at most 200 characters: Triton's PTXASError carries the whole PTX after it."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    reasons = [line for line in lines if line.startswith("ptxas") and ("error" in line or "fatal" in line)]
    return (reasons or lines or ["ptxas failed"])[0][:200]


def ptxas_rejection(report: dict[str, int] | None) -> str | None:
    """Why a candidate whose compiled kernel has ptxas ``report`` (:func:`twill.tune.spills.ptxas_report`)
    is not ranked (status ``spills``): it spills registers, or ptxas serialized its wgmma instructions (each
    then waits for the one before it); None when neither, or when nothing was compiled."""
    if not report:
        return None
    if report.get("ptxas_error"):
        return f"ptxas cannot compile it: {report['ptxas_error']}"
    if report["spill_bytes"] > 0:
        return f"ptxas reports {report['spill_bytes']} bytes of spill stores/loads"
    if report.get("serialized_wgmma"):
        return "ptxas serializes the kernel's wgmma instructions (each waits for the one before it)"
    return None
