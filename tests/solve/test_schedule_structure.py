"""Reproductions of the paper's schedule-structure results (Soi et al., Twill, OSDI '26, §4-§6).

Each test solves a built-in kernel with the default options (cost normalization at U = 300, CP-SAT) and
checks the *structure* the paper reports, not exact numbers (the paper's Table 1 is not available, and our
cost model is our own; see docs/kernels.md). Results that our model does not reproduce are ``xfail`` with
the reason.
"""

from __future__ import annotations

import math

import pytest
from solved import solved_kernel

from twill.machine import get_machine
from twill.schedule.verify_ws import ws_violations
from twill.solve.options import SolveOptions


def solved(kernel: str, arch: str, kernel_options: tuple = (), **solve_options):
    """The shared solve of :func:`solved.solved_kernel` (other test files ask for the same kernels), checked
    against the warp-specialization verifier."""
    result = solved_kernel(kernel, arch, dict(kernel_options), **solve_options)
    assert ws_violations(result, get_machine(arch), SolveOptions(**solve_options)) == []
    return result


def raw_ii(result) -> float:
    """II in raw cycles (normalized II times cycles per normalized unit)."""
    return result.ii * result.stats["normalization"]["cycles_per_unit"]


def tc_bound(result) -> int:
    return math.ceil(sum(op.usage("tc") for op in result.graph.ops))


def group_ops(result, role):
    return [set(w.ops) for w in result.warps if w.role == role]


def cyclic_runs(labels: list) -> int:
    """Runs of equal labels around a circle (a a b b -> 2; a b a b -> 4)."""
    return sum(1 for k in range(len(labels)) if labels[k] != labels[k - 1]) or 1


def overlaps_mod(a_start: int, a_len: int, b_start: int, b_len: int, ii: int) -> bool:
    a = {(a_start + c) % ii for c in range(a_len)}
    return any((b_start + c) % ii in a for c in range(b_len))


# 1 ------------------------------------------------------------------------------------------------------------
def test_paper_example_hoists_s_one_stage_ahead():
    result = solved("paper-example", "h100")
    assert result.ii == 2 and result.status == "optimal"
    assert result.stage("S") == 0
    assert result.stage("P") == result.stage("O") == 1


# 2 ------------------------------------------------------------------------------------------------------------
def test_h100_flash_fwd_two_subtiles_is_ping_pong_at_the_tensor_core_bound():
    result = solved("flash-fwd", "h100", (("subtiles", 2),))
    assert result.status == "optimal"
    assert result.ii == tc_bound(result) == result.stats["res_mii"]
    loads = group_ops(result, "load")
    assert loads == [{"load_k", "load_v"}]
    compute = [w for w in result.warps if w.role == "compute"]
    assert len(compute) == 2
    subtiles = [{result.graph.op(n).attrs["subtile"] for n in w.ops} for w in compute]
    assert sorted(map(sorted, subtiles)) == [[0], [1]]
    tc_ops = sorted((n for n in result.graph.op_names if result.graph.op(n).kind == "mma"), key=result.residue)
    assert cyclic_runs([result.assignment[n] for n in tc_ops]) == 2          # a a b b: the groups alternate
    for w in compute:
        exp = next(n for n in w.ops if result.graph.op(n).attrs["role"] == "exp")
        other_tc = [n for n in tc_ops if result.assignment[n] != w.id]
        assert any(overlaps_mod(result.start(exp), result.graph.op(exp).cycles, result.start(n),
                                result.graph.op(n).cycles, result.ii) for n in other_tc)
    hoisted = [x for x in "ab" if result.stage(f"qk_{x}") < result.stage(f"pv_{x}")]
    assert hoisted


# 3 ------------------------------------------------------------------------------------------------------------
def test_b200_flash_fwd_two_subtiles_finds_fa4_roles():
    result = solved("flash-fwd", "b200", (("subtiles", 2),))
    assert result.status == "optimal" and result.ii == result.stats["modulo_ii"]
    assert group_ops(result, "load") == [{"load_k", "load_v"}]
    mma = [w for w in result.warps if w.role == "mma"]
    assert len(mma) == 1 and mma[0].num_warps == 1 and set(mma[0].ops) == {"qk_a", "qk_b", "pv_a", "pv_b"}
    softmax = [w for w in result.warps if w.role == "softmax"]
    assert len(softmax) == 2
    per_group = sorted(sorted({result.graph.op(n).attrs["subtile"] for n in w.ops}) for w in softmax)
    assert per_group == [[0], [1]]
    assert all(any(result.graph.op(n).attrs["role"] == "exp" for n in w.ops) for w in softmax)
    correction = [w for w in result.warps if w.role == "correction"]
    assert len(correction) == 1 and {"rescale_a", "rescale_b"} <= set(correction[0].ops)


# 4 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("label,kernel_options,solve_options,family", [
    # The slowest of the three (six joint proofs after the modulo II, ~10 s of CPU); the other two check the
    # same property in the quick subset.
    pytest.param("fewer warps", (("subtiles", 2),), {"max_warps": 13}, "warp_count", marks=pytest.mark.slow),
    ("no cross-warp transfers", (("subtiles", 2),), {"cross_warp": False}, "cross_warp_spills"),
    ("no sub-tiling", (("subtiles", 1),), {}, "register_file"),
])
def test_b200_flash_fwd_ablations_are_infeasible_at_the_modulo_ii(label, kernel_options, solve_options, family):
    base = solved("flash-fwd", "b200", (("subtiles", 2),))
    result = solved("flash-fwd", "b200", kernel_options, **solve_options)
    assert result.stats["tried"][0]["ii"] == result.stats["modulo_ii"]
    assert result.stats["tried"][0]["joint"] == "infeasible"
    assert result.ii > result.stats["modulo_ii"]
    assert raw_ii(result) > raw_ii(base)
    assert any(family in entry.split("+") for entry in result.stats["blocked_by"]), result.stats["blocked_by"]
    assert result.stats["blocked_by_note"].startswith("no warp specialization exists at the modulo-only II")


# 5 ------------------------------------------------------------------------------------------------------------
def compute_ops(result):
    return [n for n in result.graph.op_names if not result.graph.op(n).variable_latency]


def test_h100_flash_bwd_pipelines_only_within_an_iteration():
    """§4.4: register capacity leaves only intra-iteration ILP. Every op outside the W_vl warp (whose TMA
    reduce-add of dQ runs on in the background) is in stage 0 and completes within one II, so no op of
    iteration i+1 overlaps iteration i; the tensor core idles, II > ResMII."""
    result = solved("flash-bwd", "h100")
    assert result.status == "optimal"
    for name in compute_ops(result):
        assert result.stage(name) == 0, name
        assert result.start(name) + result.graph.op(name).cycles <= result.ii, name
    assert result.ii > result.stats["res_mii"]


def test_h100_flash_bwd_overlaps_iterations_when_registers_allow():
    """The bound is the register file: at the architectural maximum (255 -> 248 per thread) the solver
    carries a dK/dV GEMM into the next iteration and the II drops."""
    base = solved("flash-bwd", "h100")
    wide = solved("flash-bwd", "h100", reg_limit=255)
    assert wide.ii < base.ii
    assert any(wide.stage(n) > 0 for n in compute_ops(wide))


# 6 ------------------------------------------------------------------------------------------------------------
#: FA4's compute-group budget (``num_regs_compute`` in flash_bwd_sm100.py): the paper's "Twill-LR".
FA4_COMPUTE_REGS = 136


def register_groups(result):
    return [w for w in result.warps if w.role not in ("load", "mma")]


#: Cost resolution of the quick equivalents of the B200 flash-bwd results: the same structure in seconds
#: (at U = 300 the search takes tens of seconds; those tests are ``slow``).
COARSE = 40


def check_two_exponential_groups(result) -> None:
    """Loads and MMAs on their own warps, two 240-register groups each running one half of the
    exponentials, one of them also staging dQ for the atomic add (the paper's 2-group strategy); no warp
    specialization exists at the modulo-only II, so the final II is larger (paper §6.4)."""
    assert [w.role for w in result.warps][:2] == ["load", "mma"]
    heavy = register_groups(result)
    assert len(heavy) == 2 and all(w.regs == 240 and w.num_warps == 4 for w in heavy)
    assert sorted(sorted(n for n in w.ops if n.startswith("exp")) for w in heavy) == [["exp_a"], ["exp_b"]]
    assert sum({"dq_load", "dq_store"} <= set(w.ops) for w in heavy) == 1
    assert result.stats["modulo_ii"] < result.ii and result.status == "optimal"
    assert result.stats["blocked_by"]


def check_fa4_three_groups(reduced) -> None:
    """Twill-LR at FA4's compute budget: three register groups with FA4's roles: two groups apply the
    exponentials (one half of S each) and one stages dQ for the reduction."""
    heavy = register_groups(reduced)
    assert len(heavy) == 3 and all(w.regs <= FA4_COMPUTE_REGS for w in heavy)
    ops = sorted((sorted(w.ops) for w in heavy), key=len)
    assert ops[0] == ["dq_load", "dq_store"]
    assert {tuple(sorted({reduced.graph.op(n).attrs["subtile"] for n in group})) for group in ops[1:]} == {(0,), (1,)}


@pytest.mark.slow
def test_b200_flash_bwd_default_budget_pingpongs_exponentials_and_dq_staging():
    """:func:`check_two_exponential_groups` at U = 300, where TMEM is full (S | dV | dP | dK): ``blocked_by``
    says memory capacity."""
    result = solved("flash-bwd", "b200")
    check_two_exponential_groups(result)
    assert result.stats["blocked_by"] == ["memory_capacity"]


def test_b200_flash_bwd_default_budget_structure_at_a_coarser_resolution():
    """:func:`check_two_exponential_groups` at U = 40 (there the modulo-only II is blocked by the delay of
    the cross-warp transfers rather than by TMEM)."""
    check_two_exponential_groups(solved("flash-bwd", "b200", resolution=COARSE))


@pytest.mark.slow
def test_b200_flash_bwd_reduced_budget_gives_fa4s_three_groups():
    check_fa4_three_groups(solved("flash-bwd", "b200", reg_limit=FA4_COMPUTE_REGS))


def test_b200_flash_bwd_reduced_budget_three_groups_at_a_coarser_resolution():
    check_fa4_three_groups(solved("flash-bwd", "b200", reg_limit=FA4_COMPUTE_REGS, resolution=COARSE))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "not reproduced: with our B200 costs the dQ staging (640 raw cycles) fits in the slack of a 240-register "
    "exponential group (928 cycles of a ~2900-cycle II), so the default budget's two groups reach the same II "
    "as FA4's three (221 at U = 300, both bound by TMEM capacity; docs/kernels.md, flash-bwd)"))
def test_b200_flash_bwd_reduced_budget_gives_a_smaller_ii():
    default = solved("flash-bwd", "b200")
    reduced = solved("flash-bwd", "b200", reg_limit=FA4_COMPUTE_REGS)
    assert reduced.ii < default.ii
