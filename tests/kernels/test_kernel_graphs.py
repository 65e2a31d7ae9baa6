"""Built-in kernel graphs: roles, attributes, architecture-specific structure (no solver)."""

from __future__ import annotations

import pytest

from twill.errors import TwillError
from twill.ir.validate import validate_graph
from twill.kernels import build_kernel
from twill.machine import get_machine

ARCHS = ("h100", "b200")

ROLES = {
    "gemm": {"load_a", "load_b", "mma", "mma_wait"},
    "flash-fwd": {"load_k", "load_v", "qk", "s_load", "rowmax", "alpha", "exp", "rowsum", "p_store", "o_load",
                  "rescale", "o_store", "pv"},
    "flash-bwd": {"load_q", "load_do", "load_stats", "qk", "dp", "s_load", "exp", "p_cvt", "p_store", "dp_load",
                  "ds", "ds_store", "dv", "dk", "dq", "dq_load", "dq_store", "dq_atomic"},
}

BLACKWELL_ONLY = {"s_load", "o_load", "o_store", "dp_load", "dq_load"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel,options", [
    ("gemm", {}), ("gemm", {"block_n": 256, "block_k": 128}), ("flash-fwd", {}),
    ("flash-fwd", {"subtiles": 2}), ("flash-fwd", {"subtiles": 2, "head_dim": 64}), ("flash-bwd", {}),
])
def test_every_op_has_a_known_role_and_the_graph_validates(kernel, options, arch):
    machine = get_machine(arch)
    graph = build_kernel(kernel, machine, **options)
    validate_graph(graph, machine.units)
    for op in graph.ops:
        assert op.attrs.get("role") in ROLES[kernel], op.name
    for key in ("block_m", "block_n", "dtype", "subtiles"):
        assert key in graph.attrs
    assert ("block_k" in graph.attrs) or ("head_dim" in graph.attrs)


@pytest.mark.parametrize("arch", ARCHS)
def test_streaming_loads_are_variable_latency_with_zero_latency(arch):
    graph = build_kernel("flash-fwd", get_machine(arch), subtiles=2)
    for name in ("load_k", "load_v"):
        op = graph.op(name)
        assert op.variable_latency and graph.is_streaming(name)
        assert all(e.delay == 0 for e in graph.out_edges(name))


def test_gemm_roles_and_the_blocking_wait():
    graph = build_kernel("gemm", get_machine("h100"))
    assert [graph.op(n).attrs["role"] for n in graph.op_names] == ["load_a", "load_b", "mma", "mma_wait"]
    wait_edges = [e for e in graph.edges if e.dst == "mma_wait"]
    assert len(wait_edges) == 1 and wait_edges[0].blocking and wait_edges[0].src == "mma"
    assert graph.op("mma_wait").kind == "mma_wait" and not graph.op("mma_wait").units()
    assert graph.op("mma").attrs["k"] == 64


def test_hopper_mma_is_a_warp_group_op_accumulating_in_registers():
    graph = build_kernel("flash-fwd", get_machine("h100"), subtiles=2)
    qk = graph.op("qk_a")
    assert qk.kind == "mma" and qk.warps == 4 and qk.regs > 0 and qk.tmem == 0
    assert not any(graph.op(n).attrs["role"] in BLACKWELL_ONLY for n in graph.op_names)


def test_blackwell_uses_tcgen05_into_tmem_and_explicit_tmem_moves():
    graph = build_kernel("flash-fwd", get_machine("b200"), subtiles=2)
    qk = graph.op("qk_a")
    assert qk.kind == "mma" and qk.warps == 1 and qk.regs == 0 and qk.tmem > 0
    kinds = {graph.op(n).kind for n in graph.op_names}
    assert {"tmem_load", "tmem_store"} <= kinds
    assert all(e.blocking for e in graph.edges if e.src == "qk_a")


def test_subtiles_split_the_q_block_and_share_kv_loads():
    graph = build_kernel("flash-fwd", get_machine("h100"), subtiles=2)
    subtiled = [n for n in graph.op_names if "subtile" in graph.op(n).attrs]
    assert {graph.op(n).attrs["subtile"] for n in subtiled} == {0, 1}
    assert "subtile" not in graph.op("load_k").attrs
    assert {e.dst for e in graph.out_edges("load_k")} == {"qk_a", "qk_b"}
    whole = build_kernel("flash-fwd", get_machine("h100"), subtiles=1)
    assert whole.op("qk").usage("tc") == 2 * graph.op("qk_a").usage("tc")


def test_flash_bwd_has_five_gemms_one_exp_and_the_dq_atomic_add():
    for arch in ARCHS:
        graph = build_kernel("flash-bwd", get_machine(arch))
        mmas = sorted(n for n in graph.op_names if graph.op(n).kind == "mma")
        assert mmas == ["dk", "dp", "dq", "dv", "qk"]
        exps = [n for n in graph.op_names if graph.op(n).kind == "exp2"]
        assert exps == (["exp_a", "exp_b"] if arch == "b200" else ["exp"])
        atomic = graph.op("dq_atomic")
        assert atomic.variable_latency and not graph.is_streaming("dq_atomic")


def test_blackwell_flash_bwd_has_fa4s_tiles_stages_and_tmem_layout():
    """FA4 (flash_bwd_sm100.py): 128x128 tiles, S^T/dP^T column halves on two compute groups, Q in two
    shared-memory stages and dO in one, TMEM = S | dV | dP | dK with P over S and dS, dQ over dP."""
    machine = get_machine("b200")
    graph = build_kernel("flash-bwd", machine)
    assert (graph.attrs["block_m"], graph.attrs["block_n"], graph.attrs["subtiles"]) == (128, 128, 2)
    assert graph.least_depth("load_q", 2) == 2 and graph.least_depth("load_do", 2) == 1
    assert sum(op.tmem for op in graph.ops) == machine.tmem_bytes
    assert {graph.op(f"exp_{x}").attrs["subtile"] for x in "ab"} == {0, 1}
    # S half in fp32 registers (64/thread), dP and dS one 32-column chunk at a time (32/thread), dS in place.
    assert graph.op("s_load_a").regs == 64 and graph.op("dp_load_a").regs == 32
    assert graph.op("ds_a").regs == 32 and graph.op("ds_a").attrs["in_place"]
    war = {(e.src, e.dst, e.distance) for e in graph.edges}
    assert {("dv", "qk", 1), ("dk", "dp", 1), ("dk", "dq", 0), ("dq_load", "dp", 1)} <= war


def test_unknown_or_invalid_option_is_a_one_line_error():
    with pytest.raises(TwillError, match="no option"):
        build_kernel("gemm", get_machine("h100"), head_dim=64)
    with pytest.raises(TwillError, match="subtiles must be one of"):
        build_kernel("flash-fwd", get_machine("h100"), subtiles=4)
    with pytest.raises(TwillError, match=r"subtiles must be one of \[1, 2\] on b200, got 3"):
        build_kernel("flash-fwd", get_machine("b200"), subtiles=3)
    with pytest.raises(TwillError, match="block_m 128 does not split into 3 sub-tiles"):
        build_kernel("flash-fwd", get_machine("h100"), subtiles=3, block_m=128)


def test_three_hopper_subtiles_share_the_kv_loads_on_a_register_file_split():
    """``--subtiles 3`` on Hopper: BLOCK_M 192 in three 64-row sub-tiles ``_a``/``_b``/``_c`` that read the same
    K/V loads, and a register budget at which three 4-warp compute groups and a 4-warp producer group at the
    setmaxnreg minimum fit the register file (two sub-tiles keep FA3's 240)."""
    h100 = get_machine("h100")
    graph = build_kernel("flash-fwd", h100, subtiles=3, head_dim=64)
    assert graph.attrs["block_m"] == 192
    qks = [op for op in graph.ops if op.attrs.get("role") == "qk"]
    assert [op.name for op in qks] == ["qk_a", "qk_b", "qk_c"] and {op.attrs["m"] for op in qks} == {64}
    assert {e.dst for e in graph.out_edges("load_k")} == {"qk_a", "qk_b", "qk_c"}
    budget = graph.attrs["reg_limit"]
    assert 3 * 128 * budget + 128 * h100.setmaxnreg_min <= h100.regs_per_sm
    assert 3 * 128 * (budget + h100.setmaxnreg_step) + 128 * h100.setmaxnreg_min > h100.regs_per_sm
    assert build_kernel("flash-fwd", h100, subtiles=2).attrs["reg_limit"] == 240


def test_flash_fwd_head_dim_256_defaults_to_the_ops_tile():
    """At head dim 256 on Hopper, ``subtiles`` and ``block_n`` left out are 2 and 64 (twill.ops's D = 256
    tile); given ones win; other head dims and Blackwell keep one sub-tile of 128 keys."""
    h100, b200 = get_machine("h100"), get_machine("b200")
    wide = build_kernel("flash-fwd", h100, head_dim=256)
    assert (wide.attrs["subtiles"], wide.attrs["block_n"], wide.attrs["block_m"]) == (2, 64, 128)
    assert wide == build_kernel("flash-fwd", h100, head_dim=256, subtiles=2, block_n=64)
    given = build_kernel("flash-fwd", h100, head_dim=256, subtiles=1, block_n=128)
    assert (given.attrs["subtiles"], given.attrs["block_n"]) == (1, 128)
    for machine, head_dim in ((h100, 128), (h100, 64), (b200, 256)):
        graph = build_kernel("flash-fwd", machine, head_dim=head_dim)
        assert (graph.attrs["subtiles"], graph.attrs["block_n"]) == (1, 128)
