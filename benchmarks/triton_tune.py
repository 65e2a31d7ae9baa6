"""Tuning Triton kernels with Twill vs ``@triton.autotune``, over the same configurations, in the same run.

For the tutorial-style TMA matmul and attention forward of ``twill/integrations/triton/kernels/``, each configuration
(tile-size constexprs, ``num_warps``, ``num_stages``) is compiled twice: with Triton's own software-pipelining
schedule (A) and with the schedule Twill solves for it, injected (B). ``@triton.autotune`` times every
configuration's A and keeps the fastest, so *autotune's choice* is the best measured A; *Twill-tuned* is the
fastest kernel Twill ships among the K configurations its model predicts fastest (K = 3 by default,
``--top``): B where Twill's schedule is injected, A where Twill keeps Triton's own because the model predicts
its own schedule no faster than Triton's order (:data:`twill.integrations.triton.inject.INJECT_MIN_GAIN`). The
two picks are then built again and timed together in 8 interleaved rounds, the order reversed every other
round (:func:`twill.tune.measure_triton.head_to_head`): each was the fastest of its own noisy
measurements, autotune's of every configuration's. nvidia-smi's SM clock is sampled during each case.

Two steps, because the GPU machine has no OR-Tools:

  python benchmarks/triton_tune.py prepare     # CPU: solve every configuration, spill check, rank per shape
  PYTHONPATH=. python benchmarks/triton_tune.py run --out benchmarks/results/triton_tune.json   # GPU

``prepare`` runs the ``twill tune`` sweep (:mod:`twill.tune.sweep`, cached) with the calibrated H200 model
(``--machine``, default ``benchmarks/results/calibration_h200.machine.json``) for solving and prediction;
configurations whose injected kernel spills (ptxas, :mod:`twill.tune.spills`) keep no schedule. It writes the
schedules and the per-shape rankings to ``SCHEDULES``. ``run`` checks and times A and B of every configuration
on every shape, interleaved (:func:`twill.tune.measure_triton.measure_triton_config`: fresh random
data, NaN-poisoned outputs, float32 reference), runs a real ``@triton.autotune`` over the configurations as a
cross-check, and writes per shape: autotune's choice, Twill-tuned, the best kernel Twill ships overall, their
ratios, the configurations where an injected B is slower than A, those where Twill keeps A, the rank
correlation of predicted and measured times of what Twill ships, and the head-to-head. A failing configuration
is recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import clock_summary  # noqa: E402
from triton_ab import ROOT, _load_schedule, _module  # noqa: E402 - the A/B benchmark's helpers

SCHEDULES = ROOT / "benchmarks" / "results" / "triton_tune_schedules.json"
MACHINE = ROOT / "benchmarks" / "results" / "calibration_h200.machine.json"


def _configs(names: tuple[str, ...], rows: list[tuple[int, ...]], **fixed: int) -> list[dict[str, int]]:
    """Configurations as launch keywords: ``names`` (constexprs, then num_warps, num_stages) per row."""
    return [{**fixed, **dict(zip(names, row))} for row in rows]


#: Tutorial-style matmul configurations (``03-matrix-multiplication``'s Hopper list, widened to TMA tiles):
#: BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages. 256x256 on 8 warps is there to be discarded (it spills).
MATMUL_CONFIGS = _configs(("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"), [
    (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (256, 128, 64, 8, 4),
    (128, 128, 64, 4, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4),
    (128, 128, 64, 8, 5), (128, 128, 128, 8, 3), (128, 256, 32, 8, 4), (64, 256, 64, 4, 4),
    (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
    (256, 256, 64, 8, 3),
])

#: Attention forward configurations (``06-fused-attention``'s space): BLOCK_M, BLOCK_N, num_warps, num_stages.
_ATTN_ROWS = [(128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4), (128, 64, 8, 3), (128, 64, 4, 3),
              (64, 128, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 8, 2), (64, 64, 4, 4)]
_ATTN_NAMES = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")

#: case -> (kernel module, kernel function, configurations, shapes: (M, N, K) or (B, H, S, D)).
CASES: dict[str, tuple[str, str, list[dict[str, int]], list[tuple[int, ...]]]] = {
    "matmul": ("matmul", "matmul_kernel", MATMUL_CONFIGS, [(4096, 4096, 4096), (8192, 8192, 8192),
                                                            (8192, 8192, 1024)]),
    "flash_fwd": ("flash_fwd", "attn_fwd", _configs(_ATTN_NAMES, _ATTN_ROWS, HEAD_DIM=128),
                  [(4, 32, 4096, 128), (4, 32, 8192, 128)]),
}


def _shape(sizes: Any) -> Any:
    from twill.tune.predict import Shape

    sizes = tuple(sizes.values()) if isinstance(sizes, dict) else tuple(sizes)
    return Shape("gemm" if len(sizes) == 3 else "attention", sizes)


def _machine(path: str) -> Any:
    """The machine model file ``path`` (relative to the repository root unless absolute)."""
    from twill.machine.calibration import load_machine

    return load_machine(str(ROOT / path))


def _label(settings: dict[str, Any]) -> str:
    from twill.tune.space import candidate_of

    return candidate_of(settings).label()


# -- prepare (CPU) ----------------------------------------------------------------------------------------
def prepare_case(case: str, spec: tuple, machine: Any, time_limit: float, workers: int) -> dict[str, Any]:
    """Solve every configuration of one case (spill check on), rank the solved ones on each shape."""
    from twill.tune.rank import rank
    from twill.tune.space import candidate_of
    from twill.tune.sweep import Job, Progress, run_sweep

    mod_name, fn_name, configs, shapes = spec
    mod = _module(mod_name)
    info = {"path": mod.__file__, "fn": fn_name, "signature": mod.SIGNATURE, "source": Path(mod.__file__).read_text()}
    cands = [candidate_of(c) for c in configs]
    jobs = [Job(candidate=c, machine=machine, time_limit=time_limit, triton=info, check_spills=True) for c in cands]
    records = run_sweep(jobs, workers=workers, progress=Progress(total=len(jobs), lines=True))
    ranking = {}
    for sizes in shapes:
        shape = _shape(sizes)
        ranking[shape.text()] = [{"config": cands.index(r.candidate),
                                  "predicted_us": round(r.prediction.microseconds, 3), "injected": r.injected}
                                 for r in rank(cands, records, shape, machine) if r.prediction is not None]
    out = [{"settings": c.settings(), "status": rec["status"], "reason": rec.get("reason"), "spills": rec.get("spills"),
            "solve_seconds": rec.get("seconds"), "schedule": rec.get("schedule") if rec["status"] == "ok" else None}
           for c, rec in zip(cands, records)]
    counts = {s: sum(1 for r in records if r["status"] == s) for s in {r["status"] for r in records}}
    print(f"{case}: {len(cands)} configurations: {counts}", flush=True)
    return {"module": mod_name, "fn": fn_name, "shapes": [_shape(s).as_dict() for s in shapes], "configs": out,
            "ranking": ranking}


def prepare(cases: dict[str, tuple], out_path: Path, machine_path: Path, time_limit: float, workers: int,
            keep: bool) -> None:
    """Prepare ``cases`` into ``out_path`` (``keep``: keep the other cases already in the file)."""
    machine = _machine(str(machine_path))
    doc = json.loads(out_path.read_text()) if keep and out_path.exists() else {}
    if doc.get("machine") not in (None, str(machine_path)):
        doc["cases"] = {}
    doc.update(machine=str(machine_path), time_limit=time_limit)
    doc.setdefault("cases", {})
    for case, spec in cases.items():
        doc["cases"][case] = prepare_case(case, spec, machine, time_limit, workers)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out_path}")


# -- run (GPU) --------------------------------------------------------------------------------------------
def run_case(case: str, entry: dict[str, Any], machine: Any, *, reps: int, top: int, workdir: str) -> list[dict]:
    """Every configuration of one case, both variants, every shape; then the comparison per shape."""
    from twill.tune.measure_triton import (HEAD_TO_HEAD_REPS, autotune_choice, compare_with_autotune,
                                           head_to_head, launch_hook, measure_triton_config)

    base = getattr(_module(entry["module"]), entry["fn"])
    hook = launch_hook(base)
    shapes = [_shape(s) for s in entry["shapes"]]
    measured = []
    for i, cfg in enumerate(entry["configs"]):
        schedule = _load_schedule(cfg["schedule"]) if cfg["schedule"] else None
        rows = measure_triton_config(base, hook, cfg["settings"], schedule, machine, shapes, reps=reps,
                                     workdir=workdir)
        measured.append(rows)
        print(f"{case} {_label(cfg['settings'])}: " + "; ".join(
            f"A {r.get('triton_us', r.get('triton_status'))} B {r.get('twill_us', r.get('twill_status', '-'))}"
            for r in rows), flush=True)
    out = []
    for j, shape in enumerate(shapes):
        ranking = {r["config"]: (k, r) for k, r in enumerate(entry["ranking"][shape.text()])}
        rows = [{**measured[i][j], "config": i, "label": _label(cfg["settings"]), "sweep_status": cfg["status"],
                 "predicted_rank": ranking[i][0] if i in ranking else None,
                 "predicted_us": ranking[i][1]["predicted_us"] if i in ranking else None,
                 **({"injected": ranking[i][1]["injected"]} if i in ranking else {})}
                for i, cfg in enumerate(entry["configs"])]
        ran = [entry["configs"][r["config"]]["settings"] for r in rows if r.get("triton_us") is not None]
        autotune = autotune_choice(base, hook, ran, shape, reps) if ran else {"status": "no configuration ran"}
        comparison = {**compare_with_autotune(rows, top), "autotune": autotune}
        if comparison["autotune_choice"] and comparison["twill_tuned"]:
            by_label = {_label(cfg["settings"]): cfg for cfg in entry["configs"]}
            auto = by_label[comparison["autotune_choice"]["label"]]
            tuned = by_label[comparison["twill_tuned"]["label"]]
            schedule = _load_schedule(tuned["schedule"]) if comparison["twill_tuned"]["injected"] else None
            comparison["head_to_head"] = head_to_head(base, hook, auto["settings"], tuned["settings"], schedule,
                                                      machine, shape, reps=max(reps, HEAD_TO_HEAD_REPS),
                                                      workdir=workdir)
        out.append({"case": case, "shape": shape.as_dict(), "flops": shape.flops(), "rows": rows,
                    "comparison": comparison})
        print(json.dumps({"case": case, "shape": shape.text(), **out[-1]["comparison"]}), flush=True)
    return out


def run(schedules: Path, out_path: Path, reps: int, top: int, only: list[str]) -> None:
    """The GPU step over every prepared case (``only``: just these, keeping the other cases already in
    ``out_path``, so that each case can run in a command of its own)."""
    import time

    import torch
    import triton

    from twill.machine.microbench import ClockSampler
    from twill.tune.measure_triton import triton_runtime

    doc = json.loads(schedules.read_text())
    machine = _machine(doc["machine"])
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
        "machine": doc["machine"], "top_k": top,
        "timing": f"triton.testing.do_bench median (warmup 25 ms, rep 100 ms), A and B interleaved x{reps} (the order "
                  f"reversed every other round), best run",
        "cases": []}
    windows = []
    with triton_runtime() as workdir, ClockSampler() as sampler:   # the sampler's readings arrive when it stops
        for case, entry in doc["cases"].items():
            if not only or case in only:
                start = time.time()
                rows = run_case(case, entry, machine, reps=reps, top=top, workdir=workdir)
                windows.append((rows, start, time.time()))
                results["cases"] += rows
    for rows, start, end in windows:    # nvidia-smi's SM clock while the case ran (all its shapes)
        clock = clock_summary(sampler.samples, start, end)
        for row in rows:
            row["clock_mhz"] = clock
    if only and out_path.exists():
        kept = [c for c in json.loads(out_path.read_text())["cases"] if c["case"] not in only]
        results["cases"] = kept + results["cases"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1) + "\n")
    print(format_table(results))


def format_table(results: dict[str, Any]) -> str:
    """Markdown table of a results document: one line per case and shape."""
    lines = [f"Device: {results['device']}, Triton {results['triton']}, torch {results['torch']}; "
             f"{results['timing']}. Twill-tuned = the fastest kernel Twill ships (its schedule injected, or "
             f"Triton's kept) of the top {results['top_k']} predicted; ratio = autotune's choice time / "
             f"Twill-tuned time (> 1: Twill faster).", "",
             "| case | shape | autotune's choice | us | @triton.autotune picked | Twill-tuned | us | ratio | "
             "ratio (best) | injected B slower than A | Triton's kept | Spearman | the two picks timed again: "
             "ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["cases"]:
        c = r["comparison"]
        auto, tuned, cross = c["autotune_choice"] or {}, c["twill_tuned"] or {}, c["autotune"]
        picked = _label(cross["settings"]) if cross.get("settings") else cross["status"]
        shape = "x".join(str(v) for v in r["shape"].values())
        kept = " (Triton's kept)" if tuned and not tuned.get("injected", True) else ""
        lines.append(f"| {r['case']} | {shape} | {auto.get('label', '-')} | {auto.get('us', '-')} | {picked} | "
                     f"{tuned.get('label', '-')}{kept} | {tuned.get('us', '-')} | {c.get('ratio', '-')} | "
                     f"{c.get('ratio_best', '-')} | {len(c['slower_than_triton'])} | {len(c.get('kept', []))} | "
                     f"{c['spearman']} | {_again(c.get('head_to_head'))} |")
    return "\n".join(lines)


def _again(both: dict[str, Any] | None) -> str:
    """The head-to-head cell: autotune's choice over Twill-tuned, both timed again together, with the rounds."""
    if not both:
        return "-"
    if both["status"] != "ok":
        return both["status"]
    return f"{both['ratio']} ({both['autotune_us']} / {both['twill_us']} us, {both['reps']} rounds)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="CPU: solve every configuration, check spills, rank per shape")
    p.add_argument("--machine", type=Path, default=MACHINE.relative_to(ROOT))
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per configuration")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", nargs="*", default=[], choices=list(CASES), help="prepare only these cases")
    p.add_argument("--schedules", type=Path, default=SCHEDULES)
    p = sub.add_parser("run", help="GPU: check and time both variants of every configuration, and autotune")
    p.add_argument("--schedules", type=Path, default=SCHEDULES)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "triton_tune.json")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--top", type=int, default=3, help="K: Twill-tuned is the best of the top K predicted")
    p.add_argument("--only", nargs="*", default=[], choices=list(CASES))
    p = sub.add_parser("table", help="print the markdown table of a results file")
    p.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        cases = {c: spec for c, spec in CASES.items() if not args.only or c in args.only}
        prepare(cases, args.schedules, args.machine, args.time_limit, args.workers, keep=bool(args.only))
    elif args.cmd == "run":
        run(args.schedules, args.out, args.reps, args.top, args.only)
    else:
        print(format_table(json.loads(args.path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
