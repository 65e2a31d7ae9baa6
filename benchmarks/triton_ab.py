"""A/B of the same Triton kernels under the same Triton 3.6.0: Triton's own software-pipelining schedule vs
the schedule Twill computes and injects (``twill.integrations.triton.inject``).

Two steps, because the GPU machine has no OR-Tools:

  python benchmarks/triton_ab.py prepare     # CPU: extract graphs, solve, write SCHEDULES (committed)
  python benchmarks/triton_ab.py model       # CPU: model II of Triton's own order, for the report
  PYTHONPATH=. python benchmarks/triton_ab.py run --out benchmarks/results/triton_ab.json   # GPU

``run`` compiles every kernel twice with the JIT — once plainly, once through a *separate* ``JITFunction``
whose first launch runs with Twill's injection hook (Triton 3.6 keys neither its in-memory nor its file
cache on the hook, so the variants get their own JITFunction and the file cache is off) — then for every
size: fresh random inputs, NaN-poisoned outputs, a float32 torch reference, and ``do_bench`` medians of the
two variants interleaved A, B, A, B (the spread of the two A runs is the noise floor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ROOT / "benchmarks" / "results" / "triton_ab_schedules.json"

GEMM_SIZES = [(4096, 4096, 4096), (8192, 8192, 8192)]
ATTN_SIZES = [(4, 32, 4096, 128), (4, 32, 8192, 128)]

#: case -> (kernel module, kernel function, constexpr overrides, sizes). Sizes: (M, N, K) for GEMM,
#: (B, H, S, D) for attention.
CASES = {
    "matmul": ("matmul", "matmul_kernel", {}, GEMM_SIZES),
    "flash_fwd": ("flash_fwd", "attn_fwd", {}, ATTN_SIZES),
    "flash_fwd_subtiled": ("flash_fwd_subtiled", "attn_fwd_subtiled", {}, ATTN_SIZES),
    "flash_fwd_subtiled_bn64": ("flash_fwd_subtiled", "attn_fwd_subtiled", {"BLOCK_N": 64}, ATTN_SIZES),
}


def _constexprs(case: str) -> dict[str, int]:
    mod_name, _, over, _ = CASES[case]
    consts = {c.split("=")[0]: int(c.split("=")[1]) for c in _module(mod_name).CONSTEXPRS}
    return {**consts, **over}


def _module(name: str):
    import importlib

    return importlib.import_module(f"twill.integrations.triton.kernels.{name}")


# -- prepare (CPU) ----------------------------------------------------------------------------------------
def prepare(time_limit: float, only: list[str]) -> None:
    """Extract each kernel's loop graph for sm_90, solve it for Triton, save the schedules with their graphs
    (``only``: just these cases, keeping the others already in the file)."""
    from twill.integrations.triton.inject import solve_for_triton
    from twill.schedule.document import schedule_document
    from twill.integrations.triton import kernel_spec, lower_function
    from twill.machine import get_machine
    from twill.solve import SolveOptions

    machine = get_machine("h100")
    out = json.loads(SCHEDULES.read_text()) if only and SCHEDULES.exists() else {}
    for case, (mod_name, fn_name, _, _) in CASES.items():
        if only and case not in only:
            continue
        mod = _module(mod_name)
        spec = kernel_spec(getattr(mod, fn_name), signature=mod.SIGNATURE, constexprs=_constexprs(case),
                           num_warps=mod.NUM_WARPS, num_stages=mod.NUM_STAGES, machine=machine)
        lowered, _ = lower_function(spec, machine)
        began = time.perf_counter()
        sched = solve_for_triton(lowered.graph, machine, spec.capability,
                                 SolveOptions(ws=False, time_limit=time_limit), per_ii_limit=30.0)
        doc = schedule_document(sched)
        per_unit = sched.stats["normalization"]["cycles_per_unit"]
        doc["triton_ab"] = {"ii_cycles": round(sched.ii * per_unit),
                            "ii_lower_bound_cycles": round(sched.ii_lower_bound * per_unit),
                            "solve_seconds": round(time.perf_counter() - began, 1)}
        out[case] = doc
        print(f"{case}: II {sched.ii} (~{doc['triton_ab']['ii_cycles']} cycles, {sched.status}, lower bound "
              f"~{doc['triton_ab']['ii_lower_bound_cycles']}) in {doc['triton_ab']['solve_seconds']} s", flush=True)
    SCHEDULES.parent.mkdir(parents=True, exist_ok=True)
    SCHEDULES.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {SCHEDULES}")


def model_triton_order(time_limit: float) -> None:
    """For each case, the model II of *Triton's own* emission order: the compute ops chained (delay-0 edges) in
    the (cluster, program) order of Triton's schedule, solved like Twill's (``solve_for_triton``). Stored in
    SCHEDULES under ``triton_ab.triton_order``."""
    from twill.integrations.triton.inject import solve_for_triton, triton_order
    from twill.integrations.triton import kernel_spec, lower_function
    from twill.machine import get_machine
    from twill.solve import SolveOptions

    machine = get_machine("h100")
    docs = json.loads(SCHEDULES.read_text())
    for case, (mod_name, fn_name, _, _) in CASES.items():
        mod = _module(mod_name)
        spec = kernel_spec(getattr(mod, fn_name), signature=mod.SIGNATURE, constexprs=_constexprs(case),
                           num_warps=mod.NUM_WARPS, num_stages=mod.NUM_STAGES, machine=machine)
        lowered, text = lower_function(spec, machine)
        sched = solve_for_triton(triton_order(lowered, text), machine, spec.capability,
                                 SolveOptions(ws=False, time_limit=time_limit),
                                 per_ii_limit=30.0)
        per_unit = sched.stats["normalization"]["cycles_per_unit"]
        docs[case]["triton_ab"]["triton_order"] = {
            "ii_cycles": round(sched.ii * per_unit), "ii_lower_bound_cycles": round(sched.ii_lower_bound * per_unit),
            "status": sched.status}
        print(f"{case}: Triton's order II ~{docs[case]['triton_ab']['triton_order']['ii_cycles']} cycles "
              f"({sched.status}, >= ~{docs[case]['triton_ab']['triton_order']['ii_lower_bound_cycles']}); "
              f"Twill's ~{docs[case]['triton_ab']['ii_cycles']}", flush=True)
    SCHEDULES.write_text(json.dumps(docs, indent=1) + "\n")


# -- run (GPU) --------------------------------------------------------------------------------------------
def _load_schedule(doc: dict):
    from twill.ir.io import graph_from_dict
    from twill.schedule.result import Schedule

    return Schedule.from_dict(doc, graph_from_dict(doc["loop_graph"]))


def _launcher(case: str, fn, size):
    """(launch(), check() -> error, flops) for one kernel variant and size, from the kernel module's
    ``twill_launch`` hook (:mod:`twill.integrations.triton.launch`); check() redraws the inputs."""
    from twill.tune.predict import Shape

    mod = _module(CASES[case][0])
    shape = Shape("gemm" if case == "matmul" else "attention", tuple(size))
    launch, check = mod.twill_launch(fn, shape.as_dict(), **_constexprs(case), num_warps=mod.NUM_WARPS,
                                     num_stages=mod.NUM_STAGES)
    return launch, check, shape.flops()


def run(out_path: Path, reps: int) -> None:
    import torch
    import triton
    from triton import knobs
    from triton.testing import do_bench

    from twill.integrations.triton.inject import default_load_lead, make_jit_hook
    from twill.machine import get_machine

    machine = get_machine("h100")
    knobs.compilation.always_compile = True
    knobs.cache.dir = tempfile.mkdtemp(prefix="twill-ab-cache-")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    docs = json.loads(SCHEDULES.read_text())
    device = torch.cuda.get_device_name()
    results = {"device": device, "triton": triton.__version__, "torch": torch.__version__,
               "timing": f"triton.testing.do_bench median (warmup 25 ms, rep 100 ms), interleaved A,B x{reps}",
               "cases": []}
    for case, (mod_name, fn_name, _, sizes) in CASES.items():
        mod = _module(mod_name)
        base = getattr(mod, fn_name)
        sched = _load_schedule(docs[case])
        twill_fn = triton.jit(base.fn)
        workdir = tempfile.mkdtemp(prefix=f"twill-ab-{case}-")
        lead = default_load_lead(mod.NUM_STAGES)
        for size in sizes:
            row = {"case": case, "size": list(size), "ii_model_cycles": docs[case]["triton_ab"]["ii_cycles"]}
            variants = {}
            for variant, fn in (("triton", base), ("twill", twill_fn)):
                launch, check, flops = _launcher(case, fn, size)
                if variant == "twill":
                    knobs.runtime.add_stages_inspection_hook = make_jit_hook(
                        base.__name__, sched, machine, load_lead=lead, workdir=workdir, capability=90)
                try:
                    compiled = launch()
                    torch.cuda.synchronize()
                finally:
                    knobs.runtime.add_stages_inspection_hook = None
                variants[variant] = (launch, check, flops)
                row[f"{variant}_shared_bytes"] = int(compiled.metadata.shared)
                row[f"{variant}_regs"] = int(getattr(compiled, "n_regs", 0) or 0)
                row[f"{variant}_spills"] = int(getattr(compiled, "n_spills", 0) or 0)
            for variant, (launch, check, flops) in variants.items():
                row[f"{variant}_rel_err"] = max(check(), check())
            times = {v: [] for v in variants}
            for _ in range(reps):
                for variant, (launch, _, _) in variants.items():
                    times[variant].append(do_bench(launch, warmup=25, rep=100, return_mode="median"))
            flops = variants["triton"][2]
            for variant in variants:
                best = min(times[variant])
                row[f"{variant}_ms"] = [round(t, 4) for t in times[variant]]
                row[f"{variant}_tflops"] = round(flops / best / 1e9, 1)
            row["speedup"] = round(min(times["triton"]) / min(times["twill"]), 3)
            row["noise"] = round(max(max(t) / min(t) - 1 for t in times.values()), 3)
            results["cases"].append(row)
            print(json.dumps(row), flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1) + "\n")
    print(format_table(results))


def format_table(results: dict) -> str:
    """Markdown table of a results document."""
    lines = [f"Device: {results['device']}, Triton {results['triton']}, torch {results['torch']}; "
             f"{results['timing']}.", "",
             "| kernel | size | Triton TFLOP/s | Twill TFLOP/s | speedup | rel. err (Triton / Twill) | "
             "SMEM B (Triton / Twill) | regs (T / Tw) | spills (T / Tw) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["cases"]:
        size = "x".join(str(x) for x in r["size"])
        lines.append(f"| {r['case']} | {size} | {r['triton_tflops']} | {r['twill_tflops']} | {r['speedup']:.3f} | "
                     f"{r['triton_rel_err']:.1e} / {r['twill_rel_err']:.1e} | {r['triton_shared_bytes']} / "
                     f"{r['twill_shared_bytes']} | {r['triton_regs']} / {r['twill_regs']} | "
                     f"{r['triton_spills']} / {r['twill_spills']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="CPU: solve and save schedules")
    p.add_argument("--time-limit", type=float, default=300.0)
    p.add_argument("--only", nargs="*", default=[], choices=list(CASES), help="re-solve only these cases")
    p = sub.add_parser("model", help="CPU: model II of Triton's own order, for comparison")
    p.add_argument("--time-limit", type=float, default=150.0)
    p = sub.add_parser("run", help="GPU: correctness and TFLOP/s of both variants")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "triton_ab.json")
    p.add_argument("--reps", type=int, default=2)
    p = sub.add_parser("table", help="print the markdown table of a results file")
    p.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.time_limit, args.only)
    elif args.cmd == "model":
        model_triton_order(args.time_limit)
    elif args.cmd == "run":
        run(args.out, args.reps)
    else:
        print(format_table(json.loads(args.path.read_text())))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
