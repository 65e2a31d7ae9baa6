"""The benchmark harnesses' own checks: their text probes still apply to what the generator emits, their
argument checks, and their timing and table plumbing with the GPU steps replaced. Kept beside the harnesses
(the library's tests in ``tests/`` import nothing from ``benchmarks/``); ``pytest`` collects both folders."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:      # the harnesses import each other as ``benchmarks.*``, as when run as scripts
    sys.path.insert(0, str(ROOT))
GOLDEN = ROOT / "tests" / "golden"

from twill.errors import VerificationError  # noqa: E402
from twill.tune.space import kernel_space  # noqa: E402


def _benchmark(name):
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_triton_tune_prepare_keeps_schedules_of_configs_that_do_not_spill(tmp_path, monkeypatch):
    pytest.importorskip("triton", reason="Triton is needed to compile the kernels")
    bench = _benchmark("triton_tune")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    configs = [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
               {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}]
    out = tmp_path / "schedules.json"
    bench.prepare({"matmul": ("matmul", "matmul_kernel", configs, [(4096, 4096, 4096), (8192, 8192, 1024)])},
                  out, bench.MACHINE.relative_to(bench.ROOT), time_limit=60.0, workers=1, keep=False)
    case = json.loads(out.read_text())["cases"]["matmul"]
    ok, spilled = case["configs"]
    assert ok["status"] == "ok" and ok["schedule"]["format"].startswith("twill-schedule/")
    assert spilled["status"] == "spills" and spilled["schedule"] is None and spilled["spills"]["spill_bytes"] > 0
    assert set(case["ranking"]) == {"M=4096,N=4096,K=4096", "M=8192,N=8192,K=1024"}
    for ranking in case["ranking"].values():         # only the configuration with a schedule is ranked
        assert [r["config"] for r in ranking] == [0] and ranking[0]["predicted_us"] > 0
    schedule = bench._load_schedule(ok["schedule"])
    assert schedule.graph.attrs["block_m"] == 128 and not schedule.assignment


@pytest.mark.parametrize("name", ["fa_d128_sub2_ahead1_d2", "fa_d128_sub2_ahead1_d2_causal"])
def test_attention_probes_still_apply_to_the_emitted_forward(name, tmp_path):
    """benchmarks/attention_probe.py and attention_phases.py edit emitted modules by exact text; every forward
    probe and the phase counters must still find their text in what the generator emits today (a probe that
    stops matching exits with its name rather than timing an unchanged kernel)."""
    from benchmarks.attention_phases import PHASES, instrument
    from benchmarks.attention_probe import PROBES, apply

    text = (GOLDEN / f"{name}.py.golden").read_text()
    for probe, (kernel, _) in PROBES.items():
        if kernel == "flash-fwd":
            assert apply(text, probe) != text, probe
    # the producer without its loads (after the first fill) is still a kernel: it compiles for sm_90
    from twill.codegen.gluon import aot, load_emitted

    probed = tmp_path / f"{name}_no_loads.py"
    probed.write_text(apply(text, "no-loads"))
    facts = aot.ptx_facts(aot.compile_sm90(load_emitted(str(probed), f"twill_probe_{name}")))
    assert facts.wgmma > 0 and facts.tma_loads > 0 and "mbarrier.arrive(k_ready.index(buffer))" in probed.read_text()
    counted = instrument(text)
    assert counted.count("_clock64(j)") == 7
    assert all(f"_acc{i} += " in counted for i in range(len(PHASES)))
    assert counted.count("gl.store(lse_ptr + _base + ") == len(PHASES) + 3  # phases, iterations, span
    assert counted.count("_globaltimer(n_tiles)") == 2


def test_the_backward_phase_probe_still_applies_and_compiles(tmp_path):
    """benchmarks/bwd_phases.py edits the emitted backward by exact text: the probe argument reaches the kernel,
    its compute partition and the launcher; a mark opens every phase (at each wait and partition barrier) of
    the main loop and closes the last, and the instrumented kernel still compiles for sm_90."""
    from benchmarks.bwd_phases import PHASE_START, instrument
    from twill.codegen.gluon import aot, load_emitted

    text = (GOLDEN / "fa_bwd_d128_d2_lag1.py.golden").read_text()
    counted, labels = instrument(text)
    loop = text.split("    for j in range(0, n_iters):\n")[1].split("\n    # dK = sm_scale")[0]
    first = loop.splitlines()[0]
    starts = [line.strip() for line in loop.splitlines() if PHASE_START.match(line)]
    assert labels == ([] if PHASE_START.match(first) else [first.strip()]) + starts and len(labels) > 5
    assert counted.count("_clock32(j))") == len(labels) + 1
    assert "probe_ptr):" in counted and "H // kv_shape[1], _PROBE)" in counted
    path = tmp_path / "bwd_probe.py"
    path.write_text(counted)
    facts = aot.ptx_facts(aot.compile_sm90(load_emitted(str(path), "twill_bwd_probe")))
    assert facts.wgmma > 0


@pytest.mark.parametrize("name", ["gemm_128x256x64_lag1_d4", "gemm_128x256x64_lag1_d4_persistent",
                                  "fa_d128_sub2_ahead1_d2", "fa_d64_sub3_ahead0_d2"])
def test_kernel_clock_probe_still_applies_to_the_emitted_kernels(name):
    """benchmarks/kernel_clock.py edits an emitted module by exact text: the kernel function gains the span
    buffer, reads the counters at its start and end, and the launcher passes the buffer."""
    from benchmarks.kernel_clock import instrument

    text = (GOLDEN / f"{name}.py.golden").read_text()
    counted = instrument(text)
    compile(counted, name, "exec")
    kernel = re.search(r"^KERNEL_FN = (\w+)$", text, flags=re.M).group(1)
    assert re.search(rf"^def {kernel}\(.*, clk_ptr\):$", counted, flags=re.M)
    assert counted.count("_clock64(gl.program_id(0))") == 2 and counted.count("_globaltimer(gl.program_id(0))") == 2
    # the launch passes the buffer: a keyword of kernel[grid](...), the last argument of the attention's _launch
    assert counted.count("clk_ptr=_CLK[0], num_warps=NUM_WARPS)") + counted.count(", _CLK[0])") == 1
    # the end reads come after the kernel's last statement and before the next top-level definition
    body = counted[counted.index(f"def {kernel}("):]
    body = body[:re.search(r"\n(?=\S)", body).start()]
    assert body.rstrip().endswith("(_g1 - _g0).to(gl.float32))")


def test_main_loops_of_sass_are_the_conditional_back_edges_around_a_wgmma():
    """benchmarks/loop_instructions.py counts a compute warp's main loop: a loop closed by a conditional
    backward branch that holds an HGMMA; mbarrier spin loops (no HGMMA) and the unconditional retry branches
    from the end of the function do not count."""
    from benchmarks.loop_instructions import main_loops

    sass = """
.L_x_1:
        /*0100*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ ;
.L_x_2:
        /*0110*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R3 ;
        /*0120*/              @!P0 BRA `(.L_x_2) ;
        /*0130*/                   FMUL R4, R4, R5 ;
        /*0140*/               @P1 BRA `(.L_x_1) ;
        /*0150*/                   EXIT ;
        /*0160*/                   BRA `(.L_x_1) ;
"""
    assert main_loops(sass) == [5]


def test_gluon_bench_records_the_clock_of_every_timing():
    """benchmarks/gluon_bench.py run samples the SM clock throughout and gives every kernel timing and reference
    row the median clock of the window it ran in (None where nvidia-smi read nothing); the text table shows it."""
    from benchmarks.gluon_bench import attach_clocks, table

    class Sampler:
        def median_ghz(self, start, end):
            return {(0.0, 1.0): 1.75, (1.0, 2.0): 1.5}.get((start, end))

    result = {"versions": {"gpu": "GPU", "torch": "t", "triton": "3.6.0"}, "attention_references": {
                  "fp16_d128": {2048: {"cudnn": 500.0, "window": [1.0, 2.0]}}},
              "kernels": [{"name": "fa", "kernel": "flash-fwd", "checks": [{"relerr": 1e-4}],
                           "timings": [{"S": 2048, "tflops": 450.0, "window": [0.0, 1.0]},
                                       {"S": 4096, "tflops": 470.0, "window": [5.0, 6.0]}]}]}
    attach_clocks(result, Sampler())
    first, second = result["kernels"][0]["timings"]
    assert (first["clock_ghz"], second["clock_ghz"]) == (1.75, None) and "window" not in first
    assert result["attention_references"]["fp16_d128"][2048] == {"cudnn": 500.0, "clock_ghz": 1.5}
    assert "1.75 GHz" in table(result).splitlines()[1]


def test_gluon_bench_run_wires_kernels_references_clocks_and_ratios(tmp_path, monkeypatch):
    """``run`` on the CPU with the GPU steps replaced: it times the kernels and the references inside one clock
    sampler, attaches the clocks and the ratios, and writes gluon_bench.json."""
    import json

    from benchmarks import gluon_bench
    from twill.machine import microbench

    class Sampler:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def median_ghz(self, start, end):
            return 1.6

    def kernels(result, manifest, kernel_dir, seqs, gemm_sizes, rounds):
        result["kernels"] = [{**m, "checks": [{"relerr": 1e-4}],
                              "timings": [{"S": s, "tflops": 400.0, "window": [0.0, 1.0]} for s in seqs]}
                             for m in manifest]

    monkeypatch.setattr(microbench, "ClockSampler", Sampler)
    monkeypatch.setattr(gluon_bench, "_run_kernels", kernels)
    monkeypatch.setattr(gluon_bench, "attention_references",
                        lambda case, seqs: {s: {"cudnn": 500.0, "window": [0.0, 1.0]} for s in seqs})
    monkeypatch.setattr(gluon_bench, "_versions", lambda: {"gpu": "GPU", "torch": "t", "triton": "3.6.0"})
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "manifest.json").write_text(json.dumps(
        [{"name": "fa_x", "file": "fa_x.py", "kernel": "flash-fwd", "options": {"head_dim": 128}}]))
    gluon_bench.run(str(tmp_path / "k"), str(tmp_path / "out"), quick=True)
    doc = json.loads((tmp_path / "out" / "gluon_bench.json").read_text())
    timing = doc["kernels"][0]["timings"][0]
    assert timing["clock_ghz"] == 1.6 and timing["ratio_vs_cudnn"] == pytest.approx(0.8)
    assert doc["attention_references"]["fp16_d128"]["2048"]["clock_ghz"] == 1.6


def test_an_interleaved_timing_keeps_the_ratios_of_its_own_rounds(monkeypatch):
    """``gluon_bench.py run --rounds N``: the kernel and SDPA's cuDNN and FA2 are timed in the same rounds; a
    backend that refuses the shape is left out; the ratios come from those rounds and survive the references
    timed apart for the table."""
    from benchmarks import _common, gluon_bench

    seen = {}

    def event_times(fns, calls, rounds):
        seen.update(names=sorted(fns), calls=calls, rounds=rounds)
        ms = {"twill": 2.0, "cudnn": 2.2}
        return ms, {n: [m, m] for n, m in ms.items()}, [0.0, 1.0]

    def refuse():
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(_common, "event_times", event_times)
    monkeypatch.setattr(_common, "torch_references", lambda problem, args, flash, causal: {
        "cudnn": lambda: None, flash: refuse})
    row = gluon_bench.interleaved_row(lambda: None, (None, None, None), ("fp16", 128, True, 0), 4096, 7)
    assert seen == {"names": ["cudnn", "twill"], "calls": gluon_bench.ROUND_CALLS, "rounds": 7}
    assert row["ratio_vs_cudnn"] == pytest.approx(1.1) and "ratio_vs_fa2" not in row
    flops = gluon_bench.attention_flops(gluon_bench.ATTN_BATCH, gluon_bench.ATTN_HEADS, 4096, 128, True)
    assert row["tflops"] == pytest.approx(flops / 2.0 / 1e9) and row["window"] == [0.0, 1.0]
    result = {"kernels": [{"kernel": "flash-fwd", "options": {"causal": True}, "timings": [row]}],
              "attention_references": {"fp16_d128_causal": {4096: {"cudnn": 1.0, "fa2": 300.0}}}}
    gluon_bench._attach_ratios(result)
    assert row["ratio_vs_cudnn"] == pytest.approx(1.1) and row["fa2_tflops"] == 300.0


def test_launch_overhead_refuses_a_folder_without_a_manifest_or_an_unknown_kernel(tmp_path):
    """``benchmarks/launch_overhead.py`` checks its folder and kernel names before it touches the GPU: one
    clear line and a non-zero exit each."""
    import json
    import os
    import subprocess
    import sys

    script = str(ROOT / "benchmarks" / "launch_overhead.py")
    run = subprocess.run([sys.executable, script, str(tmp_path), "--only", "fa_x"], capture_output=True, text=True)
    assert run.returncode == 2 and "no manifest.json" in run.stderr and "Traceback" not in run.stderr
    (tmp_path / "manifest.json").write_text(json.dumps([{"name": "fa_a", "file": "fa_a.py"}]))
    pytest.importorskip("torch", reason="the launch_overhead.py step checked next runs with torch")
    from benchmarks import launch_overhead

    with pytest.raises(SystemExit, match="no kernel fa_x"):
        launch_overhead.run(str(tmp_path), ["fa_x"], [2048])


def test_the_rounds_table_shows_medians_same_round_ratios_spread_and_clock():
    """``markdown_rounds_table`` renders only ``--rounds`` timings: TFLOP/s, the same-round ratios, each
    contender's max/min spread and the clock."""
    from benchmarks.gluon_bench import markdown_rounds_table

    timing = {"S": 4096, "tflops": 600.4, "rounds": 5, "ratio_vs_cudnn": 1.04, "ratio_vs_fa2": 2.0,
              "ms_spread": {"twill": [1.0, 1.05], "cudnn": [1.0, 1.1], "fa2": [2.0, 2.0]}, "clock_ghz": 1.73}
    result = {"kernels": [{"name": "fa_x", "timings": [timing, {"S": 2048, "tflops": 1.0}]}]}
    rows = markdown_rounds_table(result).splitlines()
    assert rows[2] == "| `fa_x` | 4096 | 600 | 1.04 | 2.00 | 5.0% / 10.0% | 1.73 |" and len(rows) == 3


def test_bwd_phases_refuses_a_folder_without_a_manifest_an_unknown_variant_or_a_causal_one(tmp_path):
    """``benchmarks/bwd_phases.py`` checks its folder and variant names before it touches the GPU (one clear
    line, exit 2 each), and refuses a causal variant, whose CTAs run different iteration counts."""
    import json
    import os
    import subprocess
    import sys

    script = str(ROOT / "benchmarks" / "bwd_phases.py")
    run = subprocess.run([sys.executable, script, "--modules", str(tmp_path), "x"], capture_output=True, text=True)
    assert run.returncode == 2 and "no manifest.json" in run.stderr and "Traceback" not in run.stderr
    (tmp_path / "manifest.json").write_text(json.dumps([{"name": "bwd_c", "options": {"causal": True}}]))
    run = subprocess.run([sys.executable, script, "--modules", str(tmp_path), "x"], capture_output=True, text=True)
    assert run.returncode == 2 and "no variant x" in run.stderr
    pytest.importorskip("torch", reason="the bwd_phases.py step checked next runs with torch")
    from benchmarks import bwd_phases

    with pytest.raises(SystemExit, match="causal"):
        bwd_phases.phases_of(str(tmp_path), {"name": "bwd_c", "options": {"causal": True}}, 4096)


def test_a_variant_admitted_on_ptxas_is_kept_only_without_spills(tmp_path, monkeypatch, capsys):
    """``flash_bwd_check.py generate``: a hand-built variant marked ``"registers": "ptxas"`` is verified on
    every family but REGISTER LIMIT, its register violation recorded in the manifest with ptxas's report, and
    left out when ptxas reports spills; a violation of any other family still stops it."""
    from benchmarks import flash_bwd_check as fbc
    from twill.tune import spills

    name, options, shape = next(v for v in fbc.VARIANTS if v[0] == "bwd_d64_bm128_hand_d2_lag1")
    bwd, _ = fbc._schedules(options, shape)
    assert [v.split(":")[0] for v in bwd.stats["model_register_violations"]] == ["REGISTER LIMIT"]
    report = {"registers": 168, "spill_stores": 0, "spill_loads": 0, "spill_bytes": 0, "serialized_wgmma": 0}
    monkeypatch.setattr(fbc, "VARIANTS", ((name, options, shape),))
    monkeypatch.setattr(spills, "gluon_spills", lambda schedule, machine: dict(report))
    rows = fbc.generate(str(tmp_path / "kept"))
    assert rows[0]["registers"]["model"] == bwd.stats["model_register_violations"]
    assert (tmp_path / "kept" / f"{name}_bwd.py").exists()
    monkeypatch.setattr(spills, "gluon_spills", lambda schedule, machine: {**report, "spill_stores": 4})
    assert fbc.generate(str(tmp_path / "spills")) == []
    assert "skipped: ptxas spills" in capsys.readouterr().out
    assert not (tmp_path / "spills" / f"{name}_bwd.py").exists()
    with pytest.raises(VerificationError) as failed:      # 4-deep rings overflow shared memory
        fbc._schedules(options, {**shape, "depth": 4})
    assert [v.split(":")[0] for v in failed.value.violations] == ["REGISTER LIMIT", "MEMORY CAPACITY"]


def test_a_ptxas_variant_takes_the_searched_schedule_and_records_the_search(tmp_path, monkeypatch):
    """``flash_bwd_check.py generate``: a ``"ptxas"`` variant is the schedule of
    ``twill.tune.registers.schedule_without_spills`` (here answered by the test: the real search compiles 13
    schedules, tests/ops/test_ops.py), verified, and the manifest records the reserve, the schedules compiled and
    ptxas's report of the last."""
    from benchmarks import flash_bwd_check as fbc
    from twill.solve import schedule
    from twill.tune import registers

    name, options, shape = next(v for v in fbc.VARIANTS if v[0] == "bwd_d64_bm128_ptxas")
    started = next(v for v in fbc.VARIANTS if v[0] == "bwd_d128_r16_ptxas")   # the search from reserve 16
    assert shape == "ptxas" and options["block_m"] == 128
    clean = {"registers": 168, "spill_stores": 0, "spill_loads": 0, "spill_bytes": 0, "serialized_wgmma": 0}
    asked = []

    def search(graph, machine, options):
        asked.append((graph.attrs["block_m"], graph.attrs.get("reserved_regs")))
        found = schedule(graph, machine, options)
        steps = [{"reserved_regs": 24, "ii": None, "verdict": "no schedule"},
                 {"reserved_regs": 16, "ii": found.ii, "ptxas": {**clean, "spill_bytes": 32}, "verdict": "spills"},
                 {"reserved_regs": 16, "ii": found.ii, "ptxas": clean, "verdict": "clean"}]
        return replace(found, stats={**found.stats, "registers": {"reserved_regs": 16, "steps": steps}})

    monkeypatch.setattr(registers, "schedule_without_spills", search)
    monkeypatch.setattr(fbc, "VARIANTS", ((name, {**options, "block_m": 64}, shape),))
    (row,) = fbc.generate(str(tmp_path))
    assert asked == [(64, None)] and row["search"] == {"reserved_regs": 16, "schedules": 2, "ptxas": clean}
    assert (tmp_path / f"{name}_bwd.py").exists()
    fbc._schedules(started[1], started[2])
    assert asked[-1] == (64, 16)


def test_repredict_puts_todays_prediction_beside_a_committed_measurement(tmp_path, monkeypatch):
    """``benchmarks/tune_bench.py repredict`` (CPU): each measured candidate of a ``run`` result is solved again,
    predicted with today's model and set beside its measured time and the prediction stored with it."""
    pytest.importorskip("ortools", reason="re-predicting solves the candidates (ortools)")
    from benchmarks.tune_bench import repredict, repredict_table
    from twill.machine.calibration import load_machine
    from twill.tune.predict import Shape

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine_file = str(ROOT / "benchmarks" / "results" / "calibration_h200.machine.json")
    machine = load_machine(machine_file)
    (candidate,) = [c for c in kernel_space("gemm", machine, {"dtype": ("fp16",)}).candidates
                    if c.label() == "block_m=128 block_n=256 block_k=64 warps=8 dtype=fp16 streaming_depth=3 "
                                    "persistent=True"]
    flops = Shape("gemm", (4096, 4096, 4096)).flops("gemm")
    doc = {"results": [{"name": "gemm_fp16_4096x4096x4096", "kernel": "gemm", "dtype": "fp16",
                        "sizes": [4096, 4096, 4096], "flops": flops,
                        "kernels": [{"candidate": candidate.label(), "predicted_us": 100.0, "tflops": 500.0},
                                    {"candidate": "not measured", "predicted_us": 1.0, "tflops": None}]}]}
    results = tmp_path / "tune_bench.json"
    results.write_text(json.dumps(doc))
    out = repredict(str(results), machine_file, str(tmp_path / "re.json"), workers=1)
    (row,) = out["rows"]
    measured_us = flops / 500e12 * 1e6
    assert row["measured_us"] == pytest.approx(measured_us) and row["predicted_us_then"] == 100.0
    assert row["ratio"] == pytest.approx(measured_us / row["predicted_us"]) and row["predicted_us"] > 0
    assert json.loads((tmp_path / "re.json").read_text()) == out
    assert out["within_15_percent_then"] == int(abs(measured_us / 100.0 - 1) <= 0.15)
    assert f"{len(out['rows'])} |" in repredict_table(out).splitlines()[-1]


def test_varlen_bench_draws_mixed_lengths_with_one_longest_and_counts_real_tokens_only():
    from benchmarks.varlen_bench import causal_flops, lengths

    lens = lengths(1024, 8192, 65536)
    assert lens == lengths(1024, 8192, 65536)                 # seeded: every run times the same batch
    assert max(lens) == lens[0] == 8192 and min(lens) >= 16 and 65536 <= sum(lens) < 65536 + 8192
    assert 600 < sum(lens[1:]) / len(lens[1:]) < 1600         # about the mean asked for
    assert causal_flops([3, 5], heads=2, head_dim=4) == 2 * (2 * 9 * 4 + 2 * 25 * 4)


def test_op_loop_opcodes_counts_the_op_kernels_main_loops_and_merges_runs(tmp_path, monkeypatch):
    """One configuration counted for real (the op's D = 256 fp8 forward, compiled for sm_90 on the CPU), then two
    labelled runs merged into one table."""
    pytest.importorskip("triton")
    bench = _benchmark("op_loop_opcodes")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    row = bench.count(256, "fp8e4m3", False, ("PRMT", "F2FP"))
    assert len(row["loops"]) == 2 and all(loop["instructions"] > 100 for loop in row["loops"])
    assert all(loop["PRMT"] == 0 and loop["F2FP"] > 0 for loop in row["loops"])
    monkeypatch.setattr(bench, "HEAD_DIMS", (256,))
    monkeypatch.setattr(bench, "MASKS", (False,))
    monkeypatch.setattr(bench, "count", lambda d, dtype, causal, opcodes: {**row, "loops": [
        {"instructions": 500, "PRMT": 40, "F2FP": 16}]})
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    assert bench.main(["--out", str(before), "--label", "before", "--opcodes", "PRMT,F2FP"]) == 0
    monkeypatch.setattr(bench, "count", lambda d, dtype, causal, opcodes: row)
    assert bench.main(["--out", str(after), "--label", "after", "--opcodes", "PRMT,F2FP"]) == 0
    merged = tmp_path / "merged.json"
    assert bench.main(["--merge", str(before), str(after), "--out", str(merged)]) == 0
    doc = json.loads(merged.read_text())
    assert list(doc["runs"]) == ["before", "after"]
    lines = bench.table(doc).splitlines()
    assert lines[0] == "| configuration | run | instructions | PRMT | F2FP |"
    assert lines[2] == "| D=256 fp8e4m3 | before | 500 | 40 | 16 |"
    largest = max(row["loops"], key=lambda loop: loop["instructions"])
    assert lines[3] == f"| D=256 fp8e4m3 | after | {largest['instructions']} | 0 | {largest['F2FP']} |"
