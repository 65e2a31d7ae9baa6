"""The joint SWP + WS search (CP-SAT backend) on small graphs, one constraint family at a time."""

from __future__ import annotations

import pytest
from solved import solved_kernel

from twill.errors import InfeasibleScheduleError, TwillError
from twill.ir.builder import GraphBuilder
from twill.kernels import build_kernel
from twill.machine import get_machine
from twill.schedule.verify_ws import ws_violations
from twill.solve import schedule
from twill.solve.joint.search import derive_role
from twill.solve.options import SolveOptions

H100 = get_machine("h100")


def solve(graph, **options):
    opts = SolveOptions(normalize=False, time_limit=30, **options)
    result = schedule(graph, H100, opts)
    assert ws_violations(result, H100, opts) == []
    return result


def accumulators(count: int, regs: int, *, chain: bool = False):
    """``count`` independent 4-warp accumulators (self-edge, distance 1) of ``regs`` registers each, on
    their own units; ``chain`` adds a register edge acc0 -> acc1 -> ..."""
    b = GraphBuilder("accs", units={f"U{k}": 1 for k in range(count)})
    names = [b.op(f"acc{k}", uses={f"U{k}": 1}, cycles=1, regs=regs, warps=4, kind="alu",
                  attrs={"role": "acc", "accumulator": True}) for k in range(count)]
    for n in names:
        b.edge(n, n, distance=1)
    if chain:
        for src, dst in zip(names, names[1:]):
            b.edge(src, dst)
    return b.build()


def test_paper_example_is_one_group_at_ii_2_with_ordered_objectives():
    result = solve(build_kernel("paper-example", H100))
    assert result.ii == 2 and result.status == "optimal"
    assert [o["name"] for o in result.stats["objectives"]] == ["length", "stages", "warps", "smem", "prologue"]
    assert all(o["proven"] for o in result.stats["objectives"])
    assert len(result.warps) == 1 and set(result.assignment.values()) == {0}


def test_variable_latency_ops_get_their_own_warp_and_only_they():
    b = GraphBuilder("vl", units={"tma": 1, "A": 1})
    ld = b.op("ld", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, kind="tma_load",
              smem=1024, attrs={"role": "load"})
    x = b.op("x", uses={"A": 1}, cycles=2, warps=4, regs=8, kind="alu", attrs={"role": "x"})
    b.edge(ld, x)
    result = solve(b.build())
    load = result.warp_of("ld")
    assert load.role == "load" and load.ops == ("ld",)
    assert result.warp_of("x").role == "compute"


def test_register_limit_splits_values_that_do_not_fit_one_group():
    result = solve(accumulators(2, 150))
    assert len({result.assignment["acc0"], result.assignment["acc1"]}) == 2
    assert all(w.regs == 240 for w in result.warps)


def test_lower_register_limit_admits_more_register_holding_groups():
    """R = 240: two 100-register accumulators share a group (216 usable), so 2 groups; R = 160 (136
    usable): one per group, and 12 warps at 160 registers fit the register file (12·32·160 ≤ 65536)."""
    wide = solve(accumulators(3, 100))
    narrow = solve(accumulators(3, 100), reg_limit=160)
    assert len(wide.warps) == 2
    assert len(narrow.warps) == 3 and {w.regs for w in narrow.warps} == {160}


def test_register_file_bounds_the_number_of_heavy_warps():
    with pytest.raises(InfeasibleScheduleError, match="register"):
        solve(accumulators(3, 150), max_ii=3)


def test_forbidding_cross_warp_transfers_makes_a_forced_split_infeasible():
    graph = accumulators(2, 150, chain=True)
    split = solve(graph)
    assert split.assignment["acc0"] != split.assignment["acc1"]
    with pytest.raises(InfeasibleScheduleError, match="cross-warp"):
        solve(graph, cross_warp=False, max_ii=3)


def test_cross_warp_spill_delays_the_consumer():
    b = GraphBuilder("spill", units={"A": 1, "B": 1})
    p = b.op("p", uses={"A": 1}, cycles=1, regs=150, warps=4, spill_cost=5, kind="alu",
             attrs={"role": "p", "accumulator": True})
    c = b.op("c", uses={"B": 1}, cycles=1, regs=150, warps=4, kind="alu", attrs={"role": "c", "accumulator": True})
    b.edge(p, p, distance=1)
    b.edge(c, c, distance=1)
    b.edge(p, c)
    # Algorithm 1 never adds copies at one II, so the spill only fits once II ≥ 1 + 5 + 1 (one copy).
    result = solve(b.build(), max_ii=10)
    assert result.assignment["p"] != result.assignment["c"]
    assert result.start("c") - result.start("p") >= 1 + 5


def test_warp_count_and_warp_issue_block_the_modulo_ii():
    """Two independent 2-cycle ops on different units: phase 1 reaches II 2, but one 4-warp group runs
    them one at a time (WARP ISSUE), and a second group needs more warps than max_warps allows."""
    b = GraphBuilder("issue", units={"A": 1, "B": 1})
    b.op("x", uses={"A": 1}, cycles=2, warps=4, kind="alu", attrs={"role": "x"})
    b.op("y", uses={"B": 1}, cycles=2, warps=4, kind="alu", attrs={"role": "y"})
    free = solve(b.build())
    assert free.ii == 2 and len(free.warps) == 2
    tight = solve(b.build(), max_warps=4)
    assert tight.ii == 4 and len(tight.warps) == 1
    assert tight.stats["modulo_ii"] == 2
    assert set(tight.stats["blocked_by"]) == {"warp_count", "warp_issue"}
    assert "warp count" in tight.stats["blocked_by_note"]


def test_concurrency_keeps_a_blocking_wait_out_of_other_work_in_flight():
    b = GraphBuilder("conc", units={"TC": 1, "EXP": 1})
    mma = b.op("mma", uses={"TC": 1}, cycles=2, warps=4, warp_busy=1, kind="mma", attrs={"role": "mma"})
    use = b.op("use", uses={"EXP": 1}, cycles=1, warps=4, regs=8, kind="exp2", attrs={"role": "exp"})
    other = b.op("other", uses={"EXP": 1}, cycles=2, warps=4, regs=8, kind="exp2", attrs={"role": "exp"})
    b.edge(mma, use, delay=2, blocking=True)
    b.edge(mma, mma, delay=2, distance=1)
    result = solve(b.build())
    for o in ("mma", "other"):
        if result.assignment[o] == result.assignment["use"]:
            assert (result.start("use") - result.start(o)) % result.ii >= result.graph.op(o).busy


def test_memory_capacity_counts_the_streaming_ring():
    b = GraphBuilder("ring", units={"tma": 1, "A": 1})
    ld = b.op("ld", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, kind="tma_load",
              smem=100 * 1024, attrs={"role": "load"})
    x = b.op("x", uses={"A": 1}, cycles=1, warps=4, kind="alu", attrs={"role": "x"})
    b.edge(ld, x)
    assert solve(b.build(), streaming_depth=2).stats["smem_bytes"] == 200 * 1024
    with pytest.raises(InfeasibleScheduleError, match="memory"):
        solve(b.build(), streaming_depth=3, max_ii=3)


def test_a_pinned_ring_depth_overrides_the_streaming_depth():
    """``attrs["ring_depth"]`` on a streaming load is its least depth whatever ``streaming_depth`` says;
    the solver, the verifier and the schedule's buffer report agree on it."""
    def ring(depth):
        b = GraphBuilder("ring", units={"tma": 1, "A": 1})
        ld = b.op("ld", uses={"tma": 1}, cycles=1, latency=0, variable_latency=True, kind="tma_load",
                  smem=100 * 1024, attrs={"role": "load", "ring_depth": depth})
        x = b.op("x", uses={"A": 1}, cycles=1, warps=4, kind="alu", attrs={"role": "x"})
        b.edge(ld, x)
        return b.build()
    one = solve(ring(1), streaming_depth=3)
    assert one.stats["smem_bytes"] == 100 * 1024 and one.result_depth("ld") == 1
    assert solve(ring(2), streaming_depth=1).stats["smem_bytes"] == 200 * 1024
    with pytest.raises(InfeasibleScheduleError, match="memory"):
        solve(ring(3), streaming_depth=1, max_ii=3)


@pytest.mark.parametrize("arch", ["h100", "b200"])
def test_search_is_deterministic(arch):
    machine = get_machine(arch)
    first = solved_kernel("flash-fwd", arch, {"subtiles": 2}).to_dict()      # the session's shared solve
    second = schedule(build_kernel("flash-fwd", machine, subtiles=2), machine, SolveOptions()).to_dict()
    first.pop("solve_seconds"), second.pop("solve_seconds")
    for d in (first, second):
        d["stats"].pop("tried")
    assert first == second


def test_roles_are_derived_from_the_ops():
    graph = build_kernel("flash-fwd", get_machine("b200"), subtiles=2)
    assert derive_role(graph, ["load_k", "load_v"], True) == "load"
    assert derive_role(graph, ["qk_a", "pv_b"], False) == "mma"
    assert derive_role(graph, ["s_load_a", "exp_a", "rowmax_a"], False) == "softmax"
    assert derive_role(graph, ["o_load_a", "rescale_a", "o_store_a"], False) == "correction"
    hopper = build_kernel("flash-fwd", H100, subtiles=2)
    assert derive_role(hopper, ["qk_a", "exp_a", "pv_a"], False) == "compute"


def test_a_time_limit_never_claims_optimality():
    machine = get_machine("b200")
    graph = build_kernel("flash-fwd", machine, subtiles=1)     # needs ~86 IIs proved infeasible
    try:
        result = schedule(graph, machine, SolveOptions(time_limit=2.0))
    except InfeasibleScheduleError as exc:
        assert "time limit" in str(exc)
    else:
        assert result.status == "feasible" or result.ii == result.ii_lower_bound


def test_hopper_attention_hoists_s_in_every_subtile_before_minimising_length():
    from twill.solve.joint.search import hoist_pairs

    graph = build_kernel("flash-fwd", H100, subtiles=2)
    assert hoist_pairs(graph, H100) == [("qk_a", "pv_a"), ("qk_b", "pv_b")]
    result = solved_kernel("flash-fwd", "h100", {"subtiles": 2})
    names = [o["name"] for o in result.stats["objectives"]]
    assert names == ["unhoisted", "length", "stages", "warps", "smem", "prologue"]
    assert result.stats["objectives"][0]["value"] == 0 and result.status == "optimal"
    assert all(result.stage(f"pv_{x}") == result.stage(f"qk_{x}") + 1 for x in "ab")


@pytest.mark.parametrize("kernel,arch", [("flash-bwd", "h100"), ("gemm", "h100"), ("flash-fwd", "b200"),
                                         ("paper-example", "h100")])
def test_no_hoist_pairs_without_a_waited_register_accumulator(kernel, arch):
    from twill.solve.joint.search import hoist_pairs

    machine = get_machine(arch)
    assert hoist_pairs(build_kernel(kernel, machine), machine) == []


def test_default_gemm_tile_is_one_8_warp_consumer_with_a_lagged_wait():
    graph = build_kernel("gemm", H100)
    assert (graph.attrs["block_m"], graph.attrs["block_n"], graph.attrs["warps"]) == (128, 256, 8)
    assert graph.op("mma").warps == 8 and graph.op("mma").regs == 128
    assert build_kernel("gemm", H100, block_n=128).op("mma").warps == 4
    result = solved_kernel("gemm", "h100", streaming_depth=3)
    mma = result.warp_of("mma")
    assert mma.num_warps == 8 and set(mma.ops) == {"mma", "mma_wait"}
    assert result.stage("mma_wait") - result.stage("mma") == 1


def _calibrated_h200():
    import os

    from twill.machine.calibration import load_machine

    return load_machine(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results",
                                     "calibration_h200.machine.json"))


def test_one_extra_copy_finds_the_hoisted_d256_schedule_below_algorithm_1s_ii():
    """Algorithm 1 takes the copies from phase 1 (n = ⌈LEN(M)/I⌉) and never tries more. On the calibrated
    H200 model the D = 256 forward's modulo-only schedule fits one stage, so every II below 137 is proved
    infeasible with one copy and the answer issues S and P V in one stage; with one extra copy the search
    finds II 132 with each group's next S issued a stage ahead (measured 4-9% faster, docs/performance.md)."""
    from twill.schedule.verify import verify
    from twill.solve.attempt import row_proven_infeasible

    machine = _calibrated_h200()
    graph = build_kernel("flash-fwd", machine, head_dim=256, block_n=64, subtiles=2, causal=True)
    paper = schedule(graph, machine, SolveOptions(streaming_depth=2))
    more = schedule(graph, machine, SolveOptions(streaming_depth=2, extra_copies=1))
    assert (paper.ii, more.ii) == (137, 132) and more.ii_lower_bound == 132
    assert paper.stage("pv_a") == paper.stage("qk_a") and more.stage("pv_a") == more.stage("qk_a") + 1
    assert more.stats["copies"] == 2 and str(more.status) == "optimal"
    verify(more, machine)
    last, found = more.stats["tried"][-2:]
    assert (last["ii"], last["copies"], last["joint"]) == (132, 1, "infeasible")
    assert (found["by"], found["copies"], found["joint"]) == ("extra_copies", 2, "optimal")
    # an extra-copies row proves its II infeasible only when the joint problem with those copies is
    assert row_proven_infeasible({"ii": 5, "by": "extra_copies", "joint": "infeasible", "copies": 3})
    assert not row_proven_infeasible({"ii": 5, "by": "extra_copies", "joint": "unknown", "copies": 3})


def test_extra_copies_also_serve_unhoisted_at_the_ii_the_search_stops_at():
    """On the datasheet H200 model the D = 256 forward stops at II 228 with one copy, S and P V in one stage
    (2 pairs unhoisted, proved least with one copy). One extra copy at that II hoists both at the same II:
    ``unhoisted`` is minimised over the copies tried, before L."""
    from twill.schedule.verify import verify
    from twill.solve.attempt import row_proven_infeasible

    machine = get_machine("h200")
    graph = build_kernel("flash-fwd", machine, head_dim=256, block_n=64, subtiles=2)
    paper = schedule(graph, machine, SolveOptions(streaming_depth=2))
    more = schedule(graph, machine, SolveOptions(streaming_depth=2, extra_copies=1))
    unhoisted = [{r["name"]: (r["value"], r["proven"]) for r in s.stats["objectives"]}["unhoisted"]
                 for s in (paper, more)]
    assert (paper.ii, more.ii) == (228, 228) and unhoisted == [(2, True), (0, True)]
    assert (paper.stats["copies"], more.stats["copies"]) == (1, 2) and str(more.status) == "optimal"
    assert paper.stage("pv_a") == paper.stage("qk_a") and more.stage("pv_a") == more.stage("qk_a") + 1
    verify(more, machine)
    row = more.stats["tried"][-1]
    assert (row["ii"], row["by"], row["copies"], row["unhoisted_below"], row["joint"]) == (
        228, "extra_copies", 2, 2, "optimal")
    # such a row asked for fewer unhoisted pairs: its answer says nothing about the II's feasibility
    assert not row_proven_infeasible({**row, "joint": "infeasible"})


def test_extra_copies_is_a_non_negative_integer():
    with pytest.raises(TwillError, match="extra copies"):
        SolveOptions(extra_copies=-1)
    with pytest.raises(TwillError, match="extra copies"):
        SolveOptions(extra_copies=1.5)
