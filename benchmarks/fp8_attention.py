"""Check and time the generated fp8 attention forward beside FlashAttention-3's fp8 forward (issue 35; a benchmark
script, not part of the library).

Two steps, so that the GPU machine needs neither ortools nor the solver:

* ``generate --out DIR`` (CPU): the hand-built schedule of every variant in :data:`VARIANTS` (head dims 64, 128,
  256; causal and not; all heads or grouped K/V heads), emitted (``--dtype fp8e4m3``, V transposed by the
  launcher's pre-pass) into ``DIR`` with ``DIR/manifest.json``.
* ``run --modules DIR`` (GPU; imports only the emitted modules, torch, triton and FA3's ``fa3_fwd_interface``
  from ``../shared/tools/peers.sh``): for every variant and ``S`` in :data:`SEQS`, B = 4 and H = 4096 / D
  (the issue's anchor), e4m3 q, k, v quantized from random fp32 values with per-(batch, K/V head) descale
  factors: the relative error of twill's output and of FA3's against an fp32 reference of the unquantized
  inputs (``relerr``, ``fa3_relerr``), then both timed in one run (CUDA events around ``CALLS`` calls,
  ``ROUNDS`` interleaved rounds, medians; twill's time includes its V transpose pre-pass) as TFLOP/s
  (4·B·H·S²·D, halved when causal). Writes ``$OUT/fp8_h200.json`` (or ``--out``) with one row per case:
  ``{"D", "S", "causal", "kv_heads", "twill_tflops", "fa3_tflops", "ratio", "relerr", "fa3_relerr"}``.

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

#: (name, kernel options, ahead, persistent): the hand-built tiles of the 16-bit benchmark (gluon_bench.py) in
#: fp8. D = 256 runs 64-key blocks on two sub-tiles (the default tile); ``kv_heads`` 0 = all heads, 8 =
#: grouped-query. Persistent except at D = 128, whose persistent fp8 kernel spills 256 bytes (ptxas; the
#: one-CTA-per-block kernel does not: tests/codegen/test_codegen_gluon_fp8.py).
VARIANTS = [
    (f"fa8_d{d}{'_causal' if causal else ''}{f'_kv{kv}' if kv else ''}",
     {"subtiles": 2, "head_dim": d, **({"block_n": 64} if d == 256 else {}), "causal": causal,
      **({"kv_heads": kv} if kv else {})}, 1, d != 128)
    for d in (64, 128, 256) for causal in (False, True) for kv in (0, 8)
]
#: Sequence lengths timed (the issue's table: 2k to 16k).
SEQS = (2048, 4096, 8192, 16384)
#: Batch and H·D of the issue's anchor (FA3's own benchmark shape).
BATCH, HIDDEN = 4, 4096
CALLS, ROUNDS = 10, 5


def generate(outdir: str) -> list[dict[str, Any]]:
    """Emit every variant into ``outdir`` and write ``manifest.json``."""
    from twill.codegen.gluon import emit_gluon
    from twill.kernels import build_kernel
    from twill.kernels.flash_fwd.variants import flash_schedule
    from twill.machine.models import H200
    from twill.schedule.verify import verify

    os.makedirs(outdir, exist_ok=True)
    rows = []
    for name, options, ahead, persistent in VARIANTS:
        schedule = flash_schedule(build_kernel("flash-fwd", H200, dtype="fp8e4m3", **options), H200, ahead=ahead,
                                  depth=2)
        verify(schedule, H200)
        with open(os.path.join(outdir, f"{name}.py"), "w") as fh:
            fh.write(emit_gluon(schedule, persistent=persistent))
        rows.append({"name": name, "file": f"{name}.py", "options": options, "ii": schedule.ii,
                     "persistent": persistent})
        print(f"{name}: II {schedule.ii}")
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


def run(moddir: str, out: str) -> dict[str, Any]:
    """Check and time every variant of ``moddir`` at every ``S`` (see the module docstring)."""
    import torch

    from benchmarks._common import event_times, load_module

    with open(os.path.join(moddir, "manifest.json")) as fh:
        manifest = json.load(fh)
    rows = []
    for entry in manifest:
        mod = load_module(os.path.join(moddir, entry["file"]), "fp8_")
        d, causal = entry["options"]["head_dim"], entry["options"]["causal"]
        H = HIDDEN // d
        kv_heads = entry["options"].get("kv_heads", 0) or H
        for S in SEQS:
            (q, k, v), (q8, k8, v8), descales = _inputs(BATCH, H, kv_heads, S, d)
            ref = _reference(q, k, v, causal)
            ours = mod.launch(q8, k8, v8, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
            theirs = _fa3(q8, k8, v8, descales, causal)
            fns = {"twill": lambda: mod.launch(q8, k8, v8, q_descale=descales[0], k_descale=descales[1],
                                               v_descale=descales[2]),
                   "fa3": lambda: _fa3(q8, k8, v8, descales, causal)}
            ms, _, _ = event_times(fns, CALLS, ROUNDS)
            flops = 4 * BATCH * H * S * S * d / (2 if causal else 1)
            row = {"D": d, "S": S, "causal": causal, "kv_heads": kv_heads,
                   "twill_tflops": flops / ms["twill"] / 1e9, "fa3_tflops": flops / ms["fa3"] / 1e9,
                   "relerr": _relerr(ours, ref), "fa3_relerr": _relerr(theirs, ref)}
            row["ratio"] = row["twill_tflops"] / row["fa3_tflops"]
            rows.append(row)
            print(f"{entry['name']} S={S}: twill {row['twill_tflops']:.0f} TFLOP/s, FA3 {row['fa3_tflops']:.0f} "
                  f"({row['ratio']:.2f}x); relerr {row['relerr']:.3f} (FA3 {row['fa3_relerr']:.3f})")
            del q, k, v, q8, k8, v8, ref, ours, theirs
            torch.cuda.empty_cache()
    result = {"command": f"python benchmarks/fp8_attention.py run --modules {moddir} --out {out}",
              "device": torch.cuda.get_device_name(), "batch": BATCH, "hidden": HIDDEN, "rows": rows}
    with open(os.path.join(out, "fp8_h200.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="emit every variant (CPU)")
    g.add_argument("--out", required=True)
    r = sub.add_parser("run", help="check and time the emitted modules beside FA3 (GPU)")
    r.add_argument("--modules", required=True)
    r.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.cmd == "generate":
        generate(args.out)
    else:
        run(args.modules, args.out)


if __name__ == "__main__":
    main()
