"""Where an attention kernel's time goes: the emitted kernel timed beside copies of it with one part removed
or changed (a GPU experiment behind docs/performance.md's fidelity notes, not a test and not a kernel to use).

Each *probe* is a list of exact text substitutions applied to an emitted module (every one must match, so a
probe cannot silently stop applying when the generator changes). Removing a part makes the kernel compute
something else: only the ``rotate`` probe keeps the result, and it is checked; the others are timed only.

Forward probes (``twill emit gluon flash-fwd`` modules):

* ``no-exp``: ``P = S·c − m`` instead of ``exp2(S·c − m)`` (no MUFU work for P);
* ``no-softmax``: ``P = S`` and no row max, row sum or alpha;
* ``no-pv``: the ``O += P V`` wgmma of the main loop not issued;
* ``no-rescale``: no ``O *= alpha``;
* ``no-loads``: the producer loads each ring's first ``DEPTH`` tiles, then only arrives on the ``ready``
  barrier (no TMA copy): the compute partitions run on tiles already in shared memory, as the calibration's
  attention-iteration microbenchmark does, while the ring's ``empty`` hand-offs stay.

Backward probe (``twill emit gluon flash-bwd`` modules):

* ``rotate``: every key block's CTA starts its walk over the query blocks at a different block
  (``program_id(0)·2``, wrapping), so that the CTAs of one head do not all add their dQ tiles into the same
  rows at the same time.

For each module and probe, the script prints and writes (``$OUT/attention_probe.json``) the median time over
interleaved rounds (CUDA events), the SM clock while it ran, and the cycles one SM spends per loop
iteration of one CTA: ``ms · clock · SMs / (tiles · iterations)``.

A backward module NAME_bwd.py is checked with the forward NAME_fwd.py beside it (the pairs that
``benchmarks/flash_bwd_check.py generate`` writes).

    python benchmarks/attention_probe.py --out $OUT FILE.py [FILE.py ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times, load_module  # noqa: E402

#: The online-softmax step (its m_use line, a causal kernel's guard for rows with no key yet, included).
SOFTMAX = re.compile(r"    m_new = gl\.maximum\(m_i, gl\.max\(s, 1\) \* qk_scale\)[^\n]*\n"
                     r"(?:    m_use = [^\n]*\n)?"
                     r"    alpha = gl\.exp2\(m_i - m_\w+\)[^\n]*\n"
                     r"    p = gl\.exp2\(s \* qk_scale - m_\w+\[:, None\]\)[^\n]*\n"
                     r"    l_new = l_i \* alpha \+ gl\.sum\(p, 1\)[^\n]*\n")
PV = "        o_tok = warpgroup_mma(p_op, v_ring.index(j % V_DEPTH), o, is_async=True)\n"
#: A producer's TMA load of one ring buffer (its expect and copy), in any emitted attention forward.
LOAD = re.compile(r"( +)mbarrier\.expect\((\w+)_ready\.index\(buffer\), (.+)\)\n"
                  r"\1(tma\.async_copy_global_to_shared\([^\n]*(?:\n\1 {4,}[^\n]*)*)\n")


def _first_fill_only(match: re.Match) -> str:
    """The load of ``match`` for the ring's first pass only; later passes arrive on ``ready`` without a copy."""
    pad, ring, nbytes, copy = match.groups()
    copy = copy.replace("\n", "\n    ")          # its continuation lines, one level deeper too
    return (f"{pad}if j < {ring.upper()}_DEPTH:  # probe no-loads: the first fill only\n"
            f"{pad}    mbarrier.expect({ring}_ready.index(buffer), {nbytes})\n{pad}    {copy}\n"
            f"{pad}else:\n{pad}    mbarrier.arrive({ring}_ready.index(buffer))\n")
RESCALE = "        o = o * gl.convert_layout(alpha, row_o)[:, None]  # rescale\n"

#: probe -> (kernel, [(old, new), ...]) substitutions: exact text, or a compiled pattern and its replacement
#: (a template or a function of the match)
PROBES: dict[str, tuple[str, list[tuple[Any, Any]]]] = {
    "no-exp": ("flash-fwd", [(re.compile(r"p = gl\.exp2\(s \* qk_scale - (m_\w+)\[:, None\]\)"),
                              r"p = s * qk_scale - \1[:, None]")]),
    "no-softmax": ("flash-fwd", [(SOFTMAX, "    m_new = m_i\n    alpha = m_i\n    p = s\n    l_new = l_i\n")]),
    "no-pv": ("flash-fwd", [(PV, "        o_tok = o\n")]),
    "no-rescale": ("flash-fwd", [(RESCALE, "")]),
    "no-loads": ("flash-fwd", [(LOAD, _first_fill_only)]),
    "rotate": ("flash-bwd", [(re.compile(r"m_start = \(m_first \+ (\w+) % n_m\) \* BLOCK_M"),
                              r"m_start = (m_first + (\1 + gl.program_id(0) * 2) % n_m) * BLOCK_M")]),
}
#: Timed shape: B·S = 32k tokens (forward, B = 4 at S = 8192) or 16k (backward), H·D = 4096 / 2048.
SEQ = 8192
CALLS, ROUNDS = 5, 5


def apply(text: str, probe: str) -> str:
    """``text`` with ``probe``'s substitutions; a substitution that does not match is an error."""
    for old, new in PROBES[probe][1]:
        pattern = old if isinstance(old, re.Pattern) else re.compile(re.escape(old))
        text, count = pattern.subn(new.replace("\\", "\\\\") if pattern is not old else new, text)
        if not count:
            raise SystemExit(f"probe {probe}: {pattern.pattern.strip()[:60]!r} not found")
    if probe == "no-loads":
        copies = len(re.findall(r"tma\.async_copy_global_to_shared\([kv]_desc", text))
        if copies != text.count("probe no-loads"):
            raise SystemExit("probe no-loads: a K/V copy without its own expect (rings sharing a barrier)")
    return text


def _shape(kernel: str, head_dim: int) -> tuple[int, int]:
    """(B, H) of the timed problem."""
    if kernel == "flash-bwd":
        return 16384 // SEQ, 2048 // head_dim
    return 32768 // SEQ, 4096 // head_dim


def _contenders(path: str, tmp: str) -> dict[str, Any]:
    """The module at ``path`` and one copy per probe of its kernel, loaded."""
    with open(path) as fh:
        text = fh.read()
    kernel = "flash-bwd" if 'KERNEL = "flash-bwd"' in text else "flash-fwd"
    stem = os.path.splitext(os.path.basename(path))[0]
    mods = {"original": load_module(path, "probe_")}
    for probe, (kind, _) in PROBES.items():
        if kind != kernel:
            continue
        copy = os.path.join(tmp, f"{stem}_{probe.replace('-', '_')}.py")
        with open(copy, "w") as fh:
            fh.write(apply(text, probe))
        mods[probe] = load_module(copy, "probe_")
    return {"kernel": kernel, "modules": mods}


def _forward_fns(mods: dict[str, Any], head_dim: int) -> dict[str, Any]:
    import torch

    B, H = _shape("flash-fwd", head_dim)
    q, k, v = (torch.randn(B, H, SEQ, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    return {name: (lambda m=m: m.launch(q, k, v, out=out)) for name, m in mods.items()}


def _backward_fns(mods: dict[str, Any], head_dim: int, fwd: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Timed closures of each backward module, and the check of each against the original at S = 513 and
    4096 (the rotated walk must give the same gradients)."""
    import torch

    from benchmarks.flash_bwd_check import check

    checks = {}
    for name, m in mods.items():
        checks[name] = [check(fwd, m, {"head_dim": head_dim}, S)["pass"] for S in (513, 4096)]
    B, H = _shape("flash-bwd", head_dim)
    q, k, v, do = (torch.randn(B, H, SEQ, head_dim, device="cuda", dtype=torch.float16) for _ in range(4))
    o, lse = fwd.launch(q, k, v, return_lse=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    return ({name: (lambda m=m: m.launch(q, k, v, o, do, lse, dq=dq, dk=dk, dv=dv)) for name, m in mods.items()},
            checks)


def probe_file(path: str) -> dict[str, Any]:
    """Time one module and its probes; returns its JSON record (cycles are filled in by :func:`add_cycles`
    once the clock readings are in)."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        found = _contenders(path, tmp)
        kernel, mods = found["kernel"], found["modules"]
        head_dim = mods["original"].HEAD_DIM.value
        block_m, block_n = mods["original"].BLOCK_M.value, mods["original"].BLOCK_N.value
        checks: dict[str, Any] = {}
        if kernel == "flash-bwd":
            fwd_path = path[: -len("_bwd.py")] + "_fwd.py"  # benchmarks/flash_bwd_check.py's pair
            fns, checks = _backward_fns(mods, head_dim, load_module(fwd_path, "probe_fwd_"))
            tiles_per_head, iterations = math.ceil(SEQ / block_n), math.ceil(SEQ / block_m)
        else:
            fns = _forward_fns(mods, head_dim)
            tiles_per_head, iterations = math.ceil(SEQ / block_m), math.ceil(SEQ / block_n)
        ms, spread, window = event_times(fns, CALLS, ROUNDS)
    B, H = _shape(kernel, head_dim)
    rows = {name: {"ms": t, "ms_spread": spread[name], "vs_original": ms["original"] / t,
                   **({"check": checks[name]} if checks else {})} for name, t in ms.items()}
    return {"file": os.path.basename(path), "kernel": kernel, "shape": {"B": B, "H": H, "S": SEQ, "D": head_dim},
            "tiles": B * H * tiles_per_head, "iterations": iterations,
            "sms": torch.cuda.get_device_properties(0).multi_processor_count, "window": window, "probes": rows}


def add_cycles(record: dict[str, Any], sampler: Any) -> None:
    """The clock while ``record`` ran and each probe's cycles per iteration per SM."""
    clock = sampler.median_ghz(*record.pop("window"))
    record["clock_ghz"] = clock
    for row in record["probes"].values():
        row["cycles_per_iteration"] = (row["ms"] * 1e-3 * clock * 1e9 * record["sms"]
                                       / (record["tiles"] * record["iterations"]) if clock else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="emitted flash-fwd or flash-bwd modules")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch

    from twill.machine.microbench import ClockSampler

    results = []
    with ClockSampler() as sampler:
        for path in args.files:
            try:
                results.append(probe_file(path))
            except Exception as exc:  # one module failing does not lose the others
                results.append({"file": os.path.basename(path), "error": f"{type(exc).__name__}: {exc}"})
            print(f"{path}: done", flush=True)
    for r in results:
        if "probes" in r:
            add_cycles(r, sampler)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_probe.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, fh,
                  indent=1)
    for r in results:
        if "error" in r:
            print(f"{r['file']}: {r['error']}")
            continue
        for name, row in r["probes"].items():
            cyc = f"{row['cycles_per_iteration']:.0f}" if row["cycles_per_iteration"] else "-"
            print(f"{r['file']:36s} {name:11s} {row['ms']:8.3f} ms  x{row['vs_original']:.2f}  "
                  f"{cyc:>6s} cyc/iter  {r['clock_ghz'] or 0:.2f} GHz {row.get('check', '')}")


if __name__ == "__main__":
    main()
