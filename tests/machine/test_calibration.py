"""Calibrated machine models: the twill-machine/1 file, the fit of raw measurements, calibrated costs, CLI."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

from twill.cli import main
from twill.errors import FormatError, TwillError
from twill.machine import costs
from twill.machine.calibrate import fit, fit_clock_model, plan
from twill.machine.calibration import load_machine, machine_from_dict, machine_to_dict, softmax_key
from twill.machine.models import H100, H200
from measurements import calibration_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
H200_RAW = os.path.join(RESULTS, "calibration_h200_raw.json")
H200_MODEL = os.path.join(RESULTS, "calibration_h200.machine.json")
H200_CLOCK = os.path.join(RESULTS, "kernel_clock_h200.json")


def test_fit_takes_best_and_one_group_rates():
    machine = fit(calibration_rows(), H200)
    cal = machine.calibration
    assert machine.name == "h200" and machine.model == "h200-calibrated"
    assert cal.mma_rate("fp16", 256) == 4000.0 and cal.mma_rate("fp16", 256, one_group=True) == 3900.0
    assert cal.mma_rate("fp16", 128) == 3800.0  # widest measured N not above 128 is 64
    assert cal.mma_rate("fp8", 128) is None
    assert (cal.ex2_per_clk, cal.ex2_per_clk_one_group) == (15.0, 12.0)
    assert (cal.rowmax_per_clk, cal.rowsum_per_clk) == (40.0, 50.0)
    assert cal.barrier_handoff_cycles == 70.0 and cal.tma_latency_cycles == 1200.0
    assert cal.tma_bytes_per_clk == 30.0 and cal.smem_bytes_per_clk == 100.0
    assert (cal.tma_l2_latency_cycles, cal.tma_l2_bytes_per_clk) == (700.0, 50.0)  # the 16 MiB set
    assert machine.sustained_clock_ghz == 1.7 and machine.launch_us == 2.5
    assert machine.time_clock_ghz == 1.7 and H200.time_clock_ghz == H200.clock_ghz


def test_fit_names_what_is_missing():
    rows = [r for r in calibration_rows() if r["bench"] != "handoff"]
    with pytest.raises(Exception, match="mbarrier hand-off"):
        fit(rows, H200)


def test_machine_file_round_trip(tmp_path):
    machine = fit(calibration_rows(), H200)
    doc = machine_to_dict(machine, gpu="NVIDIA H200", measured="2026-12-01T00:00:00Z")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    again = load_machine(str(path))
    assert again.calibration == machine.calibration
    assert (again.name, again.model, again.launch_us) == ("h200", "h200-calibrated", 2.5)
    assert again.notes["gpu"] == "NVIDIA H200"


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="twill-machine/9"), "format must be"),
    (lambda d: d.update(base="a100"), "base must be one of"),
    (lambda d: d.update(launch_us=-1), "launch_us must be a positive number"),
    (lambda d: d.update(sustained_clock_ghz=float("nan")), "sustained_clock_ghz must be a positive number"),
    (lambda d: d["calibration"].update(ex2_per_clk=True), "ex2_per_clk must be a positive number"),
    (lambda d: d["calibration"].update(bogus=1), "unknown field 'bogus'"),
    (lambda d: d["calibration"].pop("fma_per_clk"), "missing field 'fma_per_clk'"),
    (lambda d: d["calibration"]["mma_flops_per_clk"].update(fp16={"x": 1.0}), "not an instruction N"),
])
def test_machine_file_errors(mutate, message):
    doc = machine_to_dict(fit(calibration_rows(), H200))
    mutate(doc)
    with pytest.raises(FormatError, match=message):
        machine_from_dict(doc)


def test_unreadable_machine_files(tmp_path):
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FormatError, match="not UTF-8 text"):
        load_machine(str(binary))
    with pytest.raises(FormatError, match="cannot read machine file"):
        load_machine(str(tmp_path / "missing.json"))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(FormatError):
        load_machine(str(deep))


def test_calibrated_costs_follow_the_measured_rates():
    machine = fit(calibration_rows(), H100)
    cal = machine.calibration
    # MMA: the unit is held for work / best rate; a 4-warp op finishes after work / one-group rate + fill
    m, n, k = 64, 256, 64
    cost = costs.mma_cost(machine, m, n, k, "fp16", warps=4)
    work = 2 * m * n * k
    fill = 600.0 - 2 * 64 * 256 * 64 / 3900.0
    assert cost.cycles == math.ceil(work / 4000.0)
    assert cost.latency == math.ceil(work / 3900.0 + fill)
    wide = costs.mma_cost(machine, 128, n, k, "fp16", warps=8)
    assert wide.latency == math.ceil(2 * 128 * n * k / 4000.0 + fill)
    # exp2: MUFU held for elements / 15, the warp group busy for elements / 12
    e = costs.exp2_cost(machine, 64 * 128)
    assert (e.cycles, e.warp_busy, e.latency) == (math.ceil(8192 / 15), math.ceil(8192 / 12), math.ceil(8192 / 12))
    # reduce: row max/sum rate less the paired FMA
    r = costs.reduce_cost(machine, 64, 128)
    assert r.cycles == math.ceil(8192 / (1 / (1 / 40 - 1 / 120)))
    assert costs.spill_cost(machine, 4096) == 2 * math.ceil(4096 / cal.smem_bytes_per_clk) + 70
    # uncalibrated machines keep the datasheet costs
    assert costs.mma_cost(H100, m, n, k).cycles == work // 4096


def test_plan_covers_every_fitted_quantity():
    benches = {bench for bench, _ in plan()}
    assert benches == {"mma", "elementwise", "smem", "tma", "tma_reduce", "softmax", "attention_iteration",
                       "bwd_iteration", "handoff", "launch", "clock"}
    assert len(plan(quick=True)) < len(plan())


def test_cli_fits_from_raw_and_schedules_with_the_model(tmp_path, capsys):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"format": "twill-calibration-raw/1", "base": "h200", "measured": "x",
                               "software": {"device": "NVIDIA H200"}, "measurements": calibration_rows()}))
    model = tmp_path / "h200.json"
    assert main(["calibrate", "--from-raw", str(raw), "-o", str(model)]) == 0
    assert "h200-calibrated" in capsys.readouterr().out
    assert main(["schedule", "gemm", "--machine", str(model), "--json"]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert main(["schedule", "gemm", "--arch", "h200", "--json"]) == 0
    datasheet = json.loads(capsys.readouterr().out)
    assert calibrated["arch"] == datasheet["arch"] == "h200"
    assert main(["schedule", "gemm", "--arch", "b200", "--machine", str(model)]) == 2
    assert "contradicts" in capsys.readouterr().err


def test_cli_calibrate_errors(tmp_path, capsys):
    assert main(["calibrate", "-o", str(tmp_path / "no" / "x.json")]) == 2
    assert "no directory" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["calibrate", "--from-raw", str(bad), "-o", str(tmp_path / "m.json")]) == 2
    assert "twill-calibration-raw/1" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
    assert main(["schedule", "gemm", "--machine", str(bad)]) == 2
    assert "format must be" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(H200_RAW), reason="no committed H200 calibration")
def test_committed_h200_model_is_the_fit_of_its_raw_data():
    with open(H200_RAW) as fh:
        raw = json.load(fh)
    refit = fit(raw["measurements"], H200)
    committed = load_machine(H200_MODEL)
    assert committed.calibration == refit.calibration
    assert committed.sustained_clock_ghz == refit.sustained_clock_ghz
    with open(H200_CLOCK) as fh:
        clocks = json.load(fh)
    model = fit_clock_model(clocks["rows"], refit)
    assert dict(committed.clock_model) == {**model, "fitted_on": committed.clock_model["fitted_on"]}


def _clock_rows(machine, line=(0.43, 0.37), duties=(0.3, 0.5, 0.7, 0.9), kernel="gemm"):
    """Kernel-clock rows of kernels at ``duties`` whose clocks follow ``1/f = line[0] + line[1] u`` exactly."""
    rate = machine.calibration.mma_rate("fp16", 256)
    rows = []
    for u in duties:
        f = 1 / (line[0] + line[1] * u)
        ms = 1.0
        rows.append({"kernel": kernel, "ms": ms, "clock_ghz": f,
                     "flops": u * ms * 1e-3 * f * 1e9 * machine.sms * rate})
    return rows


def test_clock_model_fit_recovers_the_line_and_sets_the_clock_by_duty():
    from dataclasses import replace

    from twill.machine.calibration import clock_model_from_dict

    machine = fit(calibration_rows(), H200)
    model = fit_clock_model(_clock_rows(machine) + _clock_rows(machine, (0.1, 0.0), kernel="flash-fwd"), machine)
    assert math.isclose(model["ns_per_clk"], 0.43) and math.isclose(model["ns_per_tensor_clk"], 0.37)
    assert "4 gemm kernel runs" in model["fitted_on"]          # the attention rows are not fitted
    clocked = replace(machine, clock_model=clock_model_from_dict(model, "clock model"))
    assert math.isclose(clocked.clock_at(1.0), 1 / 0.80)
    assert clocked.clock_at(0.0) == H200.clock_ghz             # capped at the datasheet clock
    assert clocked.clock_at(0.2) > clocked.clock_at(0.6) > clocked.clock_at(1.0)
    assert machine.clock_at(0.9) == machine.sustained_clock_ghz  # no clock model: one clock
    again = machine_from_dict(machine_to_dict(clocked))
    assert again.clock_model == clocked.clock_model


def test_clock_model_fit_refuses_data_it_cannot_fit():
    machine = fit(calibration_rows(), H200)
    with pytest.raises(TwillError, match="at least 3"):
        fit_clock_model(_clock_rows(machine)[:2], machine)
    with pytest.raises(TwillError, match="duty spans"):
        fit_clock_model(_clock_rows(machine, duties=(0.5, 0.52, 0.55)), machine)
    with pytest.raises(TwillError, match="do not fall"):
        fit_clock_model(_clock_rows(machine, line=(0.6, -0.2)), machine)
    with pytest.raises(TwillError, match="calibrated machine"):
        fit_clock_model(_clock_rows(machine), H200)


def test_clock_model_field_is_validated():
    doc = machine_to_dict(fit(calibration_rows(), H200))
    for bad, message in (({"ns_per_clk": 0.4}, "ns_per_tensor_clk"), ({"ns_per_clk": -1, "ns_per_tensor_clk": 0.3},
                                                                          "ns_per_clk"),
                         ({"ns_per_clk": 0.4, "ns_per_tensor_clk": 0.3, "x": 1}, "unknown field"), (3, "object")):
        with pytest.raises(FormatError, match=message):
            machine_from_dict({**doc, "clock_model": bad})


def test_prediction_runs_a_busier_tensor_core_at_a_lower_clock():
    """With a clock model the same schedule's prediction uses the clock at its tensor-core duty: a shape that
    keeps the tensor core busier (more tiles per wave) runs at a lower clock."""
    from dataclasses import replace

    from twill.kernels import build_kernel
    from twill.machine.calibration import clock_model_from_dict
    from twill.solve import SolveOptions, schedule
    from twill.tune.predict import Shape, predict

    machine = fit(calibration_rows(), H200)
    clocked = replace(machine, clock_model=clock_model_from_dict({"ns_per_clk": 0.43, "ns_per_tensor_clk": 0.37},
                                                                 "clock model"))
    sched = schedule(build_kernel("gemm", clocked, block_m=128, block_n=256, block_k=64), clocked,
                     SolveOptions(streaming_depth=3))
    small, large = (predict(sched, Shape("gemm", s), clocked) for s in ((128, 256, 4096), (8192, 8192, 4096)))
    assert 0 < small.breakdown["tensor_duty"] < large.breakdown["tensor_duty"] <= 1
    assert small.breakdown["clock_ghz"] > large.breakdown["clock_ghz"]
    for p in (small, large):
        assert math.isclose(p.breakdown["clock_ghz"], clocked.clock_at(p.breakdown["tensor_duty"]))
        assert math.isclose(p.seconds, p.cycles / (p.breakdown["clock_ghz"] * 1e9) + clocked.launch_us * 1e-6)
    plain = predict(sched, Shape("gemm", (8192, 8192, 4096)), machine)
    assert plain.breakdown["clock_ghz"] == machine.sustained_clock_ghz


def test_cli_fits_the_clock_model(tmp_path, capsys):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"format": "twill-calibration-raw/1", "base": "h200", "measured": "x",
                               "software": {"device": "NVIDIA H200"}, "measurements": calibration_rows()}))
    clocks = tmp_path / "clock.json"
    clocks.write_text(json.dumps({"format": "twill-kernel-clock/1", "gpu": "NVIDIA H200",
                                  "rows": _clock_rows(fit(calibration_rows(), H200))}))
    model = tmp_path / "h200.json"
    assert main(["calibrate", "--from-raw", str(raw), "--clock-fit", str(clocks), "-o", str(model)]) == 0
    assert "clock model: 1/f = 0.4300 + 0.3700" in capsys.readouterr().out
    assert math.isclose(load_machine(str(model)).clock_model["ns_per_tensor_clk"], 0.37)
    for bad_row in ({"kernel": "gemm"}, {"kernel": "gemm", "ms": "1", "clock_ghz": 1.5, "flops": 1e9},
                    {"kernel": "gemm", "ms": 1.0, "clock_ghz": 0, "flops": 1e9}):
        clocks.write_text(json.dumps({"format": "twill-kernel-clock/1", "rows": [bad_row]}))
        assert main(["calibrate", "--from-raw", str(raw), "--clock-fit", str(clocks),
                     "-o", str(tmp_path / "m.json")]) == 2
        err = capsys.readouterr().err
        assert "twill-kernel-clock/1" in err and "Traceback" not in err
        assert not (tmp_path / "m.json").exists()


@pytest.mark.skipif(not os.path.exists(H200_MODEL), reason="no committed H200 calibration")
def test_docs_show_the_committed_model_table():
    from twill.machine.calibration import format_calibration

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "calibration.md")) as fh:
        doc = fh.read()
    shown = doc.split("<!-- calibration-table:begin -->\n")[1].split("<!-- calibration-table:end -->")[0]
    assert shown.strip() == format_calibration(load_machine(H200_MODEL)).strip()


def _table(*command: str) -> str:
    """What a benchmark's table command prints (run as documented, from the repository root; no GPU, no torch)."""
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sweep_summary_scores_the_model_and_the_measure_picks_against_the_fastest(tmp_path):
    """One shape of a --sweep report: the model ranks a 2-deep kernel first, its 3-deep twin (same tiling)
    measures fastest; --measure 3 takes one kernel per tiling, so it misses the twin."""
    shape = {"B": 1, "H": 1, "S": 2048, "D": 128}

    def row(name, tiling, predicted, ms):
        return {"name": name, "options": {"subtiles": tiling}, "shape": shape, "predicted_us": predicted,
                "ms": ms, "measured_over_predicted": ms * 1e3 / predicted, "tflops": 1.0 / ms}

    rows = [row("a_d2", 2, 100.0, 0.110), row("a_d3", 2, 100.0, 0.100), row("b", 3, 105.0, 0.120),
            row("c", 1, 130.0, 0.150)]
    report = tmp_path / "sweep.json"
    report.write_text(json.dumps({"rows": rows, "correlations": [{"shape": shape, "spearman": 0.8}],
                                  "references": [{"shape": shape, "cudnn_ms": 0.105, "flash_ms": 0.2}]}))
    line = _table("benchmarks/model_fidelity.py", "sweep-summary", str(report)).strip().splitlines()[-1]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["B=1,H=1,S=2048,D=128", "4", "3"]       # c is 1.15 over: outside ±15% by a hair
    assert cells[4] == "0.80" and cells[5] == "0.909" and cells[6] == "0.909"
    assert cells[7].startswith("`a_d3`") and cells[8] == "1.050x cudnn"


def _measured_table(name: str) -> str:
    from twill.tune.measure import format_measured

    with open(os.path.join(RESULTS, name)) as fh:
        return format_measured(json.load(fh)["measured"])


R = "benchmarks/results/"
#: (marker in docs/performance.md, what the doc shows there: the documented table command's output)
PERFORMANCE_TABLES = [
    ("fidelity-summary", lambda: _table("benchmarks/model_fidelity.py", "summary", R + "model_fidelity_h200.json")),
    ("fidelity-heldout", lambda: _table("benchmarks/model_fidelity.py", "summary",
                                        R + "model_fidelity_h200_heldout.json")),
    ("fidelity-sweep", lambda: _table("benchmarks/model_fidelity.py", "sweep-summary",
                                      R + "model_fidelity_sweep_h200.json")),
    ("triton-tune-table", lambda: "\n".join(      # the table, without its caption
        _table("benchmarks/triton_tune.py", "table", R + "triton_tune_h200.json").splitlines()[2:])),
    ("pallas-table", lambda: _table("benchmarks/pallas_bench.py", "table", R + "pallas_bench_h200.json")),
    ("pallas-same-tile", lambda: _table("benchmarks/pallas_bench.py", "table", R + "pallas_bench_h200_same_tile.json")),
    ("tilelang-table", lambda: _table("benchmarks/tilelang_bench.py", "table", R + "tilelang_bench_h200.json")),
    ("flash-bwd-table", lambda: _table("benchmarks/flash_bwd_check.py", "table", R + "flash_bwd_h200.json")),
    ("persistent-gemm-table", lambda: _table("benchmarks/persistent_gemm.py", "--table",
                                             R + "persistent_gemm_h200.json")),
    ("tune-table", lambda: _table("benchmarks/tune_bench.py", "table", R + "tune_bench_h200.json")),
    ("tune-repredict-table", lambda: _table("benchmarks/tune_bench.py", "repredict-table",
                                            R + "tune_bench_h200_repredicted.json")),
    ("sub3-table", lambda: _table("benchmarks/gluon_bench.py", "table", R + "gluon_bench_h200_sub3.json")),
    ("persistent-attention-table", lambda: _table("benchmarks/gluon_bench.py", "table",
                                                  R + "gluon_bench_h200_persistent.json")),
    ("fence-table", lambda: _table("benchmarks/gluon_bench.py", "ab-table", R + "gluon_bench_h200_fence.json")),
    ("d256-op-table", lambda: _table("benchmarks/gluon_bench.py", "table", R + "gluon_bench_h200_d256_op.json")),
    ("bwd-predicted-table", lambda: _table("benchmarks/flash_bwd_check.py", "prediction-table",
                                           R + "flash_bwd_h200_predicted.json")),
    ("causal-order-table", lambda: "with the chunked order:\n" + _table(
        "benchmarks/flash_bwd_check.py", "table", R + "flash_bwd_h200_causal_order.json", "--part", "variant")
        + "main:\n" + _table("benchmarks/flash_bwd_check.py", "table", R + "flash_bwd_h200_causal_order.json",
                              "--part", "base")),
    ("ptxas-search-table", lambda: _table("benchmarks/flash_bwd_check.py", "table", R + "flash_bwd_h200_d64_ptxas.json")),
    ("tune-bwd-measure-table", lambda: _measured_table("tune_flash_bwd_h200_measure.json")),
]


def test_every_performance_table_is_checked():
    with open(os.path.join(ROOT, "docs", "performance.md")) as fh:
        markers = re.findall(r"<!-- ([\w-]+):begin -->", fh.read())
    assert sorted(markers) == sorted(marker for marker, _ in PERFORMANCE_TABLES)


@pytest.mark.parametrize("marker,render", PERFORMANCE_TABLES, ids=[t[0] for t in PERFORMANCE_TABLES])
def test_performance_doc_shows_the_committed_results(marker, render):
    """Each measured table in docs/performance.md is what its benchmark's table command prints from the
    committed JSON."""
    with open(os.path.join(ROOT, "docs", "performance.md")) as fh:
        doc = fh.read()
    shown = doc.split(f"<!-- {marker}:begin -->\n")[1].split(f"<!-- {marker}:end -->")[0]
    shown = shown.removeprefix("```text\n").removesuffix("```\n")
    assert shown.strip() == render().strip()


def test_one_sms_intake_is_the_best_hot_mib_rate_and_optional():
    """``tma_sm_bytes_per_clk`` is the best rate over the ring depths of every SM reading one hot MiB; raw
    files without those rows fit without it, and machine files without it load."""
    machine = fit(calibration_rows() + [{"bench": "tma", "args": {"depth": 8, "hot_mb": 1},
                              "result": {"depth": 8, "hot_mb": 1, "bytes_per_clk": 86.0}},
                             {"bench": "tma", "args": {"depth": 1, "hot_mb": 1},
                              "result": {"depth": 1, "hot_mb": 1, "bytes_per_clk": 300.0}}], H200)
    assert machine.calibration.tma_sm_bytes_per_clk == 86.0      # depth 1 is a latency row, not a rate
    assert machine_from_dict(machine_to_dict(machine)).calibration == machine.calibration
    without = fit([r for r in calibration_rows() if r["args"].get("hot_mb") != 1], H200)
    assert without.calibration.tma_sm_bytes_per_clk is None
    assert "tma_sm_bytes_per_clk" not in machine_to_dict(without)["calibration"]
    assert machine_from_dict(machine_to_dict(without)).calibration == without.calibration


def test_reduce_add_rate_is_optional_and_prices_the_dq_reduce_when_measured():
    """Machine files without the TMA reduce-add rate still load and price a reduce-add as a store; with it,
    the fit takes the shared-rows, one-in-flight measurement and the reduce costs bytes over that rate."""
    from twill.machine.calibrate import SHARED_DQ

    without = fit(calibration_rows(), H200)
    assert without.calibration.tma_reduce_bytes_per_clk is None
    doc = machine_to_dict(without)
    assert "tma_reduce_bytes_per_clk" not in doc["calibration"]
    assert machine_from_dict(doc).calibration == without.calibration
    assert costs.tma_reduce_cost(without, 16384) == costs.tma_store_cost(without, 16384)
    measured = [{"bench": "tma_reduce", "args": {"block_n": 64, "share": SHARED_DQ, "depth": d},
                 "result": {"bytes_per_clk": rate}} for d, rate in ((1, 16.0), (2, 40.0))]
    measured.append({"bench": "tma_reduce", "args": {"block_n": 64, "share": 1}, "result": {"bytes_per_clk": 5.0}})
    machine = fit(calibration_rows() + measured, H200)
    assert machine.calibration.tma_reduce_bytes_per_clk == 16.0
    cost = costs.tma_reduce_cost(machine, 16384)
    assert (cost.cycles, cost.uses, cost.latency) == (1024, {"tma": 1}, 1024)
    assert machine_from_dict(machine_to_dict(machine)).calibration == machine.calibration


def test_softmax_steps_are_optional_and_keyed_by_groups_keys_and_head_dim():
    """The fit keeps the steps measured with O += P V in flight (not the ones without), keyed
    groups x keys x head dimension; files without them load; a malformed key is one clear error."""
    without = fit(calibration_rows(), H200)
    assert without.calibration.softmax_step_cycles is None
    assert "softmax_step_cycles" not in machine_to_dict(without)["calibration"]
    measured = [{"bench": "softmax", "args": {"groups": g, "block_n": 128, "head_dim": 64, "pv": pv},
                 "result": {"groups": g, "block_n": 128, "head_dim": 64, "pv": pv, "cycles_per_step": c}}
                for g, pv, c in ((1, True, 900.0), (1, False, 800.0), (2, True, 1500.0), (2, False, 1100.0))]
    machine = fit(calibration_rows() + measured, H200)
    assert dict(machine.calibration.softmax_step_cycles) == {"1x128x64": 900.0, "2x128x64": 1500.0}
    doc = machine_to_dict(machine)
    assert machine_from_dict(doc).calibration == machine.calibration
    doc["calibration"]["softmax_step_cycles"] = {"2x128": 1500.0}
    with pytest.raises(FormatError, match="softmax_step_cycles: key '2x128' is not groups x keys x head"):
        machine_from_dict(doc)


def test_committed_calibration_measured_the_kernels_softmax_steps():
    """The committed H200 model has a softmax step for every forward tile ``twill tune`` sweeps (the plan's
    ``SOFTMAX_STEPS``: 1-3 groups with 64- and 128-key tiles at D = 64/128, D = 256 with 64-key tiles), and
    the step with more groups contending is slower than with fewer (the effect the chain bound prices)."""
    from twill.machine.calibrate import SOFTMAX_STEPS
    from twill.tune.space import kernel_space

    steps = load_machine(os.path.join(RESULTS, "calibration_h200.machine.json")).calibration.softmax_step_cycles
    assert set(steps) == {softmax_key(*s) for s in SOFTMAX_STEPS}
    for head_dim in (64, 128, 256):
        for c in kernel_space("flash-fwd", H200, {"head_dim": (head_dim,)}).candidates:
            o = dict(c.options)
            assert softmax_key(o["subtiles"], o["block_n"], head_dim) in steps, o
    for g, n, d in SOFTMAX_STEPS:
        if g > 1:
            assert steps[softmax_key(g, n, d)] > steps[softmax_key(g - 1, n, d)]


def test_readme_persistent_gemm_row_shows_the_committed_result():
    """The README's persistent-GEMM row is benchmarks/results/persistent_gemm_h200.json's fp16 K = 1024 row."""
    with open(os.path.join(RESULTS, "persistent_gemm_h200.json")) as fh:
        rows = json.load(fh)["rows"]
    r = next(r for r in rows if r["dtype"] == "fp16" and r["shape"] == [8192, 8192, 1024])
    name = "gemm_128x256x64_lag1_d3_persistent"
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as fh:
        readme = fh.read()
    row = (f"| 8192×8192×1024 | {r['tflops'][name]:.0f} | cuBLAS {r['tflops']['cublas']:.0f} | "
           f"{r['vs_cublas'][name]:.2f}× |")
    assert row in readme, row


def test_readme_persistent_attention_rows_show_the_committed_results():
    """The README's persistent causal attention rows are the fenced kernel's of
    benchmarks/results/gluon_bench_h200_fence.json (the P V wait fence, docs/performance.md)."""
    with open(os.path.join(RESULTS, "gluon_bench_h200_fence.json")) as fh:
        result = json.load(fh)["variant"]
    kernel = next(k for k in result["kernels"] if k["name"] == "fa_causal_d128_sub2_solver_d2_persistent")
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as fh:
        readme = fh.read()
    for t in (t for t in kernel["timings"] if t["S"] in (2048, 4096)):
        row = f"| S={t['S']} | {t['tflops']:.0f} | cuDNN {t['cudnn_tflops']:.0f} | {t['ratio_vs_cudnn']:.2f}× |"
        assert row in readme, row


def test_readme_tuned_rows_show_the_committed_results():
    """The README's tuned GEMM and attention rows are benchmarks/results/tune_bench_h200.json's: the tuned
    kernel's TFLOP/s, the best reference's and their ratio, at the shape each row names."""
    with open(os.path.join(RESULTS, "tune_bench_h200.json")) as fh:
        results = {r["name"]: r for r in json.load(fh)["results"]}
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as fh:
        readme = fh.read()
    names = {"cublas": "cuBLAS", "cudnn": "cuDNN", "fa2": "PyTorch flash"}
    for name, size in (("gemm_fp16_8192x8192x8192", "8192³"), ("gemm_fp16_4096x4096x4096", "4096³"),
                       ("flash-fwd_fp16_4x32x16384x128", "S=16384"), ("flash-fwd_fp16_4x32x4096x128", "S=4096"),
                       ("flash-fwd_fp16_4x32x16384x64", "S=16384"), ("flash-fwd_fp16_4x32x2048x64", "S=2048")):
        r = results[name]
        ref = names.get(r["best_reference"], "Pallas `attention_mgpu`")
        row = f"| {size} | {r['tuned_tflops']:.0f} | {ref} {r['best_reference_tflops']:.0f} | {r['ratio']:.2f}× |"
        assert row in readme, row


def test_readme_backward_rows_show_the_committed_results():
    """The README's attention-backward rows are the committed measurement (benchmarks/results/flash_bwd_h200.json):
    TFLOP/s of the generated kernel and of cuDNN, and their ratio, at the S each row names."""
    with open(os.path.join(RESULTS, "flash_bwd_h200.json")) as fh:
        variants = {v["name"]: v for v in json.load(fh)["variants"]}
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as fh:
        readme = fh.read()
    with open(os.path.join(RESULTS, "flash_bwd_h200_causal_order.json")) as fh:   # the causal launch order
        causal = {v["name"]: v for v in json.load(fh)["variant"]["variants"]}
    with open(os.path.join(RESULTS, "flash_bwd_h200_d64_ptxas.json")) as fh:   # FA3's 128-row tile at D = 64
        fa3_tile = {v["name"]: v for v in json.load(fh)["variants"]}
    for source, name, seq in ((variants, "bwd_d128_solver", 8192), (variants, "bwd_d128_solver", 4096),
                              (causal, "bwd_d128_causal_solver", 8192), (causal, "bwd_d128_causal_gqa4_solver", 8192),
                              (fa3_tile, "bwd_d64_bm128_ptxas", 8192)):
        t = next(t for t in source[name]["timings"] if t["S"] == seq)
        row = (f"| S={seq} | {t['twill_bwd_tflops']:.0f} | cuDNN {t['cudnn_bwd_tflops']:.0f} | "
               f"{t['ratio_bwd_vs_cudnn']:.2f}× |")
        assert row in readme, row


def test_readme_d256_row_shows_the_committed_result():
    """The README's D = 256 causal forward row is the op's kernel (the persistent two-copy schedule) in
    benchmarks/results/gluon_bench_h200_d256_op.json."""
    with open(os.path.join(RESULTS, "gluon_bench_h200_d256_op.json")) as fh:
        kernels = {k["name"]: k for k in json.load(fh)["kernels"]}
    t = next(t for t in kernels["fa_causal_d256_bn64_sub2_solver_copies2_d2_persistent"]["timings"] if t["S"] == 8192)
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as fh:
        readme = fh.read()
    row = f"| S=8192 | {t['tflops']:.0f} | cuDNN {t['cudnn_tflops']:.0f} | {t['ratio_vs_cudnn']:.2f}× |"
    assert row in readme, row


def test_attention_iterations_are_fitted_keyed_and_left_out_of_the_prediction():
    """The attention-iteration measurements are kept per groups x keys x head dimension, round-trip through
    the machine file, and do not change the prediction (a diagnostic: docs/calibration.md)."""
    from graphs import ping_pong_attention
    from twill.tune.predict import chain_bound

    key = {"groups": 2, "block_n": 128, "head_dim": 64}
    steps = [{"bench": "softmax", "args": {**key, "pv": True},
              "result": {**key, "pv": True, "cycles_per_step": 1500.0}}]
    measured = [{"bench": "attention_iteration", "args": key, "result": {**key, "cycles_per_iteration": 2600.0}}]
    plain, machine = fit(calibration_rows() + steps, H200), fit(calibration_rows() + steps + measured, H200)
    assert plain.calibration.attention_iteration_cycles is None
    assert dict(machine.calibration.attention_iteration_cycles) == {"2x128x64": 2600.0}
    assert machine_from_dict(machine_to_dict(machine)).calibration == machine.calibration
    schedule = ping_pong_attention()
    assert chain_bound(schedule, machine) == chain_bound(schedule, plain) != {}


def test_attention_iteration_microbenchmark_compiles_with_turns_and_both_mmas():
    """The microbenchmark's kernel compiles for sm_90 (no GPU): per warp group one S = Q K^T before the timed
    loop and S = Q K^T plus O += P V inside it, wgmma waits of depth 1 and 0 as the generated loop, and the
    turn wait only when groups take turns."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from twill.codegen.gluon.aot import ptx_facts
    from twill.machine import microbench

    signature = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "out_ptr": "*fp32", "stats_ptr": "*i64",
                 "reps": "i32", "GROUPS": "constexpr", "BLOCK_N": "constexpr", "HEAD_DIM": "constexpr",
                 "WORKER_REGS": "constexpr"}
    for groups, block_n, head_dim in ((1, 64, 64), (2, 128, 64)):
        src = GluonASTSource(microbench._iteration_kernel, signature,
                             constexprs={"GROUPS": groups, "BLOCK_N": block_n, "HEAD_DIM": head_dim,
                                         "WORKER_REGS": microbench._worker_regs(groups)},
                             attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
        facts = ptx_facts(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}))
        per_mma = head_dim // 16   # k16 instructions of Q K^T; O += P V has block_n // 16
        assert facts.wgmma == groups * (2 * per_mma + block_n // 16)
        assert facts.wait_depths == (0, 1)
        assert facts.mbarrier_waits == groups * (2 + (groups > 1))  # K and V ready, and the turn


def test_clock_sampler_keeps_every_reading_of_a_long_run(tmp_path, monkeypatch):
    """nvidia-smi's readings go to a file while the block runs: through an unread pipe, the sampler lost
    every reading after the first 64 KB (about 80 s at 20 readings a second), so the later shapes of a long
    benchmark had no clock. A stand-in nvidia-smi writes 6000 readings (about 170 KB) at once."""
    from twill.machine.microbench import ClockSampler

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!" + sys.executable + "\n"
                    "import signal, sys, time\n"
                    "signal.signal(signal.SIGINT, lambda *a: sys.exit(0))\n"
                    "for i in range(6000):\n"
                    "    print(f'2026/12/02 04:{i // 600 % 60:02d}:{i // 10 % 60:02d}.{i % 10}00, {1000 + i % 900}')\n"
                    "sys.stdout.flush()\n"
                    f"open({str(tmp_path / 'written')!r}, 'w').close()\n"
                    "time.sleep(60)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with ClockSampler() as sampler:
        deadline = time.time() + 20
        while time.time() < deadline and not (tmp_path / "written").exists():
            time.sleep(0.05)
    assert len(sampler.samples) == 6000
    assert sampler.samples[-1][1] == 1000 + 5999 % 900


def test_backward_predict_refuses_unknown_sources_with_one_line(tmp_path, capsys):
    """``flash_bwd_check.py predict`` checks its inputs before solving anything: a missing results file or an
    unknown suffix is one error line and a non-zero exit."""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "flash_bwd_check.py")
    missing = subprocess.run([sys.executable, script, "predict", str(tmp_path / "none.json"), "--out",
                              str(tmp_path / "p.json")], capture_output=True, text=True)
    assert missing.returncode != 0 and missing.stderr.strip().splitlines() == [
        f"error: not found: {tmp_path / 'none.json'}"]
    good = os.path.join(RESULTS, "flash_bwd_h200.json")
    suffix = subprocess.run([sys.executable, script, "predict", good + "#causal", "--out", str(tmp_path / "p.json")],
                            capture_output=True, text=True)
    assert suffix.returncode != 0 and suffix.stderr.strip().splitlines()[-1].endswith("the only suffix is '#full'")
    assert not (tmp_path / "p.json").exists()


def test_backward_iterations_are_fitted_keyed_and_bound_the_backward():
    """The attention-backward iteration is kept per query rows x keys x head dimension, round-trips through the
    machine file, and bounds a flash-bwd loop of a measured tile from below (``chain_bound``); a tile it did
    not measure, or a forward, gets no bound from it."""
    from twill.kernels.flash_bwd.variants import flash_bwd_schedule
    from twill.kernels import build_kernel
    from twill.tune.predict import Shape, chain_bound, predict

    key = {"block_m": 64, "head_dim": 64}
    measured = [{"bench": "bwd_iteration", "args": key,
                 "result": {**key, "block_n": 128, "cycles_per_iteration": 30000.0}}]
    plain, machine = fit(calibration_rows(), H200), fit(calibration_rows() + measured, H200)
    assert plain.calibration.backward_iteration_cycles is None
    assert dict(machine.calibration.backward_iteration_cycles) == {"64x128x64": 30000.0}
    assert machine_from_dict(machine_to_dict(machine)).calibration == machine.calibration
    d64 = flash_bwd_schedule(build_kernel("flash-bwd", H200, head_dim=64), H200)
    d128 = flash_bwd_schedule(build_kernel("flash-bwd", H200, head_dim=128), H200)
    assert chain_bound(d64, machine) == {"chain_ii": 30000.0}
    assert chain_bound(d128, machine) == chain_bound(d64, plain) == {}
    shape = Shape("attention", (2, 8, 4096, 64))
    bound, free = predict(d64, shape, machine), predict(d64, shape, plain)
    iterations = 4096 // 64
    assert bound.seconds > free.seconds
    # every iteration of every CTA runs at least at the measured pace (at the machine's clock)
    assert bound.seconds * machine.clock_at(0.0) * 1e9 * machine.sms >= 0.9 * 30000.0 * iterations * (
        2 * 8 * 4096 // 128)


@pytest.mark.slow
def test_backward_iteration_microbenchmark_compiles_without_spills():
    """The backward-iteration microbenchmark compiles for sm_90 (no GPU) for every tile ``twill calibrate``
    measures: five GEMMs per iteration (S^T, dP^T with K = head dim; dV, dK with K = query rows; dQ with K =
    128 keys), wgmma waits of depth 1 and 0 as the generated loop, the four ring waits, and no spill (a spill
    would time something the kernel does not do; with loop-invariant Q/dO operands ptxas hoisted their wgmma
    descriptors out of the loop and spilled)."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from twill.codegen.gluon.aot import ptx_facts
    from twill.machine import microbench
    from twill.machine.calibrate import BACKWARD_ITERATIONS
    from twill.tune.spills import ptxas_report

    signature = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "do_ptr": "*fp16", "rows_ptr": "*fp32",
                 "out_ptr": "*fp32", "stats_ptr": "*i64", "reps": "i32", "qk_scale": "fp32", "BLOCK_M": "constexpr",
                 "BLOCK_N": "constexpr", "HEAD_DIM": "constexpr", "DQ_WARPS_M": "constexpr"}
    for block_m, head_dim in BACKWARD_ITERATIONS:
        src = GluonASTSource(microbench._bwd_iteration_kernel, signature,
                             constexprs={"BLOCK_M": block_m, "BLOCK_N": 128, "HEAD_DIM": head_dim,
                                         "DQ_WARPS_M": min(8, block_m // 16)},
                             attrs={(i,): [["tt.divisibility", 16]] for i in range(7)})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        facts = ptx_facts(compiled)
        assert facts.wgmma == 2 * head_dim // 16 + 2 * block_m // 16 + 128 // 16
        assert facts.wait_depths == (0, 1) and facts.mbarrier_waits == 4
        assert ptxas_report(compiled.asm["ptx"], 90)["spill_bytes"] == 0, (block_m, head_dim)


def test_fp8_wgmma_microbenchmark_compiles_to_the_e4m3_wgmma():
    """``twill calibrate`` measures the ``fp8`` rate of the machine tables with e4m3 operands: the wgmma
    microbenchmark compiles for sm_90 (no GPU) to ``m64nNk32`` e4m3 x e4m3 wgmmas (B read K-major), and the fit
    files the measurement under ``fp8``, the rate that prices ``flash-fwd --dtype fp8e4m3``."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from twill.machine import microbench

    assert ("mma", {"n": 128, "dtype": "fp8", "groups": 2, "lag": 1}) in plan()
    signature = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "out_ptr": "*fp32", "stats_ptr": "*i64", "reps": "i32",
                 "GROUPS": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "LAG": "constexpr",
                 "WORKER_REGS": "constexpr"}
    for groups, n in ((1, 64), (2, 256)):
        src = GluonASTSource(microbench._mma_kernel, signature,
                             constexprs={"GROUPS": groups, "BLOCK_N": n, "BLOCK_K": 64, "LAG": 1,
                                         "WORKER_REGS": microbench._worker_regs(groups)},
                             attrs={(i,): [["tt.divisibility", 16]] for i in range(4)})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        assert set(re.findall(r"wgmma\.mma_async\.\S+", ptx)) == {
            f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3"}
    rows = calibration_rows() + [
        {"bench": "mma", "args": {"n": n, "dtype": "fp8", "groups": g, "lag": 1},
         "result": {"n": n, "dtype": "fp8", "groups": g, "lag": 1, "flops_per_clk": 7000.0 + g}}
        for n in (64, 128, 256) for g in (1, 2)]
    machine = fit(rows, H200)
    assert machine.calibration.mma_rate("fp8", 128) == 7002.0
    assert costs.mma_cost(machine, 64, 128, 128, "fp8e4m3").cycles == math.ceil(2 * 64 * 128 * 128 / 7002.0)
