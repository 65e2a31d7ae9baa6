"""Model fidelity: the time the model predicts for a generated Gluon kernel against the time it takes.

Three steps, so that the GPU machine needs neither ortools nor the solver, and predictions can be re-made
from a new machine model without the GPU:

* ``generate`` (CPU): for every candidate configuration (GEMM tiles and ring depths; attention head dim,
  sub-tiles and ring depths) solve the schedule on the calibrated machine model and on the datasheet model,
  emit the Gluon kernel of the calibrated schedule, and save both schedules and ``manifest.json``.
* ``run`` (GPU): check every kernel against an fp32 reference (outputs poisoned with NaN, fresh random data,
  ragged shapes), then time every kernel and every reference (cuBLAS; cuDNN and PyTorch flash through SDPA)
  in interleaved rounds with ``triton.testing.do_bench`` (device-side events, median), sampling the SM clock
  (nvidia-smi) meanwhile. Writes ``fidelity_measured.json``.
* ``report`` (CPU): predictions (:func:`twill.tune.predict.predict`) of both schedules on every shape with
  the calibrated and the datasheet machine, measured / predicted, the prediction re-evaluated at the
  measured clock, and the Spearman rank correlation between predicted and measured over the candidates of
  one kernel and shape. Writes ``model_fidelity.json`` and prints a table.

    python benchmarks/model_fidelity.py generate out/fidelity --machine benchmarks/results/calibration_h200.machine.json
    python benchmarks/model_fidelity.py run out/fidelity --out $OUT          # GPU
    python benchmarks/model_fidelity.py report out/fidelity --measured benchmarks/results/fidelity_measured_h200.json \
        --report benchmarks/results/model_fidelity_h200.json

``generate --sweep`` takes instead every kernel of ``twill tune flash-fwd``'s sweep at each tiling's default
register budget (:func:`_sweep_entries`), for a rank correlation over the candidates the tuner chooses among;
``run --only fa_d128_`` and ``--only fa_d64_`` time them in two GPU calls, ``report --measured A B`` reads both,
and ``sweep-summary`` prints what the tuner would have got per shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import load_module, torch_references  # noqa: E402

#: GEMM candidates: (block_m, block_n, block_k, streaming depth).
GEMM_CANDIDATES = [(128, bn, bk, d) for bn, bk in ((256, 64), (128, 64), (128, 128)) for d in (2, 3, 4)] \
    + [(128, 256, 32, d) for d in (3, 4, 5)] + [(64, 256, 64, d) for d in (3, 4)]
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024)]
#: Attention candidates: (head_dim, sub-tiles, streaming depth); three groups (sub-tiles 3) fit depth 2 only.
ATTN_CANDIDATES = [(d, s, depth) for d in (128, 64) for s in (2, 1) for depth in (2, 3)] + [(128, 3, 2), (64, 3, 2)]
ATTN_SEQS = (2048, 4096, 8192, 16384)
ATTN_BATCH, ATTN_HEADS = 4, 32
#: Head dimensions of the ``--sweep`` candidate set (``twill tune flash-fwd``'s kernels, :func:`_sweep_entries`).
SWEEP_HEAD_DIMS = (128, 64)
ROUNDS = 3


def _solve(kernel: str, machine: Any, opts: dict[str, Any], depth: int) -> Any:
    from twill.kernels import build_kernel
    from twill.solve import SolveOptions, schedule

    graph = build_kernel(kernel, machine, **opts)
    return schedule(graph, machine, SolveOptions(streaming_depth=depth, time_limit=120))


def generate(outdir: str, machine_path: str, sweep: bool = False, workers: int = 2) -> None:
    from twill.codegen.gluon import emit_gluon
    from twill.schedule.document import schedule_document
    from twill.machine.calibration import load_machine
    from twill.machine.models import get_machine

    calibrated = load_machine(machine_path)
    datasheet = get_machine(calibrated.name)
    os.makedirs(outdir, exist_ok=True)
    if sweep:
        entries = _sweep_entries(outdir, calibrated, workers)
        with open(os.path.join(outdir, "manifest.json"), "w") as fh:
            json.dump({"machine_file": os.path.basename(machine_path), "sweep": True, "entries": entries}, fh,
                      indent=1)
        return
    entries = []
    jobs = [("gemm", f"gemm_{bm}x{bn}x{bk}_d{d}", {"block_m": bm, "block_n": bn, "block_k": bk}, d,
             [{"problem": "gemm", "sizes": list(s)} for s in GEMM_SHAPES]) for bm, bn, bk, d in GEMM_CANDIDATES]
    jobs += [("flash-fwd", f"fa_d{hd}_sub{s}_d{d}", {"head_dim": hd, "subtiles": s}, d,
              [{"problem": "attention", "sizes": [ATTN_BATCH, ATTN_HEADS, S, hd]} for S in ATTN_SEQS])
             for hd, s, d in ATTN_CANDIDATES]
    for kernel, name, opts, depth, shapes in jobs:
        started = time.perf_counter()
        entry: dict[str, Any] = {"name": name, "kernel": kernel, "options": opts, "depth": depth, "shapes": shapes}
        try:
            cal = _solve(kernel, calibrated, opts, depth)
            ds = _solve(kernel, datasheet, opts, depth)
            source = emit_gluon(cal)
        except Exception as exc:  # a candidate the solver or the emitter refuses is recorded, not fatal
            entry["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{name:24s} skipped: {entry['error']}")
            entries.append(entry)
            continue
        with open(os.path.join(outdir, f"{name}.py"), "w") as fh:
            fh.write(source)
        for label, sched in (("calibrated", cal), ("datasheet", ds)):
            with open(os.path.join(outdir, f"{name}.{label}.schedule.json"), "w") as fh:
                json.dump(schedule_document(sched), fh)
        entry.update(file=f"{name}.py", ii=cal.ii, status=cal.status, datasheet_ii=ds.ii)
        entries.append(entry)
        print(f"{name:24s} II {cal.ii} ({cal.status}), datasheet II {ds.ii}, {time.perf_counter() - started:.1f} s")
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump({"machine_file": os.path.basename(machine_path), "entries": entries}, fh, indent=1)


def _sweep_entries(outdir: str, machine: Any, workers: int) -> list[dict[str, Any]]:
    """The kernels of ``twill tune flash-fwd``'s default sweep with spills checked, at each head dimension of
    :data:`SWEEP_HEAD_DIMS`, at each tiling's default register budget (every sub-tile count, key tile, ring
    depth, persistent or not; the lower budgets, whose spilling schedules the ptxas-checked search compiles
    up to 16 times each, would take over an hour on two cores): each solved candidate (status ``ok``) is
    emitted with its ``persistent`` choice. The sweep's candidates do not depend on the sequence length, so
    one set is timed at every ``ATTN_SEQS``."""
    from benchmarks.tune_bench import _candidates, _jobs
    from twill.codegen.gluon import emit_gluon
    from twill.schedule.document import schedule_document
    from twill.kernels import build_kernel
    from twill.tune.predict import Shape
    from twill.tune.rank import rank
    from twill.tune.sweep import run_sweep

    entries: list[dict[str, Any]] = []
    for hd in SWEEP_HEAD_DIMS:
        shape = Shape("attention", (ATTN_BATCH, ATTN_HEADS, ATTN_SEQS[0], hd))
        candidates = [c for c in _candidates("flash-fwd", "fp16", shape, machine)
                      if c.reg_limit == build_kernel("flash-fwd", machine, **dict(c.options)).attrs.get("reg_limit")]
        results = rank(candidates, run_sweep(_jobs("flash-fwd", candidates, machine, check_spills=True),
                                             workers=workers), shape, machine)
        sources: set[str] = set()
        for result in results:
            if result.schedule is None or result.status != "ok":
                continue
            settings = result.candidate.settings()
            persistent = bool(result.candidate.persistent)
            source = emit_gluon(result.schedule, persistent=persistent)
            if source in sources:
                continue
            sources.add(source)
            name = (f"fa_d{hd}_sub{settings['subtiles']}_bn{settings['block_n']}_d{settings['streaming_depth']}"
                    + ("_p" if persistent else ""))
            with open(os.path.join(outdir, f"{name}.py"), "w") as fh:
                fh.write(source)
            with open(os.path.join(outdir, f"{name}.calibrated.schedule.json"), "w") as fh:
                json.dump(schedule_document(result.schedule), fh)
            entries.append({"name": name, "kernel": "flash-fwd", "options": dict(result.candidate.options),
                            "depth": settings["streaming_depth"], "persistent": persistent,
                            "candidate": result.candidate.label(), "file": f"{name}.py", "ii": result.schedule.ii,
                            "status": result.schedule.status,
                            "shapes": [{"problem": "attention", "sizes": [ATTN_BATCH, ATTN_HEADS, s, hd]}
                                       for s in ATTN_SEQS]})
        print(f"head dim {hd}: {len(candidates)} candidates, {sum(r.status == 'ok' for r in results)} solved, "
              f"{sum(e['options']['head_dim'] == hd for e in entries)} distinct kernels", flush=True)
    return entries


# ---------------------------------------------------------------------------------------------------- GPU

def _load(path: str) -> Any:
    return load_module(path, "")


def _relerr(out: Any, ref: Any) -> float:
    out = out.float()
    if not bool(out.isfinite().all()):
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def _check(entry: dict[str, Any], module: Any) -> float:
    """Worst relative error over ragged shapes and the first timed shape (fresh random data, NaN-poisoned
    outputs) against an fp32 torch reference."""
    import torch

    worst = 0.0
    if entry["kernel"] == "gemm":
        for m, n, k in ((300, 520, 200), (257, 333, 129), (1000, 72, 4104), (4096, 4096, 4096)):
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            module.launch(a, b, c)
            worst = max(worst, _relerr(c, a.float() @ b.float()))
        return worst
    d = entry["options"]["head_dim"]
    for b, h, s in ((1, 3, 77), (2, 2, 1000), (1, 2, 4096)):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        out = torch.full_like(q, float("nan"))
        module.launch(q, k, v, out=out)
        ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / d ** 0.5, -1) @ v.float()
        worst = max(worst, _relerr(out, ref))
    return worst


def _shape_dict(shape: dict[str, Any]) -> dict[str, int]:
    names = {"gemm": ("M", "N", "K"), "attention": ("B", "H", "S", "D")}[shape["problem"]]
    return dict(zip(names, shape["sizes"]))


def _inputs(kernel: str, shape: dict[str, int]) -> tuple[Any, ...]:
    import torch

    if kernel == "gemm":
        return (torch.randn(shape["M"], shape["K"], device="cuda", dtype=torch.float16),
                torch.randn(shape["K"], shape["N"], device="cuda", dtype=torch.float16),
                torch.empty(shape["M"], shape["N"], device="cuda", dtype=torch.float16))
    q, k, v = (torch.randn(shape["B"], shape["H"], shape["S"], shape["D"], device="cuda", dtype=torch.float16)
               for _ in range(3))
    return q, k, v, torch.empty_like(q)


def _time(fn: Any) -> tuple[float, tuple[float, float]]:
    """do_bench median (ms) of ``fn`` and the unix-time window it ran in (to read the sampled clock)."""
    from triton.testing import do_bench

    start = time.time()
    ms = do_bench(fn, warmup=25, rep=150, return_mode="median")
    return ms, (start, time.time())


def _launcher(kernel: str, module: Any, args: tuple[Any, ...]) -> Any:
    if kernel == "gemm":
        return lambda: module.launch(*args)
    return lambda: module.launch(args[0], args[1], args[2], out=args[3])


def run(kernel_dir: str, out: str, only: list[str] | None, gemm_shapes: list[tuple[int, ...]] | None = None) -> None:
    """Check, then time every correct candidate and every reference per shape in ROUNDS interleaved rounds;
    ``gemm_shapes`` replaces the GEMM candidates' shapes (shapes the model was not fitted on)."""
    import torch
    import triton

    from twill.machine.microbench import ClockSampler

    manifest = json.load(open(os.path.join(kernel_dir, "manifest.json")))
    entries = [e for e in manifest["entries"] if "file" in e and (not only or any(o in e["name"] for o in only))]
    if gemm_shapes:
        entries = [{**e, "shapes": [{"problem": "gemm", "sizes": list(s)} for s in gemm_shapes]}
                   if e["kernel"] == "gemm" else e for e in entries]
    modules, checks = {}, {}
    for entry in entries:
        try:
            modules[entry["name"]] = module = _load(os.path.join(kernel_dir, entry["file"]))
            worst = _check(entry, module)
            checks[entry["name"]] = {"correct": worst < 1e-2, "max_relerr": worst}
        except Exception as exc:  # recorded in the results; the other kernels still run
            checks[entry["name"]] = {"correct": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(f"check {entry['name']:24s} {checks[entry['name']]}", flush=True)
    groups: dict[tuple[str, str], list[str]] = {}
    for e in entries:
        if checks[e["name"]]["correct"]:
            for shape in e["shapes"]:
                groups.setdefault((e["kernel"], json.dumps(_shape_dict(shape))), []).append(e["name"])
    timings = []
    with ClockSampler() as sampler:
        for (kernel, key), names in sorted(groups.items()):
            args = _inputs(kernel, json.loads(key))
            calls = dict(torch_references(kernel, args))
            calls.update({n: _launcher(kernel, modules[n], args) for n in names})
            samples: dict[str, list[tuple[float, tuple[float, float]]]] = {n: [] for n in calls}
            for _ in range(ROUNDS):
                for n, fn in calls.items():
                    samples[n].append(_time(fn))
            timings.append({"kernel": kernel, "shape": json.loads(key), "samples": samples})
            print(f"timed {kernel} {key}: " + ", ".join(
                f"{n} {statistics.median(m for m, _ in v):.3f} ms" for n, v in samples.items()), flush=True)
            del args, calls
            torch.cuda.empty_cache()
    for t in timings:
        t["runs"] = {n: [{"ms": ms, "clock_ghz": sampler.median_ghz(*window)} for ms, window in v]
                     for n, v in t.pop("samples").items()}
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": ROUNDS, "checks": checks,
              "timings": timings}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "fidelity_measured.json"), "w") as fh:
        json.dump(result, fh, indent=1)


# ---------------------------------------------------------------------------------------------------- report

def _rho(value: float | None) -> str:
    """A rank correlation for the tables: two decimals, or "-" where a sample was constant."""
    return "-" if value is None else f"{value:.2f}"


def _kernel_clocks(path: str | None) -> dict[tuple[str, str], dict[str, Any]]:
    """(candidate, shape) -> its row of a ``benchmarks/kernel_clock.py`` measurement (none without ``path``)."""
    if not path:
        return {}
    return {(r["name"], json.dumps(r["shape"])): r for r in json.load(open(path))["rows"]}


def _merged(paths: list[str]) -> dict[str, Any]:
    """One measurement from the ``run`` results of several GPU calls on the same kernel folder: the first one's
    metadata (GPU, versions, the date of each kept in ``dates``), every call's checks and timings."""
    docs = [json.load(open(p)) for p in paths]
    merged = {**docs[0], "checks": {}, "timings": [], "dates": [d["date"] for d in docs]}
    for doc in docs:
        merged["checks"].update(doc["checks"])
        merged["timings"] += doc["timings"]
    return merged


def report(kernel_dir: str, measured_path: str | list[str], machine_path: str, report_path: str,
           kernel_clock: str | None = None) -> None:
    """Predictions of every schedule on every measured shape, against the measurements; with ``kernel_clock``
    (a ``kernel_clock.py`` measurement of the same kernels) also the cycles each ran, time x its own clock,
    against the predicted cycles: the cycle model alone, without the clock."""
    from twill.schedule.document import load_schedule_document
    from twill.machine.calibration import load_machine
    from twill.machine.models import get_machine
    from twill.tune.measure import spearman
    from twill.tune.predict import Shape, predict

    calibrated = load_machine(machine_path)
    datasheet = get_machine(calibrated.name)
    manifest = json.load(open(os.path.join(kernel_dir, "manifest.json")))
    measured = _merged([measured_path] if isinstance(measured_path, str) else measured_path)
    entries = {e["name"]: e for e in manifest["entries"] if "file" in e}
    schedules = {(n, label): load_schedule_document(path) for n in entries for label in ("calibrated", "datasheet")
                 if os.path.exists(path := os.path.join(kernel_dir, f"{n}.{label}.schedule.json"))}
    own_clock = _kernel_clocks(kernel_clock)
    rows, references, correlations = [], [], []
    for t in measured["timings"]:
        kernel, shape_d = t["kernel"], t["shape"]
        problem = "gemm" if kernel == "gemm" else "attention"
        shape = Shape(problem, tuple(shape_d.values()))
        flops = shape.flops(kernel)
        medians = {n: statistics.median(r["ms"] for r in runs) for n, runs in t["runs"].items()}
        refs = {n: ms for n, ms in medians.items() if n not in entries}
        references.append({"kernel": kernel, "shape": shape_d, **{f"{n}_ms": ms for n, ms in refs.items()},
                           **{f"{n}_tflops": flops / ms / 1e9 for n, ms in refs.items()}})
        group = []
        for name in (n for n in t["runs"] if n in entries):
            runs = t["runs"][name]
            ms = medians[name]
            clocks = [r["clock_ghz"] for r in runs if r["clock_ghz"]]
            clock = statistics.median(clocks) if clocks else None
            persistent = bool(entries[name].get("persistent"))
            pred = predict(schedules[name, "calibrated"], shape, calibrated, persistent=persistent)
            # a --sweep set has no datasheet schedules: the datasheet columns are left out
            ds = (predict(schedules[name, "datasheet"], shape, datasheet, persistent=persistent)
                  if (name, "datasheet") in schedules else None)
            at_clock = pred.cycles / (clock * 1e3) + calibrated.launch_us if clock else None
            row = {"name": name, "kernel": kernel, "options": entries[name]["options"],
                   "depth": entries[name]["depth"], "shape": shape_d, "ms": ms,
                   "ms_min": min(r["ms"] for r in runs), "ms_max": max(r["ms"] for r in runs), "clock_ghz": clock,
                   "tflops": flops / ms / 1e9, "predicted_us": pred.microseconds, "predicted_us_at_clock": at_clock,
                   "prediction": pred.to_dict(), "measured_over_predicted": ms * 1e3 / pred.microseconds,
                   "measured_over_predicted_at_clock": ms * 1e3 / at_clock if at_clock else None,
                   **({"datasheet_predicted_us": ds.microseconds, "measured_over_datasheet": ms * 1e3 / ds.microseconds}
                      if ds else {}),
                   **{f"vs_{n}": r / ms for n, r in refs.items()}}
            timed = own_clock.get((name, json.dumps(shape_d)))
            if timed:
                cycles = (timed["ms"] * 1e3 - calibrated.launch_us) * timed["clock_ghz"] * 1e3
                row.update(kernel_clock_ghz=timed["clock_ghz"], predicted_clock_ghz=pred.breakdown["clock_ghz"],
                           measured_over_predicted_cycles=cycles / pred.cycles)
            rows.append(row)
            group.append(row)
        if len(group) >= 3:
            correlations.append({"kernel": kernel, "shape": shape_d, "candidates": len(group),
                                 "spearman": spearman([r["predicted_us"] for r in group], [r["ms"] for r in group]),
                                 "spearman_datasheet": spearman([r["datasheet_predicted_us"] for r in group],
                                                                 [r["ms"] for r in group])
                                 if all("datasheet_predicted_us" in r for r in group) else None})
    ratios = [r["measured_over_predicted"] for r in rows]
    ds_ratios = [r["measured_over_datasheet"] for r in rows if "measured_over_datasheet" in r]
    cycle_ratios = [r["measured_over_predicted_cycles"] for r in rows if "measured_over_predicted_cycles" in r]
    clock_ratios = [r["kernel_clock_ghz"] / r["predicted_clock_ghz"] for r in rows if "kernel_clock_ghz" in r]
    summary = {"rows": len(rows), "within_15_percent": sum(1 for x in ratios if abs(x - 1) <= 0.15),
               **({"cycles_within_15_percent": sum(1 for x in cycle_ratios if abs(x - 1) <= 0.15),
                   "clock_measured_over_predicted": [min(clock_ratios), statistics.median(clock_ratios),
                                                     max(clock_ratios)]} if cycle_ratios else {}),
               "median_ratio": statistics.median(ratios) if ratios else None,
               "median_ratio_datasheet": statistics.median(ds_ratios) if ds_ratios else None}
    result = {**{k: measured[k] for k in ("gpu", "torch", "triton", "cuda", "cudnn", "date", "dates", "rounds",
                                          "checks")},
              "machine_model": calibrated.model, "machine_file": os.path.basename(machine_path),
              **({"kernel_clock_file": os.path.basename(kernel_clock)} if kernel_clock else {}),
              "command": "python benchmarks/model_fidelity.py generate|run|report", "summary": summary,
              "correlations": correlations, "references": references, "rows": rows}
    with open(report_path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"{'kernel':24s} {'shape':22s} {'TFLOP/s':>8s} {'meas/pred':>9s} {'@clock':>7s} {'datasheet':>9s} "
          f"{'GHz':>5s} {'vs ref':>7s}")
    for r in rows:
        ref = r.get("vs_cublas") or r.get("vs_cudnn") or float("nan")
        at = r["measured_over_predicted_at_clock"] or float("nan")
        shape = ",".join(str(v) for v in r["shape"].values())
        print(f"{r['name']:24s} {shape:22s} {r['tflops']:8.0f} {r['measured_over_predicted']:9.2f} {at:7.2f} "
              f"{r.get('measured_over_datasheet', float('nan')):9.2f} {(r['clock_ghz'] or 0):5.2f} {ref:7.2f}")
    for c in correlations:
        print(f"spearman {c['kernel']} {c['shape']}: {_rho(c['spearman'])} (datasheet model "
              f"{_rho(c['spearman_datasheet'])}, {c['candidates']} candidates)")
    print(f"summary: {summary}")


def markdown_summary(result: dict[str, Any]) -> str:
    """One row per kernel and shape of a ``report`` result: measured / predicted (calibrated and datasheet
    models), the Spearman rank correlation over the candidates, and the best candidate against the reference."""
    cycles = any("measured_over_predicted_cycles" in r for r in result["rows"])
    lines = ["| kernel | shape | candidates | measured / predicted: median (range) | "
             + ("cycles, at the kernel's own clock | " if cycles else "") + "datasheet model | "
             "Spearman (datasheet) | best candidate | best vs reference |",
             "|---|---|---|---|" + ("---|" if cycles else "") + "---|---|---|---|"]
    correlations = {(c["kernel"], json.dumps(c["shape"])): c for c in result["correlations"]}
    keys = sorted({(r["kernel"], json.dumps(r["shape"])) for r in result["rows"]})
    for kernel, key in keys:
        group = [r for r in result["rows"] if r["kernel"] == kernel and json.dumps(r["shape"]) == key]
        ratios = [r["measured_over_predicted"] for r in group]
        best = max(group, key=lambda r: r["tflops"])
        ref = "cublas" if kernel == "gemm" else "cudnn"
        corr = correlations.get((kernel, key))
        spearman = f"{_rho(corr['spearman'])} ({_rho(corr['spearman_datasheet'])})" if corr else "-"
        shape = ",".join(f"{k}={v}" for k, v in json.loads(key).items())
        own = [r["measured_over_predicted_cycles"] for r in group if "measured_over_predicted_cycles" in r]
        own_cell = f"{statistics.median(own):.2f} ({min(own):.2f}-{max(own):.2f}) | " if own else "- | "
        lines.append(f"| {kernel} | {shape} | {len(group)} | {statistics.median(ratios):.2f} "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) | " + (own_cell if cycles else "") +
                     f"{statistics.median(r['measured_over_datasheet'] for r in group):.2f} | {spearman} | "
                     f"`{best['name']}` {best['tflops']:.0f} TFLOP/s | {best[f'vs_{ref}']:.2f}x {ref} |")
    return "\n".join(lines)


def sweep_summary(result: dict[str, Any]) -> str:
    """For a ``--sweep`` set, one row per head dimension and sequence length: how many candidates, how many
    predicted within ±15%, the Spearman rank correlation, and what the tuner would have got: the model's first
    candidate and the best of the three that ``twill tune --measure 3`` measures (the best-ranked of each tiling
    first, :func:`twill.tune.rank.measure_picks`), each against the fastest candidate measured, and the fastest
    against the best reference of the run (cuDNN or PyTorch flash)."""
    correlations = {json.dumps(c["shape"]): c for c in result["correlations"]}
    lines = ["| shape | candidates | within ±15% | measured / predicted: median (range) | Spearman | "
             "model's first: vs fastest | best of 3 measured: vs fastest | fastest candidate | fastest vs reference |",
             "|---|---|---|---|---|---|---|---|---|"]
    refs = {json.dumps(r["shape"]): r for r in result["references"]}
    for key in sorted({json.dumps(r["shape"]) for r in result["rows"]}, key=lambda k: tuple(json.loads(k).values())
                      [::-1]):
        group = sorted((r for r in result["rows"] if json.dumps(r["shape"]) == key), key=lambda r: r["predicted_us"])
        ratios = [r["measured_over_predicted"] for r in group]
        fastest = min(group, key=lambda r: r["ms"])
        picks, seen = [], set()
        for r in group:                   # measure_picks: the best-ranked of each tiling first
            tiling = json.dumps(r["options"], sort_keys=True)
            if tiling not in seen:
                seen.add(tiling)
                picks.append(r)
        picked = min(picks[:3], key=lambda r: r["ms"])
        ref = refs[key]
        best_ref = min((n[:-3] for n in ref if n.endswith("_ms")), key=lambda n: ref[f"{n}_ms"])
        shape = ",".join(f"{k}={v}" for k, v in json.loads(key).items())
        lines.append(
            f"| {shape} | {len(group)} | {sum(abs(x - 1) <= 0.15 for x in ratios)} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {_rho(correlations[key]['spearman'])} | "
            f"{fastest['ms'] / group[0]['ms']:.3f} | {fastest['ms'] / picked['ms']:.3f} | `{fastest['name']}` "
            f"{fastest['tflops']:.0f} TFLOP/s | {ref[f'{best_ref}_ms'] / fastest['ms']:.3f}x {best_ref} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("generate", "run", "report", "summary", "sweep-summary"))
    parser.add_argument("kernel_dir")
    parser.add_argument("--machine", default=os.path.join(HERE, "results", "calibration_h200.machine.json"))
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(HERE, "results"))
    parser.add_argument("--only", nargs="*", default=None, help="substrings of candidate names")
    parser.add_argument("--sweep", action="store_true",
                        help="generate: the attention candidates of twill tune's sweep (every distinct kernel)")
    parser.add_argument("--workers", type=int, default=2, help="generate --sweep: solver processes")
    parser.add_argument("--gemm-shapes", nargs="*", default=None, metavar="M,N,K",
                        help="run: time the GEMM candidates at these shapes instead of the manifest's")
    parser.add_argument("--measured", nargs="+", default=None,
                        help="report: the fidelity_measured.json of a run (several: GPU calls of one kernel folder)")
    parser.add_argument("--report", default=None, help="report: where to write (default OUT/model_fidelity.json)")
    parser.add_argument("--kernel-clock", default=None,
                        help="report: a benchmarks/kernel_clock.py measurement of the same kernels (their own clocks)")
    args = parser.parse_args()
    if args.step == "generate":
        generate(args.kernel_dir, args.machine, args.sweep, args.workers)
    elif args.step == "summary":
        print(markdown_summary(json.load(open(args.kernel_dir))))
    elif args.step == "sweep-summary":
        print(sweep_summary(json.load(open(args.kernel_dir))))
    elif args.step == "run":
        from twill.errors import TwillError
        from twill.tune.predict import parse_shape

        try:
            shapes = [parse_shape(text, "gemm").sizes for text in args.gemm_shapes or ()]
        except TwillError as exc:
            parser.error(str(exc))
        run(args.kernel_dir, args.out, args.only, shapes or None)
    else:
        report(args.kernel_dir, args.measured or os.path.join(args.out, "fidelity_measured.json"), args.machine,
               args.report or os.path.join(args.out, "model_fidelity.json"), args.kernel_clock)


if __name__ == "__main__":
    main()
