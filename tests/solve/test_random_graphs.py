"""Random tile-kernel graphs (tests/randgraphs.py): the joint search returns a verified joint schedule whose
status matches its proofs (issue 17, item 2)."""

from __future__ import annotations

import pytest
from randgraphs import random_graph

from twill.machine import H100
from twill.schedule.verify import violations
from twill.solve import SolveOptions, schedule


def check(n: int, seed: int, time_limit: float) -> None:
    graph = random_graph(n, seed)
    result = schedule(graph, H100, SolveOptions(time_limit=time_limit))
    assert result.warps and set(result.assignment) == set(graph.op_names)
    assert violations(result, H100) == []
    proven = dict(result.stats["proven"])
    assert (result.status == "optimal") == all(proven.values())
    assert proven["ii"] == (result.ii == result.ii_lower_bound)


def test_the_generator_is_deterministic_and_valid():
    assert random_graph(30, 4) == random_graph(30, 4) and random_graph(30, 4) != random_graph(30, 5)
    graph = random_graph(30, 4)
    assert len(graph.ops) == 30 and all(not e.distance or e.src != e.dst or graph.op(e.src).attrs.get("accumulator")
                                        for e in graph.edges)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_small_random_graph(seed):
    check(8, seed, time_limit=60)


@pytest.mark.slow
@pytest.mark.parametrize("ops, seed, limit", [(60, 1, 30), (160, 1, 60)])
def test_a_random_graph_up_to_160_ops_within_60_s(ops, seed, limit):
    """The search's phases leave the last resort its reserve (``LAST_RESORT_SHARE`` of the limit), so a
    graph whose joint solves time out still gets a verified schedule within the limit (60 ops: 30 s). Each
    case runs for about its whole limit, so one seeded graph per size."""
    check(ops, seed, time_limit=limit)
