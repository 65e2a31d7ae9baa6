"""Check and time the generated attention backward on a GPU (a benchmark script, not part of the library).

Two steps, so that the GPU machine needs neither ortools nor the solver:

* ``generate --out DIR`` (CPU): solves (or hand-builds) the ``flash-bwd`` schedule of every variant, emits
  the backward module and the matching forward (with LSE) into ``DIR`` and writes ``DIR/manifest.json``.
* ``run --modules DIR`` (GPU; imports only the emitted modules, torch and triton): for every variant and
  ``S`` in :data:`CHECK_SEQS` (77, 513 and 1000 are ragged; 77 and 513 not a multiple of 4, the TMA
  alignment case), runs the generated forward (``return_lse=True``) and backward on fresh random data
  (dq, dk, dv poisoned with NaN first) and compares them with torch autograd
  of an fp32 reference attention (max relative error per tensor, PASS/FAIL); then, at
  :data:`TIME_SEQS`, times the backward and forward + backward against torch SDPA's cuDNN and flash
  backends (CUDA events around ``CALLS`` calls, ``ROUNDS`` interleaved rounds, medians) and prints TFLOP/s
  (backward = 2.5 x forward flops, forward = 4 B H S^2 D, halved when causal) and ratios. Writes
  ``$OUT/flash_bwd_h200.json`` (or ``--out``).

* ``sanitize --modules DIR [NAME ...]`` (GPU): one checked forward and backward launch of each variant (all
  when no NAME is given) at ``S = 513`` (ragged, and every ring wraps), for running under a sanitizer:
  ``compute-sanitizer --tool memcheck`` or Triton's concurrency sanitizer
  (``TRITON_INSTRUMENTATION_MODE=consan``, which models mbarriers, TMA and wgmma). ``--control`` then
  runs, in a child process, a copy of the first variant's backward whose compute partition does not wait
  for its Q tiles to land: under ConSan that child must stop with a violation, or a clean pass means
  nothing.

    python benchmarks/flash_bwd_check.py generate --out /tmp/bwd_modules
    python benchmarks/flash_bwd_check.py run --modules /tmp/bwd_modules --out $OUT
    TRITON_INSTRUMENTATION_MODE=consan CUDA_LAUNCH_BLOCKING=1 \\
        python benchmarks/flash_bwd_check.py sanitize --modules /tmp/bwd_modules --control
    compute-sanitizer --tool memcheck python benchmarks/flash_bwd_check.py sanitize --modules /tmp/bwd_modules
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times, load_module, without_waits  # noqa: E402

#: (name, flash-bwd options, schedule: "solver", "ptxas" (the solver's ptxas-checked search,
#: twill.tune.registers, as twill.ops.attention builds its backward), {"search": "ptxas", "reserved_regs": R}
#: (that search started at register reserve R) or the hand-built shape of twill/kernels/flash_bwd/variants.py)
VARIANTS: tuple[tuple[str, dict[str, Any], Any], ...] = (
    ("bwd_d128_solver", {"head_dim": 128}, "solver"),
    ("bwd_d128_hand_d2_lag1", {"head_dim": 128}, {"depth": 2, "dq_lag": 1}),
    # dQ reduced in the iteration it is stored (one staging buffer): the model's II for it is much longer
    ("bwd_d128_hand_d2_lag0", {"head_dim": 128}, {"depth": 2, "dq_lag": 0}),
    ("bwd_d128_causal_solver", {"head_dim": 128, "causal": True}, "solver"),
    ("bwd_d128_gqa4_solver", {"head_dim": 128, "kv_heads": 4}, "solver"),
    ("bwd_d128_causal_gqa4_solver", {"head_dim": 128, "kv_heads": 4, "causal": True}, "solver"),
    ("bwd_bf16_d128_solver", {"head_dim": 128, "dtype": "bf16"}, "solver"),
    ("bwd_d64_solver", {"head_dim": 64}, "solver"),
    ("bwd_d64_hand_d3_lag2", {"head_dim": 64}, {"depth": 3, "dq_lag": 2}),
    ("bwd_d64_causal_solver", {"head_dim": 64, "causal": True}, "solver"),
    ("bwd_d64_causal_hand_d2_lag1", {"head_dim": 64, "causal": True}, {"depth": 2, "dq_lag": 1}),
    ("bwd_bf16_d64_causal_gqa4_hand_d2_lag1", {"head_dim": 64, "dtype": "bf16", "causal": True, "kv_heads": 4},
     {"depth": 2, "dq_lag": 1}),
    # FA3's head-dim-64 tile, 128 query rows per iteration: the model's register rule refuses it by 8
    # registers, so it is admitted on ptxas's report instead (PTXAS_ADMITTED; docs/performance.md)
    ("bwd_d64_bm128_hand_d2_lag1", {"head_dim": 64, "block_m": 128}, {"depth": 2, "dq_lag": 1, "registers": "ptxas"}),
    ("bwd_d64_causal_bm128_hand_d2_lag1", {"head_dim": 64, "block_m": 128, "causal": True},
     {"depth": 2, "dq_lag": 1, "registers": "ptxas"}),
    ("bwd_bf16_d64_causal_gqa4_bm128_hand_d2_lag1",
     {"head_dim": 64, "block_m": 128, "dtype": "bf16", "causal": True, "kv_heads": 4},
     {"depth": 2, "dq_lag": 1, "registers": "ptxas"}),
    # the same tile from the solver: the model refuses it at its register reserve, so the search lowers the
    # reserve and lets ptxas reject the schedules that spill (twill.tune.registers)
    ("bwd_d64_bm128_ptxas", {"head_dim": 64, "block_m": 128}, "ptxas"),
    ("bwd_d64_causal_bm128_ptxas", {"head_dim": 64, "block_m": 128, "causal": True}, "ptxas"),
    ("bwd_bf16_d64_causal_gqa4_bm128_ptxas",
     {"head_dim": 64, "block_m": 128, "dtype": "bf16", "causal": True, "kv_heads": 4}, "ptxas"),
    # the search started at 16 reserved registers where 24 already has a schedule: a smaller II whose kernel
    # runs slower, why the search lowers the reserve only while no schedule exists (docs/model.md, "Registers
    # checked by ptxas")
    ("bwd_d128_r16_ptxas", {"head_dim": 128}, {"search": "ptxas", "reserved_regs": 16}),
    ("bwd_d128_causal_r16_ptxas", {"head_dim": 128, "causal": True}, {"search": "ptxas", "reserved_regs": 16}),
    # head dim 256: 64-key blocks, P and dS in shared memory, dQ in chunks reduced by the compute warps
    ("bwd_d256_solver", {"head_dim": 256}, "solver"),
    ("bwd_d256_causal_solver", {"head_dim": 256, "causal": True}, "solver"),
    ("bwd_bf16_d256_causal_gqa4_hand_d2", {"head_dim": 256, "dtype": "bf16", "causal": True, "kv_heads": 4},
     {"depth": 2}),
)
#: What a hand-built variant marked ``"registers": "ptxas"`` may violate: the model's REGISTER LIMIT only.
#: Every other family is verified as usual; the register count is then taken from ptxas, which must report no
#: spills for the compiled backward (checked on the CPU by ``generate``), or the variant is left out.
PTXAS_ADMITTED = "REGISTER LIMIT"
ARCH = "h200"
CHECK_SEQS = (77, 513, 1000, 2048, 4096)
TIME_SEQS = (2048, 4096, 8192)
#: Total tokens per timed problem (B = TOKENS // S) and head count H = HEAD_TOKENS // D (FA3's benchmark).
TOKENS, HEAD_TOKENS = 16384, 2048
#: Query heads of the correctness checks (a multiple of every variant's K/V heads).
CHECK_HEADS = 8
TOLERANCE = {"fp16": 1e-2, "bf16": 3e-2}
CALLS, ROUNDS = 10, 7
#: Sequence length of the sanitizer launches: ragged, not a multiple of 4, and long enough to wrap every ring.
SANITIZE_SEQ = 513


# -- generation (CPU) ------------------------------------------------------------------------------------
def _schedules(options: dict[str, Any], shape: Any) -> tuple[Any, Any]:
    """The backward schedule of one variant and the forward schedule matching its attention options."""
    from twill.kernels.flash_bwd.variants import flash_bwd_schedule
    from twill.kernels.flash_fwd.variants import flash_schedule
    from twill.kernels import build_kernel
    from twill.machine.models import get_machine
    from twill.schedule.verify import verify

    machine = get_machine(ARCH)
    graph = build_kernel("flash-bwd", machine, **options)
    if shape == "solver":
        from twill.solve import schedule
        from twill.solve.options import SolveOptions

        bwd = schedule(graph, machine, SolveOptions(time_limit=300))
        verify(bwd, machine)
    elif shape == "ptxas" or shape.get("search") == "ptxas":
        from twill.solve.options import SolveOptions
        from twill.tune.registers import schedule_without_spills

        if shape != "ptxas":
            graph = replace(graph, attrs={**graph.attrs, "reserved_regs": shape["reserved_regs"]})
        bwd = schedule_without_spills(graph, machine, SolveOptions(time_limit=300))
        verify(bwd, machine)
    elif shape.get("registers") == "ptxas":
        from twill.schedule.verify import VerificationError, violations

        bwd = flash_bwd_schedule(graph, machine, **{k: v for k, v in shape.items() if k != "registers"})
        found = violations(bwd, machine)
        if any(not v.startswith(PTXAS_ADMITTED) for v in found):
            raise VerificationError(found)
        bwd = replace(bwd, stats={**bwd.stats, "model_register_violations": found})
    else:
        bwd = flash_bwd_schedule(graph, machine, **shape)
        verify(bwd, machine)
    fwd_options = {k: v for k, v in options.items() if k in ("head_dim", "dtype", "causal", "kv_heads")}
    if options["head_dim"] == 256:
        fwd_options["block_n"] = 64   # two 128-key K/V stages do not fit beside Q at D = 256
    fwd_graph = build_kernel("flash-fwd", machine, subtiles=2, **fwd_options)
    fwd = flash_schedule(fwd_graph, machine, ahead=1, depth=3 if options["head_dim"] == 64 else 2)
    verify(fwd, machine)
    return bwd, fwd


def generate(outdir: str) -> list[dict[str, Any]]:
    """Emit every variant's backward and forward into ``outdir`` and write ``manifest.json``; a variant whose
    schedule the generator cannot render is reported and left out."""
    from twill.codegen.gluon import gluon_plan, render_plan
    from twill.errors import UnsupportedFeatureError

    os.makedirs(outdir, exist_ok=True)
    rows = []
    for name, options, shape in VARIANTS:
        bwd, fwd = _schedules(options, shape)
        try:
            plan = gluon_plan(bwd)
        except UnsupportedFeatureError as exc:
            print(f"{name}: skipped: {exc}")
            continue
        registers = {}
        if "model_register_violations" in bwd.stats:
            from twill.machine.models import get_machine
            from twill.tune.spills import gluon_spills

            registers = gluon_spills(bwd, get_machine(ARCH))
            if registers["spill_stores"] or registers["spill_loads"]:
                print(f"{name}: skipped: ptxas spills ({registers}); the model's register rule refused it too: "
                      f"{bwd.stats['model_register_violations'][0]}")
                continue
            registers["model"] = bwd.stats["model_register_violations"]
        for kind, sched in (("bwd", bwd), ("fwd", fwd)):
            with open(os.path.join(outdir, f"{name}_{kind}.py"), "w") as fh:
                fh.write(render_plan(gluon_plan(sched)))
        rows.append({"name": name, "bwd": f"{name}_bwd.py", "fwd": f"{name}_fwd.py", "options": options,
                     "solver": bwd.solver, "ii": bwd.ii, "rings": {r.name: r.depth for r in plan.rings},
                     "dq_depth": plan.decisions.dq_depth, "dq_lag": plan.decisions.dq_lag,
                     "order": list(plan.compute[0].ops),
                     **({"registers": registers} if registers else {}),
                     **({"search": _search_record(bwd.stats["registers"])} if "registers" in bwd.stats else {})})
        print(f"{name}: {bwd.solver} II {bwd.ii}, rings {rows[-1]['rings']}, dQ staging {plan.decisions.dq_depth}"
              + ("; admitted on ptxas's report (no spills), not the model's registers" if registers else ""))
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return rows


def _search_record(record: dict[str, Any]) -> dict[str, Any]:
    """What the manifest keeps of a ptxas-checked search: the reserve it ended at, the schedules it compiled
    and the kernel's ptxas report."""
    compiled = [s for s in record["steps"] if s["ii"] is not None]
    return {"reserved_regs": record["reserved_regs"], "schedules": len(compiled), "ptxas": compiled[-1]["ptxas"]}


# -- checks and timing (GPU) -----------------------------------------------------------------------------
def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _inputs(B: int, H: int, S: int, options: dict[str, Any]) -> tuple[Any, ...]:
    """Fresh random q, do [B, H, S, D] and k, v [B, H_kv, S, D]."""
    import torch

    dtype, D, kv = _torch_dtype(options.get("dtype", "fp16")), options["head_dim"], options.get("kv_heads", 0)
    q, do = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(B, kv or H, S, D, device="cuda", dtype=dtype) for _ in range(2))
    return q, k, v, do


def _reference(q: Any, k: Any, v: Any, do: Any, causal: bool) -> tuple[Any, Any, Any]:
    """dq, dk, dv of fp32 attention by torch autograd (K/V heads repeated for GQA, so dk, dv sum the group)."""
    import torch

    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = (q @ kr.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    out = torch.softmax(s, dim=-1) @ vr
    return torch.autograd.grad(out, (q, k, v), do.float())


def _relerr(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| (NaN anywhere in out -> inf)."""
    import torch

    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def check(fwd: Any, bwd: Any, options: dict[str, Any], S: int) -> dict[str, Any]:
    """One correctness check of the generated backward at sequence length ``S``."""
    import torch

    B, H = (1 if S > 2048 else 2), CHECK_HEADS
    q, k, v, do = _inputs(B, H, S, options)
    o, lse = fwd.launch(q, k, v, return_lse=True)
    dq = torch.full_like(q, float("nan"))
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    bwd.launch(q, k, v, o, do, lse, dq=dq, dk=dk, dv=dv)
    torch.cuda.synchronize()
    ref = _reference(q, k, v, do, bool(options.get("causal", False)))
    errs = {n: _relerr(t, r) for n, t, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref)}
    ok = all(e <= TOLERANCE[options.get("dtype", "fp16")] for e in errs.values())
    return {"B": B, "H": H, "S": S, **errs, "pass": ok}


def _sdpa(backend: Any, q: Any, k: Any, v: Any, do: Any, causal: bool) -> tuple[Any, Any] | None:
    """(backward, forward + backward) closures of torch SDPA on ``backend``, or None when it refuses."""
    import torch
    from torch.nn.attention import sdpa_kernel

    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def forward() -> Any:
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, **gqa)

    try:
        out = forward()
        torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
    except (RuntimeError, TypeError):  # the backend refuses the shape (or torch predates enable_gqa)
        return None

    def fwd_bwd() -> Any:
        return torch.autograd.grad(forward(), (qg, kg, vg), do)

    return (lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)), fwd_bwd


def bench(fwd: Any, bwd: Any, options: dict[str, Any], S: int) -> dict[str, Any]:
    """Backward and forward + backward times of the generated kernels and of SDPA cuDNN / flash."""
    import torch
    from torch.nn.attention import SDPBackend

    D, causal = options["head_dim"], bool(options.get("causal", False))
    B, H = TOKENS // S, HEAD_TOKENS // D
    q, k, v, do = _inputs(B, H, S, options)
    o, lse = fwd.launch(q, k, v, return_lse=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def twill_fwd_bwd() -> Any:
        out, l = fwd.launch(q, k, v, return_lse=True)
        return bwd.launch(q, k, v, out, do, l, dq=dq, dk=dk, dv=dv)

    fns = {"twill_bwd": lambda: bwd.launch(q, k, v, o, do, lse, dq=dq, dk=dk, dv=dv),
           "twill_fwd_bwd": twill_fwd_bwd}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        pair = _sdpa(backend, q, k, v, do, causal)
        if pair:
            fns[f"{name}_bwd"], fns[f"{name}_fwd_bwd"] = pair
    ms, spread, window = event_times(fns, CALLS, ROUNDS)
    fwd_flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    row: dict[str, Any] = {"B": B, "H": H, "S": S, "ms": ms, "ms_spread": spread, "window": window}
    for name, t in ms.items():
        row[f"{name}_tflops"] = (2.5 if name.endswith("_bwd") and "fwd" not in name else 3.5) * fwd_flops / t / 1e9
    for ref in ("cudnn", "flash"):
        for part in ("bwd", "fwd_bwd"):
            if f"{ref}_{part}" in ms:
                row[f"ratio_{part}_vs_{ref}"] = ms[f"{ref}_{part}"] / ms[f"twill_{part}"]
    return row


def run(moddir: str, out: str, only: str = "") -> dict[str, Any]:
    """Check and time every variant in ``moddir`` (those whose name contains ``only``); writes
    ``out/flash_bwd_h200.json``."""
    import torch

    from twill.machine.microbench import ClockSampler

    with open(os.path.join(moddir, "manifest.json")) as fh:
        manifest = json.load(fh)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": []}
    with ClockSampler() as sampler:
        _run_variants(result, manifest, moddir, only)
    for entry in result["variants"]:
        for t in entry["timings"]:  # the median SM clock while each timed problem ran
            t["clock_ghz"] = sampler.median_ghz(*t.pop("window"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "flash_bwd_h200.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))
    return result


def _run_variants(result: dict[str, Any], manifest: list[dict[str, Any]], moddir: str, only: str) -> None:
    """Check, then time, every variant of ``manifest`` whose name contains ``only``, into ``result``."""
    import torch

    for row in (r for r in manifest if only in r["name"]):
        fwd, bwd = (load_module(os.path.join(moddir, row[k]), "flash_bwd_check_") for k in ("fwd", "bwd"))
        entry = {**row, "checks": [], "timings": []}
        result["variants"].append(entry)
        for S in CHECK_SEQS:
            torch.manual_seed(S)
            try:
                c = check(fwd, bwd, row["options"], S)
            except Exception as exc:  # a failing variant is reported, the others still run
                c = {"S": S, "pass": False, "error": f"{type(exc).__name__}: {exc}"}
            entry["checks"].append(c)
            errs = " ".join(f"{n} {c[n]:.2e}" for n in ("dq", "dk", "dv") if n in c)
            print(f"{row['name']:30s} S={S:5d} {errs or c.get('error')} {'PASS' if c['pass'] else 'FAIL'}",
                  flush=True)
        if not all(c["pass"] for c in entry["checks"]):
            continue
        for S in TIME_SEQS:
            t = bench(fwd, bwd, row["options"], S)
            entry["timings"].append(t)
            ratios = " ".join(f"{k[6:]} {v:.2f}" for k, v in t.items() if k.startswith("ratio_"))
            tf = " ".join(f"{k[:-7]} {v:.0f}" for k, v in t.items() if k.endswith("_tflops"))
            print(f"{row['name']:30s} S={S:5d} TFLOP/s: {tf} | ratios: {ratios}", flush=True)


# -- sanitizers (GPU) ------------------------------------------------------------------------------------
def sanitize(moddir: str, names: list[str], control: bool = False) -> int:
    """One checked launch of each named variant (every variant when ``names`` is empty) at
    :data:`SANITIZE_SEQ`, then the broken control when asked; returns the number of failures."""
    import torch
    import triton

    # ConSan keeps its state in global scratch memory, which Triton allocates through this hook.
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    with open(os.path.join(moddir, "manifest.json")) as fh:
        manifest = [r for r in json.load(fh) if not names or r["name"] in names]
    if not manifest:
        raise SystemExit(f"no variant of {moddir} is called {' or '.join(names)}")
    failures = 0
    for row in manifest:
        fwd, bwd = (load_module(os.path.join(moddir, row[k]), "flash_bwd_sanitize_") for k in ("fwd", "bwd"))
        torch.manual_seed(SANITIZE_SEQ)
        c = check(fwd, bwd, row["options"], SANITIZE_SEQ)
        failures += not c["pass"]
        errs = " ".join(f"{n} {c[n]:.2e}" for n in ("dq", "dk", "dv"))
        print(f"sanitize {row['name']:38s} S={SANITIZE_SEQ} {errs} {'PASS' if c['pass'] else 'FAIL'}", flush=True)
    return failures + (_control(moddir, manifest[0]) if control else 0)


def _control(moddir: str, row: dict[str, Any]) -> int:
    """Run ``row``'s backward without its compute partition's waits for the Q tiles to land in a child
    process; 0 when the child fails (the sanitizer caught it), 1 when it passes unnoticed. (Removing the
    producer's empty-buffer waits instead is no control here: the producer also waits for each staged dQ
    tile, which orders its loads after the compute partition released their buffers.)"""
    with open(os.path.join(moddir, row["bwd"])) as fh:
        broken, count = without_waits(fh.read(), "q_ready")
    if not count:
        raise SystemExit(f"no q_ready wait found in {row['bwd']}")
    with tempfile.TemporaryDirectory() as tmp:
        entry = {**row, "name": "broken_" + row["name"], "bwd": "broken_" + row["bwd"], "fwd": row["fwd"]}
        with open(os.path.join(tmp, entry["bwd"]), "w") as fh:
            fh.write(broken)
        with open(os.path.join(moddir, row["fwd"])) as src, open(os.path.join(tmp, row["fwd"]), "w") as dst:
            dst.write(src.read())
        with open(os.path.join(tmp, "manifest.json"), "w") as fh:
            json.dump([entry], fh)
        child = subprocess.run([sys.executable, __file__, "sanitize", "--modules", tmp], capture_output=True,
                               text=True)
    print(f"control ({row['name']} without its {count} waits for Q tiles): exit {child.returncode}, "
          f"{'caught' if child.returncode else 'NOT CAUGHT'}; last lines:", flush=True)
    for line in (child.stdout + child.stderr).strip().splitlines()[-8:]:
        print("    " + line[:240], flush=True)
    return 0 if child.returncode else 1


def table(result: dict[str, Any]) -> str:
    """One line per variant and timed length: the largest relative error of its checks, backward TFLOP/s of
    the generated kernel, SDPA cuDNN and SDPA flash (FA2), and the backward ratios to both."""
    lines = [f"{'variant':38s} {'S':>5s} {'max err':>8s} {'twill':>6s} {'cudnn':>6s} {'FA2':>6s} "
             f"{'vs cudnn':>8s} {'vs FA2':>7s} {'GHz':>5s}"]
    for v in result["variants"]:
        errs = [c[n] for c in v["checks"] for n in ("dq", "dk", "dv") if n in c]
        worst = f"{max(errs):.1e}" if errs and all(c["pass"] for c in v["checks"]) else "FAIL"
        for t in v["timings"] or [{}]:
            tf = {n: t.get(f"{n}_bwd_tflops") for n in ("twill", "cudnn", "flash")}
            cells = " ".join(f"{x:6.0f}" if x else f"{'-':>6s}" for x in tf.values())
            ratio = lambda k: f"{t[k]:.2f}" if k in t else "-"  # noqa: E731
            clock = f"{t['clock_ghz']:.2f}" if t.get("clock_ghz") else "-"
            lines.append(f"{v['name']:38s} {t.get('S', '-'):>5} {worst:>8s} {cells} "
                         f"{ratio('ratio_bwd_vs_cudnn'):>8s} {ratio('ratio_bwd_vs_flash'):>7s} {clock:>5s}")
    return "\n".join(lines)


# -- prediction (CPU) -------------------------------------------------------------------------------------
def predict_runs(sources: list[str], machine_path: str) -> dict[str, Any]:
    """Today's prediction (``twill.tune.predict`` on the calibrated machine ``machine_path``) of every timed
    backward of the committed ``run`` results ``sources``, each variant's schedule rebuilt as ``generate``
    builds it (on the ``ARCH`` datasheet model, as the kernels were), against its measured time. A source is a
    results file (an A/B file: its ``variant``), or ``FILE#full`` for its variants without the causal mask only
    (a run made before the causal launch order that the model prices)."""
    from twill.machine.calibration import load_machine
    from twill.tune.predict import Shape, predict

    machine = load_machine(machine_path)
    shapes = {name: shape for name, _, shape in VARIANTS}
    rows, skipped, schedules = [], [], {}
    for source in sources:
        path, _, only = source.partition("#")
        doc = json.load(open(path))
        run_doc = doc.get("variant", doc)
        for v in run_doc["variants"]:
            causal = bool(v["options"].get("causal"))
            if v["name"] not in shapes or (causal and only == "full"):
                skipped.append(f"{os.path.basename(path)}: {v['name']}")
                continue
            if v["name"] not in schedules:
                schedules[v["name"]] = _schedules(v["options"], shapes[v["name"]])[0]
            for t in v["timings"]:
                size = Shape("attention", (t["B"], t["H"], t["S"], v["options"]["head_dim"]))
                pred = predict(schedules[v["name"]], size, machine)
                measured = t["ms"]["twill_bwd"]
                rows.append({"run": os.path.basename(path), "name": v["name"], "causal": causal,
                             "shape": size.as_dict(), "clock_ghz": t.get("clock_ghz"), "measured_ms": measured,
                             "predicted_ms": pred.seconds * 1e3,
                             "measured_over_predicted": measured / (pred.seconds * 1e3)})
    return {"machine_file": os.path.basename(machine_path), "solved_on": ARCH, "sources": sources, "rows": rows,
            "skipped": skipped}


def prediction_table(doc: dict[str, Any]) -> str:
    """Measured over predicted time per variant and S, then how many rows lie within ±15%."""
    lines = [f"{'variant':38s} {'S':>5s} {'measured ms':>11s} {'predicted ms':>12s} {'ratio':>6s}"]
    for r in doc["rows"]:
        lines.append(f"{r['name']:38s} {r['shape']['S']:>5d} {r['measured_ms']:11.3f} {r['predicted_ms']:12.3f} "
                     f"{r['measured_over_predicted']:6.2f}")
    within = sum(abs(r["measured_over_predicted"] - 1) <= 0.15 for r in doc["rows"])
    lines.append(f"within ±15%: {within} of {len(doc['rows'])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="solve and emit every variant (CPU)")
    g.add_argument("--out", required=True)
    r = sub.add_parser("run", help="check and time the emitted modules (GPU)")
    r.add_argument("--modules", required=True)
    r.add_argument("--out", default=os.environ.get("OUT", "."))
    r.add_argument("--only", default="", help="run the variants whose name contains this")
    z = sub.add_parser("sanitize", help="one checked launch per variant, under a sanitizer (GPU)")
    z.add_argument("--modules", required=True)
    z.add_argument("names", nargs="*", help="variants to launch (default: all)")
    z.add_argument("--control", action="store_true", help="then a copy that does not wait for its Q tiles")
    q = sub.add_parser("predict", help="today's prediction of committed runs against their times (CPU)")
    q.add_argument("results", nargs="+", help="results files (FILE#full: its variants without the mask only)")
    q.add_argument("--machine", default=os.path.join(ROOT, "benchmarks", "results", "calibration_h200.machine.json"))
    q.add_argument("--out", required=True, help="where to write the predictions (JSON)")
    t = sub.add_parser("table", help="print the table of a run's results (CPU)")
    t.add_argument("results")
    t.add_argument("--part", default=None, help="the run stored under this key of an A/B file (variant, base)")
    p = sub.add_parser("prediction-table", help="print the table of a predict output (CPU)")
    p.add_argument("results")
    args = ap.parse_args()
    if args.cmd in ("table", "prediction-table"):
        with open(args.results) as fh:
            doc = json.load(fh)
        if args.cmd == "prediction-table":
            print(prediction_table(doc))
        else:
            print(table(doc if args.part is None else doc[args.part]))
        return
    if args.cmd == "predict":
        suffixes = [s for s in args.results if s.partition("#")[2] not in ("", "full")]
        if suffixes:
            sys.exit(f"error: {suffixes[0]}: the only suffix is '#full'")
        missing = [s for s in args.results if not os.path.exists(s.partition("#")[0])] + (
            [] if os.path.isdir(os.path.dirname(os.path.abspath(args.out))) else [os.path.dirname(args.out)])
        if missing:
            sys.exit(f"error: not found: {', '.join(missing)}")
        doc = predict_runs(args.results, args.machine)
        doc["command"] = "python benchmarks/flash_bwd_check.py predict " + " ".join(args.results) + \
            f" --out {args.out}"
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(prediction_table(doc))
        return
    if args.cmd == "generate":
        generate(args.out)
    elif args.cmd == "sanitize":
        sys.exit(1 if sanitize(args.modules, args.names, args.control) else 0)
    else:
        run(args.modules, args.out, args.only)


if __name__ == "__main__":
    main()
