"""``twill schedule`` / ``twill kernels`` end to end, and every bad input: one line on stderr, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from twill.cli import main
from twill.schedule.document import load_schedule_document

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def graph_file(tmp_path, ops, edges, units=None, name="g"):
    data = {"format": "twill-graph/1", "name": name, "ops": ops, "edges": edges}
    if units is not None:
        data["units"] = units
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_kernels_lists_the_builtins(capsys):
    rc, out, err = run(capsys, "kernels")
    assert rc == 0 and err == ""
    assert out.split("\n")[0].split()[0] == "paper-example"
    assert {line.split()[0] for line in out.splitlines()} >= {"paper-example", "gemm", "flash-fwd"}


def test_schedule_paper_example_no_ws_json(capsys):
    rc, out, err = run(capsys, "schedule", "paper-example", "--no-ws", "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["format"] == "twill-schedule/1"
    assert (doc["ii"], doc["status"], doc["length"]) == (2, "optimal", 4)
    assert doc["stats"]["res_mii"] == 2 and doc["stats"]["normalization"]["enabled"] is True
    assert doc["loop_graph"]["format"] == "twill-graph/1"


def test_schedule_paper_example_default_uses_joint_solver(capsys):
    rc, out, err = run(capsys, "schedule", "paper-example", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert (doc["ii"], doc["status"]) == (2, "optimal")


def test_backend_is_a_deprecated_spelling_of_solver(capsys):
    rc, out, err = run(capsys, "schedule", "paper-example", "--no-ws", "--backend", "cpsat", "--json")
    assert rc == 0 and err == "twill: warning: --backend is deprecated; use --solver\n"
    assert json.loads(out)["solver"] == "cpsat"
    rc, out, err = run(capsys, "schedule", "paper-example", "--no-ws", "--solver", "cpsat", "--json")
    assert rc == 0 and err == "" and "backend" not in json.loads(out)["stats"]


def test_schedule_text_report_pipelined_and_output_file(capsys, tmp_path):
    target = tmp_path / "s.json"
    rc, out, err = run(capsys, "schedule", str(EXAMPLES / "dual-issue.json"), "--no-ws", "--no-normalize",
                       "--pipelined", "-o", str(target))
    assert rc == 0 and err == ""
    assert "status: optimal" in out and "II: 5    II lower bound 5 (ResMII 4, RecMII 4)" in out
    assert "IIs tried: 4 infeasible, 5 optimal" in out
    assert "normalization: off" in out
    assert "pipelined program Q: II=5" in out
    sched = load_schedule_document(str(target))
    assert sched.ii == 5 and sched.graph.name == "dual-issue"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_example_graphs_schedule(capsys, name):
    rc, out, err = run(capsys, "schedule", str(EXAMPLES / name), "--no-ws", "--json")
    assert rc == 0, err
    assert json.loads(out)["status"] == "optimal"


def test_resolution_and_options(capsys):
    rc, out, _ = run(capsys, "schedule", str(EXAMPLES / "fa-forward-toy.json"), "--no-ws", "--json",
                     "--resolution", "40")
    assert rc == 0
    norm = json.loads(out)["stats"]["normalization"]
    assert norm["U"] == 40 and sum(norm["map"].values()) <= 40


BAD_GRAPHS = {
    "unknown unit": (
        [{"name": "a", "cycles": 1, "uses": {"warp_drive": 1}}], [], {"tc": 1},
        "op 'a' uses unknown unit 'warp_drive' (known units: tc)"),
    "negative delay": (
        [{"name": "a", "cycles": 1, "uses": {}}, {"name": "b", "cycles": 1, "uses": {}}],
        [{"src": "a", "dst": "b", "delay": -1}], {}, "edge a->b: negative delay -1"),
    "zero-distance cycle": (
        [{"name": "a", "cycles": 1, "uses": {}}, {"name": "b", "cycles": 1, "uses": {}}],
        [{"src": "a", "dst": "b", "delay": 1}, {"src": "b", "dst": "a", "delay": 1, "distance": 0}], {},
        "dependence cycle with total distance 0: a -> b -> a"),
    "duplicate names": (
        [{"name": "a", "cycles": 1, "uses": {}}, {"name": "a", "cycles": 2, "uses": {}}], [], {},
        "duplicate op name 'a'"),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_bad_graphs_fail_in_one_line_without_output(capsys, tmp_path, case):
    ops, edges, units, message = BAD_GRAPHS[case]
    path = graph_file(tmp_path, ops, edges, units)
    target = tmp_path / "out.json"
    rc, out, err = run(capsys, "schedule", path, "--no-ws", "-o", str(target))
    assert rc == 2 and out == ""
    assert err == f"twill: error: {message}\n"
    assert not target.exists()


def test_op_longer_than_any_ii(capsys, tmp_path):
    path = graph_file(tmp_path, [{"name": "a", "cycles": 7, "uses": {"u": 1}},
                                 {"name": "b", "cycles": 1, "uses": {"u": 1}}], [], {"u": 1})
    rc, out, err = run(capsys, "schedule", path, "--no-ws", "--max-ii", "5")
    assert rc == 2 and out == ""
    assert err == ("twill: error: op 'a' occupies 'u' for 7 unit-cycles, longer than any II up to max II 5\n")


def test_malformed_json(capsys, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "twill-graph/1", "name": ')
    rc, out, err = run(capsys, "schedule", str(path), "--no-ws")
    assert rc == 2 and out == ""
    assert err.startswith("twill: error: ") and "invalid JSON at line 1" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["schedule", "no-such-kernel", "--no-ws"], "unknown kernel 'no-such-kernel' (built-in kernels: "),
    (["schedule", "paper-example", "--no-ws", "--arch", "a100"], "unknown architecture 'a100'"),
    (["schedule", "missing.json", "--no-ws"], "cannot read graph file 'missing.json'"),
    (["schedule", "paper-example", "--no-ws", "--subtiles", "2"], "kernel 'paper-example' has no option"),
    (["schedule", "paper-example", "--no-ws", "--num-warps", "4"], "--num-warps applies to Triton targets"),
    (["schedule", "paper-example", "--no-ws", "--time-limit", "0"], "--time-limit: must be a positive number"),
    (["schedule", "paper-example", "--no-ws", "--max-ii", "1"], "needs II >= 2 (ResMII 2, RecMII 1)"),
    (["schedule", "paper-example", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
])
def test_bad_arguments(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("twill: error: ") and message in err and err.count("\n") == 1


def test_kernel_options_rejected_for_graph_files(capsys):
    rc, _, err = run(capsys, "schedule", str(EXAMPLES / "paper-example.json"), "--block-m", "64", "--no-ws")
    assert rc == 2 and "--block-m applies to built-in kernels only" in err


def test_unwritable_output(capsys):
    rc, out, err = run(capsys, "schedule", "paper-example", "--no-ws", "-o", "/nonexistent-dir/s.json")
    assert rc == 2 and out == "" and err.startswith("twill: error: cannot write '/nonexistent-dir/s.json'")


def test_installed_command_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    target = tmp_path / "never.json"
    proc = subprocess.run([sys.executable, "-m", "twill.cli", "schedule", str(bad), "--no-ws", "-o", str(target)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not target.exists()


def test_plots_are_written(capsys, tmp_path):
    picture, folder = tmp_path / "t.png", tmp_path / "all"
    rc, _, err = run(capsys, "schedule", "paper-example", "--no-ws", "--plot", str(picture), "--plot-all",
                     str(folder))
    assert rc == 0, err
    assert picture.stat().st_size > 0 and any(folder.iterdir())
    rc, _, err = run(capsys, "schedule", "paper-example", "--no-ws", "--plot", "/nonexistent-dir/t.png")
    assert rc == 2 and err.startswith("twill: error: ") and err.count("\n") == 1


def test_json_with_pipelined_program(capsys):
    rc, out, _ = run(capsys, "schedule", "paper-example", "--no-ws", "--json", "--pipelined")
    assert rc == 0
    q = json.loads(out)["pipelined"]
    assert (q["ii"], q["copies"], q["total"]) == (2, 2, 6) and len(q["instances"]) == 6


@pytest.mark.parametrize("target", ["missing_kernel.py:attn_fwd", "missing.ttgir"])
def test_missing_triton_sources(capsys, target):
    rc, out, err = run(capsys, "schedule", target, "--no-ws")
    assert rc == 2 and out == ""
    assert err == f"twill: error: cannot read Triton source '{target.split(':')[0]}': no such file\n"


def test_kernel_options_rejected_for_triton_targets(capsys):
    rc, _, err = run(capsys, "schedule", "k.py:fn", "--subtiles", "2", "--no-ws")
    assert rc == 2 and "--subtiles applies to built-in kernels only; use --constexpr" in err


def _pairs_without_body():
    """(backend, kernel) for every registered family and backend the family has no body for."""
    from twill.kernels import families

    return [(backend, f.name) for f in families() for backend in ("gluon", "pallas", "tilelang")
            if backend not in f.backends]


@pytest.mark.parametrize("backend,kernel", _pairs_without_body())
def test_emit_refuses_a_pair_without_body_before_solving(capsys, monkeypatch, tmp_path, backend, kernel):
    """``twill emit tilelang flash-bwd`` (and every backend/kernel pair the registry has no body for) is refused
    in one line before any solve: the solver entry points are replaced by ones that fail the test."""
    import twill.integrations.tilelang.planner as planner
    import twill.solve

    def solved(*args, **kwargs):
        raise AssertionError("emit solved a pair it cannot emit")

    monkeypatch.setattr(twill.solve, "schedule", solved)
    monkeypatch.setattr(planner, "solve_for_tilelang", solved)
    out = tmp_path / "k.py"
    rc, _, err = run(capsys, "emit", backend, kernel, "-o", str(out))
    assert rc == 2 and not out.exists()
    assert err.count("\n") == 1 and err.startswith(f"twill: error: cannot emit {backend}: kernel {kernel!r}")


def test_emit_refuses_persistent_for_a_family_without_it(capsys):
    """``--persistent`` on a family without a persistent form is refused before solving, in one line."""
    rc, _, err = run(capsys, "emit", "gluon", "flash-bwd", "--persistent", "-o", "-")
    assert rc == 2 and err == ("twill: error: cannot emit gluon: kernel 'flash-bwd' has no persistent form "
                               "(persistent: gemm, flash-fwd)\n")


def test_schedule_flash_fwd_head_dim_256_with_the_family_defaults(capsys):
    """``twill schedule flash-fwd --head-dim 256`` schedules with the kernel's D = 256 tile (64-key blocks, two
    sub-tiles) without --block-n or --subtiles."""
    rc, out, err = run(capsys, "schedule", "flash-fwd", "--head-dim", "256", "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["status"] == "optimal"
    attrs = doc["loop_graph"]["attrs"]
    assert (attrs["head_dim"], attrs["subtiles"], attrs["block_n"]) == (256, 2, 64)
