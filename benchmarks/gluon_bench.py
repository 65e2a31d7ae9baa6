"""Generate, check and time the emitted Gluon kernels (a benchmark script, not part of the library).

Two steps, so that the GPU machine needs neither ortools nor the solver:

* ``generate(outdir)`` (CPU): builds every variant's schedule (the joint solver's for ``*_solver_*``
  variants, else the hand-built one of the family's ``variants.py``), verifies it, emits the kernel into
  ``outdir/<variant>.py`` and writes ``outdir/manifest.json``.
* ``run(kernel_dir, out)`` (GPU): for each emitted kernel, checks correctness against torch in fp32 on fresh
  random inputs with the output poisoned with NaN (ragged shapes included), then times it with
  ``triton.testing.do_bench`` (median) beside the references of the same run: cuBLAS (``torch.matmul``) for
  GEMM; cuDNN SDPA, PyTorch flash (FA2) and JAX Pallas Mosaic GPU ``attention_mgpu`` for attention.
  Every time is device-side: ``do_bench`` brackets each timed call with CUDA events and synchronizes once
  at the end; JAX, whose calls only finish on the host at ``block_until_ready``, is timed over
  ``JAX_CALLS`` calls per ``do_bench`` sample with a single ``block_until_ready`` after the last one.
  Writes ``out/gluon_bench.json`` and prints a table last.
* ``sanity(kernel_dir)`` (GPU): one small checked launch per kernel, for compute-sanitizer runs.

    python benchmarks/gluon_bench.py generate benchmarks/gluon_kernels
    python benchmarks/gluon_bench.py run benchmarks/gluon_kernels --out $OUT
    python benchmarks/gluon_bench.py sanity benchmarks/gluon_kernels
    python benchmarks/gluon_bench.py predict benchmarks/results/gluon_bench_h200_persistent.json ... --out P.json

* ``predict(results...)`` (CPU): today's prediction of the attention kernels of committed runs, against
  their measured times (causal kernels included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# the output checks an emitted kernel must pass live in the library
from twill.codegen.gluon.check import check_gemm  # noqa: E402
from twill.codegen.gluon.check import relative_error as _relerr  # noqa: E402
from twill.codegen.gluon.check import torch_dtype as _dtype  # noqa: E402

GEMM_SIZES = (4096, 8192)
ATTN_SEQS = (2048, 4096, 8192, 16384)
ATTN_RAGGED = ((1, 3, 77), (2, 2, 1000), (1, 2, 4096), (2, 1, 200))
ATTN_BATCH, ATTN_HEADS = 4, 32
#: K/V heads of the grouped-query variants (ATTN_HEADS / ATTN_KV_HEADS = 4 query heads per K/V head).
ATTN_KV_HEADS = 8
#: JAX calls per do_bench sample: one host synchronisation (``block_until_ready``) per this many calls.
JAX_CALLS = 20

#: (variant name, kernel, kernel options, hand-built schedule shape)
SUITE: tuple[tuple[str, str, dict[str, Any], dict[str, Any]], ...] = (
    ("gemm_128x256x64_lag1_d4", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64}, {"lag": 1, "depth": 4}),
    ("gemm_128x256x64_lag1_d3", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64}, {"lag": 1, "depth": 3}),
    ("gemm_128x256x64_lag0_d3", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64}, {"lag": 0, "depth": 3}),
    ("gemm_128x128x64_lag1_d4", "gemm", {"block_m": 128, "block_n": 128, "block_k": 64}, {"lag": 1, "depth": 4}),
    ("gemm_bf16_128x256x64_lag1_d4", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64, "dtype": "bf16"},
     {"lag": 1, "depth": 4}),
    # persistent kernels of the same schedules (emit_gluon(..., persistent=True); ring 4 stages C in halves)
    ("gemm_128x256x64_lag1_d3_persistent", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64},
     {"lag": 1, "depth": 3, "persistent": True}),
    ("gemm_128x256x64_lag1_d4_persistent", "gemm", {"block_m": 128, "block_n": 256, "block_k": 64},
     {"lag": 1, "depth": 4, "persistent": True}),
    ("gemm_bf16_128x256x64_lag1_d3_persistent", "gemm",
     {"block_m": 128, "block_n": 256, "block_k": 64, "dtype": "bf16"}, {"lag": 1, "depth": 3, "persistent": True}),
    ("fa_d128_sub2_ahead1_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 1, "depth": 2}),
    ("fa_d128_sub2_ahead0_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 0, "depth": 2}),
    ("fa_d128_sub1_ahead1_d2", "flash-fwd", {"subtiles": 1, "head_dim": 128}, {"ahead": 1, "depth": 2}),
    ("fa_d128_sub2_ahead1_d3", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"ahead": 1, "depth": 3}),
    ("fa_d64_sub2_ahead1_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64}, {"ahead": 1, "depth": 3}),
    ("fa_d64_sub2_grouped_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64},
     {"ahead": 1, "depth": 3, "grouped": True}),
    ("fa_d64_sub1_ahead1_d3", "flash-fwd", {"subtiles": 1, "head_dim": 64}, {"ahead": 1, "depth": 3}),
    ("gemm_solver_128x256x64_d3", "gemm", {}, {"solver": True, "depth": 3}),
    ("gemm_solver_128x256x64_d4", "gemm", {}, {"solver": True, "depth": 4}),
    ("gemm_solver_bf16_128x256x64_d3", "gemm", {"dtype": "bf16"}, {"solver": True, "depth": 3}),
    ("fa_d128_sub2_solver_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"solver": True, "depth": 2}),
    ("fa_d128_sub2_solver_d3", "flash-fwd", {"subtiles": 2, "head_dim": 128}, {"solver": True, "depth": 3}),
    ("fa_d128_sub1_solver_d2", "flash-fwd", {"subtiles": 1, "head_dim": 128}, {"solver": True, "depth": 2}),
    ("fa_d64_sub2_solver_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64}, {"solver": True, "depth": 3}),
    ("fa_bf16_d128_sub2_solver_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128, "dtype": "bf16"},
     {"solver": True, "depth": 2}),
    ("fa_bf16_d128_sub2_ahead1_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128, "dtype": "bf16"},
     {"ahead": 1, "depth": 2}),
    # causal (the loop stops at the diagonal), grouped-query K/V heads, head dim 256 (64-key tiles: 227 KB)
    ("fa_causal_d128_sub2_ahead1_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128, "causal": True},
     {"ahead": 1, "depth": 2}),
    ("fa_causal_d128_sub2_solver_d2", "flash-fwd", {"subtiles": 2, "head_dim": 128, "causal": True},
     {"solver": True, "depth": 2}),
    ("fa_causal_d64_sub2_ahead1_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64, "causal": True},
     {"ahead": 1, "depth": 3}),
    ("fa_causal_d64_sub2_solver_d3", "flash-fwd", {"subtiles": 2, "head_dim": 64, "causal": True},
     {"solver": True, "depth": 3}),
    ("fa_causal_d256_bn64_sub2_ahead1_d2", "flash-fwd",
     {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, {"ahead": 1, "depth": 2}),
    ("fa_causal_d256_bn64_sub2_solver_d2", "flash-fwd",
     {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, {"solver": True, "depth": 2}),
    ("fa_d256_bn64_sub2_ahead1_d2", "flash-fwd", {"subtiles": 2, "head_dim": 256, "block_n": 64},
     {"ahead": 1, "depth": 2}),
    ("fa_causal_gqa8_d128_sub2_ahead1_d2", "flash-fwd",
     {"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": ATTN_KV_HEADS}, {"ahead": 1, "depth": 2}),
    ("fa_causal_bf16_d128_sub2_ahead1_d2", "flash-fwd",
     {"subtiles": 2, "head_dim": 128, "causal": True, "dtype": "bf16"}, {"ahead": 1, "depth": 2}),
    # persistent attention forward of the same schedules (emit_gluon(..., persistent=True))
    ("fa_d128_sub2_solver_d2_persistent", "flash-fwd", {"subtiles": 2, "head_dim": 128},
     {"solver": True, "depth": 2, "persistent": True}),
    ("fa_causal_d128_sub2_solver_d2_persistent", "flash-fwd", {"subtiles": 2, "head_dim": 128, "causal": True},
     {"solver": True, "depth": 2, "persistent": True}),
    ("fa_causal_d64_sub2_solver_d3_persistent", "flash-fwd", {"subtiles": 2, "head_dim": 64, "causal": True},
     {"solver": True, "depth": 3, "persistent": True}),
    ("fa_d64_sub2_solver_d3_persistent", "flash-fwd", {"subtiles": 2, "head_dim": 64},
     {"solver": True, "depth": 3, "persistent": True}),
    ("fa_d128_sub2_solver_d3_persistent", "flash-fwd", {"subtiles": 2, "head_dim": 128},
     {"solver": True, "depth": 3, "persistent": True}),
    ("fa_causal_d256_bn64_sub2_ahead1_d2_persistent", "flash-fwd",
     {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, {"ahead": 1, "depth": 2, "persistent": True}),
    ("fa_causal_d256_bn64_sub2_solver_d2_persistent", "flash-fwd",
     {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, {"solver": True, "depth": 2, "persistent": True}),
    ("fa_causal_gqa8_d128_sub2_ahead1_d2_persistent", "flash-fwd",
     {"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": ATTN_KV_HEADS},
     {"ahead": 1, "depth": 2, "persistent": True}),
    # three compute partitions (BLOCK_M 192, FA3's D = 64 tile), tensor-core turns round robin
    ("fa_d64_sub3_solver_d2", "flash-fwd", {"subtiles": 3, "head_dim": 64}, {"solver": True, "depth": 2}),
    ("fa_d64_sub3_solver_d3", "flash-fwd", {"subtiles": 3, "head_dim": 64}, {"solver": True, "depth": 3}),
    ("fa_d64_bn64_sub3_solver_d2", "flash-fwd", {"subtiles": 3, "head_dim": 64, "block_n": 64},
     {"solver": True, "depth": 2}),
    ("fa_causal_d64_sub3_solver_d2", "flash-fwd", {"subtiles": 3, "head_dim": 64, "causal": True},
     {"solver": True, "depth": 2}),
    ("fa_d128_sub3_solver_d2", "flash-fwd", {"subtiles": 3, "head_dim": 128}, {"solver": True, "depth": 2}),
    # one extra copy (SolveOptions.extra_copies = 1): at the II the search stops at, the second copy lets S be
    # issued a stage ahead (the ``unhoisted`` objective); twill.ops.attention's D = 256 forward
    ("fa_d256_bn64_sub2_solver_copies2_d2", "flash-fwd", {"subtiles": 2, "head_dim": 256, "block_n": 64},
     {"solver": True, "depth": 2, "extra_copies": 1}),
    ("fa_causal_d256_bn64_sub2_solver_copies2_d2", "flash-fwd",
     {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, {"solver": True, "depth": 2, "extra_copies": 1}),
    ("fa_causal_d256_bn64_sub2_solver_copies2_d2_persistent", "flash-fwd",
     {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True},
     {"solver": True, "depth": 2, "extra_copies": 1, "persistent": True}),
    ("fa_d64_sub3_solver_d2_persistent", "flash-fwd", {"subtiles": 3, "head_dim": 64},
     {"solver": True, "depth": 2, "persistent": True}),
    ("fa_causal_d64_sub3_solver_d2_persistent", "flash-fwd", {"subtiles": 3, "head_dim": 64, "causal": True},
     {"solver": True, "depth": 2, "persistent": True}),
)


# -- generation (CPU) ------------------------------------------------------------------------------------
def variant_schedule(kernel: str, options: dict[str, Any], shape: dict[str, Any], machine: Any) -> Any:
    """The schedule of one suite entry (verified): the joint solver's (``shape["solver"]``, streaming depth
    ``shape["depth"]``, ``shape["extra_copies"]``) or a hand-built one."""
    from twill.kernels.flash_fwd.variants import flash_schedule
    from twill.kernels.gemm.variants import gemm_schedule
    from twill.kernels import build_kernel
    from twill.schedule.verify import verify

    graph = build_kernel(kernel, machine, **options)
    if shape.get("solver"):
        from twill.solve import schedule
        from twill.solve.options import SolveOptions

        return schedule(graph, machine, SolveOptions(time_limit=120, streaming_depth=shape.get("depth", 2),
                                                     extra_copies=shape.get("extra_copies", 0)))
    if kernel == "gemm":
        warps = 8 if options.get("block_m", 128) == 128 else 4
        sched = gemm_schedule(graph, machine, warps=warps, **shape)
    else:
        sched = flash_schedule(graph, machine, **shape)
    verify(sched, machine)
    return sched


def ii_cycles(sched: Any) -> int:
    """The II in raw machine cycles: a solved schedule's ``ii`` is in normalized units
    (``stats["normalization"]``), a hand-built variant's in cycles already."""
    from twill.schedule.report import raw_cycles

    cycles = raw_cycles(sched.ii, sched.stats.get("normalization"))
    return sched.ii if cycles is None else cycles


def generate(outdir: str, arch: str = "h100") -> list[dict[str, Any]]:
    """Emit every suite variant into ``outdir`` and write ``manifest.json``; returns the manifest rows."""
    from twill.codegen.gluon import gluon_plan, render_plan
    from twill.machine.models import get_machine

    machine = get_machine(arch)
    os.makedirs(outdir, exist_ok=True)
    rows = []
    for name, kernel, options, shape in SUITE:
        persistent = bool(shape.get("persistent"))    # a code-generator choice, not part of the schedule
        sched = variant_schedule(kernel, options, {k: v for k, v in shape.items() if k != "persistent"}, machine)
        plan = gluon_plan(sched, persistent)
        with open(os.path.join(outdir, f"{name}.py"), "w") as fh:
            fh.write(render_plan(plan))
        rows.append({"name": name, "file": f"{name}.py", "kernel": kernel, "options": options,
                     "solver": sched.solver, "ii": sched.ii, "ii_cycles": ii_cycles(sched), "stages": sched.num_stages,
                     "rings": {r.name: r.depth for r in plan.rings},
                     "mma_lag": getattr(plan.decisions, "mma_lag", 0),             # GEMM
                     "qk_ahead": max(getattr(plan.decisions, "qk_ahead", (0,))),   # attention forward
                     "compute_partitions": len(plan.compute), "persistent": persistent,
                     "turns": [list(t.ops) for t in plan.turns]})
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return rows


# -- checks and timing (GPU) -----------------------------------------------------------------------------
def time_gemm(mod: Any, dtype: str, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    import torch
    from triton.testing import do_bench

    rows = []
    for n in sizes:
        a = torch.randn(n, n, device="cuda", dtype=_dtype(dtype))
        b = torch.randn(n, n, device="cuda", dtype=_dtype(dtype))
        c = torch.full((n, n), float("nan"), device="cuda", dtype=_dtype(dtype))
        mod.launch(a, b, c)
        err = _relerr(c, a.float() @ b.float())
        started = time.time()
        ms = do_bench(lambda: mod.launch(a, b, c), warmup=100, rep=400, return_mode="median")
        ms_ref = do_bench(lambda: torch.matmul(a, b), warmup=100, rep=400, return_mode="median")
        flops = 2 * n ** 3
        rows.append({"M": n, "N": n, "K": n, "relerr": err, "tflops": flops / ms / 1e9,
                     "cublas_tflops": flops / ms_ref / 1e9, "ratio_vs_cublas": ms_ref / ms,
                     "window": [started, time.time()]})
    return rows


def attention_case(options: dict[str, Any]) -> tuple[str, int, bool, int]:
    """(dtype, head dim, causal, K/V heads or 0) of an attention suite entry's kernel options."""
    return (options.get("dtype", "fp16"), options.get("head_dim", 128), bool(options.get("causal", False)),
            int(options.get("kv_heads", 0)))


def reference_key(case: tuple[str, int, bool, int]) -> str:
    """``fp16_d128``, ``fp16_d128_causal``, ``fp16_d128_causal_kv8``: the references one timing compares to."""
    dtype, hd, causal, kv = case
    return f"{dtype}_d{hd}{'_causal' if causal else ''}{f'_kv{kv}' if kv else ''}"


def attention_flops(B: int, H: int, S: int, D: int, causal: bool) -> float:
    """Two GEMMs of 2*S*S*D per head; causal attention computes half the scores (FlashAttention's count)."""
    return 4 * B * H * S * S * D * (0.5 if causal else 1.0)


def _attention_inputs(B: int, H: int, S: int, case: tuple[str, int, bool, int]) -> tuple[Any, Any, Any]:
    """Fresh random q [B, H, S, D] and k, v [B, H_kv, S, D]."""
    import torch

    dtype, hd, _, kv = case
    q = torch.randn(B, H, S, hd, device="cuda", dtype=_dtype(dtype))
    k, v = (torch.randn(B, kv or H, S, hd, device="cuda", dtype=_dtype(dtype)) for _ in range(2))
    return q, k, v


def _sdpa_ref(q: Any, k: Any, v: Any, causal: bool = False) -> tuple[Any, Any]:
    """fp32 softmax(q k^T / sqrt(D) [causal]) v and the natural-log LSE; K/V heads repeated for GQA."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def check_attention(mod: Any, case: tuple[str, int, bool, int]) -> list[dict[str, Any]]:
    """Output and LSE against fp32 torch on ragged shapes, both poisoned with NaN."""
    import torch

    rows = []
    for B, H, S in ATTN_RAGGED:
        H = H * (case[3] or 1)
        q, k, v = _attention_inputs(B, H, S, case)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
        mod.launch(q, k, v, out=out, lse=lse)
        torch.cuda.synchronize()
        ref, ref_lse = _sdpa_ref(q, k, v, case[2])
        lse_err = float((lse - ref_lse).abs().max()) if torch.isfinite(lse).all() else float("nan")
        rows.append({"B": B, "H": H, "S": S, "D": case[1], "relerr": _relerr(out, ref), "lse_maxerr": lse_err})
    return rows


def time_attention(mod: Any, case: tuple[str, int, bool, int], seqs: tuple[int, ...],
                   rounds: int = 0) -> list[dict[str, Any]]:
    """TFLOP/s of the kernel at each S (``do_bench`` median); with ``rounds``, timed instead in that many rounds
    interleaved with cuDNN and FA2 on the same inputs (:func:`interleaved_row`)."""
    import torch
    from triton.testing import do_bench

    rows = []
    for S in seqs:
        q, k, v = _attention_inputs(ATTN_BATCH, ATTN_HEADS, S, case)
        out = torch.full_like(q, float("nan"))
        mod.launch(q, k, v, out=out)
        if rounds:
            rows.append(interleaved_row(lambda: mod.launch(q, k, v, out=out), (q, k, v), case, S, rounds))
            rows[-1]["finite"] = bool(torch.isfinite(out).all())
            continue
        started = time.time()
        ms = do_bench(lambda: mod.launch(q, k, v, out=out), warmup=50, rep=200, return_mode="median")
        flops = attention_flops(ATTN_BATCH, ATTN_HEADS, S, case[1], case[2])
        rows.append({"B": ATTN_BATCH, "H": ATTN_HEADS, "S": S, "D": case[1], "finite": bool(torch.isfinite(out).all()),
                     "tflops": flops / ms / 1e9, "window": [started, time.time()]})
    return rows


#: Calls per sample of an interleaved round (``--rounds``): CUDA events around this many back-to-back calls.
ROUND_CALLS = 10


def interleaved_row(kernel: Any, inputs: tuple[Any, Any, Any], case: tuple[str, int, bool, int], S: int,
                    rounds: int) -> dict[str, Any]:
    """One timing of ``kernel`` on ``inputs`` in ``rounds`` rounds interleaved with SDPA's cuDNN and flash (FA2)
    backends on the same inputs (K/V heads expanded for grouped-query cases; a backend that refuses the shape
    is left out): medians, their ``[min, max]`` over the rounds, the ratios of the same rounds and the
    rounds' time window (for the SM clock)."""
    from benchmarks._common import event_times, torch_references

    q, k, v = inputs
    _, head_dim, causal, kv = case
    if kv:
        k, v = (t.repeat_interleave(ATTN_HEADS // kv, dim=1) for t in (k, v))
    fns: dict[str, Any] = {"twill": kernel}
    for name, fn in torch_references("attention", (q, k, v, None), flash="fa2", causal=causal).items():
        try:
            fn()
            fns[name] = fn
        except RuntimeError:     # the backend refuses this shape on this stack
            continue
    ms, spread, window = event_times(fns, ROUND_CALLS, rounds)
    flops = attention_flops(ATTN_BATCH, ATTN_HEADS, S, head_dim, causal)
    row: dict[str, Any] = {"B": ATTN_BATCH, "H": ATTN_HEADS, "S": S, "D": head_dim, "tflops": flops / ms["twill"] / 1e9,
                           "ms": ms, "ms_spread": spread, "rounds": rounds, "window": window}
    for name in fns.keys() - {"twill"}:
        row[f"{name}_tflops"] = flops / ms[name] / 1e9
        row[f"ratio_vs_{name}"] = ms[name] / ms["twill"]
    return row


def attention_references(case: tuple[str, int, bool, int], seqs: tuple[int, ...]) -> dict[int, dict[str, Any]]:
    """cuDNN SDPA and PyTorch flash (FA2) with do_bench medians (``is_causal`` for causal cases; grouped K/V
    heads expanded to the query heads before timing); Pallas attention_mgpu (non-causal, MHA) where it runs."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    dtype, head_dim, causal, kv = case
    refs: dict[int, dict[str, Any]] = {}
    for S in seqs:
        q, k, v = _attention_inputs(ATTN_BATCH, ATTN_HEADS, S, case)
        if kv:
            k, v = (t.repeat_interleave(ATTN_HEADS // kv, dim=1) for t in (k, v))
        flops = attention_flops(ATTN_BATCH, ATTN_HEADS, S, head_dim, causal)
        row: dict[str, Any] = {"window": [time.time()]}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=50,
                                  rep=200, return_mode="median")
                row[name] = flops / ms / 1e9
            except Exception as exc:  # a backend missing on this stack is recorded, not fatal
                row[name] = f"ERR {type(exc).__name__}: {str(exc)[:100]}"
        row["window"].append(time.time())
        refs[S] = row
        del q, k, v
        torch.cuda.empty_cache()
    if not causal and not kv:
        _pallas_references(refs, dtype, head_dim, seqs)
    return refs


def _pallas_references(refs: dict[int, dict[str, Any]], dtype: str, head_dim: int, seqs: tuple[int, ...]) -> None:
    """JAX Pallas Mosaic GPU attention_mgpu (block_q 64, block_kv 128, 2 steps), timed with do_bench."""
    try:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.4")
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.gpu import attention_mgpu as am
        from triton.testing import do_bench
    except Exception as exc:
        for S in seqs:
            refs[S]["pallas_mgpu"] = f"ERR import: {str(exc)[:100]}"
        return
    jdt = {"fp16": jnp.float16, "bf16": jnp.bfloat16}[dtype]
    for S in seqs:
        try:
            keys = jax.random.split(jax.random.key(0), 3)
            qj, kj, vj = (jax.random.normal(keys[i], (ATTN_BATCH, S, ATTN_HEADS, head_dim), jdt) for i in range(3))
            cfg = am.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2)
            f = jax.jit(lambda a, b, c: am.attention(a, b, c, cfg))
            f(qj, kj, vj).block_until_ready()
            ms = do_bench(lambda: _jax_calls(f, qj, kj, vj), warmup=50, rep=200, return_mode="median") / JAX_CALLS
            refs[S]["pallas_mgpu"] = 4 * ATTN_BATCH * ATTN_HEADS * S * S * head_dim / ms / 1e9
            del qj, kj, vj
        except Exception as exc:
            refs[S]["pallas_mgpu"] = f"ERR {type(exc).__name__}: {str(exc)[:100]}"


def _jax_calls(f: Any, *args: Any) -> None:
    """``JAX_CALLS`` asynchronous calls of ``f``, then one wait for the last (calls on one stream finish in
    order), so the host round trip is paid once per sample instead of once per call."""
    for _ in range(JAX_CALLS - 1):
        f(*args)
    f(*args).block_until_ready()


def _versions() -> dict[str, Any]:
    import torch
    import triton

    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda}
    try:
        import jax

        out["jax"] = jax.__version__
    except Exception:
        out["jax"] = None
    return out


def run(kernel_dir: str, out: str, *, only: list[str] | None = None, quick: bool = False,
        rounds: int = 0) -> dict[str, Any]:
    """Check and time every kernel of ``kernel_dir/manifest.json``; write ``out/gluon_bench.json``. The SM
    clock is sampled throughout (``nvidia-smi``), and each timing records its median (``clock_ghz``)."""
    from twill.machine.microbench import ClockSampler

    with open(os.path.join(kernel_dir, "manifest.json")) as fh:
        manifest = json.load(fh)
    if only:
        manifest = [m for m in manifest if any(o in m["name"] for o in only)]
    result: dict[str, Any] = {"versions": _versions(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "kernels": [], "attention_references": {}}
    seqs = ATTN_SEQS[:2] if quick else ATTN_SEQS
    with ClockSampler() as sampler:
        _run_kernels(result, manifest, kernel_dir, seqs, GEMM_SIZES[:1] if quick else GEMM_SIZES, rounds)
        for case in sorted({attention_case(e["options"]) for e in manifest if e["kernel"] == "flash-fwd"}):
            result["attention_references"][reference_key(case)] = attention_references(case, seqs)
    attach_clocks(result, sampler)
    _attach_ratios(result)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gluon_bench.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))
    return result


def attach_clocks(result: dict[str, Any], sampler: Any) -> None:
    """Replace every timing's and reference row's ``window`` (the unix times its timing ran between) by
    ``clock_ghz``, the median SM clock ``sampler`` read in it (None where it read none)."""
    rows = [t for k in result["kernels"] for t in k.get("timings", [])]
    rows += [r for refs in result["attention_references"].values() for r in refs.values()]
    for row in rows:
        if "window" in row:
            row["clock_ghz"] = sampler.median_ghz(*row.pop("window"))


def _run_kernels(result: dict[str, Any], manifest: list[dict[str, Any]], kernel_dir: str,
                 seqs: tuple[int, ...], gemm_sizes: tuple[int, ...], rounds: int = 0) -> None:
    """Check and time every kernel of ``manifest`` into ``result["kernels"]``; a failing kernel is recorded."""
    from twill.codegen.gluon import load_emitted

    for entry in manifest:
        row = dict(entry)
        t0 = time.time()
        try:
            mod = load_emitted(os.path.join(kernel_dir, entry["file"]))
            dtype = entry["options"].get("dtype", "fp16")
            if entry["kernel"] == "gemm":
                row["checks"] = check_gemm(mod, dtype)
                row["timings"] = time_gemm(mod, dtype, gemm_sizes)
            else:
                case = attention_case(entry["options"])
                row["checks"] = check_attention(mod, case)
                row["timings"] = time_attention(mod, case, seqs, rounds)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        row["seconds"] = round(time.time() - t0, 1)
        result["kernels"].append(row)
        print(json.dumps({k: row.get(k) for k in ("name", "checks", "timings", "error")}), flush=True)


def _attach_ratios(result: dict[str, Any]) -> None:
    for row in result["kernels"]:
        if row["kernel"] != "flash-fwd" or "timings" not in row:
            continue
        refs = result["attention_references"].get(reference_key(attention_case(row["options"])), {})
        for t in row["timings"]:
            ref = refs.get(t["S"], {})
            for name in ("cudnn", "fa2", "pallas_mgpu"):
                if isinstance(ref.get(name), float) and f"ratio_vs_{name}" not in t:   # same-round ratios stay
                    t[f"{name}_tflops"] = ref[name]
                    t[f"ratio_vs_{name}"] = t["tflops"] / ref[name]


def table(result: dict[str, Any]) -> str:
    """A short text table: one line per kernel and size."""
    lines = [f"{result['versions']['gpu']} | torch {result['versions']['torch']} | triton "
             f"{result['versions']['triton']}"]
    for row in result["kernels"]:
        if "error" in row:
            lines.append(f"{row['name']:32s} ERROR {row['error'][:150]}")
            continue
        worst = max((c["relerr"] for c in row["checks"]), default=float("nan"))
        for t in row["timings"]:
            if row["kernel"] == "gemm":
                lines.append(f"{row['name']:32s} {t['M']:>5d}^3  {t['tflops']:6.0f} TF  cuBLAS "
                             f"{t['cublas_tflops']:6.0f}  x{t['ratio_vs_cublas']:.3f}  err {worst:.1e}")
            else:
                refs = "  ".join(f"{n} {t[f'{n}_tflops']:4.0f} x{t[f'ratio_vs_{n}']:.2f}"
                                 for n in ("cudnn", "fa2", "pallas_mgpu") if f"{n}_tflops" in t)
                clock = f"  {t['clock_ghz']:.2f} GHz" if t.get("clock_ghz") else ""
                lines.append(f"{row['name']:32s} S={t['S']:>5d}  {t['tflops']:6.0f} TF  {refs}  err {worst:.1e}{clock}")
    return "\n".join(lines)


def markdown_table(result: dict[str, Any]) -> str:
    """The attention kernels of a run as docs/performance.md shows them: TFLOP/s per S with the ratio to cuDNN
    of the same run in brackets, then the references (cuDNN / FA2, and Pallas where it ran) per case."""
    attention = [r for r in result["kernels"] if r["kernel"] == "flash-fwd" and "timings" in r]
    seqs = sorted({t["S"] for r in attention for t in r["timings"]})
    lines = ["| kernel | " + " | ".join(f"S={s}" for s in seqs) + " |", "|---" * (len(seqs) + 1) + "|"]
    for r in attention:
        by_s = {t["S"]: t for t in r["timings"]}
        cells = [f"{by_s[s]['tflops']:.0f} ({by_s[s]['ratio_vs_cudnn']:.2f})" if "ratio_vs_cudnn" in by_s.get(s, {})
                 else "" for s in seqs]
        lines.append(f"| `{r['name']}` | " + " | ".join(cells) + " |")
    for key, refs in sorted(result["attention_references"].items()):
        per_s = {s: refs.get(str(s), refs.get(s, {})) for s in seqs}   # JSON keys are strings
        names = [n for n in ("cudnn", "fa2", "pallas_mgpu") if any(isinstance(r.get(n), float) for r in per_s.values())]
        cells = [" / ".join(f"{per_s[s][n]:.0f}" if isinstance(per_s[s].get(n), float) else "-" for n in names)
                 for s in seqs]
        label = " / ".join({"cudnn": "cuDNN", "fa2": "FA2", "pallas_mgpu": "Pallas"}[n] for n in names)
        lines.append(f"| {label}, {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_rounds_table(result: dict[str, Any]) -> str:
    """The attention kernels of a ``--rounds`` run: per kernel and S, TFLOP/s (median over the rounds), the
    ratio to cuDNN and to FA2 of the same rounds, the kernel's and cuDNN's spread (max/min of the rounds' times)
    and the median SM clock of its rounds."""
    lines = ["| kernel | S | TFLOP/s | vs cuDNN | vs FA2 | spread (twill / cuDNN) | GHz |", "|---" * 7 + "|"]
    for r in result["kernels"]:
        for t in r.get("timings", []):
            if "rounds" not in t:
                continue
            spread = " / ".join(f"{hi / lo - 1:.1%}" for lo, hi in (t["ms_spread"][n] for n in ("twill", "cudnn")))
            clock = f"{t['clock_ghz']:.2f}" if t.get("clock_ghz") else "-"
            lines.append(f"| `{r['name']}` | {t['S']} | {t['tflops']:.0f} | {t.get('ratio_vs_cudnn', 0):.2f} | "
                         f"{t.get('ratio_vs_fa2', 0):.2f} | {spread} | {clock} |")
    return "\n".join(lines)


def markdown_ab_table(result: dict[str, Any]) -> str:
    """An A/B run of one code change (``{"variant": run, "base": run, ...}``, both ``run`` results of one GPU
    session, one after the other): per attention kernel and S, TFLOP/s with the change / without it and their
    ratio (kernels the base run lacks have no row); the last row gives cuDNN's TFLOP/s in each run, for the
    spread between the two runs."""
    def tflops(run: dict[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
        return {r["name"]: {t["S"]: t for t in r["timings"]}
                for r in run["kernels"] if r["kernel"] == "flash-fwd" and "timings" in r}

    variant, base = tflops(result["variant"]), tflops(result["base"])
    seqs = sorted({s for by_s in variant.values() for s in by_s})
    lines = ["| kernel: TFLOP/s with / without (ratio) | " + " | ".join(f"S={s}" for s in seqs) + " |",
             "|---" * (len(seqs) + 1) + "|"]
    for name, by_s in variant.items():
        if name not in base:
            continue
        cells = [f"{by_s[s]['tflops']:.0f} / {base[name][s]['tflops']:.0f} "
                 f"({by_s[s]['tflops'] / base[name][s]['tflops']:.3f})"
                 if s in by_s and s in base[name] else "" for s in seqs]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    name = next(iter(variant))
    cells = [f"{variant[name][s].get('cudnn_tflops', float('nan')):.0f} / "
             f"{base[name][s].get('cudnn_tflops', float('nan')):.0f}" for s in seqs]
    lines.append(f"| cuDNN, with `{name}`'s case: TFLOP/s in each run | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sanity(kernel_dir: str, only: list[str] | None = None, *, inner: int = 200, seq_len: int = 300) -> int:
    """One small launch per kernel plus its check (for compute-sanitizer runs); returns failures. ``inner``
    (the GEMM's K) and ``seq_len`` set how many loop iterations run: use enough for the rings to wrap."""
    import torch

    from twill.codegen.gluon import load_emitted

    with open(os.path.join(kernel_dir, "manifest.json")) as fh:
        manifest = [m for m in json.load(fh) if not only or any(o in m["name"] for o in only)]
    failures = 0
    for entry in manifest:
        mod = load_emitted(os.path.join(kernel_dir, entry["file"]))
        dtype = entry["options"].get("dtype", "fp16")
        if entry["kernel"] == "gemm":
            a = torch.randn(300, inner, device="cuda", dtype=_dtype(dtype))
            b = torch.randn(inner, 520, device="cuda", dtype=_dtype(dtype))
            err = _relerr(mod.launch(a, b), a.float() @ b.float())
        else:
            case = attention_case(entry["options"])
            q, k, v = _attention_inputs(1, 2 * (case[3] or 1), seq_len, case)
            err = _relerr(mod.launch(q, k, v), _sdpa_ref(q, k, v, case[2])[0])
        torch.cuda.synchronize()
        ok = err < 2e-2
        failures += not ok
        print(f"{entry['name']}: relerr {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return failures


# -- the model against committed runs (CPU) -----------------------------------------------------------------
def predict_runs(paths: list[str], machine_path: str, arch: str = "h100") -> dict[str, Any]:
    """Today's prediction (``twill.tune.predict`` on the calibrated machine ``machine_path``) of every attention
    forward kernel of the suite in the committed ``run`` results ``paths`` (an A/B file: its ``base``, the
    kernels of ``main``), each rebuilt from its suite entry as ``generate`` builds it; kernels not in the suite
    are listed as skipped. Causal kernels are predicted with their query blocks of unequal length
    (:func:`twill.tune.predict.causal_iterations`)."""
    from twill.machine.calibration import load_machine
    from twill.machine.models import get_machine
    from twill.tune.predict import Shape, predict

    machine, solve_machine = load_machine(machine_path), get_machine(arch)
    suite = {name: (kernel, options, shape) for name, kernel, options, shape in SUITE}
    rows, skipped, schedules = [], [], {}
    for path in paths:
        doc = json.load(open(path))
        run_doc = doc.get("base", doc)
        for entry in run_doc["kernels"]:
            if entry["kernel"] != "flash-fwd":
                continue
            if entry["name"] not in suite:
                skipped.append(f"{os.path.basename(path)}: {entry['name']}")
                continue
            kernel, options, shape = suite[entry["name"]]
            if entry["name"] not in schedules:
                schedules[entry["name"]] = variant_schedule(
                    kernel, options, {k: v for k, v in shape.items() if k != "persistent"}, solve_machine)
            causal = bool(options.get("causal"))
            for t in entry.get("timings", []):
                if not t.get("tflops"):
                    continue
                size = Shape("attention", (t["B"], t["H"], t["S"], t["D"]))
                measured = size.flops("flash-fwd", causal=causal) / t["tflops"] / 1e9
                pred = predict(schedules[entry["name"]], size, machine, persistent=bool(shape.get("persistent")))
                rows.append({"run": os.path.basename(path), "date": run_doc.get("date"), "name": entry["name"],
                             "causal": causal, "persistent": bool(shape.get("persistent")), "shape": size.as_dict(),
                             "measured_ms": measured, "predicted_ms": pred.seconds * 1e3,
                             "measured_over_predicted": measured / (pred.seconds * 1e3)})
    return {"machine_file": os.path.basename(machine_path), "solved_on": arch,
            "runs": [os.path.basename(p) for p in paths], "rows": rows, "skipped": skipped}


def prediction_table(doc: dict[str, Any]) -> str:
    """Markdown: per kernel, measured / predicted at each S (the first run a kernel appears in), and the
    share within ±15%, causal and not."""
    seqs = sorted({r["shape"]["S"] for r in doc["rows"]})
    lines = ["| kernel | run | " + " | ".join(f"S={s}" for s in seqs) + " |", "|---" * (len(seqs) + 2) + "|"]
    seen: dict[str, str] = {}
    for r in doc["rows"]:
        seen.setdefault(r["name"], r["run"])
    for name, run_name in seen.items():
        cells = {r["shape"]["S"]: r["measured_over_predicted"] for r in doc["rows"]
                 if r["name"] == name and r["run"] == run_name}
        lines.append(f"| `{name}` | {run_name.removeprefix('gluon_bench_h200_').removesuffix('.json')} | "
                     + " | ".join(f"{cells[s]:.2f}" if s in cells else "-" for s in seqs) + " |")
    for causal in (True, False):
        group = [r["measured_over_predicted"] for r in doc["rows"] if r["causal"] == causal]
        if group:
            within = sum(abs(x - 1) <= 0.15 for x in group)
            lines.append(f"| {'causal' if causal else 'not causal'}: within ±15% | | {within} of {len(group)}, "
                         f"{min(group):.2f}-{max(group):.2f} |" + " |" * (len(seqs) - 1))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/gluon_bench.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    g = sub.add_parser("generate", help="emit the suite's kernels (CPU)")
    g.add_argument("outdir")
    g.add_argument("--arch", default="h100", type=str.lower, help="target GPU (default h100)")
    r = sub.add_parser("run", help="check and time emitted kernels (GPU)")
    r.add_argument("kernel_dir")
    r.add_argument("--out", default=os.environ.get("OUT") or "out")
    r.add_argument("--only", nargs="*", default=None, help="substrings of variant names to run")
    r.add_argument("--quick", action="store_true", help="fewer sizes")
    r.add_argument("--rounds", type=int, default=0,
                   help="time each attention kernel in this many rounds interleaved with cuDNN and FA2 (ratios "
                        "of the same rounds, medians and spread) instead of one do_bench median each")
    z = sub.add_parser("sanity", help="one small checked launch per kernel (for compute-sanitizer)")
    z.add_argument("kernel_dir")
    z.add_argument("--only", nargs="*", default=None)
    q = sub.add_parser("predict", help="today's model against committed runs' attention kernels (CPU)")
    q.add_argument("results", nargs="+", help="gluon_bench.json files of earlier runs (an A/B file: its base)")
    q.add_argument("--machine", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                     "calibration_h200.machine.json"))
    q.add_argument("--out", required=True, help="where to write the predictions (JSON)")
    for step, text in (("table", "the markdown table of a run's results"),
                       ("ab-table", "the markdown table of an A/B file (variant / base per cell)")):
        t = sub.add_parser(step, help=f"print {text} (CPU)")
        t.add_argument("results")
        t.add_argument("--part", default=None, help="the run stored under this key of the file (e.g. variant)")
    args = parser.parse_args(argv)
    if args.step in ("table", "ab-table"):
        with open(args.results) as fh:
            result = json.load(fh)
        if args.part is not None:
            result = result[args.part]
        print(markdown_table(result) if args.step == "table" else markdown_ab_table(result))
        return 0
    if args.step == "predict":
        missing = [path for path in [*args.results, args.machine] if not os.path.isfile(path)]
        if missing:
            parser.error(f"cannot read {missing[0]!r}: no such file")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
            parser.error(f"cannot write {args.out!r}: no directory {os.path.dirname(args.out)!r}")
        doc = predict_runs(args.results, args.machine)
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(prediction_table(doc))
        return 0
    if args.step == "sanity":
        return 1 if sanity(args.kernel_dir, args.only) else 0
    if args.step == "generate":
        for row in generate(args.outdir, arch=args.arch):
            print(f"{row['name']:32s} {row['solver']:7s} II {row['ii']:5d} (~{row['ii_cycles']} cycles) "
                  f"rings {row['rings']}")
        return 0
    if args.rounds < 0:
        parser.error(f"--rounds must be >= 0, got {args.rounds}")
    run(args.kernel_dir, args.out, only=args.only, quick=args.quick, rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
