"""Instructions per loop iteration of each compute warp, read off the sm_90 SASS of compiled attention kernels
(CPU; a benchmark script behind docs/performance.md, not part of the library).

The question it answers: is the three-group D = 128 forward slower than the calibration's attention-iteration
microbenchmark (``twill.machine.microbench._iteration_kernel``) because its loop body has more instructions to
issue? For each generated kernel and the microbenchmark of the same groups, key block and head dimension, both
are compiled for sm_90 on the CPU (Triton's ptxas), disassembled (``twill.codegen.gluon.aot.sass``) and each
compute warp's main loop is cut out: the body of a loop that ends in a *conditional* backward branch and holds
a wgmma (``HGMMA``). The spin loops of mbarrier waits are two-instruction loops without one, and their retry
paths branch back unconditionally from the end of the function. Writes a JSON file and prints a table.

    python benchmarks/loop_instructions.py --out benchmarks/results/loop_instructions.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: (name, flash-fwd options, streaming depth, register limit, extra copies) of the kernels compared, solved on
#: the calibrated H200 model as in the three-group experiment (docs/experiments/three-groups.md).
KERNELS = (
    ("fa_d128_sub2_copies1_d2", {"head_dim": 128, "subtiles": 2}, 2, None, 0),
    ("fa_d128_bn64_sub3_copies2_d2", {"head_dim": 128, "subtiles": 3, "block_n": 64}, 2, 160, 1),
    ("fa_d128_bn64_sub3_copies1_d2", {"head_dim": 128, "subtiles": 3, "block_n": 64}, 2, 160, 0),
)


def main_loops(sass_text: str) -> list[int]:
    """Instructions in each loop of ``sass_text`` (:func:`twill.codegen.gluon.aot.sass_loops`) that ends in a
    conditional backward branch and holds a wgmma (``HGMMA``), in address order: one per compute warp's main
    loop."""
    from twill.codegen.gluon.aot import sass_loops

    return [len(loop) for loop in sass_loops(sass_text)
            if re.match(r"@!?U?P\d+ BRA ", loop[-1]) and any("HGMMA" in inst for inst in loop)]


def kernel_loops(options: dict[str, Any], depth: int, reg_limit: int | None, extra_copies: int,
                 machine: Any) -> dict[str, Any]:
    """Solve, emit and compile one generated kernel; its II in raw cycles and compute loops."""
    import tempfile

    from twill.codegen.gluon import aot, emit_gluon, load_emitted
    from twill.kernels import build_kernel
    from twill.schedule.report import raw_cycles
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    solved = schedule(build_kernel("flash-fwd", machine, **options), machine,
                      SolveOptions(streaming_depth=depth, reg_limit=reg_limit, extra_copies=extra_copies,
                                   time_limit=120))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.py")
        with open(path, "w") as fh:
            fh.write(emit_gluon(solved))
        compiled = aot.compile_sm90(load_emitted(path, f"twill_loops_{abs(hash(path))}"))
    return {"ii_cycles": raw_cycles(solved.ii, solved.stats.get("normalization")) or solved.ii,
            "loops": main_loops(aot.sass(compiled))}


def microbenchmark_loops(groups: int, block_n: int, head_dim: int) -> list[int]:
    """Compile the calibration's attention-iteration microbenchmark for sm_90; its compute loops."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from twill.codegen.gluon import aot
    from twill.machine import microbench

    signature = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "out_ptr": "*fp32", "stats_ptr": "*i64",
                 "reps": "i32", "GROUPS": "constexpr", "BLOCK_N": "constexpr", "HEAD_DIM": "constexpr",
                 "WORKER_REGS": "constexpr"}
    fixed = {"GROUPS": groups, "BLOCK_N": block_n, "HEAD_DIM": head_dim,
             "WORKER_REGS": microbench._worker_regs(groups)}
    source = GluonASTSource(microbench._iteration_kernel, signature, constexprs=fixed,
                            attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return main_loops(aot.sass(compiled))


def run(out: str, machine_path: str) -> dict[str, Any]:
    from twill.machine.calibration import load_machine

    machine = load_machine(machine_path)
    rows = []
    for name, options, depth, reg_limit, extra in KERNELS:
        groups, block_n, head_dim = options["subtiles"], options.get("block_n", 128), options["head_dim"]
        kernel = kernel_loops(options, depth, reg_limit, extra, machine)
        bench = microbenchmark_loops(groups, block_n, head_dim)
        rows.append({"name": name, "groups": groups, "block_n": block_n, "head_dim": head_dim,
                     "ii_cycles": kernel["ii_cycles"], "kernel_loops": kernel["loops"],
                     "microbenchmark_loops": bench})
        print(json.dumps(rows[-1]), flush=True)
    import triton

    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "triton": triton.__version__,
              "machine": os.path.relpath(machine_path, ROOT), "rows": rows,
              "command": "python benchmarks/loop_instructions.py --out benchmarks/results/loop_instructions.json"}
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    """One markdown row per kernel: groups, tile, instructions per compute warp per iteration in the kernel and
    in its microbenchmark (the largest of the warps), their ratio, and the same per 64 x 64 block of scores."""
    lines = ["| kernel | groups | key block | kernel | microbenchmark | ratio | kernel per 64×64 block |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        kernel, bench = max(row["kernel_loops"]), max(row["microbenchmark_loops"])
        per_block = kernel / (row["block_n"] / 64)
        lines.append(f"| `{row['name']}` | {row['groups']} | {row['block_n']} | {kernel} | {bench} | "
                     f"{kernel / bench:.2f} | {per_block:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/loop_instructions.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--machine", default=os.path.join(ROOT, "benchmarks", "results",
                                                           "calibration_h200.machine.json"))
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"error: no directory for {args.out}", file=sys.stderr)
        return 2
    run(args.out, args.machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
