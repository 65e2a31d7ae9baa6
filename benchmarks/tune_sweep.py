"""Wall time of a model-only ``twill tune`` sweep, cold and cached (not a test).

Runs the default GEMM sweep on H100 (every candidate of ``twill tune gemm``: tile sizes x warps x streaming
depth, the ones over the shared memory of a block filtered out) twice through :func:`twill.tune.sweep.run_sweep`
with an empty cache directory: once cold (every candidate solved, ``--workers`` processes) and once cached
(every candidate read back). Targets (issue 10): >= 50 candidates cold in <= 60 s on the 2-core CPU machine,
cached in <= 2 s. Writes ``benchmarks/results/tune_sweep.json``.

    .venv/bin/python benchmarks/tune_sweep.py [--workers 2] [--kernel gemm]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "tune_sweep.json")


def run(kernel: str, workers: int, arch: str) -> dict[str, Any]:
    """Time one cold and one cached sweep of ``kernel``'s default space in a fresh cache directory."""
    from twill.ir.io import graph_to_dict
    from twill.kernels import build_kernel
    from twill.machine.models import get_machine
    from twill.tune.predict import default_shape, kernel_problem
    from twill.tune.rank import rank
    from twill.tune.space import kernel_space
    from twill.tune.sweep import Job, run_sweep

    machine = get_machine(arch)
    space = kernel_space(kernel, machine, {})
    jobs = [Job(candidate=c, graph=graph_to_dict(build_kernel(kernel, machine, **dict(c.options))),
                machine=machine, time_limit=60.0) for c in space.candidates]
    with tempfile.TemporaryDirectory(prefix="twill-tune-bench-") as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        started = time.perf_counter()
        cold = run_sweep(jobs, workers=workers)
        cold_s = time.perf_counter() - started
        started = time.perf_counter()
        cached = run_sweep(jobs, workers=workers)
        cached_s = time.perf_counter() - started
    results = rank(space.candidates, cold, default_shape(kernel_problem(kernel)), machine)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {"kernel": kernel, "arch": arch, "workers": workers, "candidates": len(jobs),
            "filtered_out": len(space.rejected), "statuses": statuses, "cold_seconds": round(cold_s, 2),
            "cached_seconds": round(cached_s, 3), "cached_hits": sum(r["cached"] for r in cached),
            "best": results[0].candidate.label() if results and results[0].prediction else None,
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="gemm", choices=("gemm", "flash-fwd", "flash-bwd"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--arch", default="h100")
    args = parser.parse_args(argv)
    row = run(args.kernel, args.workers, args.arch)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as fh:
        json.dump(row, fh, indent=2)
        fh.write("\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
