"""The main loops of ``twill.ops.attention``'s forward kernels, opcode by opcode, read off their sm_90 SASS (CPU; a
benchmark script behind docs/codegen.md, not part of the library).

For each configuration the op's kernel module is emitted as ``twill.ops.prepare`` writes it (from the shipped
schedules, into a scratch kernel cache), compiled for sm_90 with Triton's ptxas and disassembled; each compute
partition's main loop (:func:`twill.codegen.gluon.aot.wgmma_loops`, the first ``subtiles`` of them) is counted:
its instructions and the opcodes named by ``--opcodes``. Static counts of one iteration's code, masked branches
included (a count of what is issued needs Nsight Compute: ``benchmarks/attention_ncu.py``). Writes a JSON file
and prints a table.

    python benchmarks/op_loop_opcodes.py --out benchmarks/results/op_loop_opcodes.json

To compare with an earlier generator, run the same command in a worktree of that commit (``git worktree add``)
with ``--label`` naming it, and ``--merge`` the result files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: Head dims and masks of the configurations counted, in the dtype of ``--dtype`` (default: the op's fp8 forwards).
HEAD_DIMS, MASKS = (64, 128, 256), (False, True)
#: Opcodes counted by default: the byte permutes, logic and shifts of P's conversion, the conversions, shuffles.
OPCODES = ("PRMT", "LOP3", "SHF", "F2FP", "SHFL")


def count(head_dim: int, dtype: str, causal: bool, opcodes: tuple[str, ...]) -> dict[str, Any]:
    """The op's forward kernel of one configuration, compiled; per compute partition's main loop, its
    instructions and ``opcodes`` (by the opcode's name before its first dot)."""
    from twill.codegen.gluon import aot, load_emitted
    from twill.ops.flash import KernelSpec, prepare

    path = prepare(head_dim, dtype, causal=causal, backward=False)
    spec = KernelSpec("flash-fwd", head_dim, dtype, causal, 0)
    module = load_emitted(str(path), f"twill_op_loops_{abs(hash(str(path)))}")
    loops = aot.wgmma_loops(aot.sass(aot.compile_sm90(module)))[:spec.subtiles()]
    rows = [{"instructions": len(loop), **{op: sum(1 for o in loop if o.split(".")[0] == op) for op in opcodes}}
            for loop in loops]
    return {"head_dim": head_dim, "dtype": dtype, "causal": causal, "module": path.name, "loops": rows}


def run(out: str, label: str, opcodes: tuple[str, ...], dtype: str = "fp8e4m3") -> dict[str, Any]:
    """Count every head dim and mask (:data:`HEAD_DIMS`, :data:`MASKS`) of ``dtype`` into ``out`` (a scratch
    kernel cache, so the op's own cache stays as it is)."""
    import subprocess

    import triton

    saved = os.environ.get("XDG_CACHE_HOME")
    with tempfile.TemporaryDirectory(prefix="twill-op-loops-") as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        try:
            rows = [count(d, dtype, causal, opcodes) for d in HEAD_DIMS for causal in MASKS]
        finally:
            if saved is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = saved
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "triton": triton.__version__,
              "runs": {label: {"commit": commit, "rows": rows}},
              "command": "python benchmarks/op_loop_opcodes.py --out benchmarks/results/op_loop_opcodes.json"}
    write(out, result)
    return result


def merge(out: str, paths: list[str]) -> dict[str, Any]:
    """One result file with the runs of every file in ``paths`` (later labels win)."""
    result: dict[str, Any] = {}
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        runs = {**result.get("runs", {}), **doc["runs"]}
        result = {**doc, "runs": runs}
    write(out, result)
    return result


def write(out: str, result: dict[str, Any]) -> None:
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))


def table(result: dict[str, Any]) -> str:
    """One markdown row per configuration and run: the largest main loop's instructions and opcode counts."""
    runs = result["runs"]
    opcodes = [k for k in next(iter(runs.values()))["rows"][0]["loops"][0] if k != "instructions"]
    lines = ["| configuration | run | instructions | " + " | ".join(opcodes) + " |",
             "|---|---|---|" + "---|" * len(opcodes)]
    for label, run_ in runs.items():
        for row in run_["rows"]:
            loop = max(row["loops"], key=lambda r: r["instructions"])
            name = f"D={row['head_dim']} {row['dtype']}{' causal' if row['causal'] else ''}"
            lines.append(f"| {name} | {label} | {loop['instructions']} | "
                         + " | ".join(str(loop[op]) for op in opcodes) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/op_loop_opcodes.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--label", default="current", help="the run's name in the result (default: current)")
    parser.add_argument("--opcodes", default=",".join(OPCODES), help="comma-separated opcodes to count")
    parser.add_argument("--dtype", default="fp8e4m3", choices=("fp8e4m3", "fp16", "bf16"),
                        help="the kernels' dtype (default fp8e4m3)")
    parser.add_argument("--merge", nargs="+", metavar="FILE", help="merge these result files into --out instead")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"error: no directory for {args.out}", file=sys.stderr)
        return 2
    if args.merge:
        merge(args.out, args.merge)
    else:
        run(args.out, args.label, tuple(o for o in args.opcodes.split(",") if o), args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
