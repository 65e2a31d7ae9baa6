"""The joint search never fails when a modulo-only schedule with the kernel's own warp groups verifies: it
returns that schedule, status ``feasible``, with the reason in ``stats["fallback"]``, the report and the JSON
(issue 38); when even that breaks a warp-specialization family, the error names the family and ``--no-ws``."""

from __future__ import annotations

import json

import pytest
from randgraphs import random_graph

from twill.cli import main
from twill.errors import InfeasibleScheduleError
from twill.ir.builder import GraphBuilder
from twill.machine import H100
from twill.schedule.verify import violations
from twill.solve import SolveOptions, schedule
from twill.solve.joint import cpsat


@pytest.fixture
def joint_times_out(monkeypatch):
    """Every joint solve (the II-by-II search and the last resort) runs out of time, as on a kernel whose
    joint problem is too large for the budget."""
    def time_out(self, objective, *, time_limit, workers=None):
        return cpsat.JointOutcome("unknown", None, time_limit)

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", time_out)


def _attention_like():
    """A small attention step: two streaming loads, S = QK^T, exp, O += PV, a rescale on the running max."""
    b = GraphBuilder("attn-step", units={"tma": 1, "tc": 1, "mufu": 1, "alu": 1})
    b.op("load_k", kind="tma_load", uses={"tma": 1}, cycles=20, warps=1, regs=0, variable_latency=True,
         attrs={"role": "load_k"})
    b.op("load_v", kind="tma_load", uses={"tma": 1}, cycles=20, warps=1, regs=0, variable_latency=True,
         attrs={"role": "load_v"})
    b.op("qk", kind="mma", uses={"tc": 1}, cycles=60, warps=4, regs=64, attrs={"role": "qk"})
    b.op("exp", kind="exp2", uses={"mufu": 1}, cycles=30, warps=4, regs=64, attrs={"role": "exp"})
    b.op("alpha", kind="alu", uses={"alu": 1}, cycles=10, warps=4, regs=8, attrs={"role": "alpha"})
    b.op("pv", kind="mma", uses={"tc": 1}, cycles=60, warps=4, regs=64, attrs={"role": "pv", "accumulator": True})
    for src, dst in (("load_k", "qk"), ("qk", "exp"), ("exp", "alpha"), ("exp", "pv"), ("load_v", "pv"),
                     ("alpha", "pv")):
        b.edge(src, dst)
    b.edge("pv", "pv", distance=1)
    b.edge("exp", "alpha", distance=1)
    return b.build()


def test_a_joint_time_out_falls_back_to_the_modulo_schedule_with_the_kernels_warp_groups(joint_times_out):
    graph = _attention_like()
    result = schedule(graph, H100, SolveOptions(time_limit=20))
    assert result.status == "feasible"
    assert result.stats["fallback"].startswith("no joint schedule of graph 'attn-step' found within the time "
                                               "limit of 20 s (undecided: II ")
    # the kernel's warps: the loads on W_vl, everything else on one 4-warp group, roles from the ops
    assert [(g.role, g.num_warps, set(g.ops)) for g in result.warps] == [
        ("load", 1, {"load_k", "load_v"}), ("compute", 4, {"qk", "exp", "alpha", "pv"})]
    # the first II, from the modulo-only II up, whose phase-1 schedule verifies with these groups (at the
    # modulo-only II one group cannot issue all four tile ops within the II), and the schedule passes every
    # verifier, the warp-specialization ones too
    modulo_ii = schedule(graph, H100, SolveOptions(ws=False, time_limit=20)).ii
    assert result.stats["modulo_ii"] == modulo_ii < result.ii
    assert violations(result, H100, SolveOptions()) == []


def test_the_fallback_is_in_the_report_and_the_json(joint_times_out, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["schedule", "paper-example", "--max-ii", "2", "--time-limit", "20", "-o", str(out)]) == 0
    report = capsys.readouterr().out.splitlines()
    assert report[1].startswith("status: feasible")
    assert report[2] == ("fallback: the modulo-only schedule with the kernel's warp groups, because: no joint "
                         "schedule of graph 'paper-example' found within the time limit of 20 s (undecided: II 2); "
                         "raise --time-limit")
    doc = json.loads(out.read_text())
    assert doc["status"] == "feasible" and "undecided: II 2" in doc["stats"]["fallback"]


def test_without_a_verified_fallback_the_error_names_the_family_and_no_ws(joint_times_out):
    # a 32-register budget: no group holds the 64-register tiles, the kernel's own groups neither
    with pytest.raises(InfeasibleScheduleError) as info:
        schedule(_attention_like(), H100, SolveOptions(reg_limit=32, time_limit=5))
    message = str(info.value)
    assert message.startswith("no joint schedule of graph 'attn-step' found within the time limit of 5 s (")
    assert "; nor does the modulo-only schedule with the kernel's warp groups verify (REGISTER LIMIT: group 1 " \
           "holds " in message       # the verifier's whole message: the group, its registers and its budget
    assert message.endswith("; use --no-ws for a schedule without warp specialization")
    assert "num_warps" not in message        # a built graph has no num_warps to change


def test_a_warp_pool_no_assignment_fits_fails_at_once_with_the_remedy():
    # a 4-warp pool: W_vl and a 4-warp MMA group need 5 warps at every II; --no-ws has a schedule
    graph = random_graph(8, 1)
    schedule(graph, H100, SolveOptions(ws=False, time_limit=20))
    heard: list[str] = []
    with pytest.raises(InfeasibleScheduleError) as info:
        schedule(graph, H100, SolveOptions(max_warps=4, time_limit=600, progress=heard.append))
    assert not any("phase 1" in line for line in heard)     # before any II is tried
    assert str(info.value) == (
        "graph 'random8s1' has no joint SWP+WS schedule at any II: its warp groups need at least 5 warps (W_vl for "
        "the variable-latency ops and a group for the widest other op), the warp pool has 4; raise --max-warps; use "
        "--no-ws for a schedule without warp specialization")
