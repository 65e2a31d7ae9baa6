"""Hostile inputs: every one ends with exit status 2, one line on stderr, no traceback and nothing written;
schedule files pass the verification gate before any command uses them (issue 17, items 3-5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twill.cli import main
from twill.schedule.document import schedule_document
from twill.ir.graph import Edge, LoopGraph, Op
from twill.files import write_text_atomic
from twill.ir.validate import MAX_OPS, zero_distance_cycle
from twill.kernels import build_kernel
from twill.machine import H100
from twill.schedule.result import Schedule
from twill.solve import SolveOptions, schedule


def fails(capsys, *argv, message):
    """Run the CLI: exit 2, nothing on stdout, exactly one error line containing ``message``."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("twill: error: ") and err.count("\n") == 1, err
    assert message in err, err
    return err


def chain(n: int, *, cycle: bool = False, **op) -> dict:
    """A ``twill-graph/1`` object: ``n`` ops in a distance-0 chain (closed into a cycle with ``cycle``)."""
    ops = [{"name": f"o{k}", "cycles": 1, "uses": {"u": 1}, **op} for k in range(n)]
    edges = [{"src": f"o{k}", "dst": f"o{k + 1}", "delay": 1} for k in range(n - 1)]
    if cycle:
        edges.append({"src": f"o{n - 1}", "dst": "o0", "delay": 1})
    return {"format": "twill-graph/1", "name": "g", "units": {"u": 1}, "ops": ops, "edges": edges}


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize("content, message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8 text"),
    (json.dumps(chain(2)).encode("utf-16"), "not UTF-8 text"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    (json.dumps({**chain(2), "attrs": {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}),
     "nested deeper than"),
    (json.dumps(chain(2, cycles=10**12)), "cycles must be in [1, 100000]"),
    (json.dumps(chain(MAX_OPS + 1)), f"at most {MAX_OPS} ops"),
    (json.dumps(chain(5000)), f"at most {MAX_OPS} ops"),
    ("1" * 5000, "invalid JSON"),
])
def test_hostile_graph_files(tmp_path, capsys, content, message):
    graph = write(tmp_path, "g.json", content)
    fails(capsys, "schedule", graph, "--no-ws", "-o", tmp_path / "s.json", message=message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_booleans_are_strict(tmp_path, capsys):
    data = chain(2)
    data["edges"][0]["blocking"] = "no"
    fails(capsys, "schedule", write(tmp_path, "g.json", json.dumps(data)), "--no-ws",
          message="edges[0]: 'blocking' must be true or false, got 'no'")
    data = chain(2, variable_latency=1)
    fails(capsys, "schedule", write(tmp_path, "h.json", json.dumps(data)), "--no-ws",
          message="'variable_latency' must be true or false, got 1")


def test_a_long_zero_distance_cycle_is_found_without_recursion(tmp_path, capsys):
    fails(capsys, "schedule", write(tmp_path, "g.json", json.dumps(chain(MAX_OPS, cycle=True))), "--no-ws",
          message="dependence cycle with total distance 0: o0 -> o1 -> o2")
    ops = tuple(Op(name=f"o{k}", rrt=({"u": 1},)) for k in range(20_000))
    edges = tuple(Edge(f"o{k}", f"o{k + 1}", 1) for k in range(19_999)) + (Edge("o19999", "o5", 1),)
    found = zero_distance_cycle(LoopGraph("long", ops, edges, {"u": 1}))
    assert found is not None and found[0] == found[-1] == "o5" and len(found) == 19_996


def test_a_large_schedule_serializes_with_the_same_order():
    n = MAX_OPS
    ops = tuple(Op(name=f"o{k}", rrt=({"u": 1},)) for k in range(n))
    graph = LoopGraph("wide", ops, (), {"u": 1})
    starts = {f"o{k}": (7 * k) % n + n * (k % 3) for k in range(n)}
    sched = Schedule(graph=graph, arch="h100", solver="manual", status="feasible", ii=n, ii_lower_bound=n,
                     starts=starts)
    doc = sched.to_dict()
    expected = sorted(graph.op_names, key=lambda name: (starts[name] % n, -(starts[name] // n),
                                                        graph.op_names.index(name)))
    assert [o["order"] for o in doc["ops"]] == [expected.index(name) for name in graph.op_names]


def test_triton_source_that_exits_at_import(tmp_path, capsys):
    pytest.importorskip("triton", reason="the Triton frontend needs triton")
    source = write(tmp_path, "k.py", "import sys\nsys.exit(0)\n")
    fails(capsys, "schedule", f"{source}:kernel", "--signature", "x=i32", message="exited while it was loaded")
    fails(capsys, "inject", f"{source}:kernel", "--signature", "x=i32", "-o", str(tmp_path / "out"),
          message="exited while it was loaded")
    assert not (tmp_path / "out").exists()


# -- outputs -------------------------------------------------------------------------------------------------
def test_outputs_are_checked_before_solving(tmp_path, capsys):
    ok = tmp_path / "ok.json"
    fails(capsys, "schedule", "paper-example", "--no-ws", "-o", ok, "--plot", tmp_path / "nodir" / "t.svg",
          message="no directory")
    fails(capsys, "schedule", "paper-example", "--no-ws", "-o", tmp_path, message="it is a directory")
    fails(capsys, "report", "paper-example", "--no-ws", "-o", tmp_path / "nodir" / "r.html", message="no directory")
    (tmp_path / "file").write_text("x")
    fails(capsys, "schedule", "paper-example", "--no-ws", "--plot-all", tmp_path / "file",
          message="is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_failing_picture_leaves_no_json_behind(tmp_path, capsys):
    fails(capsys, "schedule", "paper-example", "--no-ws", "-o", tmp_path / "ok.json", "--plot",
          tmp_path / "t.txt", message="unknown format")
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_midway_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "partial \ud800 text")      # a lone surrogate fails while writing
    assert list(tmp_path.iterdir()) == []


# -- the verification gate -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def solved():
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(time_limit=60))
    return schedule_document(result)


def corrupt(doc: dict, **changes) -> dict:
    bad = json.loads(json.dumps(doc))
    for op in bad["ops"]:
        op.pop("stage", None)
    for key, value in changes.items():
        if key == "starts":
            for op in bad["ops"]:
                op["start"] = value.get(op["name"], op["start"])
        else:
            bad[key] = value
    return bad


@pytest.mark.parametrize("changes, message", [
    ({"starts": {"P": 0}}, "DEPENDENCE: S->P"),
    ({"ii": 1, "ii_lower_bound": 1, "status": "optimal"}, "BOUND: II 1 is below the lower bound 2"),
    ({"starts": {"S": 0, "P": 2, "O": 4}}, "CAPACITY"),
    ({"starts": {"S": 0, "P": 2, "O": 10**9}}, "copies of the iteration"),
    ({"ii": 10**12, "ii_lower_bound": 10**12}, "BOUND: recorded 2 copies"),
    ({"status": "optimal", "stats": {"proven": {"ii": True, "length": False}}}, "STATUS: status 'optimal'"),
    ({"ops": "none"}, "'ops' must be an array, got str"),
    ({"ii": "2"}, "ii must be an integer"),
])
def test_schedule_files_pass_the_gate(tmp_path, capsys, solved, changes, message):
    bad = write(tmp_path, "bad.json", json.dumps(corrupt(solved, **changes)))
    fails(capsys, "emit", "gluon", "--schedule", bad, "-o", tmp_path / "k.py", message=message)
    fails(capsys, "report", bad, "-o", tmp_path / "r.html", message=message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_the_gate_admits_what_the_solver_wrote(tmp_path, capsys, solved):
    good = write(tmp_path, "good.json", json.dumps(solved))
    assert main(["report", str(good), "-o", str(tmp_path / "r.html")]) == 0
    assert "II 2 (optimal)" in capsys.readouterr().out


def test_the_messages_shown_in_docs_cli(tmp_path, capsys, monkeypatch, solved):
    """The exact lines of docs/cli.md, "Statuses, limits and exit codes"."""
    monkeypatch.chdir(tmp_path)
    doc = corrupt(solved, starts={"P": 0})
    Path("bad.json").write_text(json.dumps(doc))
    assert fails(capsys, "report", "bad.json", "-o", "r.html", message="") == (
        "twill: error: schedule rejected by the verifier: DEPENDENCE: S->P (d=1, δ=0) violated: t(P)=0 < "
        "t(S)+1=1\n")
    Path("bad.json").write_text(json.dumps(corrupt(solved, ii=1, ii_lower_bound=1)))
    assert fails(capsys, "report", "bad.json", "-o", "r.html", message="") == (
        "twill: error: schedule rejected by the verifier: BOUND: II 1 is below the lower bound 2 (ResMII 2, "
        "RecMII 1) (and 2 more)\n")
    assert fails(capsys, "schedule", "paper-example", "--plot", "nodir/t.svg", message="") == (
        "twill: error: cannot write 'nodir/t.svg': no directory 'nodir'\n")
    Path("g.json").write_bytes(b"\x89PNG")
    assert fails(capsys, "schedule", "g.json", message="") == (
        "twill: error: g.json: not UTF-8 text (byte 0); graph files are UTF-8 JSON\n")
    Path("g.json").write_text("[" * 40 + "]" * 40)
    assert fails(capsys, "schedule", "g.json", message="") == (
        "twill: error: g.json: JSON nested deeper than 32 levels\n")
    Path("g.json").write_text(json.dumps(chain(5000)))
    assert fails(capsys, "schedule", "g.json", message="") == (
        "twill: error: graph has 5000 ops and 4999 edges; Twill supports at most 1000 ops and 20000 edges\n")
    Path("g.json").write_text(json.dumps(chain(2, cycles=10**12)))
    assert fails(capsys, "schedule", "g.json", message="") == (
        "twill: error: op 'o0': cycles must be in [1, 100000], got 1000000000000\n")
    data = chain(2)
    data["edges"][0]["blocking"] = "no"
    Path("g.json").write_text(json.dumps(data))
    assert fails(capsys, "schedule", "g.json", message="") == (
        "twill: error: edges[0]: 'blocking' must be true or false, got 'no'\n")
    assert fails(capsys, "schedule", "paper-example", "--time-limit", "nan", message="") == (
        "twill: error: argument --time-limit: must be a positive number of seconds, at most 1e+06, got nan\n")


@pytest.mark.parametrize("change, message", [
    ({"attrs": {"streaming_depth": "x"}}, "attribute 'streaming_depth' must be an integer in [1, 64], got 'x'"),
    ({"attrs": {"smem_resident": 10**40}}, "attribute 'smem_resident' must be an integer"),
    ({"units": {"u": 10**30}}, "unit 'u' has capacity 1000000000000000000000000000000"),
    ({"op": {"warp_busy": 10**13}}, "op 'o0': warp_busy 10000000000000 is beyond the limit 100000"),
    ({"op": {"footprint": {"smem": 10**20}}}, "op 'o0': smem 100000000000000000000 is beyond the limit"),
    ({"edge": {"delay": 10**9}}, "delay 1000000000 / distance 0 beyond the limits"),
])
def test_values_beyond_the_model(tmp_path, capsys, change, message):
    data = chain(2)
    data.update({k: v for k, v in change.items() if k in ("attrs", "units")})
    data["ops"][0].update(change.get("op", {}))
    data["edges"][0].update(change.get("edge", {}))
    graph = write(tmp_path, "g.json", json.dumps(data))
    fails(capsys, "schedule", graph, "--no-ws", message=message)
