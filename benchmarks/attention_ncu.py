"""Stall profile of one attention forward under Nsight Compute (a benchmark behind docs/experiments/fa3-gap.md;
not part of the library).

``run`` launches one contender (``twill``: ``twill.ops.attention``; ``fa3``: FlashAttention-3's
``flash_attn_func``; or an emitted forward module's ``launch``) a few times on one shape, bf16 (or e4m3 with
``--dtype fp8e4m3``), B = 4, H·D = 4096, for ``ncu`` to profile one launch::

    ncu --clock-control none --kernel-name-base demangled -k regex:'attention_kernel|FlashAttnFwdSm90' \\
        --launch-skip 2 --launch-count 1 --section WarpStateStats --section SourceCounters \\
        --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis -o OUT/twill \\
        python benchmarks/attention_ncu.py run twill --head-dim 128 --seq 8192
    ncu -i OUT/twill.ncu-rep --page source --csv --print-source sass > OUT/twill_source.csv

``summary`` (CPU) reads such source-page CSVs (and the ``--page details --csv`` export beside each, named
``X_details.csv`` for ``X_source.csv``) and prints, per kernel, its headline metrics and warp instructions,
and where the warps of its main loops spend their stall samples: by instruction class (wgmma, its wait, named
and warpgroup barriers, mbarrier operations, MUFU, shuffles, other arithmetic) and by stall reason, as markdown
tables::

    python benchmarks/attention_ncu.py summary OUT/twill_source.csv OUT/fa3_source.csv [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import re
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.fa3_sass import opcode as sass_opcode  # noqa: E402

HIDDEN, BATCH = 4096, 4

#: SASS opcode class of a source-page row (first matching pattern wins).
CLASSES = (
    ("wgmma", r"^[HQI]GMMA"),
    ("wgmma wait", r"^WARPGROUP\.(DEPBAR|ARRIVE)"),
    ("named barrier", r"^BAR\.(SYNC|ARV)\S*\s+0x(?:[4-9a-f]|1[0-5])\b"),
    ("barrier", r"^BAR\b"),
    ("mbarrier", r"^SYNCS"),
    ("MUFU", r"^MUFU"),
    ("shuffle", r"^SHFL"),
    ("FP32 math", r"^(FFMA|FMUL|FADD|FMNMX|FSEL|FSETP)"),
    ("convert", r"^(F2FP|F2F|I2F|F2I)"),
    ("memory", r"^(LD|ST|LDS|STS|LDG|STG|LDSM|STSM|ATOM|RED|UTMA|UBLKCP)"),
    ("branch", r"^(BRA|BRX|EXIT|RET|CALL|BSSY|BSYNC|WARPSYNC|YIELD|NANOSLEEP)"),
)


def opcode_class(sass: str) -> str:
    """The class of one SASS instruction (predicate guard dropped); ``other`` when none matches."""
    text = sass.strip()
    text = text[text.index(sass_opcode(text)):] if text else text
    for name, pattern in CLASSES:
        if re.search(pattern, text):
            return name
    return "other"


def opcode(sass: str) -> str:
    """The mnemonic of one SASS instruction, without predicate or modifiers (``PRMT``, ``HGMMA``)."""
    text = sass.strip()
    return sass_opcode(text).split(".")[0] if text else ""


def _number(text: str) -> float:
    try:
        return float(str(text).replace(",", "").strip() or 0)
    except ValueError:
        return 0.0


def read_details_csv(path: str) -> dict[str, str]:
    """``{metric name: "value unit"}`` of an ``ncu --page details --csv`` export (one kernel)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {r["Metric Name"]: f"{r.get('Metric Value', '')} {r.get('Metric Unit', '')}".strip()
            for r in rows if r.get("Metric Name")}


def read_source_csv(path: str) -> dict[str, Any]:
    """Stall samples of an ``ncu --page source --csv --print-source sass`` export: per class and per reason,
    over the whole kernel and over its main loops, and the warp instructions issued.

    The columns are found by name: the SASS text ("Source"), the total samples ("Warp Stall Sampling (All
    Samples)"), "Instructions Executed" (warp instructions) and one column per stall reason ("stall_*"). The
    main loops are the instructions executed at least a third as often as the most common wgmma count (idle
    warps, the producer's waits and the prologue fall outside). A ``details`` export beside the file (the same
    name with ``_details.csv`` for ``_source.csv``) adds its metrics."""
    with open(path, newline="") as fh:
        lines = [ln for ln in fh if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "Source" in ln and "Sampling" in ln), None)
    if start is None:
        raise ValueError(f"{path}: no source-page header with 'Source' and a sampling column")
    rows = list(csv.DictReader(lines[start:]))
    header = list(rows[0].keys()) if rows else []
    total_col = next((h for h in header if re.search(r"Warp Stall Sampling \(All", h)), None)
    if total_col is None:
        raise ValueError(f"{path}: no 'Warp Stall Sampling (All Samples)' column in {header[:12]}")
    reason_cols = [h for h in header if h != total_col and re.search(r"stall|Stall", h)
                   and "Not-issued" not in h and "Not Issued" not in h and "Sampling" not in h]
    executed = [_number(r.get("Instructions Executed", 0)) for r in rows]
    wgmma_counts = collections.Counter(e for r, e in zip(rows, executed)
                                       if opcode_class(r.get("Source", "")) == "wgmma")
    floor = max(wgmma_counts) / 3 if wgmma_counts else float("inf")

    def tally(selected: list[dict[str, str]]) -> dict[str, Any]:
        by_class: dict[str, float] = collections.Counter()
        by_reason: dict[str, float] = collections.Counter()
        for r in selected:
            by_class[opcode_class(r.get("Source", ""))] += _number(r.get(total_col, 0))
            for h in reason_cols:
                by_reason[h] += _number(r.get(h, 0))
        return {"samples": sum(by_class.values()), "by_class": dict(by_class),
                "by_reason": {h: v for h, v in by_reason.items() if v}}

    by_opcode: dict[str, float] = collections.Counter()
    for r, e in zip(rows, executed):
        by_opcode[opcode(r.get("Source", ""))] += e
    doc = {"file": os.path.basename(path), **tally(rows), "by_opcode": dict(by_opcode.most_common()),
           "loops": tally([r for r, e in zip(rows, executed) if e >= floor]),
           "warp_instructions": sum(executed),
           "loop_warp_instructions": sum(e for e in executed if e >= floor)}
    details = path[: -len("_source.csv")] + "_details.csv" if path.endswith("_source.csv") else None
    if details and os.path.exists(details):
        doc["details"] = read_details_csv(details)
    return doc


#: Nsight Compute details shown in the summary's first table.
DETAILS = ("Duration", "Elapsed Cycles", "SM Frequency", "Compute (SM) Throughput", "L2 Cache Throughput",
           "DRAM Throughput", "Issue Slots Busy", "Warp Cycles Per Issued Instruction")


def summary_markdown(reports: list[dict[str, Any]], top: int = 10) -> str:
    """Four tables: the kernel's headline metrics and warp instructions; warp instructions by opcode (each
    kernel's ten most frequent); the share of the main loops' stall samples per instruction class; and per
    stall reason (top ``top``)."""
    names = [r["file"].replace("_source.csv", "") for r in reports]
    head = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for metric in DETAILS:
        head.append(f"| {metric} | " + " | ".join(r.get("details", {}).get(metric, "-") for r in reports) + " |")
    head.append("| warp instructions issued | " + " | ".join(f"{r['warp_instructions'] / 1e6:.1f} M" for r in reports)
                + " |")
    head.append("| of them in the main loops | "
                + " | ".join(f"{r['loop_warp_instructions'] / 1e6:.1f} M" for r in reports) + " |")
    ops = sorted({o for r in reports for o in list(r["by_opcode"])[:10]},
                 key=lambda o: -max(r["by_opcode"].get(o, 0) for r in reports))
    head += ["", "| warp instructions by opcode (M) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    head += [f"| {o} | " + " | ".join(f"{r['by_opcode'].get(o, 0) / 1e6:.1f}" for r in reports) + " |" for o in ops]
    reports = [dict(r["loops"], file=r["file"]) for r in reports]
    classes = sorted({c for r in reports for c in r["by_class"]},
                     key=lambda c: -max(r["by_class"].get(c, 0) / max(r["samples"], 1) for r in reports))
    out = head + ["", "| main-loop stall samples by instruction class | " + " | ".join(names) + " |",
                  "|---|" + "---|" * len(names)]
    for c in classes:
        out.append(f"| {c} | " + " | ".join(f"{100 * r['by_class'].get(c, 0) / max(r['samples'], 1):.1f}%"
                                              for r in reports) + " |")
    reasons = sorted({h for r in reports for h in r["by_reason"]},
                     key=lambda h: -max(r["by_reason"].get(h, 0) / max(r["samples"], 1) for r in reports))[:top]
    out += ["", "| main-loop stall samples by reason | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for h in reasons:
        out.append(f"| {h} | " + " | ".join(f"{100 * r['by_reason'].get(h, 0) / max(r['samples'], 1):.1f}%"
                                            for r in reports) + " |")
    return "\n".join(out)


def run(who: str, head_dim: int, seq: int, causal: bool, launches: int, dtype: str = "bf16") -> None:
    import torch

    heads = HIDDEN // head_dim
    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if dtype == "fp8e4m3":      # e4m3 inputs, no descale factors (FA3's fp8 forward takes the same)
        q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    if who == "twill":
        from twill.ops import attention

        def call() -> Any:
            return attention(q, k, v, causal=causal)
    elif who == "fa3":
        from fa3_fwd_interface import flash_attn_func

        qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))     # FA3's own layout, [B, S, H, D]

        def call() -> Any:
            return flash_attn_func(qs, ks, vs, causal=causal)
    else:
        from twill.codegen.gluon import load_emitted

        launch = load_emitted(who).launch

        def call() -> Any:
            return launch(q, k, v)
    for _ in range(launches):
        call()
    torch.cuda.synchronize()
    print(f"{who}: {launches} launches, B={BATCH} H={heads} S={seq} D={head_dim} causal={causal} {dtype}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/attention_ncu.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run", help="launch one contender a few times (GPU; under ncu)")
    r.add_argument("who", help="twill, fa3, or the path of an emitted forward module")
    r.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    r.add_argument("--seq", type=int, default=8192)
    r.add_argument("--causal", action="store_true")
    r.add_argument("--launches", type=int, default=4)
    r.add_argument("--dtype", default="bf16", choices=("bf16", "fp8e4m3"))
    s = sub.add_parser("summary", help="stall samples of ncu source-page CSV exports, by class and reason (CPU)")
    s.add_argument("csv", nargs="+")
    s.add_argument("--json", default=None, help="also write the summaries to this file")
    args = p.parse_args(argv)
    if args.step == "run":
        run(args.who, args.head_dim, args.seq, args.causal, args.launches, args.dtype)
        return 0
    try:
        reports = [read_source_csv(path) for path in args.csv]
    except (OSError, ValueError, csv.Error) as exc:
        print(f"attention_ncu: {exc}", file=sys.stderr)
        return 2
    print(summary_markdown(reports))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(reports, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
