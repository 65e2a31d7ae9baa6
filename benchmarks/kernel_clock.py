"""The SM clock a generated kernel actually runs at, read by the kernel itself (a GPU experiment behind
docs/performance.md's fidelity notes, not a test and not a kernel to use).

The GPU is power-capped, so its clock moves with what runs on it, and ``nvidia-smi``'s reading of it
(:class:`twill.machine.microbench.ClockSampler`) is a sample of the requested clock, not of the cycles the SMs
ran. Here each CTA of an emitted Gluon module reads the SM cycle counter (``%clock64``) and the global
nanosecond timer (``%globaltimer``) when its kernel function starts and when it ends (after every partition
has finished and the output is stored), and writes both spans to a side buffer; over the CTAs of the last
launch, cycles / nanoseconds is the clock the kernel ran at, and the CTAs' time over the kernel's time on all
SMs is how much of the run the SMs held a block. The instrumented copy is made by exact text edits of the
module (its ``KERNEL_FN`` gains a ``clk_ptr`` argument, which its ``launch`` passes); each edit must match
once, so the probe stops with a message rather than timing an unchanged kernel when the generator changes.

For the candidates of a ``model_fidelity.py generate`` directory, on every shape of its manifest (or the
kernels of a ``gluon_bench.py generate`` directory: attention at B = 4, H = 32 and ``--seq``): the plain
and the instrumented kernel timed with the fidelity benchmark's ``do_bench`` (warm-up 25 ms, 150 ms), and the
instrumented kernel's clock. Writes ``$OUT/kernel_clock.json`` (``twill-kernel-clock/1``: per kernel and
shape its FLOP, times, clock and SM busy share) and prints a table; ``twill calibrate --clock-fit`` fits the
machine's clock model to its GEMM rows.

    python benchmarks/kernel_clock.py out/fidelity --out $OUT [--only fa_d128 gemm_128x256x64_d3]
    python benchmarks/kernel_clock.py benchmarks/gluon_kernels --only fa_causal_d64_sub3 --seq 2048 8192 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import COUNTER_READERS, load_module  # noqa: E402
from benchmarks.model_fidelity import _inputs, _launcher, _shape_dict, _time  # noqa: E402

START = "    _c0 = _clock64(gl.program_id(0))\n    _g0 = _globaltimer(gl.program_id(0))\n"
END = ("    _c1 = _clock64(gl.program_id(0))\n    _g1 = _globaltimer(gl.program_id(0))\n"
       "    _cta = gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)\n"
       "    gl.store(clk_ptr + 2 * _cta, (_c1 - _c0).to(gl.float32))\n"
       "    gl.store(clk_ptr + 2 * _cta + 1, (_g1 - _g0).to(gl.float32))\n")
CLK_SLOT = "\n#: The span buffer the instrumented launch passes (kernel_clock.py sets it).\n_CLK = [None]\n"
#: Side-buffer floats: two per CTA, for up to this many CTAs.
MAX_CTAS = 1 << 20


def _once(pattern: str, text: str) -> re.Match[str]:
    found = list(re.finditer(pattern, text, flags=re.M | re.S))
    if len(found) != 1:
        raise SystemExit(f"kernel_clock: {pattern[:60]!r} matches {len(found)} times, expected once")
    return found[0]


def instrument(text: str) -> str:
    """The module text with the kernel's span counters (see the module docstring)."""
    name = _once(r"^KERNEL_FN = (\w+)$", text).group(1)
    head = _once(rf"^@gluon\.jit\ndef {name}\((.*?)\):\n(    \"\"\".*?\"\"\"\n)?", text)  # signature, docstring
    after = re.compile(r"\n(?=\S)").search(text, head.end())  # the next top-level line ends the body
    if after is None:
        raise SystemExit(f"kernel_clock: nothing follows {name}'s body")
    body_end = after.start() + 1
    direct = f"    _launch({name}, grid, NUM_WARPS, " in text   # the attention launchers' direct launch
    launch = (_once(rf"^(    _launch\({name}, grid, NUM_WARPS, .*?)\)$", text) if direct
              else _once(rf"^(    {name}\[grid\]\(.*?)num_warps=NUM_WARPS\)$", text))
    params = head.group(1)
    signature = text[head.start():head.end()].replace(f"def {name}({params}):", f"def {name}({params}, clk_ptr):")
    body = text[head.end():body_end].rstrip("\n") + "\n"
    call = launch.group(1) + (", _CLK[0])" if direct else "clk_ptr=_CLK[0], num_warps=NUM_WARPS)")
    return "".join([text[:head.start()], COUNTER_READERS, signature, START, body, END, "\n",
                    text[body_end:launch.start()], call, text[launch.end():], CLK_SLOT])


#: Shapes of a ``gluon_bench.py generate`` directory's kernels (its manifest names no shapes): GEMM M, N, K;
#: attention B and H (S from ``--seq``, D from the kernel).
GEMM_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024))
ATTENTION_BH = (4, 32)


def _entries(kernel_dir: str, seqs: tuple[int, ...]) -> list[dict[str, Any]]:
    """The kernels of a ``model_fidelity.py generate`` directory (its manifest's shapes) or of a
    ``gluon_bench.py generate`` directory (forward attention and GEMM kernels at ``seqs`` / GEMM_SHAPES)."""
    manifest = json.load(open(os.path.join(kernel_dir, "manifest.json")))
    if isinstance(manifest, dict):
        return [e for e in manifest["entries"] if "file" in e]
    entries = []
    for e in manifest:
        if e["kernel"] == "gemm":
            shapes = [{"problem": "gemm", "sizes": list(s)} for s in GEMM_SHAPES]
        elif e["kernel"] == "flash-fwd":
            shapes = [{"problem": "attention", "sizes": [*ATTENTION_BH, s, e["options"].get("head_dim", 128)]}
                      for s in seqs]
        else:
            continue
        entries.append({**e, "shapes": shapes})
    return entries


def measure(kernel_dir: str, only: list[str] | None, seqs: tuple[int, ...] = (2048, 8192)
            ) -> list[dict[str, Any]]:
    """Plain and instrumented time and the kernel's own clock for every candidate and shape."""
    import torch

    from twill.tune.predict import Shape

    entries = [e for e in _entries(kernel_dir, seqs) if not only or any(o in e["name"] for o in only)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(2 * MAX_CTAS, device="cuda")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in entries:
            src = os.path.join(kernel_dir, entry["file"])
            copy = os.path.join(tmp, entry["file"])
            with open(src) as fh, open(copy, "w") as dst:
                dst.write(instrument(fh.read()))
            plain, counted = load_module(src, "plain_"), load_module(copy, "clock_")
            counted._CLK[0] = buf
            for shape in entry["shapes"]:
                dims = _shape_dict(shape)
                args = _inputs(entry["kernel"], dims)
                buf.zero_()
                ms_plain, _ = _time(_launcher(entry["kernel"], plain, args))
                ms_counted, _ = _time(_launcher(entry["kernel"], counted, args))
                spans = buf.view(-1, 2).double()
                spans = spans[spans[:, 1] > 0]
                cycles, ns = spans[:, 0].sum().item(), spans[:, 1].sum().item()
                flops = Shape(shape["problem"], tuple(shape["sizes"])).flops(
                    entry["kernel"], causal=bool(entry.get("options", {}).get("causal")))
                rows.append({"name": entry["name"], "kernel": entry["kernel"], "shape": dims, "ctas": len(spans),
                             "flops": flops,
                             "ms": ms_plain, "ms_instrumented": ms_counted, "clock_ghz": cycles / ns,
                             "cta_cycles": cycles / len(spans),
                             "sm_busy": ns / (ms_counted * 1e6 * sms),
                             # the CTAs' own spans: how unevenly the work fell on them
                             "cta_us": [spans[:, 1].min().item() / 1e3, spans[:, 1].median().item() / 1e3,
                                        spans[:, 1].max().item() / 1e3]})
                r = rows[-1]
                print(f"{entry['name']:24s} {','.join(str(v) for v in dims.values()):18s} {ms_plain:9.4f} ms "
                      f"x{ms_counted / ms_plain:.3f}  {r['clock_ghz']:.3f} GHz  busy {r['sm_busy']:.3f}  CTA us "
                      + "/".join(f"{v:.0f}" for v in r["cta_us"]), flush=True)
                del args
                torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel_dir", help="a model_fidelity.py or gluon_bench.py generate directory (manifest.json "
                                       "and modules)")
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 8192],
                    help="attention S of a gluon_bench directory's kernels (B = 4, H = 32)")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of candidate names")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch
    import triton

    rows = measure(args.kernel_dir, args.only, tuple(args.seq))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_clock.json"), "w") as fh:
        json.dump({"format": "twill-kernel-clock/1", "gpu": torch.cuda.get_device_name(0),
                   "torch": torch.__version__, "triton": triton.__version__,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "timing": "triton.testing.do_bench median, warm-up 25 ms, rep 150 ms; clock from the "
                             "instrumented kernel's last launch", "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
