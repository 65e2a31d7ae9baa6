"""Where the compute partition of a generated attention backward spends its loop iteration: the emitted
backward with the SM cycle counter read before every statement of its main loop (a GPU experiment behind
docs/performance.md's notes on the backward, not a test and not a kernel to use).

The instrumented copy is made by exact text edits of the emitted module (``flash_bwd_check.py generate``'s
``*_bwd.py``; each edit must apply, so the probe cannot silently stop fitting when the generator changes):

* ``backward_kernel`` takes one more argument, ``probe_ptr`` (int32), which ``launch`` passes from the module
  global ``_PROBE`` and the kernel hands to its compute partition;
* at the start of every phase of the compute partition's main loop (a phase runs from a wait or a barrier to
  the next: :data:`PHASE_START`) and after the last one, the partition reads the low 32 bits of the cycle
  counter (``%clock``) and stores them at ``probe_ptr[(cta * n_iters + j) * MARKS + k]``.

A store per mark adds a few instructions per phase; the script times the plain and the instrumented
kernel to show what that costs. For each module it runs the generated forward (for O and the LSE), then the
plain and instrumented backward in interleaved rounds, checks that the instrumented kernel's dK and dV equal
the plain kernel's, and reports, per phase, the mean cycles from its mark to the next over the CTAs and
the steady-state iterations (the first and last iteration of each CTA left out), and the iteration (the sum).
Non-causal kernels only (every CTA runs the same iterations). Prints a table and writes
``$OUT/bwd_phases.json``.

    python benchmarks/bwd_phases.py --modules DIR NAME [NAME ...] --out $OUT [--seq 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times, load_module  # noqa: E402

#: Calls per sample and rounds of the plain/instrumented timing.
CALLS, ROUNDS = 5, 5
#: (B, H) of a run at sequence length S and head dim D: flash_bwd_check.py's shapes (16k tokens, 2048 // D heads).
TOKENS, HEAD_TOKENS = 16384, 2048

LOOP = re.compile(r"^    for j in range\((?:0|1), n_iters\):\n", re.M)
KERNEL_ARGS = ("sm_scale, group):", "sm_scale, group, probe_ptr):")
COMPUTE_ARGS = ("seq_k, qk_scale, sm_scale)", "seq_k, qk_scale, sm_scale, probe_ptr)")
LAUNCH_ARGS = ("H // kv_shape[1])", "H // kv_shape[1], _PROBE)")
COMPUTE_DEF = "@gluon.jit\ndef compute_partition("
#: The low 32 bits of the SM cycle counter: half the registers of ``%clock64`` in a kernel at its register
#: budget (differences are taken modulo 2**32 on the host).
CLOCK32 = '''@gluon.jit
def _clock32(anchor):
    """The SM cycle counter's low 32 bits (benchmark instrumentation)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [anchor], dtype=gl.int32, is_pure=False,
                                     pack=1)

'''
SIGNATURE = ('        "group": "i32",\n', '        "group": "i32",\n        "probe_ptr": "*i32",\n')


def _replace(text: str, old: str, new: str, count: int) -> str:
    if text.count(old) != count:
        raise SystemExit(f"bwd_phases.py: expected {count} x {old!r} in the emitted backward, found "
                         f"{text.count(old)} (the generator changed; update the probe)")
    return text.replace(old, new)


#: Statements a phase starts at: the waits (ring buffers, wgmma retirements, dQ staging) and the partition
#: barriers. The work between two of them is one phase: a mark between every statement would stop ptxas from
#: interleaving the elementwise work of neighbouring statements, which is what fits FA3's 128-row tile in its
#: registers (with such marks it spills).
PHASE_START = re.compile(r"^        (?:\w+(?:, \w+)* = )?(?:mbarrier\.wait|warpgroup_mma_wait|gl\.thread_barrier)\(")


def statements(body: list[str]) -> list[list[str]]:
    """The loop body's lines grouped into phases: each starts at a wait or a barrier (:data:`PHASE_START`), or
    at the body's first line, and runs to the next; comment lines go with the phase of the line after them."""
    out: list[list[str]] = []
    pending: list[str] = []
    for line in body:
        if line.lstrip().startswith("#") and not line.startswith("         "):
            pending.append(line)
        elif not out or PHASE_START.match(line):
            out.append(pending + [line])
            pending = []
        else:
            out[-1] += pending + [line]
            pending = []
    return out


def instrument(text: str) -> tuple[str, list[str]]:
    """The instrumented module text and the label (first code line) of each phase of the main loop."""
    text = _replace(text, KERNEL_ARGS[0], KERNEL_ARGS[1], 1)
    text = _replace(text, COMPUTE_ARGS[0], COMPUTE_ARGS[1], 2)
    text = _replace(text, LAUNCH_ARGS[0], LAUNCH_ARGS[1], 1)
    text = _replace(text, SIGNATURE[0], SIGNATURE[1], 1)
    text = _replace(text, COMPUTE_DEF, CLOCK32 + COMPUTE_DEF, 1)
    start = text.index("def compute_partition(")
    loop = LOOP.search(text, start)
    if loop is None:
        raise SystemExit("bwd_phases.py: no main loop 'for j in range(0|1, n_iters):' in compute_partition")
    lines = text[loop.end():].split("\n")
    n = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("        "))
    body = [line for line in lines[:n] if line.strip()]
    stmts = statements(body)
    marks = len(stmts) + 1

    def mark(k: int) -> list[str]:
        return [f"        gl.store(probe_ptr + (_pbase + j) * {marks} + {k}, _clock32(j))"]

    new_body: list[str] = []
    for k, stmt in enumerate(stmts):
        new_body += mark(k) + stmt
    new_body += mark(len(stmts))
    labels = [next(line for line in s if not line.lstrip().startswith("#")).strip() for s in stmts]
    head = "    _pbase = (gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)) * n_iters\n"
    text = (text[:loop.start()] + head + text[loop.start():loop.end()] + "\n".join(new_body) + "\n"
            + "\n".join(lines[n:]))
    return text + "\n_PROBE = None\n", labels


def phases_of(moddir: str, row: dict[str, Any], seq: int) -> dict[str, Any]:
    """Cycles per phase of one variant's backward main loop (module docstring)."""
    import torch

    if row["options"].get("causal"):
        raise SystemExit(f"bwd_phases.py: {row['name']} is causal; the probe takes non-causal kernels only")
    with open(os.path.join(moddir, row["bwd"])) as fh:
        text, labels = instrument(fh.read())
    marks = len(labels) + 1
    fwd = load_module(os.path.join(moddir, row["fwd"]), "bwd_phases_fwd_")
    plain = load_module(os.path.join(moddir, row["bwd"]), "bwd_phases_plain_")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "instrumented_" + row["bwd"])
        with open(path, "w") as fh:
            fh.write(text)
        probe = load_module(path, "bwd_phases_probe_")
    D = row["options"]["head_dim"]
    dtype = torch.bfloat16 if row["options"].get("dtype") == "bf16" else torch.float16
    B, H = TOKENS // seq, HEAD_TOKENS // D
    kv = row["options"].get("kv_heads") or H
    torch.manual_seed(seq)
    q, do = (torch.randn(B, H, seq, D, device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(B, kv, seq, D, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = fwd.launch(q, k, v, return_lse=True)
    block_n, block_m = plain.BLOCK_N.value, plain.BLOCK_M.value
    ctas = -(-seq // block_n) * B * kv
    iters = (H // kv) * -(-seq // block_m)
    probe._PROBE = torch.zeros(ctas * iters * marks, dtype=torch.int32, device="cuda")
    outs = {}
    for name, mod in (("plain", plain), ("instrumented", probe)):
        outs[name] = mod.launch(q, k, v, o, do, lse)
    exact = all(torch.equal(a, b) for a, b in zip(outs["plain"][1:], outs["instrumented"][1:]))
    ms, spread, window = event_times({"plain": lambda: plain.launch(q, k, v, o, do, lse),
                                      "instrumented": lambda: probe.launch(q, k, v, o, do, lse)}, CALLS, ROUNDS)
    probe._PROBE.zero_()
    probe.launch(q, k, v, o, do, lse)
    torch.cuda.synchronize()
    stamps = probe._PROBE.view(ctas, iters, marks).long()
    steady = stamps[:, 1:-1] if iters > 2 else stamps
    deltas = ((steady[:, :, 1:] - steady[:, :, :-1]) % 2**32).double().mean(dim=(0, 1)).tolist()
    per_iter = (((stamps[:, 2:-1, 0] - stamps[:, 1:-2, 0]) % 2**32).double().mean().item() if iters > 3
                else float("nan"))
    return {"name": row["name"], "options": row["options"], "shape": {"B": B, "H": H, "S": seq, "D": D},
            "ctas": ctas, "iterations": iters, "labels": labels, "cycles": deltas,
            "iteration_cycles": per_iter, "ms": ms, "ms_spread": spread, "window": window,
            "dk_dv_equal": exact}


def table(doc: dict[str, Any]) -> str:
    """Per variant: mean cycles per phase of the main loop (labelled by its first line), then the iteration
    and the timings."""
    lines = []
    for r in doc["results"]:
        lines.append(f"{r['name']} S={r['shape']['S']}: {r['iteration_cycles']:.0f} cycles per iteration "
                     f"(marks), plain {r['ms']['plain']:.3f} ms, instrumented {r['ms']['instrumented']:.3f} ms, "
                     f"dK/dV {'equal' if r['dk_dv_equal'] else 'DIFFER'}"
                     + (f", {r['cycles_per_iteration']:.0f} cycles per iteration from the plain time at "
                        f"{r['clock_ghz']:.2f} GHz" if r.get("cycles_per_iteration") else ""))
        for label, cyc in zip(r["labels"], r["cycles"]):
            lines.append(f"  {cyc:7.0f}  {label[:100]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", required=True, help="a folder written by 'flash_bwd_check.py generate'")
    ap.add_argument("names", nargs="+", help="variants (manifest.json names) to instrument")
    ap.add_argument("--seq", type=int, default=4096, help="sequence length (B = 16384 // S, H = 2048 // D)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    manifest_path = os.path.join(args.modules, "manifest.json")
    if not os.path.isfile(manifest_path):
        ap.error(f"{args.modules}: no manifest.json (run 'python benchmarks/flash_bwd_check.py generate' first)")
    with open(manifest_path) as fh:
        manifest = {r["name"]: r for r in json.load(fh)}
    missing = [n for n in args.names if n not in manifest]
    if missing:
        ap.error(f"no variant {', '.join(missing)} in {manifest_path}")
    import torch

    from twill.machine.microbench import ClockSampler

    results = []
    with ClockSampler() as sampler:
        for name in args.names:
            results.append(phases_of(args.modules, manifest[name], args.seq))
            print(f"{name}: done", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for r in results:
        clock = sampler.median_ghz(*r.pop("window"))
        r["clock_ghz"] = clock
        r["cycles_per_iteration"] = (r["ms"]["plain"] * 1e-3 * clock * 1e9 * sms / (r["ctas"] * r["iterations"])
                                     if clock else None)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bwd_phases.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(table(doc))


if __name__ == "__main__":
    main()
