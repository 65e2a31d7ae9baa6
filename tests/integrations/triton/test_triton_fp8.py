"""fp8 ``tl.dot`` in the Triton frontend (issue 35): an fp8 matmul and a block-scaled fp8 GEMM get warp-specialized
schedules (a load group and a group that runs the wgmma), the product added outside the wgmma is modelled as
Triton emits it, and injection compiles to the e4m3 wgmma."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.integrations.triton import graph_from_target  # noqa: E402
from twill.ir.semantics import read_cycles  # noqa: E402
from twill.machine import get_machine  # noqa: E402
from twill.schedule.verify import verify  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

DATA = Path(__file__).resolve().parents[2] / "data"
FAMILIES = DATA / "triton_families.py"
sys.path.insert(0, str(DATA))
import triton_families as F  # noqa: E402

H100 = get_machine("h100")
TILES = ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=128")


def _graph(fn: str, signature: str, constexprs, num_warps: int = 8):
    return graph_from_target(FAMILIES, fn, signature=signature, constexprs=list(constexprs), num_warps=num_warps,
                             num_stages=3, machine=H100)


def _ws_schedule(graph):
    pytest.importorskip("ortools")
    from twill.solve import SolveOptions, schedule

    result = schedule(graph, H100, SolveOptions(time_limit=60))
    verify(result, H100)
    return result


def _groups(result) -> dict[str, set[str]]:
    return {g.role: set(g.ops) for g in result.warps}


def test_fp8_dot_with_accumulator_is_one_in_place_mma():
    g = _graph("matmul_fp8", F.FP8_SIGNATURE, TILES + ("PROMOTE=False",))
    assert [op.kind for op in g.ops if op.kind not in ("tma_load", "load")] == ["mma"]
    mma = g.op("mma")
    assert mma.attrs["dtype"] == "fp8" and (mma.attrs["m"], mma.attrs["n"], mma.attrs["k"]) == (128, 128, 128)
    assert ("mma", "mma", 1) in {(e.src, e.dst, e.distance) for e in g.edges}
    assert g.op("load_a").smem == g.op("load_b").smem == 128 * 128


def test_fp8_product_added_outside_the_wgmma_is_an_in_place_add():
    """Triton 3.6 on sm_90 keeps ``acc += tl.dot(a, b)`` of fp8 as a wgmma from zero and an fp32 add: the add
    updates the sum in place and frees the product as it reads it; the product is a second tile of registers,
    live while the wgmma runs."""
    g = _graph("matmul_fp8", F.FP8_SIGNATURE, TILES + ("PROMOTE=True",))
    add = next(op for op in g.ops if op.kind == "alu")
    assert add.attrs["mlir_op"] == "arith.addf" and add.attrs["in_place"]
    edges = {(e.src, e.dst, e.distance) for e in g.edges}
    assert ("mma", add.name, 0) in edges and (add.name, add.name, 1) in edges and ("mma", "mma", 1) not in edges
    assert g.op("mma").regs == add.regs == 64          # 128 x 128 fp32 over 8 warps, each
    assert read_cycles(g, "mma", add.name) == 0


@pytest.mark.parametrize("promote", [False, True])
def test_fp8_matmul_schedules_with_warp_specialization(promote):
    g = _graph("matmul_fp8", F.FP8_SIGNATURE, TILES + (f"PROMOTE={promote}",))
    result = _ws_schedule(g)
    groups = _groups(result)
    assert len(result.warps) > 1 and groups["load"] == {"load_a", "load_b"}
    compute = next(ops for ops in groups.values() if "mma" in ops)
    assert compute == {op.name for op in g.ops if op.kind in ("mma", "alu")}
    # tensor-core bound: one 128 x 128 x 128 fp8 wgmma per iteration
    assert result.status == "optimal" and result.ii == result.stats["res_mii"]


def test_block_scaled_fp8_gemm_schedules_with_warp_specialization():
    g = _graph("matmul_fp8_block_scaled", F.FP8_SCALED_SIGNATURE, TILES)
    assert g.op("mma").attrs["dtype"] == "fp8"
    scales = [op for op in g.ops if op.kind == "load"]
    assert len(scales) == 2 and all(op.attrs["dtype"] == "fp32" for op in scales)
    chain = [op for op in g.ops if op.kind == "alu"]
    assert sorted(op.attrs["mlir_op"] for op in chain) == ["arith.addf", "arith.mulf", "arith.mulf"]
    assert all(op.attrs["in_place"] for op in chain)
    result = _ws_schedule(g)
    groups = _groups(result)
    assert len(result.warps) > 1 and groups["load"] == {"load_a", "load_b"} | {op.name for op in scales}
    # the scaled product and the sum stay with the wgmma's warps: no tile crosses groups
    compute = next(ops for ops in groups.values() if "mma" in ops)
    assert compute == {"mma"} | {op.name for op in chain}
    assert result.status == "optimal" and result.ii == result.stats["res_mii"]


def test_fp8_matmul_injects_the_e4m3_wgmma(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    args = [f"{FAMILIES}:matmul_fp8", "--signature", F.FP8_SIGNATURE, "--num-warps", "8",
            *[a for c in TILES + ("PROMOTE=True",) for a in ("--constexpr", c)]]
    assert main(["inject", *args, "--time-limit", "30", "-o", str(tmp_path / "k")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "optimal" and [b["dtype"] for b in summary["buffers"]] == ["f8E4M3FN"] * 2
    ptx = (tmp_path / "k" / "matmul_fp8.ptx").read_text()
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ptx
    assert main(["schedule", *args, "--no-ws", "-o", str(tmp_path / "s.json")]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["status"] == "optimal" and not doc.get("warps")


@pytest.mark.parametrize("fn,constexprs,num_warps,spills", [
    ("matmul_fp8", ("PROMOTE=False",), 4, False),
    ("matmul_fp8", ("PROMOTE=True",), 4, True),
    ("matmul_fp8_block_scaled", (), 8, False),
])
def test_registers_of_the_product_added_outside_the_wgmma_are_real(fn, constexprs, num_warps, spills):
    """ptxas on Triton's own schedule agrees with the model's count: the product and the sum, each 128 x 128
    fp32, overflow 4 warps' registers (the sum kept in the wgmma does not); over 8 warps they fit."""
    from twill.integrations.triton import kernel_spec
    from twill.integrations.triton.compile import compile_with_edit
    from twill.ir.semantics import in_place
    from twill.solve.joint.problem import reg_limit_for
    from twill.tune.spills import ptxas_report

    signature = F.FP8_SIGNATURE if fn == "matmul_fp8" else F.FP8_SCALED_SIGNATURE
    spec = kernel_spec(getattr(F, fn), signature=signature, constexprs=TILES + constexprs, num_warps=num_warps,
                       num_stages=3, machine=H100)
    kernel, _ = compile_with_edit(spec, None)
    report = ptxas_report(kernel.asm["ptx"], 90)
    assert (report["spill_bytes"] > 0) is spills
    g = _graph(fn, signature, TILES + constexprs, num_warps=num_warps)
    # the sum, held across iterations, plus the product, live while the wgmma runs
    held = sum(op.regs for op in g.ops if in_place(g, op.name)) + (0 if in_place(g, "mma") else g.op("mma").regs)
    assert (held > reg_limit_for(g, H100, None) - H100.reserved_regs(g.attrs)) is spills
