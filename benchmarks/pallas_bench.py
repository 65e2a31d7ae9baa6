"""Generate, check and time the emitted Pallas Mosaic GPU kernels (a benchmark script, not the library).

Two steps, so that the GPU machine needs neither ortools nor the solver:

* ``generate(outdir)`` (CPU): builds every variant's schedule (the joint solver's for ``*_solver_*``
  variants, else the hand-built one of the family's ``variants.py``), verifies it, emits the Pallas module into
  ``outdir/<variant>.py`` and writes ``outdir/manifest.json``. A schedule the Pallas backend cannot emit is
  recorded in the manifest with its ``cannot emit`` reason.
* ``run(kernel_dir, out)`` (GPU, JAX only): for each emitted module, checks correctness against an fp32 JAX
  reference on fresh random inputs of ragged shapes (random data, so an output tile never written cannot
  pass as zeros; JAX gives every call a fresh output buffer), then times it beside the references of the
  same run: ``attention_mgpu`` (best of its valid tuning configs) and cuDNN
  (``jax.nn.dot_product_attention(implementation="cudnn")``) for attention; ``hopper_matmul_mgpu`` (best of
  its valid tuning configs) and XLA's dot (cuBLAS) for GEMM. Timing is device-side: ``CALLS`` calls between
  two synchronisations, rounds interleaved over the contenders, median over ``ROUNDS``. One failing kernel
  or reference is recorded, never fatal. Writes ``out/pallas_bench.json`` and prints a table last.

    python benchmarks/pallas_bench.py generate benchmarks/pallas_kernels          # CPU
    python benchmarks/pallas_bench.py run benchmarks/pallas_kernels --out $OUT    # GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import load_module  # noqa: E402

GEMM_SIZES = (4096, 8192)
GEMM_RAGGED = ((300, 520, 200), (257, 333, 129), (1000, 72, 4104), (128, 256, 64))
ATTN_SEQS = (2048, 4096, 8192, 16384)
ATTN_RAGGED = ((1, 77, 3), (2, 1000, 2), (1, 4096, 2), (2, 200, 1))  # (B, S, H)
ATTN_BATCH, ATTN_HEADS = 4, 32
#: Calls between two synchronisations per timed sample (at most; fewer for large problems, see
#: :func:`calls_for`), and interleaved samples per contender.
CALLS, ROUNDS = 20, 7
#: Floating-point operations one timed sample should cover at least (about 30 ms on an H200), so that a
#: sample of a large problem needs only a few calls and a small problem still amortises the two syncs.
SAMPLE_FLOPS = 2e13

#: (variant name, kernel, kernel options, hand-built schedule shape)
SUITE: tuple[tuple[str, str, dict[str, Any], dict[str, Any]], ...] = (
    ("gemm_128x256x64_lag1_d4", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64}, {"lag": 1, "depth": 4}),
    ("gemm_128x256x64_lag1_d3", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64}, {"lag": 1, "depth": 3}),
    ("gemm_128x256x64_lag0_d3", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64}, {"lag": 0, "depth": 3}),
    ("gemm_128x128x64_lag1_d4", "gemm", {"block_m": 128, "block_n": 128, "block_k": 64}, {"lag": 1, "depth": 4}),
    ("gemm_bf16_128x256x64_lag1_d4", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64, "dtype": "bf16"},
     {"lag": 1, "depth": 4}),
    ("gemm_solver_128x256x64_d4", "gemm", {}, {"solver": True, "depth": 4}),
    ("fa_d128_sub2_ahead0_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 0, "depth": 2}),
    ("fa_d128_sub2_grouped_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128},
     {"ahead": 0, "depth": 2, "grouped": True}),
    ("fa_d128_sub1_ahead0_d2", "flash-fwd", {"subtiles": 1, "head_dim": 128}, {"ahead": 0, "depth": 2}),
    ("fa_d128_sub2_ahead0_d3", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 0, "depth": 3}),
    ("fa_d64_sub2_ahead0_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64}, {"ahead": 0, "depth": 3}),
    ("fa_d64_sub2_grouped_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64},
     {"ahead": 0, "depth": 3, "grouped": True}),
    ("fa_d128_sub2_ahead1_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 1, "depth": 2}),
    ("fa_d128_sub2_ahead1_d3", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 1, "depth": 3}),
    ("fa_d64_sub2_ahead1_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64}, {"ahead": 1, "depth": 3}),
    ("fa_d64_sub2_grouped_ahead1_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64},
     {"ahead": 1, "depth": 3, "grouped": True}),
    ("fa_d128_sub2_solver_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"solver": True, "depth": 2}),
    ("fa_d128_sub2_solver_d3", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"solver": True, "depth": 3}),
    ("fa_d64_sub2_solver_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64}, {"solver": True, "depth": 3}),
)


# -- generation (CPU) ------------------------------------------------------------------------------------
def generate(outdir: str, arch: str = "h100") -> list[dict[str, Any]]:
    """Emit every suite variant into ``outdir`` and write ``manifest.json``; returns the manifest rows."""
    from benchmarks.gluon_bench import variant_schedule
    from twill.codegen.pallas import pallas_plan, render_plan
    from twill.errors import UnsupportedFeatureError
    from twill.machine.models import get_machine

    machine = get_machine(arch)
    os.makedirs(outdir, exist_ok=True)
    rows = []
    for name, kernel, options, shape in SUITE:
        sched = variant_schedule(kernel, options, shape, machine)
        row: dict[str, Any] = {"name": name, "kernel": kernel, "options": options, "solver": sched.solver,
                               "ii": sched.ii, "stages": sched.num_stages}
        try:
            plan = pallas_plan(sched)
            source = render_plan(plan)
        except UnsupportedFeatureError as exc:
            rows.append({**row, "file": None, "cannot_emit": str(exc)})
            continue
        with open(os.path.join(outdir, f"{name}.py"), "w") as fh:
            fh.write(source)
        rows.append({**row, "file": f"{name}.py", "rings": {r.name: r.depth for r in plan.rings},
                     "mma_lag": getattr(plan.decisions, "mma_lag", 0), "compute_partitions": len(plan.compute),
                     "turns": [list(t.ops) for t in plan.turns]})
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return rows


# -- checks and timing (GPU) -----------------------------------------------------------------------------
def _load(path: str) -> Any:
    return load_module(path, "twill_pallas_")


def _dtype(name: str) -> Any:
    import jax.numpy as jnp

    return {"fp16": jnp.float16, "bf16": jnp.bfloat16}[name]


def _relerr(out: Any, ref: Any) -> float:
    import jax.numpy as jnp

    out = out.astype(jnp.float32)
    return float(jnp.max(jnp.abs(out - ref)) / (jnp.max(jnp.abs(ref)) + 1e-6))


def _random(key: int, shape: tuple[int, ...], dtype: str) -> Any:
    import jax

    return jax.random.normal(jax.random.key(key), shape, _dtype(dtype))


def check_gemm(mod: Any, dtype: str) -> list[dict[str, Any]]:
    """Ragged shapes against an fp32 reference."""
    import jax.numpy as jnp

    rows = []
    for i, (m, n, k) in enumerate(GEMM_RAGGED):
        a, b = _random(2 * i, (m, k), dtype), _random(2 * i + 1, (k, n), dtype)
        out = mod.gemm(a, b)
        ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
        rows.append({"shape": [m, n, k], "finite": bool(jnp.isfinite(out).all()), "relerr": _relerr(out, ref)})
    return rows


def _attention_ref(q: Any, k: Any, v: Any) -> Any:
    import jax
    import jax.numpy as jnp

    q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
    s = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(q.shape[-1])
    return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(s, axis=-1), v)


def check_attention(mod: Any, dtype: str, head_dim: int) -> list[dict[str, Any]]:
    """Ragged (B, S, H) against an fp32 reference."""
    import jax.numpy as jnp

    rows = []
    for i, (b, s, h) in enumerate(ATTN_RAGGED):
        q, k, v = (_random(3 * i + j, (b, s, h, head_dim), dtype) for j in range(3))
        out = mod.attention(q, k, v)
        rows.append({"shape": [b, s, h, head_dim], "finite": bool(jnp.isfinite(out).all()),
                     "relerr": _relerr(out, _attention_ref(q, k, v))})
    return rows


def calls_for(flops: float) -> int:
    """Calls per timed sample for a problem of ``flops``: enough to cover ``SAMPLE_FLOPS``, 2 to ``CALLS``."""
    return max(2, min(CALLS, int(SAMPLE_FLOPS // max(flops, 1.0))))


def device_ms(fn: Callable[[], Any], calls: int = CALLS) -> float:
    """Milliseconds per call of one sample: ``calls`` calls between two synchronisations."""
    fn().block_until_ready()
    t0 = time.perf_counter()
    for _ in range(calls - 1):
        fn()
    fn().block_until_ready()
    return (time.perf_counter() - t0) * 1e3 / calls


def interleaved(contenders: dict[str, Callable[[], Any]], calls: int = CALLS) -> tuple[dict[str, Any], dict[str, Any]]:
    """Median ms per contender over ``ROUNDS`` interleaved rounds (a contender that fails is recorded as its
    error), and each contender's ``[min, max]`` ms over the rounds."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    failed: dict[str, str] = {}
    for _ in range(ROUNDS):
        for name, fn in contenders.items():
            if name in failed:
                continue
            try:
                samples[name].append(device_ms(fn, calls))
            except Exception as exc:  # recorded, not fatal
                failed[name] = f"ERR {type(exc).__name__}: {str(exc)[:160]}"
    medians = {name: failed.get(name) or statistics.median(samples[name]) for name in contenders}
    spread = {name: [min(v), max(v)] for name, v in samples.items() if v and name not in failed}
    return medians, spread


def _best(configs: list[tuple[str, Callable[[], Any]]], calls: int) -> tuple[str, Callable[[], Any] | None]:
    """The fastest of a library kernel's tuning configs that compile and run (one sample each), or the last
    error when none does."""
    best: tuple[str, Callable[[], Any] | None] = ("no config ran", None)
    best_ms = float("inf")
    for label, fn in configs:
        try:
            ms = device_ms(fn, calls)
        except Exception as exc:  # a config that does not fit (shared memory) is skipped, as JAX's tuner does
            if best[1] is None:
                best = (f"ERR {label}: {type(exc).__name__}: {str(exc)[:120]}", None)
            continue
        if ms < best_ms:
            best, best_ms = (label, fn), ms
    return best


def _failed(label: str) -> Callable[[], Any]:
    """A contender standing for a reference none of whose configs ran: raises, so ``interleaved`` records it."""
    def fail() -> Any:
        raise RuntimeError(label)

    return fail


def attention_contenders(q: Any, k: Any, v: Any, calls: int, same_tile: bool = False
                         ) -> dict[str, tuple[str, Callable[[], Any]]]:
    """attention_mgpu at its best valid config and cuDNN through jax.nn.dot_product_attention; with
    ``same_tile`` also attention_mgpu at its best 128-key-block config (``attention_mgpu_bkv128``)."""
    import jax
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    configs = []
    for block_kv, steps in itertools.product((64, 128, 256), (2, 3, 4)):
        cfg = am.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=steps)
        f = jax.jit(lambda a, b, c, cfg=cfg: am.attention(a, b, c, cfg))
        configs.append((f"block_kv={block_kv} steps={steps}", lambda f=f: f(q, k, v)))
    label, fn = _best(configs, calls)
    cudnn = jax.jit(lambda a, b, c: jax.nn.dot_product_attention(a, b, c, implementation="cudnn"))
    refs = {"attention_mgpu": (label, fn or _failed(label)), "cudnn": ("cudnn", lambda: cudnn(q, k, v))}
    if same_tile:  # attention_mgpu restricted to the emitted kernels' 128-key blocks (separates tile from pipeline)
        same, same_fn = _best([(lbl, f) for lbl, f in configs if lbl.startswith("block_kv=128 ")], calls)
        refs["attention_mgpu_bkv128"] = (same, same_fn or _failed(same))
    return refs


def gemm_contenders(a: Any, b: Any, calls: int) -> dict[str, tuple[str, Callable[[], Any]]]:
    """hopper_matmul_mgpu at its best valid config and XLA's dot (cuBLAS)."""
    import jax
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    configs = []
    for tile_m, tile_n, wg_dim, width in itertools.product((64, 128), (128, 256), tuple(hm.MatmulDimension),
                                                          (1, 4, 8)):
        cfg = hm.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=64, max_concurrent_steps=4,
                              wg_dimension=wg_dim, grid_tile_width=width)
        f = jax.jit(lambda x, y, cfg=cfg: hm.matmul(x, y, None, cfg))
        configs.append((f"tile={tile_m}x{tile_n} wg={wg_dim} width={width}", lambda f=f: f(a, b)))
    label, fn = _best(configs, calls)
    dot = jax.jit(lambda x, y: x @ y)
    return {"hopper_matmul_mgpu": (label, fn or _failed(label)), "cublas": ("XLA dot", lambda: dot(a, b))}


#: (kernel, dtype, size) -> (inputs, reference contenders): shared by every emitted kernel of that shape.
_SHARED: dict[tuple[str, str, int, int], tuple[tuple[Any, ...], dict[str, tuple[str, Callable[[], Any]]]]] = {}


def _shared(kernel: str, dtype: str, size: int, head_dim: int, same_tile: bool
            ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random inputs of one benchmark size and the references tuned on them (once per run)."""
    key = (kernel, dtype, size, head_dim)
    if key not in _SHARED:
        calls = calls_for(_flops(kernel, size, head_dim))
        if kernel == "gemm":
            args = (_random(1, (size, size), dtype), _random(2, (size, size), dtype))
            _SHARED[key] = args, gemm_contenders(*args, calls)
        else:
            args = tuple(_random(j, (ATTN_BATCH, size, ATTN_HEADS, head_dim), dtype) for j in range(3))
            _SHARED[key] = args, attention_contenders(*args, calls, same_tile)
    return _SHARED[key]


def _flops(kernel: str, size: int, head_dim: int) -> int:
    """Floating-point operations of one call at a benchmark size (GEMM size^3, attention B, H fixed)."""
    if kernel == "gemm":
        return 2 * size ** 3
    return 4 * ATTN_BATCH * ATTN_HEADS * size * size * head_dim


def _time_kernel(entry: dict[str, Any], mod: Any, quick: bool, only_sizes: list[int] | None,
                 same_tile: bool) -> list[dict[str, Any]]:
    """Time one emitted kernel beside its references at every benchmark size."""
    dtype = entry["options"].get("dtype", "fp16")
    gemm = entry["kernel"] == "gemm"
    head_dim = 0 if gemm else entry["options"].get("head_dim", 128)
    sizes = GEMM_SIZES if gemm else ATTN_SEQS
    rows = []
    for size in sizes[:1] if quick else [s for s in sizes if not only_sizes or s in only_sizes]:
        args, refs = _shared(entry["kernel"], dtype, size, head_dim, same_tile)
        fn = mod.gemm if gemm else mod.attention
        flops = _flops(entry["kernel"], size, head_dim)
        start = time.time()
        ms, spread = interleaved({"twill": lambda: fn(*args), **{n: f for n, (_, f) in refs.items()}},
                                 calls_for(flops))
        shape = ({"M": size, "N": size, "K": size} if gemm else
                 {"B": ATTN_BATCH, "S": size, "H": ATTN_HEADS, "D": head_dim})
        row = _row(shape, flops, ms, refs)
        row.update(ms_spread=spread, calls=calls_for(flops), window=[start, time.time()])
        rows.append(row)
    return rows


def _row(shape: dict[str, int], flops: int, ms: dict[str, Any], refs: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    tflops = {n: (flops / t / 1e9 if isinstance(t, float) else t) for n, t in ms.items()}
    ratios = {f"vs_{n}": tflops["twill"] / t for n, t in tflops.items()
              if n != "twill" and isinstance(t, float) and isinstance(tflops["twill"], float)}
    return {**shape, "tflops": tflops, **ratios, "configs": {n: label for n, (label, _) in refs.items()}}


def run(kernel_dir: str, out: str, *, only: list[str] | None = None, quick: bool = False,
        sizes: list[int] | None = None, same_tile: bool = False) -> dict[str, Any]:
    """Check and time every kernel of ``kernel_dir/manifest.json`` with the SM clock sampled throughout;
    write ``out/pallas_bench.json`` (after each kernel, and with the clocks at the end)."""
    from twill.machine.microbench import ClockSampler

    with ClockSampler() as sampler:
        result = _run(kernel_dir, out, only=only, quick=quick, sizes=sizes, same_tile=same_tile)
    for k in result["kernels"]:
        for t in k.get("timing", []):
            t["clock_ghz"] = sampler.median_ghz(*t.pop("window"))
    _write(result, out)
    print(table(result))
    return result


def _jaxlib_version() -> str:
    import jaxlib

    return jaxlib.__version__


def _write(result: dict[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "pallas_bench.json"), "w") as fh:
        json.dump(result, fh, indent=1)


def _run(kernel_dir: str, out: str, *, only: list[str] | None, quick: bool,
         sizes: list[int] | None, same_tile: bool) -> dict[str, Any]:
    import jax

    with open(os.path.join(kernel_dir, "manifest.json")) as fh:
        manifest = json.load(fh)
    if only:
        manifest = [m for m in manifest if any(o in m["name"] for o in only)]
    result: dict[str, Any] = {"versions": {"jax": jax.__version__, "jaxlib": _jaxlib_version(),
                                                           "device": jax.devices()[0].device_kind},
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kernels": []}
    for entry in manifest:
        row = dict(entry)
        if not entry.get("file"):
            result["kernels"].append(row)
            continue
        t0 = time.time()
        try:
            mod = _load(os.path.join(kernel_dir, entry["file"]))
            dtype = entry["options"].get("dtype", "fp16")
            row["checks"] = (check_gemm(mod, dtype) if entry["kernel"] == "gemm"
                             else check_attention(mod, dtype, entry["options"].get("head_dim", 128)))
            row["correct"] = all(c["finite"] and c["relerr"] < 2e-2 for c in row["checks"])
            if row["correct"]:
                row["timing"] = _time_kernel(entry, mod, quick, sizes, same_tile)
        except Exception as exc:  # one failing kernel is recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["seconds"] = round(time.time() - t0, 1)
        result["kernels"].append(row)
        _write(result, out)
    return result


def table(result: dict[str, Any]) -> str:
    """One line per kernel and size: TFLOP/s of Twill's kernel and the ratios to each reference."""
    lines = [f"{'kernel':32s} {'size':>16s} {'twill':>8s}  ratios"]
    for k in result["kernels"]:
        if not k.get("file"):
            lines.append(f"{k['name']:32s} {k['cannot_emit'][:90]}")
        elif "error" in k or not k.get("correct"):
            lines.append(f"{k['name']:32s} {'FAILED':>16s} {k.get('error', 'wrong result')[:80]}")
        for t in k.get("timing", []):
            size = f"S={t['S']} D={t['D']}" if "S" in t else f"{t['M']}^3"
            tw = t["tflops"]["twill"]
            ratios = " ".join(f"{n[3:]}={v:.2f}" for n, v in t.items() if n.startswith("vs_"))
            lines.append(f"{k['name']:32s} {size:>16s} {tw if isinstance(tw, str) else f'{tw:8.1f}'}  {ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/pallas_bench.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    g = sub.add_parser("generate", help="emit the suite's Pallas modules (CPU)")
    g.add_argument("outdir")
    g.add_argument("--arch", default="h100", type=str.lower, help="target GPU (default h100)")
    r = sub.add_parser("run", help="check and time emitted modules (GPU)")
    r.add_argument("kernel_dir")
    r.add_argument("--out", default=os.environ.get("OUT") or "out")
    r.add_argument("--only", nargs="*", default=None, help="substrings of variant names to run")
    r.add_argument("--quick", action="store_true", help="only the first size of each kernel")
    r.add_argument("--sizes", nargs="*", type=int, default=None, help="only these sizes (S or GEMM edge)")
    r.add_argument("--same-tile", action="store_true",
                   help="also time attention_mgpu at its best 128-key-block configuration (the emitted tile)")
    t = sub.add_parser("table", help="print the table of a results file (CPU)")
    t.add_argument("results")
    args = parser.parse_args(argv)
    if args.step == "table":
        with open(args.results) as fh:
            print(table(json.load(fh)))
        return 0
    if args.step == "generate":
        rows = generate(args.outdir, args.arch)
        print(f"wrote {sum(1 for r in rows if r['file'])} modules and manifest.json to {args.outdir}")
        return 0
    run(args.kernel_dir, args.out, only=args.only, quick=args.quick, sizes=args.sizes, same_tile=args.same_tile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
