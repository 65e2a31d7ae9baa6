"""Host time per launch of emitted attention forward kernels against their GPU time (a GPU experiment behind
docs/performance.md's "Host time per launch", not a test).

For each kernel (a module of ``gluon_bench.py generate``'s folder, named as in its ``manifest.json``) and each
S, on the same inputs as ``gluon_bench.py run`` (B = 4, H = 32), and for SDPA's cuDNN backend on the same
problem:

* ``host_us``: wall time per call of ``CALLS`` calls issued back to back with no synchronisation (the GPU
  queue is deep enough to take them all): what the host needs to launch one call;
* ``back_to_back_us``: CUDA events around ``CALLS`` calls issued back to back (what ``gluon_bench.py run
  --rounds`` times), median of ``ROUNDS``;
* ``graph_us``: the same calls captured in one CUDA graph and replayed between two events: the GPU's time
  with no host in the way;
* ``do_bench_us``: ``triton.testing.do_bench``'s median (each call timed alone after an L2 flush), what
  ``gluon_bench.py run`` without ``--rounds`` reports.

A host-bound harness shows ``back_to_back_us`` above ``graph_us`` and ``host_us`` near ``back_to_back_us``.
Prints a table and writes ``$OUT/launch_overhead.json``.

    python benchmarks/launch_overhead.py benchmarks/gluon_kernels --only NAME ... [--seq 2048 8192] --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import events_ms, host_us  # noqa: E402

#: Calls per sample, and samples (rounds) per measurement.
CALLS, ROUNDS = 10, 7


def _graph_us(fn: Callable[[], Any], calls: int) -> float:
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):     # warm up on a side stream before capture, as torch's docs ask
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return events_ms(graph.replay, 1) * 1e3 / calls


def measure(fn: Callable[[], Any]) -> dict[str, Any]:
    """The four times of ``fn`` (module docstring), medians over ``ROUNDS`` with their ``[min, max]``."""
    from triton.testing import do_bench

    fn()
    samples: dict[str, list[float]] = {"host_us": [], "back_to_back_us": [], "graph_us": []}
    for _ in range(ROUNDS):
        samples["host_us"].append(host_us(fn, CALLS))
        samples["back_to_back_us"].append(events_ms(fn, CALLS) * 1e3)
        samples["graph_us"].append(_graph_us(fn, CALLS))
    row: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    row["spread"] = {k: [min(v), max(v)] for k, v in samples.items()}
    row["do_bench_us"] = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    return row


def run(kernel_dir: str, names: list[str], seqs: list[int]) -> dict[str, Any]:
    import torch
    import triton

    from benchmarks._common import torch_references
    from benchmarks.gluon_bench import ATTN_BATCH, ATTN_HEADS, _attention_inputs, attention_case
    from twill.codegen.gluon import load_emitted

    with open(os.path.join(kernel_dir, "manifest.json")) as fh:
        manifest = {row["name"]: row for row in json.load(fh)}
    missing = [n for n in names if n not in manifest]
    if missing:
        raise SystemExit(f"launch_overhead.py: no kernel {', '.join(missing)} in {kernel_dir}/manifest.json")
    rows = []
    for name in names:
        entry = manifest[name]
        mod = load_emitted(os.path.join(kernel_dir, entry["file"]))
        case = attention_case(entry["options"])
        for S in seqs:
            q, k, v = _attention_inputs(ATTN_BATCH, ATTN_HEADS, S, case)
            out = torch.full_like(q, float("nan"))
            kr, vr = (t.repeat_interleave(ATTN_HEADS // case[3], dim=1) for t in (k, v)) if case[3] else (k, v)
            refs = torch_references("attention", (q, kr, vr, None), causal=case[2])
            for who, fn in (("twill", lambda: mod.launch(q, k, v, out=out)), ("cudnn", refs["cudnn"])):
                row = {"kernel": name, "who": who, "S": S, "B": ATTN_BATCH, "H": ATTN_HEADS, **measure(fn)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            if not torch.isfinite(out).all():
                raise SystemExit(f"launch_overhead.py: {name} left non-finite outputs at S={S}")
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "calls": CALLS, "rounds": ROUNDS,
            "rows": rows}


def table(doc: dict[str, Any]) -> str:
    """Microseconds per call (medians) as docs/performance.md shows them."""
    lines = ["| kernel | S | who | host | back to back | CUDA graph | do_bench |", "|---" * 7 + "|"]
    for r in doc["rows"]:
        lines.append(f"| `{r['kernel']}` | {r['S']} | {r['who']} | {r['host_us']:.0f} | {r['back_to_back_us']:.0f} "
                     f"| {r['graph_us']:.0f} | {r['do_bench_us']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel_dir", help="a folder written by 'python benchmarks/gluon_bench.py generate'")
    ap.add_argument("--only", nargs="+", required=True, help="kernel names (manifest.json) to measure")
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 8192], help="sequence lengths")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.kernel_dir, "manifest.json")):
        ap.error(f"{args.kernel_dir}: no manifest.json (run 'python benchmarks/gluon_bench.py generate DIR' first)")
    os.makedirs(args.out, exist_ok=True)
    doc = run(args.kernel_dir, args.only, args.seq)
    with open(os.path.join(args.out, "launch_overhead.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(table(doc))


if __name__ == "__main__":
    main()
