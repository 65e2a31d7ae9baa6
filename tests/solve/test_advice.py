"""The advice of a failed search names only constraint families that blocked and only flags of the command
given, moved the way they can still move (issue 38): no "drop --no-cross-warp" when it was not passed, no
"raise --max-warps" when the pool is already the machine's, no flag a command (``twill tune``, the Python
operator) does not have."""

from __future__ import annotations

import pytest

from twill.errors import InfeasibleScheduleError
from twill.ir.builder import GraphBuilder
from twill.machine import H100
from twill.solve import SolveOptions, schedule
from twill.solve.joint.search import remedy_flags, remedy_for
from twill.tune.sweep import TUNE_FLAGS


def _accumulators():
    b = GraphBuilder("accs", units={f"U{k}": 1 for k in range(3)})
    for k in range(3):      # three 150-register 4-warp accumulators: the register file holds two such groups
        b.edge(b.op(f"acc{k}", uses={f"U{k}": 1}, cycles=1, regs=150, warps=4, attrs={"accumulator": True}),
               f"acc{k}", distance=1)
    return b.build()


def test_cross_warp_advice_only_when_no_cross_warp_was_given():
    graph = _accumulators()
    assert remedy_for(["cross_warp_spills"], remedy_flags(graph, H100, SolveOptions())) == ""
    assert remedy_for(["cross_warp_spills"], remedy_flags(graph, H100, SolveOptions(cross_warp=False))) == \
        "drop --no-cross-warp"


def test_warp_advice_only_when_the_pool_can_grow():
    graph = _accumulators()
    assert remedy_for(["warp_count"], remedy_flags(graph, H100, SolveOptions())) == ""
    assert remedy_for(["warp_issue"], remedy_flags(graph, H100, SolveOptions(max_warps=8))) == "raise --max-warps"
    assert remedy_for(["warp_issue"], remedy_flags(graph, H100, SolveOptions(max_warps=8, max_ii=3))) == \
        "raise --max-warps or raise --max-ii"


def test_register_advice_only_below_the_cap():
    graph = _accumulators()
    assert remedy_for(["register_limit"], remedy_flags(graph, H100, SolveOptions(reg_limit=128))) == \
        "raise --reg-limit or use smaller tiles"
    assert remedy_for(["register_limit"], remedy_flags(graph, H100, SolveOptions(reg_limit=255))) == \
        "use smaller tiles"


def test_advice_names_only_the_flags_of_the_command_given():
    graph = _accumulators()
    tune = SolveOptions(max_warps=8, max_ii=3, cross_warp=False, reg_limit=128, flags=TUNE_FLAGS)
    flags = remedy_flags(graph, H100, tune)
    assert set(flags) == {"reg_limit"}
    assert remedy_for(["warp_issue", "cross_warp_spills"], flags) == ""
    assert remedy_for(["register_limit"], flags) == "raise --reg-limit or use smaller tiles"
    assert remedy_flags(graph, H100, SolveOptions(max_warps=8, max_ii=3, flags=())) == {}


def test_every_tune_flag_exists_in_twill_tune():
    import argparse

    from twill.commands import tune

    parser = argparse.ArgumentParser()
    tune.register(parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices["tune"]
    known = {flag for action in sub._actions for flag in action.option_strings}
    assert {flag for _, flag in TUNE_FLAGS} <= known


def test_a_search_without_flags_gives_no_flag_advice():
    with pytest.raises(InfeasibleScheduleError) as info:
        schedule(_accumulators(), H100, SolveOptions(normalize=False, max_ii=3, time_limit=30, flags=()))
    message = str(info.value)
    assert message.startswith("graph 'accs' has no joint SWP+WS schedule with II <= 3 (II 1..3 proved "
                              "infeasible); use smaller tiles or fewer register-holding warps (")
    assert "--" not in message


def test_time_out_advice_only_where_the_time_limit_is_a_flag(monkeypatch):
    from twill.kernels import build_kernel
    from twill.solve.joint import cpsat

    def time_out(self, objective, *, time_limit, workers=None):
        return cpsat.JointOutcome("unknown", None, time_limit)

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", time_out)
    result = schedule(build_kernel("paper-example", H100), H100, SolveOptions(max_ii=2, time_limit=30, flags=()))
    assert result.stats["fallback"] == ("no joint schedule of graph 'paper-example' found within the time limit "
                                        "of 30 s (undecided: II 2)")
