"""Tuned generated kernels against the best references, in one run (issue: calibration and tuning).

* ``generate`` (CPU): for every target shape, ``twill tune``'s sweep (library API, the calibrated H200 model)
  ranks the candidate tiles, sub-tiles, ring depths and register budgets; the ``--top`` solved
  candidates that ``twill tune --measure`` would measure (the best-ranked of each tiling first), with distinct
  kernels, are emitted as Gluon kernels with their predictions and ranks into ``manifest.json``.
* ``run`` (GPU): every kernel is checked against fp32 torch (ragged shapes, NaN-poisoned outputs, fresh random
  data; :mod:`twill.codegen.gluon.check`); then, per shape, the candidates and every reference are timed in
  ``ROUNDS`` interleaved rounds with ``triton.testing.do_bench`` medians, device-side: cuBLAS for GEMM; cuDNN and
  PyTorch flash (FA2) through SDPA and JAX Pallas ``attention_mgpu`` (the best of its tuning configurations
  that fit, 20 calls per sample and one ``block_until_ready``) for attention. "Tuned" is the best measured of
  the top candidates (what ``twill tune --measure`` picks). Writes ``tune_bench.json``, prints a table last.
* Beside the tuned GEMMs, the hand-built 128x256x64 kernels of :data:`FIXED_GEMMS` (wait lag 1, ring depth 3
  and 4, one CTA per tile and persistent) are checked and timed in the same rounds (``fixed`` in the JSON,
  not candidates for "tuned"; persistent ring 4 stages the C tile in halves); a variant the generator refuses
  is recorded with the reason.

    python benchmarks/tune_bench.py generate out/tune --machine benchmarks/results/calibration_h200.machine.json
    python benchmarks/tune_bench.py run out/tune --out $OUT          # GPU, carrying out/tune
    python benchmarks/tune_bench.py repredict benchmarks/results/tune_bench_h200.json \
        --out benchmarks/results/tune_bench_h200_repredicted.json       # CPU: today's model, same measurement
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import clock_summary, torch_references  # noqa: E402

GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024)]
ATTN_SHAPES = [(4, 32, s, d) for d in (128, 64) for s in (2048, 4096, 8192, 16384)]
ROUNDS = 3
JAX_CALLS = 20
#: attention_mgpu tuning configurations tried (block_q, block_kv, max_concurrent_steps); the best that runs.
PALLAS_CONFIGS = ((64, 128, 2), (64, 64, 2), (64, 128, 3))
#: Hand-built GEMM kernels timed beside the tuned ones: (ring depth, persistent) at 128x256x64, lag 1, 8 warps.
FIXED_GEMMS = tuple((depth, persistent) for depth in (3, 4) for persistent in (False, True))


def _targets() -> list[dict[str, Any]]:
    out = [{"kernel": "gemm", "dtype": dt, "problem": "gemm", "sizes": list(s)}
           for dt in ("fp16", "bf16") for s in GEMM_SHAPES]
    out += [{"kernel": "flash-fwd", "dtype": "fp16", "problem": "attention", "sizes": list(s)} for s in ATTN_SHAPES]
    return out


def _name(target: dict[str, Any]) -> str:
    return f"{target['kernel']}_{target['dtype']}_" + "x".join(str(v) for v in target["sizes"])


def _candidates(kernel: str, dtype: str, shape: Any, machine: Any) -> list[Any]:
    """The candidates ``twill tune`` sweeps for ``kernel`` on ``shape``: the kernel's default axes at one dtype
    (and, for attention, the shape's head dimension)."""
    from twill.tune.space import kernel_space

    axes: dict[str, tuple[Any, ...]] = {"dtype": (dtype,)}
    if kernel == "flash-fwd":
        axes["head_dim"] = (shape["D"],)
    return list(kernel_space(kernel, machine, axes).candidates)


def _jobs(kernel: str, candidates: list[Any], machine: Any, *, check_spills: bool) -> list[Any]:
    """One sweep job per candidate: its loop graph, solved with a 60 s limit."""
    from twill.ir.io import graph_to_dict
    from twill.kernels import build_kernel
    from twill.tune.sweep import Job

    return [Job(candidate=c, graph=graph_to_dict(build_kernel(kernel, machine, **dict(c.options))),
                machine=machine, time_limit=60.0, check_spills=check_spills) for c in candidates]


def generate(outdir: str, machine_path: str, top: int, workers: int) -> None:
    from twill.codegen.gluon import emit_gluon
    from twill.machine.calibration import load_machine
    from twill.tune.predict import Shape
    from twill.tune.rank import measure_picks, rank
    from twill.tune.sweep import run_sweep

    machine = load_machine(machine_path)
    os.makedirs(outdir, exist_ok=True)
    entries = []
    for target in _targets():
        started = time.perf_counter()
        shape = Shape(target["problem"], tuple(target["sizes"]))
        candidates = _candidates(target["kernel"], target["dtype"], shape, machine)
        jobs = _jobs(target["kernel"], candidates, machine, check_spills=True)
        results = rank(candidates, run_sweep(jobs, workers=workers), shape, machine)
        kernels, sources = [], set()
        for rank_, result in measure_picks(results, len(results)):  # what `twill tune --measure` would measure
            source = emit_gluon(result.schedule, persistent=bool(result.candidate.persistent))
            if source in sources:  # another candidate with the same schedule (e.g. an unused register budget)
                continue
            sources.add(source)
            file = f"{_name(target)}_{len(kernels)}.py"
            with open(os.path.join(outdir, file), "w") as fh:
                fh.write(source)
            kernels.append({"file": file, "candidate": result.candidate.label(), "rank": rank_,
                            "predicted_us": result.prediction.microseconds})
            if len(kernels) == top:
                break
        fixed = _fixed_gemms(target, machine.name, outdir) if target["problem"] == "gemm" else []
        entries.append({**target, "name": _name(target), "flops": shape.flops(target["kernel"]),
                        "candidates": len(jobs), "kernels": kernels, "fixed": fixed})
        print(f"{_name(target):32s} {len(jobs)} candidates, top: {kernels[0]['candidate'] if kernels else '-'} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump({"machine_file": os.path.basename(machine_path), "top": top, "entries": entries}, fh, indent=1)


def _fixed_gemms(target: dict[str, Any], arch: str, outdir: str) -> list[dict[str, Any]]:
    """Emit the :data:`FIXED_GEMMS` of a GEMM target, hand-built (``twill/kernels/gemm/variants.py``) on the datasheet
    model of ``arch`` (the variants are verified there); a refused variant is listed with its reason."""
    from twill.kernels.gemm.variants import gemm_schedule
    from twill.codegen.gluon import emit_gluon
    from twill.errors import UnsupportedFeatureError
    from twill.kernels import build_kernel
    from twill.machine.models import get_machine
    from twill.schedule.verify import verify

    machine = get_machine(arch)
    graph = build_kernel("gemm", machine, block_m=128, block_n=256, block_k=64, dtype=target["dtype"])
    out = []
    for depth, persistent in FIXED_GEMMS:
        label = f"128x256x64 lag1 ring{depth}" + (" persistent" if persistent else "")
        schedule = gemm_schedule(graph, machine, lag=1, depth=depth, warps=8)
        verify(schedule, machine)
        try:
            source = emit_gluon(schedule, persistent=persistent)
        except UnsupportedFeatureError as exc:
            out.append({"candidate": label, "persistent": persistent, "skipped": str(exc)})
            continue
        file = f"{_name(target)}_fixed_d{depth}{'_persistent' if persistent else ''}.py"
        with open(os.path.join(outdir, file), "w") as fh:
            fh.write(source)
        out.append({"file": file, "candidate": label, "persistent": persistent})
    return out


# ---------------------------------------------------------------------------------------------------- GPU

def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("twill_tuned_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(fn: Any) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=150, return_mode="median")


def _pallas(entry: dict[str, Any]) -> dict[str, Any]:
    """Per tuning configuration of attention_mgpu: a callable timing ``JAX_CALLS`` calls, or the error."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.4")
    try:
        import jax
        from jax.experimental.pallas.ops.gpu import attention_mgpu as am
    except Exception as exc:  # JAX missing on this machine: recorded
        return {"error": f"import: {exc}"}
    b, h, s, d = entry["sizes"]
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(keys[i], (b, s, h, d), jax.numpy.float16) for i in range(3))
    calls: dict[str, Any] = {}
    for bq, bkv, steps in PALLAS_CONFIGS:
        try:
            cfg = am.TuningConfig(block_q=bq, block_kv=bkv, max_concurrent_steps=steps)
            f = jax.jit(lambda a, b_, c, cfg=cfg: am.attention(a, b_, c, cfg))
            f(q, k, v).block_until_ready()

            def many(f=f):
                for _ in range(JAX_CALLS - 1):
                    f(q, k, v)
                f(q, k, v).block_until_ready()

            calls[f"pallas_{bq}_{bkv}_{steps}"] = many
        except Exception as exc:  # a configuration that does not fit is skipped
            calls.setdefault("skipped", []).append(f"{(bq, bkv, steps)}: {str(exc).splitlines()[0][:120]}")
    return calls


def _prepare(kernel_dir: str, entry: dict[str, Any], kern: dict[str, Any], args: tuple[Any, ...],
             calls: dict[str, Any]) -> dict[str, Any]:
    """Load and check one kernel of ``entry``; a correct one is added to ``calls`` (timed by its file name).
    Returns its row (``max_relerr``, or ``error``)."""
    from twill.codegen.gluon.check import check_attention, check_gemm

    info = dict(kern)
    try:
        module = _load(os.path.join(kernel_dir, kern["file"]))
        checks = (check_gemm(module, entry["dtype"]) if entry["problem"] == "gemm"
                  else check_attention(module, entry["dtype"], entry["sizes"][3]))
        info["max_relerr"] = max(c["relerr"] for c in checks)
        if info["max_relerr"] < 1e-2:
            calls[kern["file"]] = ((lambda m=module: m.launch(*args)) if entry["problem"] == "gemm"
                                   else (lambda m=module: m.launch(args[0], args[1], args[2], out=args[3])))
        else:
            info["error"] = f"wrong: relative error {info['max_relerr']:.3g}"
    except Exception as exc:  # recorded; the other candidates still run
        info["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return info


def run(kernel_dir: str, out: str) -> None:
    import torch
    import triton

    from twill.machine.microbench import ClockSampler

    manifest = json.load(open(os.path.join(kernel_dir, "manifest.json")))
    with ClockSampler() as sampler:  # its readings arrive when it stops
        results = _run_entries(kernel_dir, manifest)
    for row in results:
        row["clock_mhz"] = clock_summary(sampler.samples, *row.pop("window"))   # while the shape's rounds ran
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": ROUNDS,
           "machine_file": manifest["machine_file"], "top": manifest["top"], "results": results}
    try:
        import jax

        doc["jax"] = jax.__version__
    except Exception:
        doc["jax"] = None
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tune_bench.json"), "w") as fh:
        json.dump(doc, fh, indent=1)


def _run_entries(kernel_dir: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Check and time every shape of ``manifest``: one row per shape (see :func:`run`)."""
    import torch

    from twill.codegen.gluon.check import torch_dtype

    results = []
    for entry in manifest["entries"]:
        dtype = torch_dtype(entry["dtype"])
        row: dict[str, Any] = {k: entry[k] for k in ("name", "kernel", "dtype", "sizes", "flops")}
        calls: dict[str, Any] = {}
        if entry["problem"] == "gemm":
            m, n, k = entry["sizes"]
            args: tuple[Any, ...] = (torch.randn(m, k, device="cuda", dtype=dtype),
                                     torch.randn(k, n, device="cuda", dtype=dtype),
                                     torch.empty(m, n, device="cuda", dtype=dtype))
        else:
            b, h, s, d = entry["sizes"]
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
            args = (q, k, v, torch.empty_like(q))
        row["kernels"] = [_prepare(kernel_dir, entry, kern, args, calls) for kern in entry["kernels"]]
        row["fixed"] = [_prepare(kernel_dir, entry, kern, args, calls) if "file" in kern else dict(kern)
                        for kern in entry.get("fixed", [])]
        calls.update(torch_references(entry["problem"], args, flash="fa2"))
        if entry["problem"] == "attention":
            pallas = _pallas(entry)
            row["pallas_skipped"] = pallas.pop("skipped", []) + ([pallas.pop("error")] if "error" in pallas else [])
            calls.update(pallas)
        samples: dict[str, list[float]] = {n: [] for n in calls}
        window = time.time()
        for _ in range(ROUNDS):
            for name, fn in calls.items():
                try:
                    ms = _time(fn)
                    samples[name].append(ms / JAX_CALLS if name.startswith("pallas_") else ms)
                except Exception as exc:  # a failing call is recorded by its absence of samples
                    row.setdefault("errors", []).append(f"{name}: {type(exc).__name__}")
        row["window"] = (window, time.time())
        med = {n: statistics.median(v) for n, v in samples.items() if v}
        spread = {n: (min(v), max(v)) for n, v in samples.items() if v}
        for info in row["kernels"] + [i for i in row["fixed"] if "file" in i]:
            if info["file"] in med:
                info.update(ms=med[info["file"]], ms_range=spread[info["file"]],
                            tflops=entry["flops"] / med[info["file"]] / 1e9)
        row["references"] = {n: {"ms": ms, "tflops": entry["flops"] / ms / 1e9, "ms_range": spread[n]}
                             for n, ms in med.items() if not n.endswith(".py")}
        timed = [i for i in row["kernels"] if "ms" in i]
        pallas_best = min((n for n in row["references"] if n.startswith("pallas_")),
                          key=lambda n: row["references"][n]["ms"], default=None)
        named = [n for n in row["references"] if not n.startswith("pallas_")] + ([pallas_best] if pallas_best else [])
        if timed and named:
            tuned = min(timed, key=lambda i: i["ms"])
            best_ref = min(named, key=lambda n: row["references"][n]["ms"])
            row.update(tuned=tuned["candidate"], tuned_tflops=tuned["tflops"], best_reference=best_ref,
                       best_reference_tflops=row["references"][best_ref]["tflops"],
                       ratio=row["references"][best_ref]["ms"] / tuned["ms"],
                       predicted_rank_of_tuned=tuned.get("rank", row["kernels"].index(tuned) + 1))
        for info in row["fixed"]:
            if "ms" in info and "best_reference" in row:
                info["ratio"] = row["references"][row["best_reference"]]["ms"] / info["ms"]
            print(f"  {info['candidate']:36s} " + (f"{info['tflops']:6.0f} TFLOP/s, {info.get('ratio', 0):.3f}x"
                                                   if "ms" in info else info.get("skipped") or info.get("error", "")),
                  flush=True)
        results.append(row)
        print(f"{entry['name']:34s} tuned {row.get('tuned_tflops', float('nan')):6.0f} TFLOP/s vs "
              f"{row.get('best_reference', '-')} {row.get('best_reference_tflops', float('nan')):6.0f}: "
              f"{row.get('ratio', float('nan')):.3f}x", flush=True)
        del args, calls
        torch.cuda.empty_cache()
    return results


def markdown_table(doc: dict[str, Any]) -> str:
    """The tuned kernel per shape against the best reference of the same run; then the hand-built kernels."""
    lines = ["| kernel | shape | tuned candidate (rank predicted) | TFLOP/s | best reference | TFLOP/s | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        shape = "x".join(str(v) for v in r["sizes"])
        if "ratio" not in r:
            lines.append(f"| {r['kernel']} {r['dtype']} | {shape} | (no kernel ran) | | | | |")
            continue
        lines.append(f"| {r['kernel']} {r['dtype']} | {shape} | `{r['tuned']}` ({r['predicted_rank_of_tuned']}) | "
                     f"{r['tuned_tflops']:.0f} | {r['best_reference']} | {r['best_reference_tflops']:.0f} | "
                     f"{r['ratio']:.2f}x |")
    fixed = [(r, f) for r in doc["results"] for f in r.get("fixed", [])]
    if fixed:
        lines += ["", "| kernel | shape | hand-built kernel | TFLOP/s | ratio to the best reference |",
                  "|---|---|---|---|---|"]
        for r, f in fixed:
            shape = "x".join(str(v) for v in r["sizes"])
            measured = (f"{f['tflops']:.0f} | {f['ratio']:.2f}x" if "ratio" in f
                        else f"| {f.get('skipped') or f.get('error', 'not timed')}")
            lines.append(f"| {r['kernel']} {r['dtype']} | {shape} | {f['candidate']} | {measured} |")
    return "\n".join(lines)


def repredict(results_path: str, machine_path: str, out_path: str, workers: int) -> dict[str, Any]:
    """Today's model against a committed measurement (CPU): every measured candidate of ``results_path`` (a
    ``run`` result) is solved again (the sweep's cache makes a repeat fast) and predicted with the current
    :func:`twill.tune.predict.predict`; writes ``{"rows": [...], "within_15_percent": ..., ...}`` to
    ``out_path`` with each candidate's measured time, the prediction stored at ``generate`` time and today's.
    A kernel the code generator would now emit differently was measured in its old form: compare such rows
    with care (``docs/performance.md`` says which)."""
    from twill.machine.calibration import load_machine
    from twill.tune.predict import Shape
    from twill.tune.rank import rank
    from twill.tune.sweep import run_sweep

    machine = load_machine(machine_path)
    doc = json.load(open(results_path))
    rows = []
    for entry in doc["results"]:
        shape = Shape(entry.get("problem") or ("gemm" if entry["kernel"] == "gemm" else "attention"),
                      tuple(entry["sizes"]))
        measured = {k["candidate"]: k for k in entry["kernels"] if k.get("tflops")}
        chosen = [c for c in _candidates(entry["kernel"], entry["dtype"], shape, machine) if c.label() in measured]
        jobs = _jobs(entry["kernel"], chosen, machine, check_spills=False)
        for result in rank(chosen, run_sweep(jobs, workers=workers), shape, machine):
            kern = measured[result.candidate.label()]
            measured_us = entry["flops"] / (kern["tflops"] * 1e12) * 1e6
            rows.append({"name": entry["name"], "candidate": kern["candidate"], "measured_us": measured_us,
                         "predicted_us_then": kern["predicted_us"], "predicted_us": result.prediction.microseconds,
                         "ratio": measured_us / result.prediction.microseconds})
    out = {"results": os.path.basename(results_path), "machine_file": os.path.basename(machine_path),
           "rows": rows,
           "within_15_percent": sum(abs(r["ratio"] - 1) <= 0.15 for r in rows),
           "within_15_percent_then": sum(abs(r["measured_us"] / r["predicted_us_then"] - 1) <= 0.15 for r in rows)}
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=1)
    return out


def repredict_table(doc: dict[str, Any]) -> str:
    """Measured / predicted per measured candidate, with the prediction of ``generate`` time and today's."""
    lines = ["| shape | candidate | measured µs | predicted then (ratio) | predicted now (ratio) |",
             "|---|---|---|---|---|"]
    for r in doc["rows"]:
        then = r["measured_us"] / r["predicted_us_then"]
        lines.append(f"| {r['name']} | `{r['candidate']}` | {r['measured_us']:.0f} | "
                     f"{r['predicted_us_then']:.0f} ({then:.2f}) | {r['predicted_us']:.0f} ({r['ratio']:.2f}) |")
    lines.append(f"| within ±15% | | | {doc['within_15_percent_then']} of {len(doc['rows'])} | "
                 f"{doc['within_15_percent']} of {len(doc['rows'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("generate", "run", "table", "repredict", "repredict-table"))
    parser.add_argument("path", help="kernel folder (generate, run), tune_bench.json (table, repredict) or a "
                                     "repredict output (repredict-table)")
    parser.add_argument("--machine", default=os.path.join(HERE, "results", "calibration_h200.machine.json"))
    parser.add_argument("--top", type=int, default=3, help="candidates emitted and measured per shape")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(HERE, "results"))
    args = parser.parse_args()
    if args.step == "generate":
        generate(args.path, args.machine, args.top, args.workers)
    elif args.step == "run":
        run(args.path, args.out)
    elif args.step == "repredict":
        out = os.path.join(args.out, "tune_bench_repredicted.json") if os.path.isdir(args.out) else args.out
        print(repredict_table(repredict(args.path, args.machine, out, args.workers)))
    elif args.step == "repredict-table":
        print(repredict_table(json.load(open(args.path))))
    else:
        print(markdown_table(json.load(open(args.path))))


if __name__ == "__main__":
    main()
