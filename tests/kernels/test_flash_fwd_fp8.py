"""The fp8 attention forward (``flash-fwd --dtype fp8e4m3|fp8e5m2``, issue 35): its loop graph, its costs at the
``fp8`` tensor-core rate, the V transpose (in the loop or a pre-pass priced by the tuner) and its schedules."""

from __future__ import annotations

import pytest

from twill.errors import TwillError
from twill.ir.validate import validate_graph
from twill.kernels import build_kernel
from twill.kernels.flash_fwd import tune
from twill.machine import get_machine
from twill.machine.costs import DTYPE_BYTES, mma_cost, rate_dtype
from twill.tune.predict import Shape

H100 = get_machine("h100")


def test_fp8_formats_are_priced_at_the_machine_tables_fp8_rate():
    assert rate_dtype("fp8e4m3") == rate_dtype("fp8e5m2") == "fp8"
    assert rate_dtype("bf16") == "bf16"
    assert DTYPE_BYTES["fp8e4m3"] == DTYPE_BYTES["fp8e5m2"] == 1
    assert mma_cost(H100, 64, 128, 128, "fp8e4m3").cycles * 2 == mma_cost(H100, 64, 128, 128, "bf16").cycles


@pytest.mark.parametrize("dtype", ["fp8e4m3", "fp8e5m2"])
def test_fp8_graph_converts_p_and_transposes_v_in_the_loop(dtype):
    graph = build_kernel("flash-fwd", H100, dtype=dtype, v_transpose="kernel")
    validate_graph(graph, H100.units)
    bf16 = build_kernel("flash-fwd", H100, dtype="bf16")
    assert graph.attrs["instr_k"] == 32 and graph.attrs["v_transpose"] == "kernel"
    assert "instr_k" not in bf16.attrs and "v_transpose" not in bf16.attrs
    for role in ("qk", "pv"):
        assert graph.op(role).cycles * 2 == bf16.op(role).cycles       # the fp8 rate is twice the bf16 rate
    assert graph.attrs["smem_resident"] * 2 == bf16.attrs["smem_resident"]   # the Q tile: one byte an element
    assert graph.op("load_k").smem * 2 == bf16.op("load_k").smem
    # P: exp writes fp32 over S, convert packs it into a quarter of the registers for the P V wgmma
    exp, convert = graph.op("exp"), graph.op("convert")
    assert exp.attrs["in_place"] and exp.regs == graph.op("qk").regs
    assert convert.regs * 4 == exp.regs and convert.usage("alu") > 0
    assert {(e.src, e.dst) for e in graph.edges} >= {("exp", "convert"), ("convert", "pv"), ("exp", "rowsum")}
    assert not any(e.src == "exp" and e.dst == "pv" for e in graph.edges)
    # V: loaded, transposed in shared memory (twice its bytes on the smem pipe), then read by P V
    transpose = graph.op("v_transpose")
    assert transpose.kind == "smem_transpose" and transpose.smem == graph.op("load_v").smem
    assert transpose.usage("smem") > 0 and transpose.cycles == 2 * transpose.smem // H100.smem_bytes_per_clk
    assert [e.src for e in graph.in_edges("pv")].count("v_transpose") == 1
    assert all(e.dst == "v_transpose" for e in graph.out_edges("load_v"))


def test_fp8_prepass_loads_v_transposed_and_prices_the_pass_outside_the_loop():
    graph = build_kernel("flash-fwd", H100, dtype="fp8e4m3", v_transpose="prepass", kv_heads=2)
    names = set(graph.op_names)
    assert "v_transpose" not in names and "convert" in names
    load_v = graph.op("load_v")
    assert (load_v.attrs["rows"], load_v.attrs["cols"]) == (128, 64 * 2)          # V^T tile [head_dim, block_n]
    assert any(e.src == "load_v" and e.dst == "pv" and e.delay == 0 for e in graph.edges)
    shape = Shape("attention", (4, 32, 4096, 128))
    passes = tune.extra_passes(graph, shape, H100)
    moved = 2 * 4 * 2 * 4096 * 128     # one read and one write of V: B * kv_heads * S * D bytes each
    assert passes["passes_us"] == pytest.approx(moved / H100.dram_bytes_per_s * 1e6 + H100.launch_us)
    assert tune.extra_passes(build_kernel("flash-fwd", H100, dtype="fp8e4m3", v_transpose="kernel"), shape,
                             H100) == {}
    assert build_kernel("flash-fwd", H100, dtype="fp8e4m3").attrs["v_transpose"] == "prepass"   # the default
    # the fp8 forward stores a bf16 O
    assert tune.stored_from_registers(graph, 1) == graph.attrs["block_m"] * 128 * 2


@pytest.mark.parametrize("options,message", [
    ({"dtype": "bf16", "v_transpose": "kernel"}, "v_transpose applies to the fp8 dtypes"),
    ({"dtype": "fp8e4m3", "v_transpose": "sideways"}, "sideways"),
    ({"dtype": "fp8"}, "fp8"),
])
def test_fp8_option_errors_are_one_line(options, message):
    with pytest.raises(TwillError, match=message) as err:
        build_kernel("flash-fwd", H100, **options)
    assert "\n" not in str(err.value)


def test_fp8_is_hopper_only():
    with pytest.raises(TwillError, match="Hopper only"):
        build_kernel("flash-fwd", get_machine("b200"), dtype="fp8e4m3")


@pytest.mark.parametrize("head_dim,v_transpose", [(64, "prepass"), (128, "prepass"), (256, "prepass"),
                                                   (128, "kernel"), (256, "kernel")])
def test_fp8_schedules_solve_and_verify(head_dim, v_transpose):
    """``twill schedule flash-fwd --dtype fp8e4m3 --head-dim D`` solves; the schedule passes the verifier. At
    D = 256 (two sub-tiles, tensor-core bound in both dtypes) the II is about half the bf16 one."""
    pytest.importorskip("ortools")
    from twill.schedule.verify import violations
    from twill.solve import schedule

    graph = build_kernel("flash-fwd", H100, dtype="fp8e4m3", head_dim=head_dim, v_transpose=v_transpose)
    result = schedule(graph, H100)
    assert result.status in ("optimal", "feasible")
    assert violations(result, H100) == []
    roles = {result.graph.op(n).attrs["role"] for n in result.assignment}
    assert "convert" in roles and ("v_transpose" in roles) == (v_transpose == "kernel")
    if head_dim == 256:
        bf16 = schedule(build_kernel("flash-fwd", H100, dtype="bf16", head_dim=head_dim), H100)

        def raw(s):
            return s.ii * s.stats["normalization"]["cycles_per_unit"]

        assert 0.4 < raw(result) / raw(bf16) < 0.6
