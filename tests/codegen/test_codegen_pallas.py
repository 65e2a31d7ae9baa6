"""Pallas backend: schedules -> emitted JAX Pallas Mosaic GPU modules -> Mosaic GPU MLIR (no GPU needed).

Every variant is a different valid schedule of the same kernel (verified with twill.schedule.verify); the
emitted modules must differ accordingly and, where JAX is installed (the ``jax`` extra), the module each one
lowers to must show what the schedule asked for: wgmma shapes, ``wgmma.wait_group`` depths (the lag),
``setmaxnreg`` budgets and the rings' shared memory.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import replace
from functools import lru_cache

import pytest

from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
from twill.codegen.pallas import emit_pallas, pallas_plan, render_plan
from twill.errors import UnsupportedFeatureError
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.schedule.verify import verify

GEMM_CASES = [  # (block_m, block_n, lag, depth, warps)
    (128, 256, 1, 4, 8),
    (128, 256, 0, 3, 8),
    (128, 128, 1, 2, 8),
    (64, 128, 1, 4, 4),
]
FLASH_CASES = [  # (subtiles, head_dim, depth, grouped, ahead)
    (2, 128, 2, False, 0),
    (2, 128, 2, True, 0),
    (1, 128, 2, False, 0),
    (2, 64, 3, False, 0),
    (2, 128, 2, False, 1),
    (2, 64, 3, True, 1),
    (1, 64, 3, False, 1),
]


@lru_cache(maxsize=None)
def _gemm(bm, bn, lag, depth, warps):
    sched = gemm_schedule(build_kernel("gemm", H100, block_m=bm, block_n=bn, block_k=64), H100, lag=lag,
                          depth=depth, warps=warps)
    verify(sched, H100)
    return sched


@lru_cache(maxsize=None)
def _flash(subtiles, head_dim, depth, grouped, ahead):
    sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=subtiles, head_dim=head_dim), H100,
                           ahead=ahead, depth=depth, grouped=grouped)
    verify(sched, H100)
    return sched


def _load(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"twill_pallas_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- without JAX: the mapping --------------------------------------------------------------------------
def test_gemm_variants_emit_different_modules():
    sources = {(lag, depth): emit_pallas(_gemm(128, 256, lag, depth, 8)) for lag in (0, 1) for depth in (3, 4)}
    assert len(set(sources.values())) == 4
    assert "plgpu.wgmma_wait(DELAY_RELEASE)" in sources[(1, 3)]
    assert "DELAY_RELEASE        = 1  # wgmma wait lag: stage(mma_wait)=1 - stage(mma)=0" in sources[(1, 3)]
    assert "MAX_CONCURRENT_STEPS = 4" in sources[(0, 4)]
    for source in sources.values():
        compile(source, "gemm.py", "exec")


@pytest.mark.parametrize("bm,bn,lag,depth,warps", GEMM_CASES)
def test_gemm_knobs_follow_the_schedule(bm, bn, lag, depth, warps):
    sched = _gemm(bm, bn, lag, depth, warps)
    plan = pallas_plan(sched)
    source = emit_pallas(sched)
    assert f"MAX_CONCURRENT_STEPS = {plan.rings[0].depth}  # ring depth" in source
    assert f"DELAY_RELEASE        = {sched.stage('mma_wait') - sched.stage('mma')}  #" in source
    assert f"COMPUTE_WGS          = {warps // 4}  #" in source
    assert f"MEMORY_REGISTERS     = {plan.load.regs}  #" in source


@pytest.mark.parametrize("subtiles,head_dim,depth,grouped,ahead", FLASH_CASES)
def test_flash_turns_become_barrier_hand_offs(subtiles, head_dim, depth, grouped, ahead):
    plan = pallas_plan(_flash(subtiles, head_dim, depth, grouped, ahead))
    source = render_plan(plan)
    compile(source, "fa.py", "exec")
    lines = [line.strip() for line in source.splitlines()]
    waits, passes = lines.count("_take_turn()"), lines.count("_pass_turn()")
    if subtiles == 1:
        assert plan.turns == () and "_take_turn" not in source and "_pass_turn" not in source
    else:  # one wait before and one pass after each turn of a partition, per iteration
        assert waits == passes == plan.turn_counts[0]
        assert f"pl.when(wg == {plan.turns[0].partition})(_first_turn)" in source
    assert f"MAX_CONCURRENT_STEPS = {depth}  #" in source and f"HEAD_DIM             = {head_dim}  #" in source


def test_turn_order_of_the_schedule_changes_the_module():
    one = emit_pallas(_flash(2, 128, 2, True, 0))
    two = emit_pallas(_flash(2, 128, 2, False, 0))
    assert one != two
    assert [line.strip() for line in one.splitlines()].count("_take_turn()") == 1
    assert [line.strip() for line in two.splitlines()].count("_take_turn()") == 2


def test_partitions_that_differ_take_their_turn_under_pl_when():
    plan = pallas_plan(_flash(2, 128, 2, False, 0))
    first, second = plan.compute
    edited = replace(plan, partitions=(replace(first, turn_waits={first.roles["qk"]: 0}),
                                       replace(second, turn_waits={second.roles["pv"]: 0}), plan.load))
    source = render_plan(edited)
    assert "pl.when(wg == 0)(_take_turn)" in source and "pl.when(wg == 1)(_take_turn)" in source


def test_qk_a_stage_ahead_keeps_pv_in_flight_into_the_next_step():
    """stage(pv) - stage(qk) = 1: S(j) is read with one wgmma group (PV(j-1)) left in flight and V(j-1)'s buffer
    is released one step after it was read; with 0 the body runs in series and releases V in its step."""
    ahead = emit_pallas(_flash(2, 128, 2, False, 1))
    serial = emit_pallas(_flash(2, 128, 2, False, 0))
    assert "plgpu.wgmma_accumulator_load(s_ref, wait_n=1)" in ahead and "wait_n=1" not in serial
    assert "pl.when(idx[0] > 0)(lambda: plgpu.barrier_arrive(v_consumed_ring.at[prev]))" in ahead
    assert "plgpu.barrier_arrive(v_consumed)  # empty" in serial and "v_consumed_ring" not in serial


def test_partitions_with_different_stage_offsets_cannot_be_emitted():
    plan = pallas_plan(_flash(2, 128, 2, False, 1))
    assert plan.decisions.qk_ahead == (1, 1)
    edited = replace(plan, decisions=replace(plan.decisions, qk_ahead=(1, 0)))
    with pytest.raises(UnsupportedFeatureError, match=r"^cannot emit: compute partitions with different"):
        render_plan(edited)


def test_rings_of_different_depths_cannot_be_emitted():
    plan = pallas_plan(_gemm(128, 256, 1, 4, 8))
    edited = replace(plan, rings=(plan.rings[0], replace(plan.rings[1], depth=3)))
    with pytest.raises(UnsupportedFeatureError, match=r"rings of different depths \(a 4, b 3\).*max_concurrent"):
        render_plan(edited)


def test_compute_budget_above_what_pallas_gives_cannot_be_emitted():
    plan = pallas_plan(_gemm(128, 256, 1, 4, 8))
    edited = replace(plan, partitions=(replace(plan.compute[0], regs=248), plan.load))
    with pytest.raises(UnsupportedFeatureError, match=r"compute budget 248 registers .* = 240"):
        render_plan(edited)


def test_cli_emit_pallas_error_is_one_line(tmp_path):
    """A valid schedule whose K and V rings differ in depth (streaming depth 1, V held a stage longer): one
    error line, exit 2, no file."""
    import json

    from twill.ir.io import graph_to_dict

    sched = _flash(2, 128, 1, False, 1)
    doc = tmp_path / "fa.json"
    doc.write_text(json.dumps({**sched.to_dict(), "loop_graph": graph_to_dict(sched.graph)}))
    out = tmp_path / "fa.py"
    proc = subprocess.run([sys.executable, "-m", "twill.cli", "emit", "pallas", "--schedule", str(doc), "-o",
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("twill: error: cannot emit: rings of different depths (k 1, v 2)")
    assert not out.exists()


def test_renderers_read_only_the_plan():
    import ast
    from pathlib import Path

    import twill

    root = Path(twill.__file__).parent
    for path, family in (("codegen/pallas/render.py", None), ("kernels/gemm/pallas.py", "gemm"),
                         ("kernels/flash_fwd/pallas.py", "flash_fwd")):
        tree = ast.parse((root / path).read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        twill_modules = {m for m in modules if m and m.startswith("twill")}
        assert twill_modules <= {"twill.codegen.plan", "twill.codegen.chart", "twill.codegen.pallas.render",
                                 "twill.errors", f"twill.kernels.{family}.plan"}, (path, twill_modules)


# -- with JAX: lowered to Mosaic GPU MLIR on the CPU -----------------------------------------------------
def _mosaic_mlir(lowered) -> str:
    """The kernel of a lowered jitted function as readable Mosaic GPU MLIR (the custom call's module)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import mosaic_gpu_dialect
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic.gpu import core

    calls = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == "stablehlo.custom_call":
                        calls.append(inner)
                    walk(inner.operation)

    walk(lowered.compiler_ir("stablehlo").operation)
    (call,) = calls
    config = ir.DictAttr(call.operation.attributes["mhlo.backend_config"])
    blob = bytes(ir.StringAttr(config["module"]).value_bytes)
    with jax_mlir.make_ir_context() as ctx, ir.Location.unknown():
        mosaic_gpu_dialect.register_dialect(ctx)
        ctx.allow_unregistered_dialects = True
        return str(core._run_serde_pass(ir.Module.parse(blob), serialize=False))


def _facts(text: str) -> dict:
    import re

    return {"waits": {int(n) for n in re.findall(r"wgmma\.wait\.group\.sync\.aligned (\d+)", text)},
            "regs": set(re.findall(r"setmaxregister (increase|decrease) (\d+)", text)),
            "shapes": set(re.findall(r"m64n\d+k16", text)),
            "smem": int(re.search(r"dynamic_shared_memory_size %c(\d+)", text).group(1))}


@pytest.mark.parametrize("bm,bn,lag,depth,warps", GEMM_CASES)
def test_gemm_lowers_with_the_scheduled_lag_ring_and_budgets(tmp_path, bm, bn, lag, depth, warps):
    jax = pytest.importorskip("jax", reason="needs the jax extra (pip install twill-gpu[jax])")
    import jax.numpy as jnp

    module = _load(tmp_path, emit_pallas(_gemm(bm, bn, lag, depth, warps)), f"gemm_{bm}_{bn}_{lag}_{depth}")
    a = jax.ShapeDtypeStruct((1000, 700), jnp.float16)     # ragged: padded to whole tiles by gemm()
    b = jax.ShapeDtypeStruct((700, 900), jnp.float16)
    facts = _facts(_mosaic_mlir(module.gemm.trace(a, b).lower(lowering_platforms=("cuda",))))
    assert facts["waits"] == {0, lag} and facts["shapes"] == {f"m64n{bn}k16"}
    assert ("decrease", "24") in facts["regs"] and ("increase", str(module.COMPUTE_REGISTERS)) in facts["regs"]
    ring_bytes = max(depth, lag + 1) * (bm * 64 + 64 * bn) * 2
    assert ring_bytes <= facts["smem"] < ring_bytes + 2 * 2 * 64 * 64 * 2 + 4096


@pytest.mark.parametrize("subtiles,head_dim,depth,grouped,ahead", FLASH_CASES)
def test_flash_lowers_with_the_scheduled_ring_and_turns(tmp_path, subtiles, head_dim, depth, grouped, ahead):
    jax = pytest.importorskip("jax", reason="needs the jax extra (pip install twill-gpu[jax])")
    import jax.numpy as jnp

    plan = pallas_plan(_flash(subtiles, head_dim, depth, grouped, ahead))
    module = _load(tmp_path, render_plan(plan), f"fa_{subtiles}_{head_dim}_{depth}_{int(grouped)}_{ahead}")
    q = jax.ShapeDtypeStruct((2, 1000, 4, head_dim), jnp.float16)   # ragged S: padded and masked
    text = _mosaic_mlir(module.attention.trace(q, q, q).lower(lowering_platforms=("cuda",)))
    facts = _facts(text)
    assert facts["waits"] == ({0, 1} if ahead else {0}) and facts["shapes"] == {"m64n128k16", f"m64n{head_dim}k16"}
    assert ("decrease", "24") in facts["regs"] and ("increase", "240") in facts["regs"]
    ring_bytes = 2 * depth * 128 * head_dim * 2 + 2 * 64 * head_dim * 2
    assert ring_bytes <= facts["smem"] < ring_bytes + 4096


def test_lines_quoted_in_the_docs_come_from_emitted_modules():
    """docs/codegen.md (Pallas section) quotes emitted lines; each must be in a module emitted here."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "codegen.md").read_text()
    section = doc[doc.index("## Pallas Mosaic GPU backend"):]
    block = section[section.index("```text\n") + 8:]
    quoted = [line for line in block[:block.index("```")].splitlines() if line.strip()]
    emitted = "\n".join([emit_pallas(_gemm(*case)) for case in GEMM_CASES]
                        + [emit_pallas(_flash(*case)) for case in FLASH_CASES]).splitlines()
    assert len(quoted) >= 4
    missing = [line for line in quoted if line not in emitted]
    assert not missing, f"docs/codegen.md quotes lines no emitted module has: {missing}"


def test_three_compute_partitions_cannot_be_emitted():
    """Three sub-tiles pass the tensor core round robin; the Pallas template hands it between two warpgroups."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=3, head_dim=64), H100, ahead=0, depth=2)
    with pytest.raises(UnsupportedFeatureError, match=r"^cannot emit: 3 compute partitions \(Pallas backend: turn"):
        render_plan(pallas_plan(sched))


@pytest.mark.parametrize("argv,depth", [
    (["--head-dim", "128"], 3),                              # the measured best at head dim 128
    (["--head-dim", "128", "--streaming-depth", "2"], 2),    # a given depth wins
    (["--head-dim", "64"], 2),                               # not measured: the graph's default
])
def test_cli_emit_pallas_flash_fwd_streaming_depth_default(tmp_path, capsys, argv, depth):
    """``twill emit pallas flash-fwd`` solves with the K/V ring depth that ran best at head dim 128 (3) unless
    ``--streaming-depth`` is given; other head dims keep the graph's default (2)."""
    from twill.cli import main

    out = tmp_path / "fa.py"
    assert main(["emit", "pallas", "flash-fwd", *argv, "-o", str(out)]) == 0
    assert f"MAX_CONCURRENT_STEPS = {depth}  #" in out.read_text()


def test_only_the_pallas_flash_fwd_body_chooses_a_streaming_depth():
    """The depth default is the Pallas attention body's alone: Gluon and TileLang, and the Pallas GEMM, keep
    the graph's default."""
    from twill.kernels import emit_streaming_depth, family

    graph = build_kernel("flash-fwd", H100, head_dim=128)
    assert emit_streaming_depth(family("flash-fwd"), "pallas", graph) == 3
    assert emit_streaming_depth(family("flash-fwd"), "gluon", graph) is None
    assert emit_streaming_depth(family("flash-fwd"), "tilelang", graph) is None
    assert emit_streaming_depth(family("gemm"), "pallas", build_kernel("gemm", H100)) is None


@pytest.mark.parametrize("argv,what", [(["--causal"], "the causal mask"), (["--kv-heads", "8"], "grouped K/V heads")])
def test_cli_emit_pallas_refuses_what_its_body_does_not_write(tmp_path, capsys, argv, what):
    """The Pallas attention body writes the non-causal forward with one K/V head per query head: a causal or
    grouped-K/V request is refused in one line, never emitted as the other kernel."""
    from twill.cli import main

    out = tmp_path / "fa.py"
    assert main(["emit", "pallas", "flash-fwd", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"twill: error: cannot generate: {what} not supported by the Pallas backend (emitted by the " \
                  "Gluon backend; this one writes the non-causal forward with one K/V head per query head)\n"
    assert not out.exists()
