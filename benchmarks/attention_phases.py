"""Where each compute partition of a generated attention forward spends its loop iteration: the emitted kernel
with the SM cycle counter read between the phases of its main loop (a GPU experiment behind
docs/performance.md's fidelity notes, not a test and not a kernel to use).

The phases of one iteration of a compute partition (``twill emit gluon flash-fwd`` modules whose compute
partitions take tensor-core turns and issue S one stage ahead, as ``--subtiles 2`` does):

* ``turn``: waiting for the next K tile and for the other partition to pass the tensor-core turn;
* ``issue``: issuing S(j+1) = Q K(j+1)ᵀ, converting P(j) to the wgmma operand, waiting for V(j), issuing
  O += P(j) V(j) and passing the turn on;
* ``s_wait``: waiting for S(j+1) (wgmma groups retire in order);
* ``softmax``: the online softmax of S(j+1) (row max, alpha, exp, row sum);
* ``pv_wait``: waiting for O += P(j) V(j);
* ``rescale``: O *= alpha, and P(j+1) converted to the wgmma operand.

Around the whole compute partition (from its wait for Q to its last store) every partition also reads the
cycle counter and ``%globaltimer`` (ns): their ratio is the SM clock the kernel actually ran at (not a
sampled ``nvidia-smi`` reading), the cycles outside the loop are the block's prologue and epilogue, and the
partitions' busy time over the kernel's time on all SMs is the share of the run in which SMs held a block.

The instrumented copy is made by exact text insertions into the emitted module (each must match once, so the
probe cannot silently stop applying when the generator changes); every partition of every CTA adds its
cycles per phase over the loop and writes the sums behind the LSE output. The script also times the original
and the instrumented kernel (the counter reads cost a little) and, for each ``attention_probe`` variant named
with ``--probes``, the same phases of that variant. Prints a table and writes ``$OUT/attention_phases.json``.

    python benchmarks/attention_phases.py --out $OUT FILE.py [FILE.py ...] [--probes no-softmax no-pv]
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

from benchmarks._common import COUNTER_READERS, event_times, load_module  # noqa: E402
from benchmarks.attention_probe import apply  # noqa: E402

PHASES = ("turn", "issue", "s_wait", "softmax", "pv_wait", "rescale")
SLOTS = 10  # floats per partition in the stats area: PHASES, the iteration count, span cycles, span ns

CLOCK_FN = COUNTER_READERS + "@gluon.jit\ndef online_softmax("

STORE = '''    _base = seq_len * gl.num_programs(1) + ((gl.program_id(1) * gl.num_programs(0) + gl.program_id(0))
                                            * NUM_COMPUTE + SUB) * {slots}
{stores}    gl.store(lse_ptr + _base + {n}, (n_tiles - 1).to(gl.float32))
    # epilogue: pv of the last iteration
'''

#: Passing the tensor-core turn on (to partition SUB + 1 with two groups, SUB + 2 in some three-group orders).
PASS_TURN = re.compile(r"        mbarrier\.arrive\(turn_bars\.index\(\(SUB \+ \d\) % NUM_COMPUTE\)\)"
                       r"  # pass the tensor core on\n")
#: The loop's last line: P(j+1) converted to the wgmma operand once P(j) V(j) retired and O was rescaled.
P_CONVERT = re.compile(r"        p_op = gl\.convert_layout\(p\.to\(DTYPE\), p_layout\).*\n")
#: The accumulators, set before the main loop.
INIT = "".join(f"    _acc{i} = (n_tiles * 0).to(gl.int64)\n" for i in range(len(PHASES)))
LOOP = "    for j in range(0, n_tiles - 1):\n"
#: (anchor text, text inserted after it); each anchor must occur exactly once in the compute partition.
INSERTS = [
    ("        jn = j + 1\n", "        _t0 = _clock64(j)\n"),
    ("        mbarrier.wait(turn_bars.index(SUB), (j * TURNS) & 1)\n",
     "        _t1 = _clock64(j)\n        _acc0 += _t1 - _t0\n"),
    (PASS_TURN, "        _t2 = _clock64(j)\n        _acc1 += _t2 - _t1\n"),
    ("        s_cur, o, p_op = warpgroup_mma_wait(1, deps=[s_tok, o_tok, p_op])\n",
     "        _t3 = _clock64(j)\n        _acc2 += _t3 - _t2\n"),
    (P_CONVERT, "        _t6 = _clock64(j)\n        _acc5 += _t6 - _t5\n"),
]


#: The partition's span: its start (before its wait for Q) and its end (after its last store, the LSE's).
SPAN_START = ("    mbarrier.wait(q_bar, 0)  # Q sub-tile loaded by load_partition\n",
              "    _c0 = _clock64(n_tiles)\n    _g0 = _globaltimer(n_tiles)\n")
SPAN_END = (re.compile(r"        gl\.store\(lse_ptr \+ \([^\n]*rows_s\)\.to\(gl\.int64\), lse, mask=lse_mask\)\n"),
            "        _c1 = _clock64(n_tiles)\n        _g1 = _globaltimer(n_tiles)\n"
            "        gl.store(lse_ptr + _base + {n}, (_c1 - _c0).to(gl.float32))\n"
            "        gl.store(lse_ptr + _base + {n1}, (_g1 - _g0).to(gl.float32))\n")


def _insert_after(text: str, anchor: str | re.Pattern[str], new: str, before: bool = False) -> str:
    """``new`` after (or before) ``anchor`` (text or a pattern), which must occur exactly once."""
    if isinstance(anchor, re.Pattern):
        found = anchor.findall(text)
        anchor = found[0] if len(found) == 1 else anchor.pattern
    if text.count(anchor) != 1:
        raise SystemExit(f"phases: {anchor.strip()[:60]!r} occurs {text.count(anchor)} times, expected once")
    return text.replace(anchor, new + anchor if before else anchor + new)


def instrument(text: str) -> str:
    """The module text with the phase counters (see the module docstring)."""
    if text.count("@gluon.jit\ndef online_softmax(") != 1:
        raise SystemExit("phases: no online_softmax function to anchor the clock helper")
    text = text.replace("@gluon.jit\ndef online_softmax(", CLOCK_FN)
    text = _insert_after(text, LOOP, INIT, before=True)
    text = _insert_after(text, SPAN_START[0], SPAN_START[1], before=True)
    text = _insert_after(text, SPAN_END[0], SPAN_END[1].format(n=len(PHASES) + 1, n1=len(PHASES) + 2))
    for anchor, new in INSERTS:
        text = _insert_after(text, anchor, new)
    pv_line = "        o, p_op = warpgroup_mma_wait(0, deps=[o, p_op])"
    if text.count(pv_line) != 1:
        raise SystemExit("phases: the loop's wait for O += P V was not found")
    start = text.index(pv_line)
    end = text.index("\n", start) + 1
    text = (text[:start] + "        _t4 = _clock64(j)\n        _acc3 += _t4 - _t3\n" + text[start:end]
            + "        _t5 = _clock64(j)\n        _acc4 += _t5 - _t4\n" + text[end:])
    stores = "".join(f"    gl.store(lse_ptr + _base + {i}, _acc{i}.to(gl.float32))\n" for i in range(len(PHASES)))
    epilogue = "    # epilogue: pv of the last iteration\n"
    if text.count(epilogue) != 1:
        raise SystemExit("phases: the loop's epilogue comment was not found")
    return text.replace(epilogue, STORE.format(slots=SLOTS, stores=stores, n=len(PHASES)))


def _launcher(m: Any, q: Any, k: Any, v: Any, out: Any, stats: Any):
    """A closure launching module ``m``'s kernel with ``stats`` as its LSE pointer."""
    import math

    import triton

    B, H, S, D = q.shape
    q_desc = m._tma_view(q, "q", [m.SUB_M.value, D])   # rank-4 descriptors, the tensors' own strides
    k_desc = m._tma_view(k, "k", [m.BLOCK_N.value, D])
    v_desc = m._tma_view(v, "v", [m.BLOCK_N.value, D])
    grid = (triton.cdiv(S, m.BLOCK_M.value), B * H)
    scale = 1.0 / math.sqrt(D) * m.LOG2E
    return grid, lambda: m.attention_kernel[grid](q_desc, k_desc, v_desc, out, *out.stride()[:3], stats, S, H,
                                                  scale, num_warps=m.NUM_WARPS)


def phases_of(path: str, probes: list[str], seq: int, batch: int | None = None, heads: int | None = None
              ) -> dict[str, Any]:
    """Phase cycles per iteration (mean over partitions and CTAs) of the module and of its probe variants."""
    import torch

    with open(path) as fh:
        text = fh.read()
    variants = {"original": text, **{p: apply(text, p) for p in probes}}
    head_dim = None
    record: dict[str, Any] = {"file": os.path.basename(path), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        mods = {}
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for name, body in variants.items():
            for tag, src in (("plain", body), ("phases", instrument(body))):
                copy = os.path.join(tmp, f"{name.replace('-', '_')}_{tag}.py")
                with open(copy, "w") as fh:
                    fh.write(src)
                mods[(name, tag)] = load_module(copy, "phases_")
        head_dim = mods[("original", "plain")].HEAD_DIM.value
        B, H = batch or 32768 // seq, heads or 4096 // head_dim
        q, k, v = (torch.randn(B, H, seq, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
        out = torch.empty_like(q)
        fns, stats = {}, {}
        for (name, tag), m in mods.items():
            grid, _ = _launcher(m, q, k, v, out, None)
            stats[(name, tag)] = torch.zeros(B * H * seq + grid[0] * grid[1] * m.NUM_COMPUTE.value * SLOTS,
                                             device="cuda")
            fns[f"{name}/{tag}"] = _launcher(m, q, k, v, out, stats[(name, tag)])[1]
        ms, spread, window = event_times(fns, 5, 5)
        for (name, tag), buf in stats.items():
            if tag != "phases":
                continue
            m = mods[(name, tag)]
            area = buf[B * H * seq:].view(-1, SLOTS).double()
            iters = area[:, len(PHASES)].sum().item()
            per_iter = {p: area[:, i].sum().item() / iters for i, p in enumerate(PHASES)}
            span_cycles = area[:, len(PHASES) + 1]
            span_ns = area[:, len(PHASES) + 2]
            loop_cycles = area[:, :len(PHASES)].sum(1)
            parts = m.NUM_COMPUTE.value
            record["variants"][name] = {
                "phases": per_iter, "iteration": sum(per_iter.values()),
                "ms": ms[f"{name}/plain"], "ms_instrumented": ms[f"{name}/phases"],
                "ms_spread": spread[f"{name}/plain"],
                # the clock the partitions ran at, from their own counters
                "span_clock_ghz": span_cycles.sum().item() / span_ns.sum().item(),
                # cycles per block outside the loop (prologue, last P V, normalise, stores), mean over partitions
                "outside_loop_cycles": (span_cycles - loop_cycles).mean().item(),
                "span_cycles": span_cycles.mean().item(),
                # blocks' time on the SMs over the instrumented kernel's time on every SM
                "sm_busy": span_ns.sum().item() / parts / (ms[f"{name}/phases"] * 1e6 * sms)}
        record["window"] = window
        record["shape"] = {"B": B, "H": H, "S": seq, "D": head_dim}
        record["grid"] = list(grid)
        m0 = mods[("original", "plain")]
        record["tiles"] = grid[0] * grid[1]
        record["iterations"] = -(-seq // m0.BLOCK_N.value)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="emitted flash-fwd modules with ping-pong compute partitions and S "
                                             "issued one stage ahead")
    ap.add_argument("--probes", nargs="*", default=[], help="attention_probe.py variants to instrument too")
    ap.add_argument("--seq", type=int, nargs="+", default=[8192], help="sequence lengths (B = 32768 // S)")
    ap.add_argument("--batch", type=int, default=None, help="B (default 32768 // S)")
    ap.add_argument("--heads", type=int, default=None, help="H (default 4096 // D)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch

    from twill.machine.microbench import ClockSampler

    results = []
    with ClockSampler() as sampler:
        for path in args.files:
            for seq in args.seq:
                try:
                    results.append(phases_of(path, args.probes, seq, args.batch, args.heads))
                except SystemExit as exc:  # a module the probes do not fit is reported, the others still run
                    print(f"{path}: skipped ({exc})", flush=True)
                    break
                print(f"{path} S={seq}: done", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for r in results:
        clock = sampler.median_ghz(*r.pop("window"))
        r["clock_ghz"] = clock
        for row in r["variants"].values():
            row["cycles_per_iteration"] = (row["ms"] * 1e-3 * clock * 1e9 * sms / (r["tiles"] * r["iterations"])
                                           if clock else None)
            row["cycles_per_iteration_span_clock"] = (row["ms"] * 1e-3 * row["span_clock_ghz"] * 1e9 * sms
                                                      / (r["tiles"] * r["iterations"]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_phases.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, fh,
                  indent=1)
    print(table({"results": results}))


def table(doc: dict[str, Any]) -> str:
    """The phases of a run (``attention_phases.json``) as the script prints them and docs/performance.md shows
    them: mean cycles per iteration per phase and their sum, the kernel's cycles per iteration from its time at
    the sampled clock and at the partitions' own clock, the instrumented/plain time ratio, both clocks, the
    cycles per block outside the loop and the SMs' busy share."""
    lines = [f"{'file':34s} {'S':>5s} {'variant':9s} " + " ".join(f"{p:>7s}" for p in PHASES)
             + "    sum  meas(smi) meas(span) x(instr) GHz(smi) GHz(span) outside busy"]
    for r in doc["results"]:
        for name, row in r["variants"].items():
            cyc = row["cycles_per_iteration"] or 0
            lines.append(f"{r['file']:34s} {r['shape']['S']:5d} {name:9s} "
                         + " ".join(f"{row['phases'][p]:7.0f}" for p in PHASES)
                         + f" {row['iteration']:6.0f} {cyc:9.0f} {row['cycles_per_iteration_span_clock']:10.0f}"
                         f" {row['ms_instrumented'] / row['ms']:8.3f} {r['clock_ghz'] or 0:8.3f}"
                         f" {row['span_clock_ghz']:9.3f} {row['outside_loop_cycles']:7.0f} {row['sm_busy']:.3f}")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
