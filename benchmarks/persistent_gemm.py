"""Persistent against one-CTA-per-tile generated GEMMs, beside cuBLAS in the same run (GPU; not a test).

The kernels are the ``gemm_*`` modules of ``benchmarks/gluon_bench.py generate`` (the hand-built 128x256x64
schedules with a deferred wgmma wait, ring depth 3 and 4, and their ``persistent`` twins). Each shape and dtype
is timed device-side (CUDA events around 10 calls, 7 rounds interleaved over the kernels and cuBLAS,
medians and the min-max over rounds) while the SM clock is sampled. Correctness is
``tests/gpu/test_gpu_gluon.py -k gemm`` (ragged shapes, NaN-poisoned outputs, fp32 reference), run first.

    python -m pytest -q tests/gpu/test_gpu_gluon.py -k gemm
    python benchmarks/persistent_gemm.py benchmarks/gluon_kernels --out $OUT     # writes persistent_gemm.json
    python benchmarks/persistent_gemm.py --table benchmarks/results/persistent_gemm_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024))
KERNELS = {"fp16": ("gemm_128x256x64_lag1_d3", "gemm_128x256x64_lag1_d4", "gemm_128x256x64_lag1_d3_persistent",
                    "gemm_128x256x64_lag1_d4_persistent"),
           "bf16": ("gemm_bf16_128x256x64_lag1_d4", "gemm_bf16_128x256x64_lag1_d3_persistent")}
CALLS, ROUNDS = 10, 7


def run(kernel_dir: str, out: str) -> None:
    import torch
    import triton

    from benchmarks._common import event_times, load_module
    from twill.machine.microbench import ClockSampler

    rows = []
    with ClockSampler() as sampler:
        for dtype, names in KERNELS.items():
            tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
            mods = {n: load_module(os.path.join(kernel_dir, n + ".py"), "pg_") for n in names}
            for M, N, K in SHAPES:
                a, b = torch.randn(M, K, device="cuda", dtype=tdt), torch.randn(K, N, device="cuda", dtype=tdt)
                c = torch.empty(M, N, device="cuda", dtype=tdt)
                fns = {"cublas": lambda: torch.matmul(a, b, out=c),
                       **{n: (lambda m=m: m.launch(a, b, c)) for n, m in mods.items()}}
                ms, spread, window = event_times(fns, CALLS, ROUNDS)
                rows.append({"dtype": dtype, "shape": [M, N, K], "clock_ghz": sampler.median_ghz(*window),
                             "ms": ms, "ms_spread": spread,
                             "tflops": {n: 2.0 * M * N * K / t / 1e9 for n, t in ms.items()},
                             "vs_cublas": {n: ms["cublas"] / t for n, t in ms.items()}})
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "calls": CALLS, "rounds": ROUNDS, "rows": rows}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "persistent_gemm.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))


def table(result: dict[str, Any]) -> str:
    """Markdown: TFLOP/s and the ratio to cuBLAS of every kernel, per dtype and shape."""
    lines = ["| dtype | shape | kernel | TFLOP/s | vs cuBLAS | cuBLAS TFLOP/s |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        shape = "x".join(str(v) for v in r["shape"])
        for name, tflops in r["tflops"].items():
            if name != "cublas":
                lines.append(f"| {r['dtype']} | {shape} | `{name}` | {tflops:.0f} | {r['vs_cublas'][name]:.3f}x | "
                             f"{r['tflops']['cublas']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel_dir", nargs="?", help="folder of gluon_bench.py generate (GPU run)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--table", metavar="JSON", help="print the table of a result file instead (no GPU)")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as fh:
            print(table(json.load(fh)))
    elif args.kernel_dir:
        run(args.kernel_dir, args.out)
    else:
        ap.error("give the kernel folder, or --table FILE")


if __name__ == "__main__":
    main()
