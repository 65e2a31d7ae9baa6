"""Property test: random corruptions of valid schedule files, fed to every command that reads a schedule
(``emit gluon --schedule``, ``report``, ``inject --schedule``). Each run either exits 2 with one line and
writes nothing, or exits 0 with a schedule that an independent check (written here, no Twill code) accepts:
no unverified schedule enters any command."""

from __future__ import annotations

import functools
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solved import solved_kernel

from twill.cli import main
from twill.schedule.document import schedule_document
from twill.machine import H100

WRONG_VALUES = (None, "x", 1.5, True, [], {}, -1, 10**15)


@functools.lru_cache(maxsize=None)
def valid_document(kernel: str) -> str:
    """A solver-written schedule document (JSON text), without the optional ``stage``/``order`` fields so that
    corrupted start times reach the verifier."""
    doc = schedule_document(solved_kernel(kernel, "h100"))
    for op in doc["ops"]:
        op.pop("stage")
        op.pop("order")
    return json.dumps(doc)


@st.composite
def corruption(draw, doc: dict, last: bool = True) -> dict:
    """One random change of ``doc`` (in place): a start, the II and its bound, the status, a warp
    assignment, a warp group, a graph edge or unit, an entry removed or duplicated, a value of the wrong
    type."""
    ops, graph = doc["ops"], doc["loop_graph"]
    ii = doc["ii"]
    kinds = ["start", "ii", "bound", "status", "warp", "group", "edge", "unit", "drop", "duplicate", "proven"]
    kind = draw(st.sampled_from(kinds + ["type"] if last else kinds))  # a wrong type only as the last change
    op = draw(st.sampled_from(ops))
    if kind == "start":
        op["start"] = draw(st.integers(-2, 3 * ii + 2))
    elif kind == "ii":
        doc["ii"] = draw(st.integers(1, 2 * ii + 1))
    elif kind == "bound":
        doc["ii_lower_bound"] = draw(st.integers(0, 2 * ii + 1))
    elif kind == "status":
        doc["status"] = draw(st.sampled_from(["optimal", "feasible", "infeasible", "proved"]))
    elif kind == "warp" and "warp" in op:
        op["warp"] = draw(st.integers(-1, len(doc.get("warps", [])) + 1))
    elif kind == "group" and doc.get("warps"):
        group = draw(st.sampled_from(doc["warps"]))
        group[draw(st.sampled_from(["num_warps", "regs"]))] = draw(st.sampled_from([1, 2, 3, 4, 8, 24, 256, 512]))
    elif kind == "edge" and graph["edges"]:
        edge = draw(st.sampled_from(graph["edges"]))
        edge[draw(st.sampled_from(["delay", "distance"]))] = draw(st.integers(0, 4 * ii))
    elif kind == "unit" and graph.get("units"):
        unit = draw(st.sampled_from(sorted(graph["units"])))
        graph["units"][unit] = draw(st.integers(0, 2))
    elif kind == "drop":
        ops.remove(op)
    elif kind == "duplicate":
        ops.append(dict(op))
    elif kind == "type":
        target = draw(st.sampled_from(["start", "ii", "ii_lower_bound", "status", "warps", "arch", "stats"]))
        holder = op if target == "start" else doc
        holder[target] = draw(st.sampled_from(WRONG_VALUES))
    elif kind == "proven":
        doc["status"] = "optimal"
        doc.setdefault("stats", {})["proven"] = {"ii": True, "length": False}
    return doc


@st.composite
def corrupted(draw, kernel: str) -> dict:
    doc = json.loads(valid_document(kernel))
    changes = draw(st.integers(1, 3))
    for i in range(changes):
        doc = draw(corruption(doc, last=i == changes - 1))
    return doc


def independent_check(doc: dict) -> list[str]:
    """Dependences and modulo unit capacities of a ``twill-schedule/1`` document, from its JSON alone."""
    graph, ii = doc["loop_graph"], doc["ii"]
    start = {o["name"]: o["start"] for o in doc["ops"]}
    problems = [f"{e['src']}->{e['dst']}" for e in graph["edges"]
                if start[e["dst"]] + e.get("distance", 0) * ii < start[e["src"]] + e["delay"]]
    caps = graph.get("units") or dict(H100.units)
    load: dict[tuple[str, int], int] = {}
    for op in graph["ops"]:
        rows = op.get("rrt") or [op["uses"]] * op["cycles"]
        for c, row in enumerate(rows):
            for unit, count in row.items():
                key = (unit, (start[op["name"]] + c) % ii)
                load[key] = load.get(key, 0) + count
    problems += [f"{unit}@{r}" for (unit, r), used in load.items() if used > caps.get(unit, 0)]
    used = {u: sum(c for op in graph["ops"] for row in (op.get("rrt") or [op["uses"]] * op["cycles"])
                   for un, c in row.items() if un == u) for u in caps}
    res = max([1] + [math.ceil(total / caps[u]) for u, total in used.items() if caps[u] > 0])
    if ii < res:
        problems.append(f"II {ii} < ResMII {res}")
    return problems


def run_command(argv_of, doc: dict, capsys) -> None:
    """Feed ``doc`` to one command; check the outcome as the module docstring says."""
    folder = Path(tempfile.mkdtemp(prefix="twill-trust-"))
    try:
        path = folder / "s.json"
        path.write_text(json.dumps(doc))
        out = folder / "out"
        rc = main(argv_of(path, out))
        stdout, err = capsys.readouterr()
        if rc == 0:
            assert independent_check(doc) == [], "an invalid schedule was accepted"
        else:
            assert rc == 2 and err.startswith("twill: error: ") and err.count("\n") == 1, err
            assert sorted(p.name for p in folder.iterdir()) == ["s.json"], "an output was written"
    finally:
        shutil.rmtree(folder)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=corrupted("paper-example"))
def test_emit_refuses_or_checks_every_corrupted_schedule(doc, capsys):
    run_command(lambda path, out: ["emit", "gluon", "--schedule", str(path), "-o", str(out)], doc, capsys)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=corrupted("gemm"))
def test_emit_and_report_refuse_or_check_every_corrupted_gemm_schedule(doc, capsys):
    run_command(lambda path, out: ["emit", "gluon", "--schedule", str(path), "-o", str(out)], doc, capsys)
    run_command(lambda path, out: ["report", str(path), "-o", f"{out}.html"], doc, capsys)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=corrupted("paper-example"))
def test_report_refuses_or_checks_every_corrupted_schedule(doc, capsys):
    run_command(lambda path, out: ["report", str(path), "-o", f"{out}.html"], doc, capsys)


def test_inject_refuses_a_corrupted_schedule(tmp_path, capsys):
    pytest.importorskip("triton", reason="twill inject needs triton")
    import importlib

    mod = importlib.import_module("twill.integrations.triton.kernels.matmul")
    doc = json.loads(valid_document("paper-example"))
    doc["ops"][1]["start"] = 0                                   # P before S finishes
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    target = f"{Path(mod.__file__)}:matmul_kernel"
    argv = ["inject", target, "--signature", mod.SIGNATURE, "--num-warps", str(mod.NUM_WARPS),
            "--num-stages", str(mod.NUM_STAGES), *[f"--constexpr={c}" for c in mod.CONSTEXPRS],
            "--schedule", str(bad), "-o", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "schedule rejected by the verifier: DEPENDENCE" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
