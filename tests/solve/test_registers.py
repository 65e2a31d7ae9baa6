"""Registers decided by ptxas: the register reserve (graph attribute ``reserved_regs``), the excluded carried
sets and orders of the joint search (both backends, and the verifier), and the ptxas-checked search of
``twill.tune.registers`` built on them (here with ptxas's verdicts given by the test; the real compile runs in
tests/ops/test_ops.py's backward test)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from solved import solved_kernel

from twill.errors import GraphError, InfeasibleScheduleError, SpillsError, TwillError, UnsupportedFeatureError
from twill.ir.validate import validate_graph
from twill.kernels import build_kernel
from twill.machine.models import get_machine
from twill.schedule.verify import violations
from twill.schedule.verify_ws import register_limit_violations
from twill.solve import SolveOptions, schedule
from twill.solve._yices_loader import INSTALL_HINT, yices_available
from twill.tune import registers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"
#: Cost resolution of these solves: at U = 20 the H200 backward solves in under a second.
RESOLUTION = 20
H200 = get_machine("h200")
SOLVERS = ["cpsat", pytest.param("yices", marks=pytest.mark.skipif(not yices_available(), reason=INSTALL_HINT))]


def _backward(**options):
    return build_kernel("flash-bwd", H200, **options)


# -- the register reserve ----------------------------------------------------------------------------------
def test_reserved_regs_defaults_to_the_setmaxnreg_minimum_and_is_validated():
    assert H200.reserved_regs({}) == H200.setmaxnreg_min == 24
    assert H200.reserved_regs({"reserved_regs": 16}) == 16
    graph = _backward()
    for bad in (-8, "16", True):
        with pytest.raises(GraphError, match="reserved_regs"):
            validate_graph(replace(graph, attrs={**graph.attrs, "reserved_regs": bad}), H200.units)


def test_register_limit_counts_against_the_graphs_reserve():
    """FA3's 128-row tile at D = 64 holds 224 registers per thread at dS: over 240 - 24, within 240 - 16."""
    first = solved_kernel("flash-bwd", "h200", {"head_dim": 64}, resolution=RESOLUTION)
    assert register_limit_violations(first, H200) == []
    squeezed = replace(first, graph=replace(first.graph, attrs={**first.graph.attrs, "reserved_regs": 200}))
    (found,) = register_limit_violations(squeezed, H200)
    assert found.startswith("REGISTER LIMIT") and "minus 200 reserved" in found
    with pytest.raises(InfeasibleScheduleError):
        schedule(_backward(head_dim=64, block_m=128), H200, SolveOptions(resolution=RESOLUTION))
    graph = _backward(head_dim=64, block_m=128)
    roomier = schedule(replace(graph, attrs={**graph.attrs, "reserved_regs": 16}), H200,
                       SolveOptions(resolution=RESOLUTION))
    assert violations(roomier, H200) == []
    assert any("holds 224 registers" in v for v in register_limit_violations(
        replace(roomier, graph=replace(roomier.graph, attrs={**roomier.graph.attrs, "reserved_regs": 24})), H200))


# -- excluded carried sets and orders ----------------------------------------------------------------------
@pytest.mark.parametrize("solver", SOLVERS)
def test_an_excluded_carried_set_is_never_carried_whole(solver):
    first = solved_kernel("flash-bwd", "h200", resolution=RESOLUTION)
    carried = first.carried()
    assert carried and all(op.regs > 0 for op in first.graph.ops if op.name in carried)
    options = SolveOptions(solver=solver, resolution=RESOLUTION, excluded_carries=(carried,))
    again = schedule(_backward(), H200, options)
    assert not set(carried) <= set(again.carried())
    assert again.ii == first.ii                     # another schedule at the same II exists
    assert violations(again, H200, options) == []
    (found,) = violations(first, H200, options)
    assert found.startswith("EXCLUDED: the schedule carries every value")


@pytest.mark.parametrize("solver", SOLVERS)
def test_an_excluded_order_is_never_repeated(solver):
    first = solved_kernel("flash-bwd", "h200", resolution=RESOLUTION)
    order = first.register_order()
    assert [first.starts[n] for n in order] == sorted(first.starts[n] for n in order)
    options = SolveOptions(solver=solver, resolution=RESOLUTION, excluded_orders=(order,))
    again = schedule(_backward(), H200, options)
    assert again.register_order() != order
    assert violations(again, H200, options) == []
    (found,) = violations(first, H200, options)
    assert found.startswith("EXCLUDED: the schedule starts") and "excluded order" in found


def test_carried_values_are_register_values_read_in_a_later_stage():
    first = solved_kernel("flash-bwd", "h200", resolution=RESOLUTION)
    for op in first.graph.ops:
        later = [e.dst for e in first.graph.out_edges(op.name)
                 if e.distance == 0 and e.dst != op.name and first.stage(e.dst) > first.stage(op.name)]
        assert (op.name in first.carried()) == (op.regs > 0 and bool(later))


@pytest.mark.parametrize("options, message", [
    ({"excluded_carries": ((),)}, "excluded carried set"),
    ({"excluded_carries": (("qk", 3),)}, "excluded carried set"),
    ({"excluded_orders": (("qk",),)}, "excluded order must be a tuple of at least 2"),
    ({"excluded_orders": (("qk", "dp"),), "ws": False}, "joint search"),
])
def test_bad_exclusions_are_one_line_errors(options, message):
    with pytest.raises(TwillError, match=message):
        SolveOptions(**options)


def test_exclusions_naming_unknown_ops_are_refused():
    with pytest.raises(GraphError, match="does not have: nope"):
        schedule(_backward(), H200, SolveOptions(resolution=RESOLUTION, excluded_carries=(("qk", "nope"),)))


# -- the ptxas-checked search ------------------------------------------------------------------------------
def _ptxas(verdicts):
    """A stand-in for ``gluon_spills``: the next verdict (spill bytes) per call, recording each schedule."""
    seen = []

    def report(schedule, machine, persistent=False):
        spill = verdicts[len(seen)] if len(seen) < len(verdicts) else 0
        seen.append(schedule)
        return {"registers": 168, "spill_stores": spill, "spill_loads": 0, "spill_bytes": spill,
                "serialized_wgmma": 0}
    return report, seen


def test_search_excludes_what_each_spilling_schedule_carries_then_its_order(monkeypatch):
    report, seen = _ptxas([64] * 5)
    monkeypatch.setattr(registers, "gluon_spills", report)
    heard = []
    found = registers.schedule_without_spills(_backward(), H200, SolveOptions(resolution=RESOLUTION,
                                                                              progress=heard.append))
    steps = found.stats["registers"]["steps"]
    assert len(seen) == len(steps) == 6 and steps[-1]["verdict"] == "clean" and found is not seen[-1]
    assert found.starts == seen[-1].starts and found.stats["registers"]["reserved_regs"] == 24
    carries = orders = ()
    for rejected, later in zip(seen, seen[1:]):
        if rejected.carried():
            carries += (rejected.carried(),)
        else:
            orders += (rejected.register_order(),)
        assert violations(later, H200, SolveOptions(excluded_carries=carries, excluded_orders=orders)) == []
    lines = [line for line in heard if line.startswith("registers:")]
    assert len(lines) == 5 and all("ptxas reports 64 bytes of spill stores/loads" in line for line in lines)


def test_search_lowers_the_reserve_while_no_schedule_exists(monkeypatch):
    report, seen = _ptxas([])
    monkeypatch.setattr(registers, "gluon_spills", report)
    heard = []
    found = registers.schedule_without_spills(_backward(head_dim=64, block_m=128), H200,
                                              SolveOptions(resolution=RESOLUTION, progress=heard.append))
    assert found.stats["registers"]["reserved_regs"] == 16 == found.graph.attrs["reserved_regs"]
    assert [s["ii"] is None for s in found.stats["registers"]["steps"]] == [True, False]
    assert "registers: no schedule with 24 reserved registers; trying 16" in heard
    assert violations(found, H200) == []        # the reserve travels with the graph


def test_search_gives_up_with_one_line_naming_each_step(monkeypatch):
    report, _ = _ptxas([8] * 10)
    monkeypatch.setattr(registers, "gluon_spills", report)
    with pytest.raises(InfeasibleScheduleError) as caught:
        registers.schedule_without_spills(_backward(), H200, SolveOptions(resolution=RESOLUTION), attempts=3)
    message = str(caught.value)
    assert "\n" not in message and message.count("ptxas reports 8 bytes") == 3 and "3 schedules rejected" in message
    with pytest.raises(InfeasibleScheduleError) as caught:     # the solver's own message at the graph's reserve
        registers.schedule_without_spills(_backward(head_dim=64, block_m=128), H200,
                                          SolveOptions(resolution=RESOLUTION), floor=17)
    assert str(caught.value).startswith("graph 'flash-bwd' has no joint SWP+WS schedule")
    assert not isinstance(caught.value, SpillsError) and "reserved registers" not in str(caught.value)


def test_search_ends_with_the_generators_refusal_or_when_nothing_is_left_to_exclude(monkeypatch):
    """A graph the Gluon generator does not build is refused with its own error (as without the search); a
    spilling schedule with no carried value and fewer than two register values leaves nothing to exclude; a
    graph with no schedule at its reserve nor at the floor gets the solver's message at once."""
    from twill.ir.io import load_graph

    example = load_graph(str(EXAMPLES / "dual-issue.json"))
    with pytest.raises(UnsupportedFeatureError, match="not supported by the Gluon backend"):
        registers.schedule_without_spills(example, H200, SolveOptions(resolution=RESOLUTION))
    report, seen = _ptxas([8])
    monkeypatch.setattr(registers, "gluon_spills", report)
    with pytest.raises(SpillsError, match="nothing is left to exclude"):
        registers.schedule_without_spills(example, H200, SolveOptions(resolution=RESOLUTION))
    assert len(seen) == 1 and seen[0].carried() == () and len(seen[0].register_order()) < 2
    toy = load_graph(str(EXAMPLES / "fa-forward-toy.json"))
    with pytest.raises(InfeasibleScheduleError, match=r"\(nor with 0 registers reserved\)$"):   # the floor, asked
        registers.schedule_without_spills(toy, H200, SolveOptions(resolution=RESOLUTION, time_limit=60))


def test_search_is_for_hopper():
    b200 = get_machine("b200")
    with pytest.raises(UnsupportedFeatureError, match="sm_90 only"):
        registers.schedule_without_spills(build_kernel("flash-bwd", b200), b200)


def test_emit_check_spills_builds_the_tile_the_model_refuses(tmp_path, monkeypatch, capsys):
    """``twill emit gluon ... --check-spills`` solves with the ptxas-checked search (ptxas's verdict given by the
    test here); without it the 128-row tile is one infeasible line; with ``--schedule`` it is refused."""
    from twill.cli import main

    report, seen = _ptxas([])
    monkeypatch.setattr(registers, "gluon_spills", report)
    args = ["emit", "gluon", "flash-bwd", "--arch", "h200", "--head-dim", "64", "--block-m", "128",
            "--resolution", str(RESOLUTION)]
    assert main([*args, "--check-spills", "-o", str(tmp_path / "bwd.py")]) == 0
    assert len(seen) == 1 and "tile block_m=128 block_n=128 head_dim=64" in (tmp_path / "bwd.py").read_text()
    capsys.readouterr()
    assert main([*args, "-o", str(tmp_path / "refused.py")]) != 0
    err = capsys.readouterr().err
    assert "no joint SWP+WS schedule" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "refused.py").exists()
    assert main(["emit", "gluon", "--schedule", str(tmp_path / "x.json"), "--check-spills", "-o", "-"]) != 0
    assert "a --schedule FILE is emitted as it is" in capsys.readouterr().err


def test_tune_check_spills_ranks_what_the_search_admits(tmp_path, monkeypatch):
    """The sweep solves a built-in Hopper kernel by the ptxas-checked search when spills are checked: the
    128-row backward tile, infeasible to the model alone, becomes a ranked candidate with the search's report;
    a candidate whose every schedule spills is ``spills``."""
    from twill.tune.space import Candidate
    from twill.tune.sweep import Job, run_job
    from twill.ir.io import graph_to_dict

    report, _ = _ptxas([])
    monkeypatch.setattr(registers, "gluon_spills", report)
    graph = graph_to_dict(_backward(head_dim=64, block_m=128))
    job = Job(candidate=Candidate(options=(("block_m", 128), ("head_dim", 64))), machine=H200, time_limit=60,
              resolution=RESOLUTION, graph=graph)
    assert run_job(job)["status"] == "infeasible"
    record = run_job(replace(job, check_spills=True))
    assert record["status"] == "ok" and record["spills"]["spill_bytes"] == 0
    assert record["schedule"]["loop_graph"]["attrs"]["reserved_regs"] == 16
    spilling, _ = _ptxas([8] * 40)
    monkeypatch.setattr(registers, "gluon_spills", spilling)
    record = run_job(replace(job, check_spills=True))
    assert record["status"] == "spills" and "no schedule whose kernel ptxas compiles" in record["reason"]


def test_a_kernel_ptxas_cannot_compile_is_rejected_and_the_same_failure_twice_ends_the_search(monkeypatch):
    from twill.tune.spills import ptxas_reason, ptxas_rejection

    message = ("Internal Triton PTX codegen error\n`ptxas` stderr:\nptxas info    : (C7512) wgmma serialized\n"
               "ptxas fatal   : (C7600) Register allocation failed with register count of 120\n.version 8.7\n")
    reason = ptxas_reason(message)
    assert reason.startswith("ptxas fatal   : (C7600) Register allocation failed")
    failed = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "spill_bytes": 0, "serialized_wgmma": 0,
              "ptxas_error": reason}
    assert ptxas_rejection(failed) == f"ptxas cannot compile it: {reason}"
    seen = []
    monkeypatch.setattr(registers, "gluon_spills", lambda schedule, machine, persistent=False: seen.append(1) or failed)
    with pytest.raises(SpillsError, match="ptxas fails the same way on two schedules in a row"):
        registers.schedule_without_spills(_backward(), H200, SolveOptions(resolution=RESOLUTION))
    assert len(seen) == 2


def test_tune_reports_a_graph_the_generator_refuses_as_cannot_emit():
    """With spills checked, a candidate whose schedules the Gluon generator refuses (two 64-row sub-tiles on
    160 registers: the solver splits a sub-tile's ops over two groups) is ``cannot_emit``, as without."""
    from twill.ir.io import graph_to_dict
    from twill.tune.space import Candidate
    from twill.tune.sweep import Job, run_job

    graph = build_kernel("flash-fwd", H200, head_dim=128, subtiles=2)
    job = Job(candidate=Candidate(options=(("subtiles", 2),), reg_limit=160), machine=H200, time_limit=60,
              graph=graph_to_dict(graph), check_spills=True)
    record = run_job(job)
    assert record["status"] == "cannot_emit" and "not supported by the Gluon backend" in record["reason"]


def test_the_backwards_128_row_tile_is_swept_only_with_spills_checked():
    from twill.tune.space import default_axes, kernel_space

    assert default_axes("flash-bwd", H200)["block_m"] == (64,)
    assert default_axes("flash-bwd", H200, check_spills=True)["block_m"] == (64, 128)
    assert "block_m" not in default_axes("flash-bwd", get_machine("b200"), check_spills=True)
    checked = kernel_space("flash-bwd", H200, {"head_dim": (64,)}, check_spills=True)
    assert sorted({dict(c.options)["block_m"] for c in checked.candidates}) == [64, 128]
    assert {dict(c.options)["block_m"] for c in kernel_space("flash-bwd", H200, {"head_dim": (64,)}).candidates} \
        == {64}


def test_measure_checks_and_times_a_backward_by_its_gradients(monkeypatch):
    """``twill tune --measure`` on flash-bwd: the check is the backward's (gradients), not the forward's; the
    GPU half runs in benchmarks (tune_flash_bwd_h200_measure.json)."""
    from twill.codegen.gluon import check
    from twill.tune import measure
    from twill.tune.predict import Shape

    asked = []
    monkeypatch.setattr(check, "check_attention_backward",
                        lambda module, dtype, d: asked.append(("bwd", dtype, d)) or [{"relerr": 1e-4}])
    monkeypatch.setattr(check, "check_attention", lambda module, dtype, d: pytest.fail("the forward's check"))
    shape = Shape("attention", (4, 16, 4096, 64))
    assert measure._check(object(), shape, {"kernel": "flash-bwd", "dtype": "bf16", "head_dim": 64}) == 1e-4
    assert asked == [("bwd", "bf16", 64)]
