"""TileLang on the GPU: Twill-emitted, Twill-planned, TileLang-planned and unpipelined kernels, with cuBLAS and
cuDNN in the same run (a benchmark script, not the library).

Two steps, so that the GPU machine needs neither ortools nor the solver:

* ``generate(outdir)`` (CPU, the TileLang environment): ``twill emit tilelang`` modules (the joint solver's
  warp-specialized schedule, as ``T.WSSchedule``) for the GEMM at its default 128x256x64 tile and at the
  examples' 128x128x64 tile, and for attention; ``twill inject`` of ``examples/tilelang/gemm.py`` and
  ``flash_fwd.py`` (Twill's stage/order in their ``T.Pipelined`` loop) and ``twill inject --ws`` of both (their
  loop under a ``T.WSSchedule`` of Twill's warp assignment, ``inject_ws_<name>/<name>_twill_ws.py``); the GEMM
  example in TileLang's manual form (``stage=[0, 0, 2], order=[0, 1, 2]``, the hand-written plan of TileLang's
  own docs and tests) as ``manual_gemm.py``; ``outdir/manifest.json``.
* ``run(kernel_dir, out)`` (GPU, TileLang + torch): every contender of one problem compiled by TileLang for the
  GPU, checked against an fp32 torch reference on fresh random data (outputs poisoned with NaN first), then
  timed device-side: CUDA events around ``CALLS`` calls, ``ROUNDS`` rounds interleaved over the contenders,
  median and spread (min, max) in ms and TFLOP/s. Contenders: GEMM ``M = N = K`` in ``GEMM_SIZES`` (fp16):
  ``tilelang_auto`` (the example, ``num_stages=3``: TileLang's PipelinePlanning and automatic warp
  specialization), ``tilelang_manual`` (the manual form), ``tilelang_plain`` (``num_stages=0``),
  ``twill_planned`` (the injected example), ``twill_planned_ws`` (its ``--ws`` rewrite),
  ``twill_emitted_128x256`` / ``twill_emitted_128x128`` and cuBLAS (``torch.matmul``); no emitted GEMM with
  the wgmma in flight (lag 1): TileLang 0.1.15 cannot express it (docs/codegen.md, "What TileLang cannot
  express"). Attention ``B, H, S, D = ATTN_SHAPE`` (non-causal, fp16; TileLang's layout [B, S, H, D], the
  emitted module's [B, H, S, D]): ``tilelang_auto`` (``num_stages=2``), ``tilelang_plain``, ``twill_planned``,
  ``twill_planned_ws``, ``twill_emitted`` and cuDNN (SDPA). A contender that fails is recorded, never fatal.
  Writes ``out/tilelang_bench_h200.json`` and prints a table.

    python benchmarks/tilelang_bench.py generate benchmarks/tilelang_kernels       # CPU, TileLang venv
    python benchmarks/tilelang_bench.py run benchmarks/tilelang_kernels --out $OUT  # GPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times, load_module  # noqa: E402
GEMM_SIZES = (4096, 8192)
ATTN_SHAPE = (4, 32, 4096, 128)
#: Calls between two events per timed sample, and interleaved samples per contender.
CALLS, ROUNDS = 20, 7
TWILL = [sys.executable, "-m", "twill.cli"]
EMIT = {"gemm_128x256.py": ["gemm"], "gemm_128x128.py": ["gemm", "--block-n", "128"],
        "flash_fwd.py": ["flash-fwd"]}
#: TileLang's manual T.Pipelined form of the GEMM (stage, order).
MANUAL = ([0, 0, 2], [0, 1, 2])
INJECT = {"gemm": ("examples/tilelang/gemm.py:matmul", ["M=4096", "N=4096", "K=4096"]),
          "flash_fwd": ("examples/tilelang/flash_fwd.py:flashattn", ["batch=4", "heads=32", "seq_len=4096",
                                                                      "dim=128"])}


def _twill(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([*TWILL, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip())
    return done.stdout


def generate(outdir: str, arch: str = "h200") -> dict[str, Any]:
    """Emit and inject every Twill contender into ``outdir`` (see the module docstring)."""
    os.makedirs(outdir, exist_ok=True)
    manifest: dict[str, Any] = {"arch": arch, "emitted": {}, "planned": {}, "planned_ws": {}}
    for name, argv in EMIT.items():
        _twill("emit", "tilelang", *argv, "--arch", arch, "-o", os.path.join(outdir, name))
        manifest["emitted"][name] = argv
    for name, (target, args) in INJECT.items():
        for prefix, ws in (("inject", []), ("inject_ws", ["--ws"])):
            summary = json.loads(_twill("inject", target, *(x for a in args for x in ("--arg", a)), "--arch", arch,
                                        *ws, "-o", os.path.join(outdir, f"{prefix}_{name}")))
            manifest["planned_ws" if ws else "planned"][name] = summary
    from twill.integrations.tilelang import rewrite_source

    manual = rewrite_source(os.path.join(ROOT, "examples", "tilelang", "gemm.py"), "matmul", *MANUAL,
                            "TileLang's manual form: stage/order written by hand")
    with open(os.path.join(outdir, "manual_gemm.py"), "w") as f:
        f.write(manual)
    manifest["manual"] = {"stage": MANUAL[0], "order": MANUAL[1]}
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def _load(path: str) -> Any:
    return load_module(path, "tl_bench_")


def _compile(func: Any, pass_configs: dict[str, Any] | None = None) -> Any:
    import tilelang

    return tilelang.compile(func, target="cuda", pass_configs=pass_configs or {})


def _time(fns: dict[str, Callable[[], Any]]) -> dict[str, dict[str, Any]]:
    """Median and spread of ``CALLS`` calls per sample, ``ROUNDS`` samples interleaved over ``fns``."""
    ms, spread, window = event_times(fns, CALLS, ROUNDS)
    return {k: {"ms": ms[k], "min_ms": spread[k][0], "max_ms": spread[k][1], "window": window} for k in fns}


def _relerr(out: Any, ref: Any) -> float:
    import torch

    out = out.float()
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).norm() / ref.norm())


def _gemm_contenders(kernel_dir: str, n: int) -> dict[str, tuple[Callable[[Any, Any, Any], Any], Any]]:
    """name -> (call(a, b, c), None) for the GEMM of size ``n``; failures are recorded by the caller."""
    import torch

    example = _load(os.path.join(ROOT, "examples", "tilelang", "gemm.py"))
    planned = _load(os.path.join(kernel_dir, "inject_gemm", "gemm_twill.py"))
    planned_ws = _load(os.path.join(kernel_dir, "inject_ws_gemm", "gemm_twill_ws.py"))
    manual = _load(os.path.join(kernel_dir, "manual_gemm.py"))
    out: dict[str, Any] = {}
    builders = {
        "tilelang_auto": lambda: _compile(example.matmul.get_tir(n, n, n)),
        "tilelang_manual": lambda: _compile(manual.matmul.get_tir(n, n, n)),
        "tilelang_plain": lambda: _compile(example.matmul.get_tir(n, n, n, num_stages=0)),
        "twill_planned": lambda: _compile(planned.matmul.get_tir(n, n, n)),
        "twill_planned_ws": lambda: _compile(planned_ws.matmul.get_tir(n, n, n)),
    }
    for name in ("gemm_128x256.py", "gemm_128x128.py"):
        mod = _load(os.path.join(kernel_dir, name))
        builders["twill_emitted_" + name[5:-3]] = lambda mod=mod: mod.compiled(n, n, n)
    for name, build in builders.items():
        try:
            out[name] = build()
        except Exception as exc:  # noqa: BLE001 - recorded
            out[name] = exc
    out["cublas"] = lambda a, b, c: torch.matmul(a, b, out=c)
    return out


def bench_gemm(kernel_dir: str) -> list[dict[str, Any]]:
    """Check and time every GEMM contender at each size."""
    import torch

    rows = []
    for n in GEMM_SIZES:
        torch.manual_seed(n)
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
        ref = a.float() @ b.float()
        calls, row = {}, {"problem": f"gemm {n}^3 fp16", "flops": 2.0 * n ** 3, "results": {}}
        for name, kern in _gemm_contenders(kernel_dir, n).items():
            if isinstance(kern, Exception):
                row["results"][name] = {"error": f"{type(kern).__name__}: {str(kern)[:300]}"}
                continue
            c = torch.full((n, n), float("nan"), device="cuda", dtype=torch.float16)
            try:
                kern(a, b, c)
                torch.cuda.synchronize()
                row["results"][name] = {"relerr": _relerr(c, ref)}
                calls[name] = lambda kern=kern, c=c: kern(a, b, c)
            except Exception as exc:  # noqa: BLE001 - recorded
                row["results"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        for name, t in _time(calls).items():
            row["results"][name].update(t, tflops=row["flops"] / t["ms"] / 1e9)
        rows.append(row)
    return rows


def bench_attention(kernel_dir: str) -> dict[str, Any]:
    """Check and time every attention contender at ``ATTN_SHAPE``."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, S, D = ATTN_SHAPE
    torch.manual_seed(S)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.float16) for _ in range(3))   # [B, S, H, D]
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))                          # [B, H, S, D]
    scale = 1.0 / math.sqrt(D)
    ref = torch.softmax((qh.float() @ kh.float().transpose(-1, -2)) * scale, dim=-1) @ vh.float()
    example = _load(os.path.join(ROOT, "examples", "tilelang", "flash_fwd.py"))
    planned = _load(os.path.join(kernel_dir, "inject_flash_fwd", "flash_fwd_twill.py"))
    planned_ws = _load(os.path.join(kernel_dir, "inject_ws_flash_fwd", "flash_fwd_twill_ws.py"))
    emitted = _load(os.path.join(kernel_dir, "flash_fwd.py"))
    bshd = {"tilelang_auto": lambda: _compile(example.flashattn.get_tir(B, H, S, D)),
            "tilelang_plain": lambda: _compile(example.flashattn.get_tir(B, H, S, D, num_stages=0)),
            "twill_planned": lambda: _compile(planned.flashattn.get_tir(B, H, S, D)),
            "twill_planned_ws": lambda: _compile(planned_ws.flashattn.get_tir(B, H, S, D))}
    row: dict[str, Any] = {"problem": f"attention B={B} H={H} S={S} D={D} fp16", "flops": 4.0 * B * H * S * S * D,
                           "results": {}}
    calls = {}

    def add(name: str, call: Callable[[Any], Any], out: Any, to_bhsd: bool) -> None:
        try:
            call(out)
            torch.cuda.synchronize()
            got = out.transpose(1, 2) if to_bhsd else out
            row["results"][name] = {"relerr": _relerr(got, ref)}
            calls[name] = lambda: call(out)
        except Exception as exc:  # noqa: BLE001 - recorded
            row["results"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    for name, build in bshd.items():
        try:
            kern = build()
        except Exception as exc:  # noqa: BLE001 - recorded
            row["results"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        add(name, lambda o, kern=kern: kern(q, k, v, o), torch.full_like(q, float("nan")), True)
    try:
        kern = emitted.compiled(B, H, S, scale)
        add("twill_emitted", lambda o: kern(qh, kh, vh, o), torch.full_like(qh, float("nan")), False)
    except Exception as exc:  # noqa: BLE001 - recorded
        row["results"]["twill_emitted"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    def cudnn(o: Any) -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o.copy_(torch.nn.functional.scaled_dot_product_attention(qh, kh, vh))

    add("cudnn", cudnn, torch.full_like(qh, float("nan")), False)
    for name, t in _time(calls).items():
        row["results"][name].update(t, tflops=row["flops"] / t["ms"] / 1e9)
    return row


def _device() -> dict[str, Any]:
    import tilelang
    import torch

    info: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                            "tilelang": tilelang.__version__, "calls": CALLS, "rounds": ROUNDS}
    return info


def table(result: dict[str, Any]) -> str:
    """One line per problem and contender: median ms, spread, TFLOP/s, relative error, ratios."""
    lines = [f"{'problem':34s} {'contender':24s} {'ms':>8s} {'min-max':>15s} {'TFLOP/s':>8s} {'relerr':>9s}"]
    for row in [*result["gemm"], result["attention"]]:
        for name, r in row["results"].items():
            if "error" in r:
                lines.append(f"{row['problem']:34s} {name:24s} ERROR {r['error'][:80]}")
                continue
            if "ms" not in r:
                lines.append(f"{row['problem']:34s} {name:24s} relerr {r['relerr']:.2e} (not timed)")
                continue
            lines.append(f"{row['problem']:34s} {name:24s} {r['ms']:8.3f} {r['min_ms']:7.3f}-{r['max_ms']:<7.3f} "
                         f"{r['tflops']:8.1f} {r['relerr']:9.2e}")
    return "\n".join(lines)


#: (contender, reference) pairs whose speed ratio the summary states, where both were timed.
RATIOS = (("twill_planned", "tilelang_auto"), ("twill_planned_ws", "tilelang_auto"), ("twill_emitted", "tilelang_auto"),
          ("twill_emitted_128x256", "tilelang_auto"), ("twill_emitted_128x256", "cublas"),
          ("twill_emitted", "cudnn"), ("tilelang_auto", "cublas"), ("tilelang_auto", "cudnn"))


def ratios(result: dict[str, Any]) -> str:
    """One line per problem: the speed ratios of :data:`RATIOS` (reference time / contender time)."""
    lines = []
    for row in [*result["gemm"], result["attention"]]:
        res = row["results"]
        parts = [f"{a} / {b} = {res[b]['ms'] / res[a]['ms']:.2f}x" for a, b in RATIOS
                 if "ms" in res.get(a, {}) and "ms" in res.get(b, {})]
        lines.append(f"{row['problem']}: " + ", ".join(parts))
    return "\n".join(lines)


def run(kernel_dir: str, out: str) -> dict[str, Any]:
    """The GPU step (see the module docstring)."""
    from twill.machine.microbench import ClockSampler

    with ClockSampler() as sampler:
        result = {"device": _device(), "manifest": json.load(open(os.path.join(kernel_dir, "manifest.json"))),
                  "gemm": bench_gemm(kernel_dir), "attention": bench_attention(kernel_dir)}
    for row in [*result["gemm"], result["attention"]]:
        for r in row["results"].values():
            if "window" in r:  # the median SM clock while this problem's contenders ran
                r["clock_ghz"] = sampler.median_ghz(*r.pop("window"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tilelang_bench_h200.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(table(result))
    print(ratios(result))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    g = sub.add_parser("generate")
    g.add_argument("outdir")
    g.add_argument("--arch", default="h200")
    r = sub.add_parser("run")
    r.add_argument("kernel_dir")
    r.add_argument("--out", default=os.environ.get("OUT", "out"))
    t = sub.add_parser("table", help="print the table and the ratios of a results file (CPU)")
    t.add_argument("results")
    args = parser.parse_args(argv)
    if args.step == "table":
        with open(args.results) as fh:
            result = json.load(fh)
        print(f"{table(result)}\n{ratios(result)}")
    elif args.step == "generate":
        generate(args.outdir, args.arch)
    else:
        run(args.kernel_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
