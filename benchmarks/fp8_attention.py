"""Check and time the generated fp8 attention forward beside FlashAttention-3's fp8 forward (issue 35; a benchmark
script, not part of the library).

Two steps, so that the GPU machine needs neither ortools nor the solver:

* ``generate --out DIR`` (CPU): the kernels ``twill.ops.attention`` runs for every case of :data:`CASES` (head
  dims 64, 128, 256; causal and not; all heads or grouped K/V heads), emitted from the op's shipped schedules
  (``twill.ops.flash.kernel_path``, no solver) into ``DIR`` with ``DIR/manifest.json``.
* ``run --modules DIR`` (GPU; imports only the emitted modules, torch, triton and FA3's ``fa3_fwd_interface``
  from ``../shared/tools/peers.sh``): for every variant and ``S`` in :data:`SEQS`, B = 4 and H = 4096 / D
  (the issue's anchor), e4m3 q, k, v quantized from random fp32 values with per-(batch, K/V head) descale
  factors: the relative error of twill's output and of FA3's against an fp32 reference of the unquantized
  inputs (``relerr``, ``fa3_relerr``), then both timed in one run (CUDA events around ``CALLS`` calls,
  ``ROUNDS`` interleaved rounds, medians; twill's time includes its V transpose pre-pass) as TFLOP/s
  (4·B·H·S²·D, halved when causal), with the SM clock sampled over each row's rounds. Writes
  ``$OUT/fp8_h200.json`` (``fp8_h100.json`` on an H100; into ``--out`` when given) with one row per case and
  S: ``{"name", "D", "S", "causal", "kv_heads", "twill_tflops", "fa3_tflops", "ratio", "relerr", "fa3_relerr",
  "sm_clock_mhz"}``. ``--seqs`` and ``--only`` (manifest names) narrow the run; a manifest row may name any
  emitted fp8 forward module (a candidate kernel beside the op's), each timed against FA3 in its own rounds.

    bash ../shared/tools/peers.sh fetch .peers fwd && cp ../shared/tools/peers.sh .peers/   # CPU machine, once
    python benchmarks/fp8_attention.py generate --out .peers/fp8_modules     # CPU, into the carried folder
    # GPU machine (carry .peers; ../shared is not copied there):
    bash .peers/peers.sh install .peers && export PYTHONPATH=/tmp/peers:$PYTHONPATH
    python benchmarks/fp8_attention.py run --modules .peers/fp8_modules --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: (name, head dim, causal, K/V heads): the cases timed; K/V heads 0 = as many as the query heads.
CASES = [(f"fa8_d{d}{'_causal' if causal else ''}{f'_kv{kv}' if kv else ''}", d, causal, kv)
         for d in (64, 128, 256) for causal in (False, True) for kv in (0, 8)]
#: Sequence lengths timed (the issue's table: 2k to 16k).
SEQS = (2048, 4096, 8192, 16384)
#: Batch and H·D of the issue's anchor (FA3's own benchmark shape).
BATCH, HIDDEN = 4, 4096
CALLS, ROUNDS = 10, 5


def generate(outdir: str) -> list[dict[str, Any]]:
    """Emit the op's kernel of every case into ``outdir`` and write ``manifest.json``."""
    import shutil

    from twill.ops.flash import kernel_path
    from twill.ops.spec import KernelSpec

    os.makedirs(outdir, exist_ok=True)
    rows = []
    for name, d, causal, kv in CASES:
        spec = KernelSpec("flash-fwd", d, "fp8e4m3", causal, kv)
        shutil.copyfile(kernel_path(spec), os.path.join(outdir, f"{name}.py"))
        rows.append({"name": name, "file": f"{name}.py", "options": spec.kernel_options()})
        print(f"{name}: {rows[-1]['options']}")
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return rows


def _inputs(B: int, H: int, kv_heads: int, S: int, D: int) -> tuple[Any, ...]:
    """fp32 q [B, H, S, D], k, v [B, kv_heads, S, D]; their e4m3 quantizations with per-(batch, K/V head) descale
    factors (the amax over each head's rows of q's group, k, v, over e4m3's 448)."""
    import torch

    group = H // kv_heads
    q = torch.randn(B, H, S, D, device="cuda")
    k, v = (torch.randn(B, kv_heads, S, D, device="cuda") for _ in range(2))
    q_amax = q.abs().amax(dim=(2, 3)).view(B, kv_heads, group).amax(dim=2)
    descales = [q_amax / 448, k.abs().amax(dim=(2, 3)) / 448, v.abs().amax(dim=(2, 3)) / 448]
    per_head = [descales[0].repeat_interleave(group, dim=1), descales[1], descales[2]]
    q8, k8, v8 = ((t / s[:, :, None, None]).to(torch.float8_e4m3fn) for t, s in zip((q, k, v), per_head))
    return (q, k, v), (q8, k8, v8), descales


def _reference(q: Any, k: Any, v: Any, causal: bool) -> Any:
    import torch.nn.functional as F

    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _relerr(out: Any, ref: Any) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _fa3(q8: Any, k8: Any, v8: Any, descales: list[Any], causal: bool) -> Any:
    """FA3's fp8 forward on our [B, H, S, D] tensors (it takes [B, S, H, D]); its output as [B, H, S, D]."""
    from fa3_fwd_interface import flash_attn_func

    q, k, v = (t.transpose(1, 2).contiguous() for t in (q8, k8, v8))
    out = flash_attn_func(q, k, v, causal=causal, q_descale=descales[0], k_descale=descales[1],
                          v_descale=descales[2])
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)


def run(moddir: str, out: str, seqs: tuple[int, ...] = SEQS, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check and time every module of ``moddir`` (those named in ``only``, when given) at every ``S`` of
    ``seqs`` (see the module docstring)."""
    import torch

    from twill.machine.microbench import ClockSampler

    with open(os.path.join(moddir, "manifest.json")) as fh:
        manifest = json.load(fh)
    with ClockSampler() as sampler:
        rows = _run_rows(manifest, moddir, seqs, only)
    for row in rows:
        ghz = sampler.median_ghz(*row.pop("window"))
        row["sm_clock_mhz"] = None if ghz is None else round(ghz * 1e3)
    result = {"command": " ".join(["python benchmarks/fp8_attention.py", *sys.argv[1:]]),
              "device": torch.cuda.get_device_name(), "batch": BATCH, "hidden": HIDDEN, "rows": rows}
    card = "h100" if "H100" in result["device"] else "h200"
    with open(os.path.join(out, f"fp8_{card}.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return result


def _run_rows(manifest: list[dict[str, Any]], moddir: str, seqs: tuple[int, ...],
              only: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of :func:`run`, each with the unix-time ``window`` its rounds ran in."""
    import torch

    from benchmarks._common import event_times, load_module

    rows = []
    for entry in manifest:
        if only and entry["name"] not in only:
            continue
        mod = load_module(os.path.join(moddir, entry["file"]), "fp8_")
        d, causal = entry["options"]["head_dim"], entry["options"]["causal"]
        H = HIDDEN // d
        kv_heads = entry["options"].get("kv_heads", 0) or H
        for S in seqs:
            (q, k, v), (q8, k8, v8), descales = _inputs(BATCH, H, kv_heads, S, d)
            ref = _reference(q, k, v, causal)
            ours = mod.launch(q8, k8, v8, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
            theirs = _fa3(q8, k8, v8, descales, causal)
            fns = {"twill": lambda: mod.launch(q8, k8, v8, q_descale=descales[0], k_descale=descales[1],
                                               v_descale=descales[2]),
                   "fa3": lambda: _fa3(q8, k8, v8, descales, causal)}
            ms, _, window = event_times(fns, CALLS, ROUNDS)
            flops = 4 * BATCH * H * S * S * d / (2 if causal else 1)
            row = {"name": entry["name"], "D": d, "S": S, "causal": causal, "kv_heads": kv_heads,
                   "twill_tflops": flops / ms["twill"] / 1e9, "fa3_tflops": flops / ms["fa3"] / 1e9,
                   "relerr": _relerr(ours, ref), "fa3_relerr": _relerr(theirs, ref), "window": window}
            row["ratio"] = row["twill_tflops"] / row["fa3_tflops"]
            rows.append(row)
            print(f"{entry['name']} S={S}: twill {row['twill_tflops']:.0f} TFLOP/s, FA3 {row['fa3_tflops']:.0f} "
                  f"({row['ratio']:.2f}x); relerr {row['relerr']:.3f} (FA3 {row['fa3_relerr']:.3f})")
            del q, k, v, q8, k8, v8, ref, ours, theirs
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="emit the op's kernel of every case (CPU)")
    g.add_argument("--out", required=True)
    r = sub.add_parser("run", help="check and time the emitted modules beside FA3 (GPU)")
    r.add_argument("--modules", required=True)
    r.add_argument("--out", default=os.environ.get("OUT", "."))
    r.add_argument("--seqs", default=",".join(map(str, SEQS)), help="comma-separated sequence lengths")
    r.add_argument("--only", default="", help="comma-separated manifest names (default: all)")
    args = ap.parse_args()
    if args.cmd == "generate":
        generate(args.out)
    else:
        run(args.modules, args.out, tuple(int(x) for x in args.seqs.split(",") if x),
            tuple(x for x in args.only.split(",") if x))


if __name__ == "__main__":
    main()
