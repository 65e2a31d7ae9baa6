"""Phase-1 optimal modulo scheduling at a fixed II and the II search of ``twill.solve.schedule``."""

from __future__ import annotations

import pytest

from twill.errors import InfeasibleScheduleError
from twill.ir import GraphBuilder
from twill.kernels import build_kernel
from twill.machine import B200, H100
from twill.schedule.verify import violations
from twill.solve import SolveOptions, schedule
from twill.ir.bounds import rec_mii, res_mii
from twill.solve.modulo import (modulo_schedule, projection_infeasible, projections, solve_modulo, stage_limit,
                                unit_chunks)

SOLO = dict(time_limit=10, workers=1, seed=0)


def paper():
    return build_kernel("paper-example", H100)


def test_paper_example_ii1_is_infeasible_ii2_optimal_length_4():
    g = paper()
    units = dict(g.units)
    assert solve_modulo(g, units, 1, **SOLO).status == "infeasible"
    r = solve_modulo(g, units, 2, **SOLO)
    assert (r.status, r.length, r.proven, r.length_bound, r.ii) == ("optimal", 4, True, 4, 2)
    t = r.starts
    assert t["S"] % 2 != t["O"] % 2                 # S and O share the tensor core
    assert t["P"] >= t["S"] + 1 and t["O"] >= t["P"] + 1


def test_modulo_schedule_returns_none_when_no_schedule():
    g = paper()
    assert modulo_schedule(g, dict(g.units), 1, **SOLO) is None
    found = modulo_schedule(g, dict(g.units), 3, **SOLO)
    assert found is not None and found.length == 3 and found.status == "optimal"


def test_length_bounds_and_hint():
    g = paper()
    units = dict(g.units)
    r = solve_modulo(g, units, 2, length_bounds=(5, None), hint={"S": 0, "P": 1, "O": 3}, **SOLO)
    assert r.status == "optimal" and r.length == 5
    assert solve_modulo(g, units, 2, length_bounds=(None, 3), **SOLO).status == "infeasible"


def test_chunks_split_runs_longer_than_ii():
    b = GraphBuilder("long", units={"alu": 2})
    b.op("a", rrt=[{}] + [{"alu": 1}] * 5)
    chunks = unit_chunks(b.build(), 2)["alu"]
    assert [(c.offset, c.length) for c in chunks] == [(1, 2), (3, 2), (5, 1)]


def test_capacity_two_uses_cumulative_and_counts_wraparound():
    b = GraphBuilder("cap2", units={"alu": 2})
    b.op("a", uses={"alu": 1}, cycles=3)              # residues r, r+1, r at II=2
    b.op("b", uses={"alu": 1}, cycles=1)
    g = b.build()
    r = solve_modulo(g, dict(g.units), 2, **SOLO)
    assert r.found
    assert (r.starts["b"] - r.starts["a"]) % 2 == 1   # b must avoid a's doubly used residue
    b2 = GraphBuilder("cap2x", units={"alu": 2})
    b2.op("a", uses={"alu": 1}, cycles=6)             # 3 instances at each residue mod 2
    g2 = b2.build()
    assert solve_modulo(g2, dict(g2.units), 2, **SOLO).status == "infeasible"
    assert solve_modulo(g2, dict(g2.units), 3, **SOLO).found


def test_multi_instance_rows():
    b = GraphBuilder("wide", units={"alu": 3})
    b.op("a", uses={"alu": 2}, cycles=1)
    b.op("c", uses={"alu": 2}, cycles=1)
    g = b.build()
    assert solve_modulo(g, dict(g.units), 1, **SOLO).status == "infeasible"
    r = solve_modulo(g, dict(g.units), 2, **SOLO)
    assert r.found and r.starts["a"] % 2 != r.starts["c"] % 2


def test_stage_limit_formula():
    g = paper()
    # S->P d=1: ⌈2/2⌉ = 1; P->O: 1; O->O d=1 δ=1: ⌈2/2⌉-1 = 0
    assert stage_limit(g, 2) == 2


def test_schedule_api_no_ws_is_optimal_and_verified():
    s = schedule(paper(), H100, SolveOptions(ws=False, time_limit=20))
    assert s.status == "optimal" and s.ii == 2 and s.ii_lower_bound == 2 and s.length == 4
    assert s.stats["res_mii"] == 2 and s.stats["rec_mii"] == 1
    assert s.stats["normalization"]["enabled"] and s.stats["normalization"]["F"] == 0
    assert [row["ii"] for row in s.stats["tried"]] == [2]
    assert violations(s, H100) == []


def test_search_starts_at_res_mii_without_normalization():
    b = GraphBuilder("skip", units={"u": 1})
    b.op("a", uses={"u": 1}, cycles=1)
    b.op("b", uses={}, cycles=1)
    b.op("c", uses={"u": 1}, cycles=1)
    b.edge("a", "c", delay=1)
    g = b.build()
    s = schedule(g, H100, SolveOptions(ws=False, normalize=False))
    assert s.stats["res_mii"] == 2 and s.ii == 2 and s.status == "optimal"


def test_options_are_honoured():
    progress: list[str] = []
    s = schedule(paper(), H100, SolveOptions(ws=False, normalize=False, progress=progress.append))
    assert s.stats["normalization"] == {"enabled": False}
    assert any("II 2" in line for line in progress) and any("ResMII 2" in line for line in progress)


def test_max_ii_below_bound_is_infeasible():
    with pytest.raises(InfeasibleScheduleError, match="max II is 1"):
        schedule(paper(), H100, SolveOptions(ws=False, max_ii=1))


def test_infeasible_up_to_max_ii_names_the_range():
    b = GraphBuilder("gap", units={"u": 1})
    b.op("a", uses={"u": 1}, cycles=1)
    b.op("b", uses={"u": 1}, cycles=1)
    b.edge("a", "b", delay=2)
    b.edge("b", "a", delay=0, distance=1)            # RecMII 2 ... then b at a+2 collides with a mod 2
    g = b.build()
    with pytest.raises(InfeasibleScheduleError, match=r"II <= 2 \(II 2\.\.2 proved infeasible\)"):
        schedule(g, H100, SolveOptions(ws=False, normalize=False, max_ii=2))
    s = schedule(g, H100, SolveOptions(ws=False, normalize=False))
    assert s.ii == 3 and [row["status"] for row in s.stats["tried"]] == ["infeasible", "optimal"]


def chained_pair():
    """a -> b (delay 2) and b -> a (delay 0, next iteration) pin t_b = t_a + 2 at II 2: both on the tensor
    core at the same residue, although ResMII = RecMII = 2. At II 3 they fit."""
    b = GraphBuilder("pair", units={"tc": 1, "alu": 1})
    b.op("a", uses={"tc": 1}, cycles=1)
    b.op("x", uses={"alu": 1}, cycles=1)
    b.op("b", uses={"tc": 1}, cycles=1)
    b.edge("a", "x", delay=1)
    b.edge("x", "b", delay=1)
    b.edge("b", "a", delay=0, distance=1)
    return b.build()


def test_projection_proves_the_ii_infeasible_and_agrees_with_the_full_model():
    g = chained_pair()
    units = dict(g.units)
    assert projections(g, units) == [("tc", "alu")]
    assert projection_infeasible(g, units, 2, time_limit=10) == ("tc", "alu")
    assert projection_infeasible(g, units, 3, time_limit=10) is None
    proved = solve_modulo(g, units, 2, prove=True, **SOLO)
    assert (proved.status, proved.stats["projection"]) == ("infeasible", ("tc", "alu"))
    assert solve_modulo(g, units, 2, **SOLO).status == "infeasible"
    plain, checked = solve_modulo(g, units, 3, **SOLO), solve_modulo(g, units, 3, prove=True, **SOLO)
    assert (plain.status, plain.length) == (checked.status, checked.length) == ("optimal", 3)


def normalized_kernel(kernel, machine, **options):
    from twill.ir.validate import validate_graph
    from twill.solve import normalized

    graph, _ = normalized(build_kernel(kernel, machine, **options), SolveOptions())
    return graph, validate_graph(graph, machine.units)


@pytest.mark.parametrize("machine", [H100, B200], ids=["h100", "b200"])
@pytest.mark.parametrize("kernel,options", [("paper-example", {}), ("gemm", {}), ("flash-fwd", {"subtiles": 1}),
                                            ("flash-fwd", {"subtiles": 2}), ("flash-bwd", {})])
def test_projections_never_cut_a_schedule_of_a_built_in_kernel(machine, kernel, options):
    """Differential: at the first IIs from ResMII up, a projection proves infeasible only IIs that the full
    model proves infeasible too (B200 flash-bwd, whose full proofs take minutes, is the slow test below)."""
    if machine is B200 and kernel == "flash-bwd":
        pytest.skip("the full model's proofs take minutes: test_b200_flash_bwd_projection_rules_out_the_iis_"
                    "the_full_model_did")
    graph, units = normalized_kernel(kernel, machine, **options)
    start = max(res_mii(graph, units), rec_mii(graph))
    for ii in range(start, start + 3):
        full = solve_modulo(graph, units, ii, **SOLO)
        assert full.status in ("optimal", "infeasible")
        if projection_infeasible(graph, units, ii, time_limit=10) is not None:
            assert full.status == "infeasible"


def test_b200_flash_bwd_projection_rules_out_the_iis_the_full_model_did():
    """The tensor core and the MUFU alone rule out II 195 (ResMII) to 201, which the full model proved
    infeasible before the projections existed (tens of seconds per II; the modulo II 202 of
    tests/data/solve_baseline.json), and at 202 no projection objects."""
    graph, units = normalized_kernel("flash-bwd", B200)
    for ii in (195, 201):
        assert projection_infeasible(graph, units, ii, time_limit=60) == ("tc", "mufu")
    assert projection_infeasible(graph, units, 202, time_limit=60) is None
    assert solve_modulo(graph, units, 202, time_limit=300, workers=2, prove=True).status == "optimal"
