"""Machine models and the cost model's anchor numbers."""

from __future__ import annotations

import pytest

from twill.errors import MachineError, UnsupportedFeatureError
from twill.machine import (B200, H100, H200, MACHINES, alu_cost, exp2_cost, get_machine, mma_cost,
                           regs_per_thread, tma_load_cost, tmem_cost)


def test_lookup_is_case_insensitive_and_errors_name_the_choices():
    assert get_machine("H100") is H100 and get_machine("b200") is B200
    assert set(MACHINES) == {"h100", "h200", "b200"}
    with pytest.raises(MachineError, match=r"unknown architecture 'a100' \(known: h100, h200, b200\)"):
        get_machine("a100")


def test_peak_rates_match_datasheets():
    assert H100.peak_tflops("fp16") == pytest.approx(989.4, rel=0.01)
    assert B200.peak_tflops("fp16") == pytest.approx(2255, rel=0.01)
    assert H200.units == H100.units and "tmem" in B200.units and "tmem" not in H100.units


def test_paper_anchor_gemm_and_exp_cost_the_same_on_hopper():
    gemm = mma_cost(H100, 128, 128, 128)
    exp = exp2_cost(H100, 128 * 128)
    assert gemm.cycles == 1024 and gemm.uses == {"tc": 1} and gemm.warp_busy == 32
    assert exp.cycles == 1024 and exp.uses == {"mufu": 1}
    assert mma_cost(B200, 128, 128, 128).cycles == 512          # exp becomes the bottleneck on Blackwell
    assert len(gemm.rrt()) == 1024


def test_other_costs():
    assert alu_cost(H100, 128 * 128).cycles == 128
    load = tma_load_cost(H100, 32768)
    assert (load.cycles, load.latency, load.uses) == (1, 0, {"tma": 1})
    assert regs_per_thread(128, 128, "fp32", 4) == 128
    with pytest.raises(UnsupportedFeatureError, match="no tensor memory"):
        tmem_cost(H100, 1024)
    with pytest.raises(UnsupportedFeatureError, match="no tensor-core rate for dtype 'i4'"):
        mma_cost(H100, 64, 64, 64, "i4")


def test_setmaxnreg_rounding():
    assert H100.round_regs(1) == 24 and H100.round_regs(233) == 240 and H100.round_regs(300) == 256


def test_int8_tensor_core_rate_is_the_fp8_rate():
    from twill.machine.costs import mma_cost

    for m in (H100, B200):
        assert m.tc_flops_per_clk["i8"] == m.tc_flops_per_clk["fp8"]
        assert mma_cost(m, 128, 128, 128, "i8").cycles == 2 * 128 ** 3 // m.tc_flops_per_clk["i8"]
