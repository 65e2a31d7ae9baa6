"""Solve time of the joint SWP + WS search on every built-in kernel and on the loop graphs the Triton
frontend builds from real kernels (not a test).

For each kernel configuration x architecture (h100, b200) x backend (cpsat; yices when installed) it runs
``twill.solve.schedule`` with the default options (normalization at U = 300, 2 CP-SAT workers; B200 flash-bwd
also at FA4's 136-register budget) and records the II lower bound, the final II, L, the model size of the
final joint solve, the status, the wall and CPU time, and beside them the time before the phase-1
projections and the paper's Table 1 time where the paper reports the problem. A Triton kernel (kernel
``path.py:fn``) is compiled on the CPU as ``twill schedule path.py:fn`` does; its graph build time is recorded
apart (``build s``), outside the solve time. Its ``twill inject`` row solves as ``twill inject`` does
(:func:`twill.integrations.triton.inject.solve_for_triton`: no warp specialization; on h100 the window search
of the graph constrained for Triton 3.6).
Writes ``benchmarks/results/solve_time.json`` and the "Solve time" section of ``docs/performance.md``.

    .venv/bin/python benchmarks/solve_time.py [--time-limit 300] [--backends cpsat,yices] [--only flash-fwd]
                                              [--repeat 3]

``--only`` keeps the kernels whose name contains the text: ``flash-fwd``, or ``triton`` for every Triton kernel.

``--repeat N`` solves every case N times and records the median wall and CPU seconds (the host is shared,
so single runs are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "solve_time.json")
PERFORMANCE_DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Solve time"

#: The Triton kernels measured: (target path.py:fn, signature, constexprs), all at num_warps 8, num_stages 3.
TRITON_KERNELS = (
    ("twill/integrations/triton/kernels/flash_fwd.py:attn_fwd",
     "Q=*fp16:16,K=*fp16:16,V=*fp16:16,Out=*fp16:16,sm_scale=fp32,ZH=i32,N_CTX=i32:16",
     ["HEAD_DIM=128", "BLOCK_M=128", "BLOCK_N=128"]),
    ("twill/integrations/triton/kernels/flash_fwd_subtiled.py:attn_fwd_subtiled",
     "Q=*fp16:16,K=*fp16:16,V=*fp16:16,Out=*fp16:16,sm_scale=fp32,ZH=i32,N_CTX=i32:16",
     ["HEAD_DIM=128", "BLOCK_M=64", "BLOCK_N=128"]),
    ("twill/integrations/triton/kernels/matmul.py:matmul_kernel",
     "a_ptr=*fp16:16,b_ptr=*fp16:16,c_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16",
     ["BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=64"]),
    ("tests/data/triton_families.py:attn_bwd_dkdv",
     "Q=*fp16:16,K=*fp16:16,V=*fp16:16,DO=*fp16:16,M=*fp32:16,D=*fp32:16,DK=*fp16:16,DV=*fp16:16,"
     "stride_tok=i32:16,N_CTX=i32:16",
     ["HEAD_DIM=128", "BLOCK_M=64", "BLOCK_N=128"]),
    ("tests/data/triton_families.py:attn_bwd_dq",
     "Q=*fp16:16,K=*fp16:16,V=*fp16:16,DO=*fp16:16,M=*fp32:16,D=*fp32:16,DQ=*fp16:16,stride_tok=i32:16,"
     "N_CTX=i32:16",
     ["HEAD_DIM=128", "BLOCK_M=64", "BLOCK_N=128"]),
)

#: Issue 16's target for the joint solve of a Triton graph: proved optimal within this many CPU seconds.
TRITON_TARGET_SECONDS = 10.0

#: Solve options of a ``twill inject`` row (``inject`` is the script's own key, not a SolveOptions field).
INJECT = {"ws": False, "inject": True}


def triton_configs() -> tuple:
    """The :data:`CONFIGS` entries of :data:`TRITON_KERNELS`: the joint search and ``twill inject``'s."""
    out = []
    for target, signature, constexprs in TRITON_KERNELS:
        options = {"signature": signature, "constexprs": constexprs, "num_warps": 8, "num_stages": 3}
        name = target.rsplit("/", 1)[1]
        out += [(target, options, {}, f"triton {name}", ("h100", "b200")),
                (target, options, INJECT, f"triton {name} (twill inject)", ("h100", "b200"))]
    return tuple(out)


#: (kernel, kernel options, solve options, label, architectures) for every configuration measured.
CONFIGS = (
    ("paper-example", {}, {}, "paper-example", ("h100", "b200")),
    ("gemm", {}, {}, "gemm (default 128x256x64)", ("h100", "b200")),
    ("flash-fwd", {"subtiles": 1}, {}, "flash-fwd --subtiles 1", ("h100", "b200")),
    ("flash-fwd", {"subtiles": 2}, {}, "flash-fwd --subtiles 2", ("h100", "b200")),
    ("flash-fwd", {"subtiles": 2, "head_dim": 64}, {}, "flash-fwd --subtiles 2 --head-dim 64", ("h100", "b200")),
    ("flash-bwd", {}, {}, "flash-bwd", ("h100", "b200")),
    ("flash-bwd", {}, {"reg_limit": 136}, "flash-bwd --reg-limit 136", ("b200",)),
) + triton_configs()
ARCHS = ("h100", "b200")

#: The paper's search times (Table 1, one core of a Xeon Platinum 8570, Yices) for the problems it reports:
#: (label, arch) -> seconds. B200 backward at FA4's compute budget of 136 registers is the paper's "Twill-LR".
PAPER_SECONDS = {
    ("flash-fwd --subtiles 2", "h100"): 28.0, ("flash-fwd --subtiles 2", "b200"): 18.0,
    ("flash-bwd", "h100"): 84.0, ("flash-bwd", "b200"): 242.0, ("flash-bwd --reg-limit 136", "b200"): 48.0,
}

#: The measurements before the phase-1 projections and the residue split (commit 1bf2d02), for the
#: "before s" column.
BASELINE = os.path.join(ROOT, "benchmarks", "results", "solve_time_baseline.json")


def config_of(row: dict[str, Any]) -> tuple:
    """The :data:`CONFIGS` entry a result row belongs to."""
    return next(c for c in CONFIGS if c[0] == row["kernel"] and c[1] == row["options"]
                and c[2] == row.get("solve_options", {}))


def label_of(row: dict[str, Any]) -> str:
    return config_of(row)[3]


def selected(kernel: str, only: str | None) -> bool:
    """Whether ``--only`` keeps ``kernel`` (its name contains the text; everything without ``--only``)."""
    return only is None or only in kernel


def triton_command(row: dict[str, Any]) -> str:
    """The ``twill`` command line that solves a Triton row's case as the row did."""
    options = row["options"]
    verb = "inject" if row["solve_options"].get("inject") else "schedule"
    output = " -o out/" if verb == "inject" else ""
    constexprs = " ".join(f"--constexpr {c}" for c in options["constexprs"])
    return (f"twill {verb} {row['kernel']}{output} --arch {row['arch']} --num-warps {options['num_warps']} "
            f"--num-stages {options['num_stages']} --signature '{options['signature']}' {constexprs}")


def build_graph(kernel: str, options: dict[str, Any], machine: Any) -> Any:
    """The loop graph of a case: a built-in kernel, or a Triton ``path.py:fn`` compiled on this CPU."""
    if ".py:" not in kernel:
        from twill.kernels import build_kernel

        return build_kernel(kernel, machine, **options)
    from twill.integrations.triton import graph_from_target

    path, fn = kernel.rsplit(":", 1)
    return graph_from_target(os.path.join(ROOT, path), fn, signature=options["signature"],
                             constexprs=options["constexprs"], num_warps=options["num_warps"],
                             num_stages=options["num_stages"], machine=machine)


def solve(graph: Any, machine: Any, solve_options: dict[str, Any], backend: str, time_limit: float) -> Any:
    """``twill.solve.schedule`` under ``solve_options``, or ``twill inject``'s search for an :data:`INJECT` row."""
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    fields = {k: v for k, v in solve_options.items() if k != "inject"}
    options = SolveOptions(solver=backend, time_limit=time_limit, **fields)
    if not solve_options.get("inject"):
        return schedule(graph, machine, options)
    from twill.integrations.triton.inject import solve_for_triton
    from twill.integrations.triton.compile import capability_of

    return solve_for_triton(graph, machine, capability_of(machine.arch), options)


def run_one(kernel: str, options: dict[str, Any], solve_options: dict[str, Any], arch: str, backend: str,
            time_limit: float, graph: Any, build_seconds: float) -> dict[str, Any]:
    """One solve of the case's ``graph`` (built in ``build_seconds``): its result row."""
    from twill.errors import TwillError
    from twill.machine import get_machine

    machine = get_machine(arch)
    began, cpu = time.perf_counter(), time.process_time()
    row: dict[str, Any] = {"kernel": kernel, "options": options, "solve_options": solve_options, "arch": arch,
                           "backend": backend, "ops": len(graph.ops), "edges": len(graph.edges),
                           "build_seconds": build_seconds, "date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        result = solve(graph, machine, solve_options, backend, time_limit)
    except TwillError as exc:
        row.update({"status": "error", "error": str(exc), "seconds": round(time.perf_counter() - began, 2),
                    "cpu_seconds": round(time.process_time() - cpu, 2)})
        return row
    stats = result.stats
    row.update({
        "status": result.status, "ii_lower_bound": max(stats.get("res_mii", 0), stats.get("rec_mii", 0)),
        "modulo_ii": stats.get("modulo_ii"), "ii": result.ii, "length": result.length,
        "stages": result.num_stages, "warps": [f"{w.role}:{w.num_warps}x{w.regs}" for w in result.warps],
        "variables": stats.get("variables"), "constraints": stats.get("constraints"),
        "blocked_by": stats.get("blocked_by"), "iis_tried": len(stats.get("tried", [])),
        "iis_skipped": sum(1 for t in stats.get("tried", []) if t.get("by") == "warp_issue_bound"),
        "iis_projected": sum(1 for t in stats.get("tried", []) if t.get("by") == "projection"),
        "iis_relaxed": sum(1 for t in stats.get("tried", []) if t.get("by") == "relaxation"),
        "seconds": round(time.perf_counter() - began, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
        "cycles_per_unit": stats.get("normalization", {}).get("cycles_per_unit"),
    })
    return row


def run_median(kernel: str, options: dict[str, Any], solve_options: dict[str, Any], arch: str, backend: str,
               time_limit: float, repeat: int) -> dict[str, Any]:
    """:func:`run_one` ``repeat`` times on one graph: the first run's row with the median wall and CPU seconds
    of all runs and ``runs``."""
    from twill.machine import get_machine

    began = time.perf_counter()
    graph = build_graph(kernel, options, get_machine(arch))
    built = round(time.perf_counter() - began, 2)
    runs = [run_one(kernel, options, solve_options, arch, backend, time_limit, graph, built)
            for _ in range(repeat)]
    row = dict(runs[0])
    row["seconds"] = round(statistics.median(r["seconds"] for r in runs), 2)
    row["cpu_seconds"] = round(statistics.median(r["cpu_seconds"] for r in runs), 2)
    row["runs"] = repeat
    return row


def backends(requested: list[str]) -> list[str]:
    out = []
    for name in requested:
        if name == "yices":
            from twill.solve._yices_loader import yices_available

            if not yices_available():
                print("yices is not installed: skipping that backend", file=sys.stderr)
                continue
        out.append(name)
    return out


def row_order(row: dict[str, Any]) -> tuple[int, int, int]:
    """Backend (cpsat first), configuration and architecture order of :data:`CONFIGS`."""
    return (row["backend"] != "cpsat", CONFIGS.index(config_of(row)), ARCHS.index(row["arch"]))


def baseline_seconds() -> dict[tuple[str, str, str], float]:
    """(label, arch, backend) -> wall seconds of :data:`BASELINE` (empty when the file is absent)."""
    if not os.path.exists(BASELINE):
        return {}
    with open(BASELINE) as fh:
        rows = json.load(fh)["rows"]
    return {(label_of(r), r["arch"], r["backend"]): r["seconds"] for r in rows}


def blank(value: Any) -> Any:
    """A table cell: empty for a value the row's search does not have (``twill inject``'s has no joint model)."""
    return "" if value is None else value


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| kernel | arch | backend | ops | II bound | modulo II | final II | IIs tried (warp-issue / projection / "
            "relaxation) "
            "| L | status | variables | constraints | seconds | CPU s | build s | before s | paper s |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    before = baseline_seconds()
    lines = []
    for r in rows:
        label = label_of(r)
        then = before.get((label, r["arch"], r["backend"]), "")
        paper = PAPER_SECONDS.get((label, r["arch"]), "")
        build = r.get("build_seconds", "")
        if r["status"] == "error":
            what = "no schedule within the time limit" if "time limit" in r["error"] else f"error: {r['error'][:60]}"
            lines.append(f"| {label} | {r['arch']} | {r['backend']} | {r['ops']} | | | | | | {what} | | | "
                         f"{r['seconds']} | {r.get('cpu_seconds', '')} | {build} | {then} | {paper} |")
            continue
        lines.append(f"| {label} | {r['arch']} | {r['backend']} | {r['ops']} | {r['ii_lower_bound']} | "
                     f"{blank(r['modulo_ii'])} | {r['ii']} | {r['iis_tried']} ({r.get('iis_skipped', 0)} / "
                     f"{r.get('iis_projected', 0)} / {r.get('iis_relaxed', 0)}) | {r['length']} | {r['status']} | "
                     f"{blank(r['variables'])} | "
                     f"{blank(r['constraints'])} | {r['seconds']} | {r.get('cpu_seconds', '')} | {build} | {then} | "
                     f"{paper} |")
    return head + "\n".join(lines) + "\n"


def paper_comparison(rows: list[dict[str, Any]]) -> str:
    """One sentence per paper problem: CP-SAT's wall and CPU seconds against a tenth of the paper's time."""
    parts = []
    for (label, arch), paper in PAPER_SECONDS.items():
        mine = [r for r in rows if r["backend"] == "cpsat" and label_of(r) == label and r["arch"] == arch
                and r["status"] != "error"]
        if mine:
            r = mine[0]
            verdict = "within" if r["cpu_seconds"] <= paper / 10 else "not within"
            parts.append(f"`{label}` on {arch}: {r['seconds']} s wall, {r['cpu_seconds']} s CPU against the "
                         f"paper's {paper:g} s ({verdict} a tenth, {paper / 10:g} s, in CPU time)")
    if not parts:
        return ""
    return ("The paper's problems (its Table 1 times in the `paper s` column; different machine, cost model "
            "and graphs, so a sanity check rather than a like-for-like comparison): " + "; ".join(parts) + ".\n\n")


def triton_paragraph(rows: list[dict[str, Any]]) -> str:
    """The Triton rows against issue 16's target (each joint solve proved optimal within 10 s), and the
    command of every Triton case."""
    triton = [r for r in rows if r["backend"] == "cpsat" and ".py:" in r["kernel"]]
    if not triton:
        return ""
    joint = [r for r in triton if not r["solve_options"].get("inject")]
    met = [r for r in joint if r["status"] == "optimal" and r["cpu_seconds"] <= TRITON_TARGET_SECONDS]
    missed = "; ".join(f"`{label_of(r)}` on {r['arch']}: {r['status']}, {r['seconds']} s wall, "
                       f"{r['cpu_seconds']} s CPU" for r in joint if r not in met)
    commands = sorted({triton_command(r) for r in triton})
    return ("Triton rows (`triton ...`): the loop graph the Triton frontend builds from a real kernel "
            f"(compiled on this CPU; `build s` is the compile and graph build, once per case, not part of "
            f"`seconds`). `(twill inject)` rows solve as `twill inject` does: no warp specialization, and on h100 "
            f"the window search of the graph constrained for Triton 3.6 (docs/triton.md §3). Issue 16's target, "
            f"each joint solve proved optimal within {TRITON_TARGET_SECONDS:g} s of CPU: {len(met)} of "
            f"{len(joint)} cases" + (f"; not met: {missed}" if missed else "") + ". Commands of the Triton "
            "cases:\n\n```text\n" + "\n".join(commands) + "\n```\n\n")


def section(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    compare = paper_comparison(rows) + triton_paragraph(rows)
    cpsat = [r for r in rows if r["backend"] == "cpsat" and r["status"] != "error"]
    if cpsat:
        slow = max((r for r in cpsat if not r["solve_options"].get("inject")), key=lambda r: r["seconds"])
        proven = sum(r["status"] == "optimal" for r in cpsat)
        runs = sorted({r.get("runs", 1) for r in cpsat})
        compare += (f"CP-SAT rows: median of {' or '.join(map(str, runs))} run(s) per case (`--repeat`). "
                    f"CP-SAT proved {proven} of {len(cpsat)} cases optimal. The slowest joint search, "
                    f"`{label_of(slow)}` on "
                    f"{slow['arch']} ({slow['seconds']} s wall, {slow.get('cpu_seconds')} s CPU), tries "
                    f"{slow['iis_tried']} IIs: {slow.get('iis_projected', 0)} proved infeasible by a phase-1 "
                    f"projection, {slow.get('iis_skipped', 0)} by the warp-issue bound and "
                    f"{slow.get('iis_relaxed', 0)} by the joint relaxation (docs/model.md §5); each other II costs "
                    f"a phase-1 solve, a model build and a joint solve. `before s`: the same "
                    f"case before the projections and the residue split (`benchmarks/results/"
                    f"solve_time_baseline.json`, same machine, 2026-11-29 to 2026-12-01).\n\n")
    if any(r["backend"] == "yices" for r in rows):
        compare += ("`yices` is the paper-faithful time-indexed backend (`twill/solve/joint/yices.py`, Booleans per "
                    "op, copy and cycle inside each op's issue window) under the same time limit and the same search "
                    "(`twill/solve/joint/search.py`; rows measured before issue 14 ran a plain Algorithm 1 loop "
                    "without the warp-issue bound); its grid grows with T = (n−1)·II + L. Rows that were "
                    "not re-run keep their last measurement (`date` per row in the JSON).\n\n")
    return (f"{SECTION}\n\n"
            f"Measured by `benchmarks/solve_time.py` on {meta['machine']} ({meta['cpus']} CPUs, Python "
            f"{meta['python']}, load average {meta.get('load_average', '?')} at the end: other jobs share the "
            f"host, so wall times are inflated and `CPU s` is the process's CPU time), {meta['date']}; "
            f"default options (normalization U = 300, CP-SAT with 2 workers, "
            f"time limit {meta['time_limit']:g} s per case). Times include normalization, phase 1 at every II "
            f"tried, the joint solves, the secondary objectives, the UNSAT explanation (when the modulo-only II "
            f"is infeasible) and verification. II and L are in normalized units (not comparable across rows). "
            f"`variables`/`constraints`: the final joint CP-SAT model. Raw data: "
            f"`benchmarks/results/solve_time.json`. Command: `PYTHONPATH=. .venv/bin/python "
            f"benchmarks/solve_time.py` (`--backends cpsat`, `--only flash-bwd` or `--only triton` for a "
            "part).\n\n"
            + compare + table(rows))


def write_section(text: str) -> None:
    """Replace (or append) the "## Solve time" section of docs/performance.md, leaving other sections."""
    existing = ""
    if os.path.exists(PERFORMANCE_DOC):
        with open(PERFORMANCE_DOC) as fh:
            existing = fh.read()
    if not existing:
        existing = "# Performance\n\n"
    pattern = re.compile(r"^## Solve time\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(existing):
        updated = pattern.sub(lambda _: text + "\n", existing, count=1)
    else:
        updated = existing.rstrip("\n") + "\n\n" + text
    with open(PERFORMANCE_DOC, "w") as fh:
        fh.write(updated.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--backends", default="cpsat,yices")
    parser.add_argument("--only", default=None, help="run only the kernels whose name contains this text")
    parser.add_argument("--repeat", type=int, default=1, help="solve every case this many times (medians)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write the JSON and the doc")
    parser.add_argument("--from-json", action="store_true", help="only rewrite the doc section from the JSON")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(RESULTS) as fh:
            data = json.load(fh)
        write_section(section(data["rows"], data["meta"]))
        return 0
    rows = []
    for backend in backends(args.backends.split(",")):
        for kernel, options, solve_options, label, archs in CONFIGS:
            if not selected(kernel, args.only):
                continue
            for arch in archs:
                row = run_median(kernel, options, solve_options, arch, backend, args.time_limit, args.repeat)
                print(f"{label:40s} {arch} {backend:5s} {row['status']:10s} II {row.get('ii')} "
                      f"({row['seconds']} s, {row['cpu_seconds']} s CPU, build {row['build_seconds']} s)",
                      flush=True)
                rows.append(row)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "time_limit": args.time_limit, "load_average": [round(x, 2) for x in os.getloadavg()]}
    if not args.no_write:
        ran = {r["backend"] for r in rows}
        if os.path.exists(RESULTS):
            with open(RESULTS) as fh:
                kept = [r for r in json.load(fh)["rows"]
                        if r["backend"] not in ran or not selected(r["kernel"], args.only)]
            rows = sorted(rows + kept, key=row_order)   # keep the last measurements of what was not re-run
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
        write_section(section(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
