"""Triton kernels with several loops and declared ``num_stages`` (tests/data/triton_loops.py): every loop that
holds dots is scheduled unless ``--loop`` picks one, and the streaming depth follows the kernel's
``num_stages`` unless ``--streaming-depth`` overrides it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.integrations.triton import graph_from_target  # noqa: E402
from twill.machine import get_machine  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

DATA = Path(__file__).resolve().parents[2] / "data"
LOOPS = DATA / "triton_loops.py"
sys.path.insert(0, str(DATA))
import triton_loops as L  # noqa: E402


def _matmul(fn: str, num_stages: int | None = None):
    return graph_from_target(LOOPS, fn, signature=L.MATMUL_SIGNATURE, constexprs=list(L.MATMUL_CONSTEXPRS),
                             num_warps=None, num_stages=num_stages, machine=get_machine("h100"))


def test_streaming_depth_is_the_kernels_num_stages():
    assert _matmul("matmul_one_stage").attrs["streaming_depth"] == 1          # its autotune config's
    assert _matmul("matmul_one_stage", num_stages=3).attrs["streaming_depth"] == 3    # --num-stages
    # the loop's own tl.range(..., num_stages=4) wins over the kernel's
    assert _matmul("matmul_ranged", num_stages=2).attrs["streaming_depth"] == 4


def test_streaming_depth_flag_overrides_num_stages(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    base = ["schedule", f"{LOOPS}:matmul_one_stage", "--signature", L.MATMUL_SIGNATURE, "--no-ws"]
    assert main(base + ["-o", str(tmp_path / "own.json")]) == 0
    assert main(base + ["--streaming-depth", "3", "-o", str(tmp_path / "three.json")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "own.json").read_text())["streaming_depth"] == 1
    assert json.loads((tmp_path / "three.json").read_text())["streaming_depth"] == 3
    assert main(base) == 0        # the report's note says what one buffer means
    assert ("have no latency in the model and each has one buffer, so none runs ahead of its consumer's previous "
            "read") in capsys.readouterr().out


# -- every loop that holds dots -----------------------------------------------------------------------------
CAUSAL = [f"{LOOPS}:causal_two_pass", "--signature", L.CAUSAL_SIGNATURE,
          *(arg for c in L.CAUSAL_CONSTEXPRS for arg in ("--constexpr", c))]


def _line_of(text: str) -> int:
    return next(k + 1 for k, line in enumerate(LOOPS.read_text().splitlines()) if line.startswith(text))


FOR_LINES = [_line_of("    for n0 in range(0, row0, BLOCK_N):"),
             _line_of("    for n0 in range(row0, row0 + BLOCK_M, BLOCK_N):")]


def test_schedule_takes_every_loop_that_holds_dots(capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    assert main(["schedule", *CAUSAL, "--no-ws", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernel"] == "causal_two_pass" and len(doc["loops"]) == 2
    for loop, line in zip(doc["loops"], FOR_LINES):
        assert loop["format"] == "twill-schedule/1" and loop["status"] == "optimal"
        assert loop["loop_graph"]["attrs"]["loop_source"] == f"triton_loops.py:{line}"
        assert {"qk", "pv", "exp", "load_k", "load_v"} <= {op["attrs"]["role"] for op in loop["loop_graph"]["ops"]}
    assert main(["schedule", *CAUSAL, "--no-ws"]) == 0
    report = capsys.readouterr().out
    assert report.startswith("causal_two_pass: 2 loops hold dots (loops 0, 1)")
    assert report.count("schedule of 'causal_two_pass'") == 2
    assert report.index(f"loop: triton_loops.py:{FOR_LINES[0]}") < report.index(f"loop: triton_loops.py:{FOR_LINES[1]}")


def test_loop_picks_one_and_one_graph_needs_it(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    assert main(["schedule", *CAUSAL, "--no-ws", "--loop", f"line:{FOR_LINES[1]}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "twill-schedule/1" and doc["loop_graph"]["attrs"]["loop_index"] == 1
    for argv in (["graph", *CAUSAL, "-o", str(tmp_path / "g.json")],
                 ["schedule", *CAUSAL, "--no-ws", "--plot", str(tmp_path / "t.png")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--loop" in err and "2 loops that hold dots" in err
    assert not (tmp_path / "g.json").exists() and not (tmp_path / "t.png").exists()


def test_the_python_api_gives_one_loop_or_every_loop():
    import twill

    graphs = twill.loops_from_triton(L.causal_two_pass, signature=L.CAUSAL_SIGNATURE,
                                     constexprs=list(L.CAUSAL_CONSTEXPRS))
    assert [g.attrs["loop_index"] for g in graphs] == [0, 1]
    assert [g.attrs["loop_source"] for g in graphs] == [f"triton_loops.py:{line}" for line in FOR_LINES]
    second = twill.from_triton(L.causal_two_pass, signature=L.CAUSAL_SIGNATURE,
                               constexprs=list(L.CAUSAL_CONSTEXPRS), loop=1)
    assert second.ops == graphs[1].ops and second.edges == graphs[1].edges
    with pytest.raises(twill.TwillError, match="2 loops that hold dots"):
        twill.from_triton(L.causal_two_pass, signature=L.CAUSAL_SIGNATURE, constexprs=list(L.CAUSAL_CONSTEXPRS))


def test_inject_schedules_every_loop_that_holds_dots(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main
    from twill.integrations.triton.mlir import find_loops

    assert main(["inject", *CAUSAL, "-o", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kernel"] == "causal_two_pass" and summary["shared_memory_bytes"] > 0
    assert [loop["loop_index"] for loop in summary["loops"]] == [0, 1]
    assert [loop["loop"] for loop in summary["loops"]] == [f"triton_loops.py:{line}" for line in FOR_LINES]
    text = (tmp_path / "causal_two_pass.scheduled.ttgir").read_text()
    lines = text.splitlines()
    for loop, found in zip(summary["loops"], find_loops(text)):
        assert f"tt.scheduled_max_stage = {loop['stages'] - 1} " in lines[found.close_line]
        assert all("loop.stage" in lines[st.last_line] for st in found.body)
    schedules = json.loads((tmp_path / "schedule.json").read_text())
    assert [s["format"] for s in schedules["loops"]] == ["twill-schedule/1"] * 2
    # the kernel's schedule file injects every loop again, each schedule on the loop it was solved for
    assert main(["inject", *CAUSAL, "--schedule", str(tmp_path / "schedule.json"), "-o", str(tmp_path / "again")]) == 0
    assert json.loads(capsys.readouterr().out)["loops"] == summary["loops"]
    assert (tmp_path / "again" / "causal_two_pass.scheduled.ttgir").read_text() == text
    # --loop takes that loop's schedule from it
    assert main(["inject", *CAUSAL, "--loop", "1", "--schedule", str(tmp_path / "schedule.json"),
                 "-o", str(tmp_path / "second")]) == 0
    assert json.loads(capsys.readouterr().out)["loop"] == f"triton_loops.py:{FOR_LINES[1]}"
    # one loop's schedule is not the kernel's; a file without a loop's schedule names the loop
    one = tmp_path / "one.json"
    one.write_text(json.dumps(schedules["loops"][0]))
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({**schedules, "loops": [schedules["loops"][0]] * 2}))
    for path, words in ((one, "holds one loop's schedule and the kernel has 2 loops that hold dots"),
                        (twice, f"holds no schedule of loop 1 (at triton_loops.py:{FOR_LINES[1]}); its schedules "
                                "are of loops 0")):
        assert main(["inject", *CAUSAL, "--schedule", str(path), "-o", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err
    assert not (tmp_path / "refused").exists()


def test_inject_config_all_tunes_over_every_loop(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    assert main(["inject", f"{LOOPS}:causal_two_pass_tuned", "--signature", L.CAUSAL_SIGNATURE,
                 "--constexpr", "HEAD_DIM=64", "--config", "all", "-o", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [row["config"] for row in summary["configs"]] == [0, 1]
    assert all(row["status"] == "optimal" and row["flop_per_cycle"] > 0 for row in summary["configs"])
    best = max(summary["configs"], key=lambda row: (row["flop_per_cycle"], -row["config"]))
    assert summary["config"] == best["config"]
    assert [loop["loop_index"] for loop in summary["loops"]] == [0, 1]
    assert len(json.loads((tmp_path / "schedule.json").read_text())["loops"]) == 2


def test_a_loops_schedule_is_injected_on_its_own_loop():
    pytest.importorskip("ortools")
    from twill.integrations.triton import lower_function_loops, spec_from_target
    from twill.integrations.triton.inject import inject, read_schedule_attrs, solve_for_triton, triton_order
    from twill.integrations.triton.mlir import find_loops
    from twill.solve import SolveOptions

    machine = get_machine("h100")
    spec = spec_from_target(LOOPS, "causal_two_pass", signature=L.CAUSAL_SIGNATURE,
                            constexprs=list(L.CAUSAL_CONSTEXPRS), num_warps=None, num_stages=None, machine=machine)
    ((_, first), (index, second)), own = lower_function_loops(spec, machine)
    assert (first.graph.attrs["loop_index"], index, second.graph.attrs["loop_index"]) == (0, 1, 1)
    schedule = solve_for_triton(second.graph, machine, spec.capability, SolveOptions(ws=False))
    result = inject(spec, schedule, machine)          # no loop given: the one the schedule was solved for
    before, after = own.splitlines(), result.scheduled_ttgir.splitlines()
    untouched, scheduled = find_loops(result.scheduled_ttgir)
    assert after[untouched.header_line:untouched.close_line + 1] == \
        before[untouched.header_line:untouched.close_line + 1]          # Triton's own schedule stays
    assert f"tt.scheduled_max_stage = {result.plan.max_stage} " in after[scheduled.close_line]
    written = read_schedule_attrs(result.scheduled_ttgir, scheduled)
    assert {second.owner[i]: place for i, place in written.items() if i in second.owner} == result.plan.op_places
    # Triton's own order of the same loop, which the tuner prices against Twill's
    chained = triton_order(second, own)
    assert len(chained.edges) > len(second.graph.edges) and chained.attrs["loop_index"] == 1


def test_tune_takes_the_loop_given(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    args = ["tune", *CAUSAL, "--shape", "1,1,1024,64", "--no-cache"]
    assert main(args + ["--json", str(tmp_path / "all.json")]) == 0
    (row,) = json.loads((tmp_path / "all.json").read_text())["results"]
    assert row["status"] == "error" and "--loop" in row["reason"]
    assert main(args + ["--loop", f"line:{FOR_LINES[1]}", "--json", str(tmp_path / "one.json")]) == 0
    (row,) = json.loads((tmp_path / "one.json").read_text())["results"]
    assert row["status"] == "ok" and row["solve_status"] == "optimal"
    capsys.readouterr()
