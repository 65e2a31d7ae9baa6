"""Triton frontend: TTGIR capture on the CPU, loop-body lowering, roles, edges, errors, II vs built-ins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from triton_targets import KERNELS, triton_graph, triton_module  # noqa: E402
from twill.errors import TwillError, UnsupportedFeatureError  # noqa: E402
from twill.integrations.triton import graph_from_target, graph_from_ttgir, lower_ttgir  # noqa: E402
from twill.integrations.triton.compile import (KernelSpec, parse_constexprs, parse_signature,  # noqa: E402
                                               require_triton)
from twill.ir import graph_from_dict, graph_to_dict, validate_graph  # noqa: E402
from twill.machine import get_machine  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "flash_fwd_sm90_prepipeline.ttgir"

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")


@pytest.fixture(scope="module")
def matmul():
    return triton_graph("matmul", "matmul_kernel")


@pytest.fixture(scope="module")
def flash():
    return triton_graph("flash_fwd", "attn_fwd")


@pytest.fixture(scope="module")
def flash_subtiled():
    return triton_graph("flash_fwd_subtiled", "attn_fwd_subtiled")


def _edges(graph):
    return {(e.src, e.dst, e.distance): e for e in graph.edges}


# -- signature / constexpr parsing ------------------------------------------------------------------------
def test_signature_parsing():
    args = parse_signature("a_ptr=*fp16:16,M=i32:16,scale=fp32")
    assert [(a.name, a.type, a.divisible) for a in args] == [("a_ptr", "*fp16", True), ("M", "i32", True),
                                                              ("scale", "fp32", False)]
    desc = parse_signature("d=tensordesc<fp16[128, 64]>,n=i32")
    assert desc[0].type == "tensordesc<fp16[128, 64]>" and not desc[0].divisible


@pytest.mark.parametrize("bad", ["", "a_ptr", "a_ptr=*fp16:8", "1x=i32"])
def test_signature_errors_are_one_line(bad):
    with pytest.raises(TwillError) as info:
        parse_signature(bad)
    assert "\n" not in str(info.value)


def test_constexpr_parsing():
    assert parse_constexprs(["BLOCK_M=128", "SCALE=0.5", "CAUSAL=False", "MODE=fast"]) == {
        "BLOCK_M": 128, "SCALE": 0.5, "CAUSAL": False, "MODE": "fast"}
    with pytest.raises(TwillError, match="NAME=VALUE"):
        parse_constexprs(["BLOCK_M"])


def test_missing_argument_and_constexpr_are_reported():
    mod = triton_module("matmul")
    with pytest.raises(TwillError, match="argument 'K' is missing"):
        graph_from_target(KERNELS / "matmul.py", "matmul_kernel", signature="a_ptr=*fp16:16,b_ptr=*fp16:16,"
                          "c_ptr=*fp16:16,M=i32:16,N=i32:16", constexprs=list(mod.CONSTEXPRS), num_warps=8,
                          num_stages=3, machine=get_machine("h100"))
    with pytest.raises(TwillError, match="constexpr 'BLOCK_K' has no value"):
        graph_from_target(KERNELS / "matmul.py", "matmul_kernel", signature=mod.SIGNATURE,
                          constexprs=["BLOCK_M=128", "BLOCK_N=128"], num_warps=8, num_stages=3,
                          machine=get_machine("h100"))
    with pytest.raises(TwillError, match="has no function 'nope'"):
        graph_from_target(KERNELS / "matmul.py", "nope", signature=mod.SIGNATURE, constexprs=[], num_warps=8,
                          num_stages=3, machine=get_machine("h100"))


def test_other_triton_version_is_refused(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    with pytest.raises(UnsupportedFeatureError, match="Triton 3.5.1 .* 3.6.0"):
        require_triton()


def test_unsupported_capability_is_refused():
    with pytest.raises(UnsupportedFeatureError, match="capability 80"):
        KernelSpec(fn=None, signature=(), constexprs={}, capability=80)


# -- extracted graphs -------------------------------------------------------------------------------------
def test_matmul_graph(matmul):
    assert [(op.name, op.kind) for op in matmul.ops] == [("load_a", "tma_load"), ("load_b", "tma_load"),
                                                         ("mma", "mma")]
    mma = matmul.op("mma")
    assert (mma.attrs["m"], mma.attrs["n"], mma.attrs["k"]) == (128, 128, 64)
    assert mma.cycles == 2 * 128 * 128 * 64 // 4096 and mma.regs == 128 * 128 * 4 // 4 // 256
    assert mma.attrs["mlir_op"] == "ttng.warp_group_dot" and re.match(r"matmul\.py:\d+:\d+", mma.attrs["loc"])
    for load in ("load_a", "load_b"):
        op = matmul.op(load)
        assert op.variable_latency and op.smem == 128 * 64 * 2 and matmul.is_streaming(load)
    edges = _edges(matmul)
    assert set(edges) == {("load_a", "mma", 0), ("load_b", "mma", 0), ("mma", "mma", 1)}
    assert edges[("mma", "mma", 1)].delay == mma.cycles and edges[("mma", "mma", 1)].blocking
    assert matmul.attrs["block_k"] == 64 and matmul.attrs["arch"] == "sm_90" and matmul.attrs["num_warps"] == 8
    validate_graph(matmul, get_machine("h100").units)


def test_flash_graph_roles_and_edges(flash):
    roles = {op.attrs["role"]: op for op in flash.ops}
    for role in ("load_k", "load_v", "qk", "rowmax", "exp", "alpha", "rowsum", "rescale", "pv"):
        assert role in roles, role
    kinds = {op.name: op.kind for op in flash.ops}
    assert kinds["qk"] == kinds["pv"] == "mma" and kinds["exp"] == "exp2" and kinds["rowmax"] == "reduce"
    assert kinds["acc_convert_layout"] == "convert" and set(flash.op("acc_convert_layout").units()) == {"smem"}
    assert flash.op("exp").cycles == 128 * 128 // 16 and set(flash.op("exp").units()) == {"mufu"}
    assert flash.op("rowmax").attrs["combiner"] == "max" and flash.op("rowsum").attrs["combiner"] == "sum"
    edges = _edges(flash)
    assert edges[("load_k", "qk", 0)].delay == 0
    assert edges[("qk", "rowmax", 0)].blocking and edges[("qk", "rowmax", 0)].delay == 1024
    assert ("pv", "rescale", 1) in edges and ("rescale", "pv", 0) in edges and ("load_v", "pv", 0) in edges
    assert ("m_ij_maxnumf", "m_ij_maxnumf", 1) in edges          # running max carried to the next iteration
    assert ("alpha", "rescale", 0) in edges and ("exp", "rowsum", 0) in edges
    # index arithmetic (the K/V row offset) is folded: no integer op becomes a node
    assert not any(op.attrs["mlir_op"].startswith(("arith.addi", "arith.muli")) for op in flash.ops)
    assert all(not name.startswith("offset") for name in flash.op_names)
    validate_graph(flash, get_machine("h100").units)


def test_subtiled_flash_graph(flash_subtiled):
    g = flash_subtiled
    assert g.attrs["subtiles"] == 2
    for role in ("qk", "exp", "pv", "rowmax", "rowsum", "rescale", "alpha"):
        subs = sorted(op.attrs.get("subtile") for op in g.ops if op.attrs["role"] == role)
        assert subs == [0, 1], role
    assert {"qk_a", "qk_b", "pv_a", "pv_b", "exp_a", "exp_b"} <= set(g.op_names)
    for load in ("load_k", "load_v"):
        assert "subtile" not in g.op(load).attrs
    edges = _edges(g)
    assert ("load_k", "qk_a", 0) in edges and ("load_k", "qk_b", 0) in edges
    assert ("pv_a", "rescale_a", 1) in edges and ("pv_b", "rescale_b", 1) in edges
    assert not any(e.src.endswith("_a") and e.dst.endswith("_b") for e in g.edges)


def test_blackwell_flash_graph_uses_tmem():
    g = triton_graph("flash_fwd", "attn_fwd", "b200")
    roles = {op.attrs["role"] for op in g.ops}
    assert {"s_load", "p_store", "o_load", "o_store", "qk", "pv"} <= roles
    qk = next(op for op in g.ops if op.attrs["role"] == "qk")
    assert qk.attrs["mlir_op"] == "ttng.tc_gen5_mma" and qk.tmem == 128 * 128 * 4 and qk.regs == 0
    assert qk.warps == 1 and qk.cycles == 2 * 128 ** 3 // 8192
    edges = _edges(g)
    assert ("qk", "s_load", 0) in edges and edges[("qk", "s_load", 0)].blocking
    assert ("pv", "o_load", 1) in edges
    validate_graph(g, get_machine("b200").units)


def test_graph_round_trips_through_json(flash):
    again = graph_from_dict(graph_to_dict(flash))
    assert again == flash and dict(again.op("qk").attrs) == dict(flash.op("qk").attrs)


# -- .ttgir input and errors ------------------------------------------------------------------------------
def test_ttgir_file_gives_the_same_graph_as_the_kernel(tmp_path, flash):
    from twill.integrations.triton import kernel_spec, lower_function

    mod = triton_module("flash_fwd")
    spec = kernel_spec(mod.attn_fwd, signature=mod.SIGNATURE, constexprs=list(mod.CONSTEXPRS),
                       num_warps=mod.NUM_WARPS, num_stages=mod.NUM_STAGES, machine="h100")
    _, text = lower_function(spec, get_machine("h100"))
    path = tmp_path / "fa.ttgir"
    path.write_text(text)
    g = graph_from_ttgir(path, "h100")
    assert g.op_names == flash.op_names and set(_edges(g)) == set(_edges(flash))


def test_shipped_sample_ttgir():
    g = graph_from_ttgir(SAMPLE, "h100")
    assert [op.attrs["role"] for op in g.ops if op.kind == "mma"] == ["qk", "pv"]
    assert g.attrs["arch"] == "sm_90" and g.attrs["num_warps"] == 8


def test_unsupported_ops_are_listed_in_one_error():
    text = SAMPLE.read_text()
    text = re.sub(r"(%alpha_\d+) = math\.exp2 (%alpha)", r"\1 = tt.histogram \2", text, count=1)
    text = text.replace("arith.truncf %p", "tt.elementwise_inline_asm %p", 1)
    with pytest.raises(UnsupportedFeatureError) as info:
        lower_ttgir(text, get_machine("h100"))
    msg = str(info.value)
    assert re.search(r"tt.histogram \(\w+\.py:\d+, TTGIR line \d+\)", msg) and "\n" not in msg
    assert re.search(r"tt.elementwise_inline_asm \(\w+\.py:\d+, TTGIR line \d+\)", msg)


def test_pipelined_ttgir_is_refused():
    text = re.sub(r"= ttng\.warp_group_dot ", "= ttng.warp_group_dot_wait ", SAMPLE.read_text(), count=1)
    with pytest.raises(UnsupportedFeatureError, match="already software pipelined"):
        lower_ttgir(text, get_machine("h100"))


def test_no_loop_is_an_error():
    with pytest.raises(UnsupportedFeatureError, match="no scf.for"):
        lower_ttgir('module { tt.func public @k() { tt.return } }', get_machine("h100"))


# -- scheduling: same II as the built-in hand-written graphs -----------------------------------------------
@pytest.mark.parametrize("case", ["gemm", "flash", "flash_subtiled"])
def test_same_ii_as_builtin_graph(case, matmul, flash, flash_subtiled):
    """Raw-cycle II (normalized II x cycles per unit) of the extracted and of the built-in graph agree to
    within normalization rounding (1%); both equal the tensor-core bound (sum of MMA cycles)."""
    pytest.importorskip("ortools")
    from twill.kernels import build_kernel
    from twill.solve import SolveOptions, schedule

    machine = get_machine("h100")
    graph, builtin = {
        "gemm": (matmul, build_kernel("gemm", machine, block_m=128, block_n=128, block_k=64)),
        "flash": (flash, build_kernel("flash-fwd", machine, block_m=128, block_n=128, head_dim=128)),
        "flash_subtiled": (flash_subtiled, build_kernel("flash-fwd", machine, subtiles=2, block_m=128,
                                                        block_n=128, head_dim=128)),
    }[case]
    raw = []
    for g in (graph, builtin):
        s = schedule(g, machine, SolveOptions(ws=False, time_limit=60))
        assert s.status == "optimal"
        raw.append(s.ii * s.stats["normalization"]["cycles_per_unit"])
    tc_bound = sum(op.cycles for op in graph.ops if op.kind == "mma")
    assert raw[0] == pytest.approx(raw[1], rel=0.01)
    assert raw[0] == pytest.approx(tc_bound, rel=0.01)
