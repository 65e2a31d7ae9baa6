"""Range checks of the numbers users give (issue 36, "Validation"): machine files, numeric command-line
options and the tile sizes, warp counts and statistics of schedule files. Each bad value is one line on
stderr, exit status 2, before any work, and nothing is written or cached."""

from __future__ import annotations

import copy
import json
import os

import pytest
from solved import solved_kernel

from twill.cli import main
from twill.schedule.document import schedule_document

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results")
H200_MODEL = os.path.join(RESULTS, "calibration_h200.machine.json")


def one_line_error(capsys, argv: list[str], message: str) -> str:
    """Run ``twill argv``: exit 2, nothing on stdout, one ``twill: error:`` line containing ``message``."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert out == "" and err.startswith("twill: error: ") and err.count("\n") == 1, err
    assert message in err, err
    return err


# -- machine files -----------------------------------------------------------------------------------------
def _machine(tmp_path, change) -> str:
    with open(H200_MODEL) as fh:
        doc = json.load(fh)
    change(doc)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _cal(**fields):
    return lambda d: d["calibration"].update(fields)


@pytest.mark.parametrize("change, message", [
    (_cal(ex2_per_clk=5e-324), "calibration.ex2_per_clk must be between 0.016 and 64 per clock"),
    (lambda d: d["calibration"]["mma_flops_per_clk"]["fp16"].update({"64": 5e-324}),
     "calibration.mma_flops_per_clk.fp16[64] must be between 4.096 and 16384 per clock"),
    (_cal(tma_bytes_per_clk=1e9), "calibration.tma_bytes_per_clk must be between"),
    (lambda d: d["calibration"]["mma_flops_per_clk_one_group"].pop("bf16"),
     "calibration.mma_flops_per_clk_one_group measures dtypes ['fp16'], mma_flops_per_clk ['bf16', 'fp16']"),
    (lambda d: d["calibration"]["mma_flops_per_clk_one_group"]["fp16"].pop("128"),
     "calibration.mma_flops_per_clk_one_group.fp16 measures instruction N [64, 256]"),
    (lambda d: [d["calibration"][t].update(fp9={"64": 4000.0})
                for t in ("mma_flops_per_clk", "mma_flops_per_clk_one_group")],
     "dtype 'fp9' has no tensor-core rate on h200"),
    (lambda d: d["calibration"]["mma_flops_per_clk_one_group"]["fp16"].update({"64": 4096.0}),
     "mma_flops_per_clk_one_group.fp16[64] (4096.0) exceeds mma_flops_per_clk.fp16[64]"),
    (_cal(ex2_per_clk_one_group=15.0), "ex2_per_clk_one_group (15.0) exceeds ex2_per_clk"),
    (lambda d: d.update(sustained_clock_ghz=1e-300), "sustained_clock_ghz must be between 0.1 and 10 GHz, got 1e-300"),
    (lambda d: d.update(launch_us=1e12), "launch_us must be between 0.001 and 1000 us"),
    (lambda d: d["clock_model"].update(ns_per_clk=1e-300), "clock_model.ns_per_clk must be between 0.1 and 10 ns"),
    (lambda d: d["clock_model"].update(ns_per_tensor_clk=1e6), "clock_model.ns_per_clk + ns_per_tensor_clk"),
    (lambda d: d["calibration"]["mma_group_latency"].update({"-64": 100.0}),
     "calibration.mma_group_latency: key '-64' is not an instruction N"),
    (lambda d: d["calibration"]["mma_flops_per_clk"]["fp16"].update({"6_4": 4000.0}), "key '6_4' is not an instruction N"),
    (_cal(barrier_handoff_cycles=1e-9), "calibration.barrier_handoff_cycles must be between 1 and 1e+06 cycles"),
    (lambda d: d["calibration"]["softmax_step_cycles"].update({"2x128x128": 1e300}),
     "calibration.softmax_step_cycles[2x128x128] must be between 1 and 1e+06 cycles"),
    (lambda d: d["calibration"]["softmax_step_cycles"].update({"²x128x128": 1000.0}), "is not groups x keys"),
    (lambda d: d.update(gpu=["x"]), "gpu must be a string"),
])
def test_machine_files_out_of_range_are_one_line(tmp_path, capsys, change, message):
    path = _machine(tmp_path, change)
    err = one_line_error(capsys, ["schedule", "paper-example", "--no-ws", "--machine", path], message)
    assert err.startswith(f"twill: error: {path}: ")


def test_the_committed_machine_file_loads_and_fits_pass_the_same_checks():
    from twill.machine.calibrate import fit
    from twill.machine.calibration import load_machine
    from twill.machine.models import H200

    machine = load_machine(H200_MODEL)
    assert machine.sustained_clock_ghz == pytest.approx(1.548, abs=1e-3)
    with open(os.path.join(RESULTS, "calibration_h200_raw.json")) as fh:
        rows = json.load(fh)["measurements"]
    assert fit(rows, H200).calibration == machine.calibration
    absurd = [dict(r, result={**r["result"], "elements_per_clk": 1e-300}) if r["bench"] == "elementwise"
              and "result" in r else r for r in rows]
    with pytest.raises(Exception, match="ex2_per_clk must be between"):
        fit(absurd, H200)             # twill calibrate never writes a file that --machine would refuse


# -- numeric command-line options ---------------------------------------------------------------------------
SOLVE_COMMANDS = [["schedule", "paper-example"], ["emit", "gluon", "gemm", "-o", "k.py"],
                  ["report", "paper-example", "-o", "r.html"], ["inject", "k.py:fn", "-o", "out"]]


@pytest.mark.parametrize("command", SOLVE_COMMANDS + [["tune", "gemm"]], ids=lambda c: c[0])
@pytest.mark.parametrize("flag, value, message", [
    ("--workers", "100000", "argument --workers: must be an integer in [1, 256], got 100000"),
    ("--workers", "0", "argument --workers: must be an integer in [1, 256], got 0"),
    ("--seed", str(2**64), f"argument --seed: must be an integer in [0, 2147483647], got {2**64}"),
    ("--seed", "-1", "argument --seed: must be an integer in [0, 2147483647], got -1"),
    ("--arch", "", "argument --arch: unknown architecture '' (known: h100, h200, b200)"),
    ("--time-limit", "nan", "argument --time-limit: must be a positive number of seconds, at most 1e+06, got nan"),
    ("--time-limit", "inf", "argument --time-limit: must be a positive number of seconds, at most 1e+06, got inf"),
    ("--time-limit", "-3", "argument --time-limit: must be a positive number of seconds"),
    ("--extra-copies", "-1", "argument --extra-copies: must be an integer in [0, 16], got -1"),
    ("--streaming-depth", "0", "argument --streaming-depth: must be an integer in [1, 64], got 0"),
    ("--reg-limit", "8", "argument --reg-limit: must be an integer in [24, 255], got 8"),
])
def test_numeric_options_are_checked_alike_in_every_command(command, flag, value, message, tmp_path, capsys,
                                                            monkeypatch):
    if command[0] == "tune" and flag == "--seed":
        pytest.skip("twill tune has no --seed")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    one_line_error(capsys, [*command, flag, value], message)
    assert sorted(os.listdir(tmp_path)) == []           # nothing written, nothing cached


@pytest.mark.parametrize("argv, message", [
    (["--max-ii", "0"], "argument --max-ii: must be an integer in [1, 10000000], got 0"),
    (["--resolution", "0"], "argument --resolution: must be an integer in [1, 100000], got 0"),
    (["--max-warps", "-8"], "argument --max-warps: must be an integer in [1, 32], got -8"),
    (["--workers", "two"], "argument --workers: must be an integer in [1, 256], got 'two'"),
    (["--num-warps", "0"], "argument --num-warps: must be an integer in [1, 32], got 0"),
    (["--num-stages", "100000"], "argument --num-stages: must be an integer in [1, 64], got 100000"),
])
def test_other_numeric_options(argv, message, capsys):
    one_line_error(capsys, ["schedule", "paper-example", *argv], message)


@pytest.mark.parametrize("argv, message", [
    (["tune", "gemm", "--streaming-depth", "2,0"], "argument --streaming-depth: must be an integer in [1, 64], got 0"),
    (["tune", "gemm", "--reg-limit", "240,0"], "argument --reg-limit: must be an integer in [24, 255], got 0"),
    (["tune", "gemm", "--top", "0"], "argument --top: must be an integer in [1, 100000], got 0"),
    (["tune", "gemm", "--measure", "0"], "argument --measure: must be an integer in [1, 100000], got 0"),
    (["tune", "k.py:fn", "--num-warps", "4,0"], "argument --num-warps: must be an integer in [1, 32], got 0"),
    (["inject", "k.py:fn", "--load-lead", "0", "-o", "out"], "argument --load-lead: must be an integer in [1, 64]"),
    (["calibrate", "--arch", "", "-o", "m.json"], "argument --arch: unknown architecture ''"),
    (["graph", "gemm", "--arch", "", "-o", "g.json"], "argument --arch: unknown architecture ''"),
])
def test_numeric_options_of_tune_inject_calibrate_graph(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    one_line_error(capsys, argv, message)
    assert sorted(os.listdir(tmp_path)) == []


def test_the_cli_ranges_are_the_solve_options_ranges():
    """One source of truth: every value the CLI type refuses, SolveOptions refuses, and the ends are accepted."""
    import argparse

    from twill.commands.common import option_type
    from twill.errors import TwillError
    from twill.solve.options import OPTION_RANGES, SECONDS_OPTIONS, SolveOptions

    for name, (low, high) in OPTION_RANGES.items():
        if name == "window_ii_limit":
            continue
        parse = option_type(name)
        inside = [high] + ([] if name in SECONDS_OPTIONS else [low])
        outside = [high * 2 + 1, float("nan")] + ([low] if name in SECONDS_OPTIONS else [low - 1])
        for value in inside:
            SolveOptions(**{name: parse(str(value))})
        for value in outside:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(str(value))
            with pytest.raises(TwillError):
                SolveOptions(**{name: value})


def test_a_job_with_options_no_solve_takes_is_not_cached(tmp_path, monkeypatch):
    from twill.ir.io import graph_to_dict
    from twill.kernels import build_kernel
    from twill.machine import get_machine
    from twill.tune.space import Candidate
    from twill.tune.sweep import Job, run_job, run_sweep

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine = get_machine("h100")
    graph = graph_to_dict(build_kernel("paper-example", machine))
    for job in (Job(candidate=Candidate(streaming_depth=0), machine=machine, time_limit=10, graph=graph),
                Job(candidate=Candidate(), machine=machine, time_limit=float("nan"), graph=graph)):
        record = run_job(job)
        assert record["status"] == "error" and record["cacheable"] is False
        assert run_sweep([job], workers=1)[0]["status"] == "error"
    assert not any(files for _, _, files in os.walk(tmp_path))


# -- schedule files -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemm_document():
    return schedule_document(solved_kernel("gemm", "h100"))


def _warp(k, **fields):
    return lambda d: d["warps"][k].update(fields)


def _attrs(**fields):
    return lambda d: d["loop_graph"]["attrs"].update(fields)


def _stats(**fields):
    return lambda d: d["stats"].update(fields)


@pytest.mark.parametrize("change, message", [
    (_warp(1, num_warps=0), "WARP"),
    (_warp(1, num_warps=-8), "WARP COUNT: warp group 1 has -8 warps; a group has at least 1"),
    (_warp(0, num_warps=0), "group 0 has 0"),
    (_attrs(block_m=0), "graph 'gemm': attribute 'block_m' must be an integer in [1, 4096], got 0"),
    (_attrs(block_m="x"), "graph 'gemm': attribute 'block_m' must be an integer in [1, 4096], got 'x'"),
    (_attrs(block_m=128.0), "attribute 'block_m' must be an integer in [1, 4096], got 128.0"),
    (_attrs(block_n=-256), "attribute 'block_n' must be an integer in [1, 4096], got -256"),
    (_attrs(block_k=True), "attribute 'block_k' must be an integer in [1, 4096], got True"),
    (_attrs(subtiles=0), "attribute 'subtiles' must be an integer in [1, 16], got 0"),
    (_attrs(warps=-8), "attribute 'warps' must be an integer in [1, 32], got -8"),
    (_stats(proven=[1]), "stats 'proven' must be an object of true/false, got [1]"),
    (_stats(proven="abc"), "stats 'proven' must be an object of true/false"),
    (_stats(length="x"), "stats 'length' must be a non-negative integer, got 'x'"),
    (_stats(reg_limit={"a": [1, {"b": None}]}), "stats 'reg_limit' must be a non-negative integer"),
    (_stats(normalization="x"), "stats 'normalization' must be an object"),
    (_stats(normalization={"enabled": True, "map": {"1": "x"}}), "stats 'normalization' must be a normalization"),
    (_stats(normalization={"enabled": True, "cycles_per_unit": -1}), "stats 'normalization' must be"),
    (_stats(tried=[1, 2]), "stats 'tried' must be an array of objects"),
    (_stats(tried=[{"ii": "x"}]), "stats 'tried' must be rows whose 'ii' is an integer"),
    (_stats(compiled={"shared_bytes": "lots"}), "stats 'compiled' must be an object of non-negative integers"),
    (_stats(registers={"steps": [1]}), "stats 'registers' must be an object whose 'steps' are objects"),
    (lambda d: d.update(stats=[1]), "'stats' must be an object"),
    (lambda d: d.update(ops="none"), "'ops' must be an array, got str"),
    (lambda d: d.update(warps=[1]), "'warps[0]' must be an object, got int"),
    (lambda d: d["warps"][0].update(ops="ab"), "'warps[0].ops' must be an array, got str"),
])
def test_bad_numbers_in_schedule_files_are_one_line_and_write_nothing(gemm_document, change, message, tmp_path,
                                                                      capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = copy.deepcopy(gemm_document)
    change(doc)
    (tmp_path / "s.json").write_text(json.dumps(doc))
    for backend in ("gluon", "pallas"):
        one_line_error(capsys, ["emit", backend, "--schedule", "s.json", "-o", "k.py"], message)
    assert sorted(os.listdir(tmp_path)) == ["s.json"]


def test_the_unchanged_schedule_file_is_emitted(gemm_document, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text(json.dumps(gemm_document))
    assert main(["emit", "gluon", "--schedule", "s.json", "-o", "k.py"]) == 0
    assert (tmp_path / "k.py").exists()
