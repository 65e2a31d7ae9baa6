"""twill tune: the candidate space, the predicted-time model, the cached parallel sweep, the command."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import pytest

from twill.cli import main
from twill.errors import TwillError
from twill.ir.builder import GraphBuilder
from twill.ir.io import graph_to_dict
from twill.kernels import build_kernel
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
from twill.machine.models import H100, B200
from twill.schedule.result import Schedule, WarpGroup
from twill.tune.predict import Shape, ctas_per_sm, parse_shape, predict
from twill.tune.space import Candidate, default_axes, kernel_space, triton_space
from twill.tune.spills import parse_ptxas_log, ptxas_rejection
from twill.tune import sweep
from twill.tune.sweep import Job, Progress, cache_dir, run_sweep
from graphs import ping_pong_attention


# -- space ------------------------------------------------------------------------------------------------
def test_gemm_space_rejects_candidates_over_the_shared_memory_of_a_block():
    axes = {"block_m": (128, 256), "block_n": (256,), "block_k": (128,), "warps": (8,), "streaming_depth": (2, 3),
            "persistent": (False,)}
    space = kernel_space("gemm", H100, axes)
    for cand in space.candidates + tuple(c for c, _ in space.rejected):
        s = cand.settings()
        ring = s["streaming_depth"] * (s["block_m"] * s["block_k"] + s["block_k"] * s["block_n"]) * 2  # fp16 A, B
        assert (cand in space.candidates) == (ring <= H100.smem_per_block)
    assert len(space.candidates) + len(space.rejected) == 4
    assert all("shared memory" in why for _, why in space.rejected)


def test_default_axes_follow_the_machine_and_the_kernel_budget():
    assert "warps" in default_axes("gemm", H100)
    assert "warps" not in default_axes("gemm", B200)
    assert "reg_limit" not in default_axes("flash-fwd", B200)
    space = kernel_space("flash-fwd", H100, {"head_dim": (64,), "block_n": (128,), "streaming_depth": (2,)})
    budgets = {}
    for c in space.candidates:
        budgets.setdefault(c.settings()["subtiles"], set()).add(c.reg_limit)
    # offsets from each budget; three sub-tiles at 80 registers cannot hold S (64) + O (32) + bookkeeping (24)
    assert budgets == {1: {240, 200, 160}, 2: {240, 200, 160}, 3: {160, 120}}
    assert [(c.reg_limit, c.persistent, why.split(" registers")[0]) for c, why in space.rejected] == [
        (80, False, "a budget of 80"), (80, True, "a budget of 80")]
    assert {c.persistent for c in space.candidates} == {False, True}
    assert all(dict(c.options)["head_dim"] == 64 for c in space.candidates)
    blackwell = kernel_space("flash-fwd", B200, {"head_dim": (64,), "block_n": (128,), "streaming_depth": (2,)})
    assert {c.settings()["subtiles"] for c in blackwell.candidates} == {1, 2}
    assert [(dict(c.options)["subtiles"], why) for c, why in blackwell.rejected] == [
        (3, "kernel 'flash-fwd': subtiles must be one of [1, 2] on b200, got 3")]


def test_unknown_axis_is_an_error():
    with pytest.raises(TwillError, match="no option 'block_k'"):
        kernel_space("flash-fwd", H100, {"block_k": (64,)})
    with pytest.raises(TwillError, match="persistent is an axis of gemm and flash-fwd; there is no persistent "
                                         "'flash-bwd' kernel"):
        kernel_space("flash-bwd", H100, {"persistent": (True,)})
    with pytest.raises(TwillError, match="Hopper Gluon generator; b200 has none"):
        kernel_space("gemm", B200, {"persistent": (True,)})


def test_persistent_is_a_gemm_axis_that_counts_the_c_staging_buffer():
    """A persistent GEMM keeps a C staging buffer (at least half the block_m x block_n fp16 tile) live with the
    rings: 128x128x64 with a 7-deep ring (224 KiB) fits one tile per CTA but not persistent; on Blackwell
    the axis does not exist."""
    assert default_axes("gemm", H100)["persistent"] == (False, True)
    assert "persistent" not in default_axes("gemm", B200)
    space = kernel_space("gemm", H100, {"block_m": (128,), "block_n": (128,), "block_k": (64,), "warps": (8,),
                                        "streaming_depth": (6, 7)})
    kept = {(c.streaming_depth, c.persistent) for c in space.candidates}
    assert kept == {(6, False), (6, True), (7, False)}
    assert [(c.streaming_depth, c.persistent) for c, _ in space.rejected] == [(7, True)]
    (chosen,) = [c for c in space.candidates if c.persistent]
    assert "persistent=True" in chosen.label() and chosen.settings()["persistent"] is True


def test_triton_space_is_the_product_of_constexprs_warps_and_stages():
    space = triton_space({"BLOCK_M": (64, 128), "BLOCK_N": (128,)}, {"num_warps": (4, 8)})
    assert len(space.candidates) == 4
    assert {(dict(c.options)["BLOCK_M"], c.num_warps, c.num_stages) for c in space.candidates} == \
        {(64, 4, 3), (64, 8, 3), (128, 4, 3), (128, 8, 3)}


# -- prediction -------------------------------------------------------------------------------------------
def _hand_schedule(warps, stats, *, ii=10, cycles=25, scale=4.0):
    """One op of ``cycles`` normalized units at start 0, so L = cycles; GEMM tile 128x128x64."""
    b = GraphBuilder("hand", attrs={"kernel": "gemm", "block_m": 128, "block_n": 128, "block_k": 64})
    b.op("mma", cycles=cycles, uses={"tc": 1})
    norm = {"enabled": True, "cycles_per_unit": scale} if scale != 1.0 else {"enabled": False}
    return Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=ii, ii_lower_bound=ii,
                    starts={"mma": 0}, warps=tuple(warps), stats={**stats, "normalization": norm})


def test_prediction_arithmetic_one_cta_per_sm():
    machine = replace(H100, sms=10, sustained_clock_ghz=1.0, launch_us=2.0)
    sched = _hand_schedule([WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "mma", 8, 240, ("mma",))],
                           {"res_mii": 10, "smem_bytes": 100_000})
    p = predict(sched, Shape("gemm", (1000, 1000, 1000)), machine)
    tiles = 8 * 8                       # ceil(1000/128)^2
    iters = 16                          # ceil(1000/64)
    # 9 warps, launched as 12 (whole warp groups) at the largest budget, 240: 92160 > 65536 -> one CTA per SM.
    tile_cycles = (iters - 1) * 10 * 4 + 25 * 4
    waves = 7                           # ceil(64 / 10 SMs)
    assert (p.tiles, p.iterations, p.waves) == (tiles, iters, waves)
    assert p.breakdown["ctas_per_sm"] == 1
    assert p.cycles == pytest.approx(waves * tile_cycles)
    assert p.seconds == pytest.approx(waves * tile_cycles / 1e9 + 2e-6)


def test_prediction_shares_the_sm_between_coresident_ctas():
    machine = replace(H100, sms=10, sustained_clock_ghz=2.0, launch_us=0.0)
    sched = _hand_schedule([WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "mma", 4, 128, ("mma",))],
                           {"res_mii": 10, "smem_bytes": 100_000})
    p = predict(sched, Shape("gemm", (1000, 1000, 1000)), machine)
    per_sm = 2                          # 233472 // 100000 bytes of shared memory (regs: 8 x 32 x 128 allow 2)
    busy = per_sm * 16 * 10 * 4         # two CTAs' tensor-core work per wave, 40 raw cycles per iteration
    assert p.breakdown["ctas_per_sm"] == per_sm
    assert p.waves == math.ceil(64 / (10 * per_sm))
    assert p.cycles == pytest.approx(p.waves * busy)
    assert p.seconds == pytest.approx(p.waves * busy / 2e9)


def _triton_schedule(num_warps, stats):
    """A schedule without warp groups (a Triton kernel's) of ``num_warps`` warps."""
    b = GraphBuilder("triton", attrs={"kernel": "matmul_kernel", "num_warps": num_warps, "block_m": 64,
                                      "block_n": 64, "block_k": 64})
    b.op("mma", cycles=25, uses={"tc": 1})
    return Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=10, ii_lower_bound=10,
                    starts={"mma": 0}, stats=stats)


def test_a_compiled_triton_kernel_counts_its_registers_and_shared_memory_per_sm():
    """Without the compile, a 4-warp Triton kernel of 50 000 model bytes fits 4 CTAs per SM (shared memory);
    compiled, its 115 000 bytes fit 2, and 138 registers per thread (allocated as 144) on 4 warps allow 3."""
    model_only = _triton_schedule(4, {"smem_bytes": 50_000})
    assert ctas_per_sm(model_only, H100) == 233472 // 50_000
    compiled = _triton_schedule(4, {"smem_bytes": 50_000, "compiled": {"registers": 138, "shared_bytes": 115_000}})
    assert ctas_per_sm(compiled, H100) == min(233472 // 115_000, 65536 // (4 * 32 * 144)) == 2
    # 8 warps at 138 (144) registers: 65536 // 36864 = 1 CTA, whatever the shared memory
    wide = _triton_schedule(8, {"compiled": {"registers": 138, "shared_bytes": 60_000}})
    assert ctas_per_sm(wide, H100) == 1


def test_ranking_keeps_tritons_schedule_unless_twills_is_predicted_faster():
    """A Triton record carries the schedule of Triton's own order: a Twill schedule predicted less than
    INJECT_MIN_GAIN faster is not injected and the candidate is priced as Triton's kernel."""
    from twill.integrations.triton.inject import INJECT_MIN_GAIN
    from twill.schedule.document import schedule_document
    from twill.tune.rank import rank

    machine = replace(H100, sms=10, sustained_clock_ghz=1.0, launch_us=0.0)
    stats = {"res_mii": 1, "compiled": {"registers": 90, "shared_bytes": 150_000}}
    twill = replace(_triton_schedule(8, stats), ii=10)
    shape = Shape("gemm", (640, 640, 640))
    cands = [Candidate(options=(("BLOCK", b),), num_warps=8) for b in (1, 2, 3)]
    records = [{"status": "ok", "schedule": schedule_document(twill),
                "triton_order": schedule_document(replace(twill, ii=ii))} for ii in (10, 12)]
    records.append({"status": "ok", "schedule": schedule_document(twill), "triton_order": None})
    by_block = {dict(r.candidate.options)["BLOCK"]: r for r in rank(cands, records, shape, machine)}
    assert by_block[1].injected is False                       # a tie: Triton's own schedule is kept
    assert by_block[2].injected is True                        # Twill's order predicted faster: injected
    assert by_block[3].injected is True                        # Triton's order has no schedule: Twill's
    own = predict(replace(twill, ii=12), shape, machine)    # block 2's Triton order, which Twill's beats
    assert by_block[2].prediction.seconds < own.seconds * (1 - INJECT_MIN_GAIN)
    assert by_block[1].to_dict()["injected"] is False


def test_a_triton_kernel_over_the_shared_memory_of_a_block_cannot_launch():
    fits = _triton_schedule(8, {"compiled": {"registers": 90, "shared_bytes": H100.smem_per_block}})
    over = _triton_schedule(8, {"compiled": {"registers": 90, "shared_bytes": H100.smem_per_block + 1}})
    assert sweep._shared_overflow(fits, H100) is None
    assert f"needs {H100.smem_per_block + 1} bytes of shared memory" in sweep._shared_overflow(over, H100)


def test_persistent_prediction_pays_the_pipeline_fill_and_drain_once_per_cta():
    """Persistent: min(tiles, SMs) CTAs, each running ceil(tiles / grid) tiles back to back: the K loops of
    all its tiles in a row plus one L - II, against one (n - 1)·II + L per tile and wave."""
    machine = replace(H100, sms=10, sustained_clock_ghz=1.0, launch_us=0.0)
    sched = _hand_schedule([WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "mma", 8, 240, ("mma",))],
                           {"res_mii": 10, "smem_bytes": 100_000})
    shape = Shape("gemm", (1000, 1000, 1000))                 # 64 tiles of 16 iterations
    ii, length = 10 * 4, 25 * 4
    one_per_tile = predict(sched, shape, machine)
    persistent = predict(sched, shape, machine, persistent=True)
    assert persistent.waves == one_per_tile.waves == 7         # tiles per CTA = waves of one CTA per SM
    assert persistent.cycles == pytest.approx(7 * 16 * ii + length - ii)
    assert one_per_tile.cycles - persistent.cycles == pytest.approx((7 - 1) * (length - ii))
    few = Shape("gemm", (256, 256, 1000))                     # 4 tiles, fewer than SMs: nothing to save
    assert predict(sched, few, machine, persistent=True).cycles == pytest.approx(predict(sched, few, machine).cycles)


def test_persistent_prediction_hides_all_but_one_fill_and_store_on_a_calibrated_machine():
    """Calibrated: one CTA per tile pays fill + staging + store per tile; the persistent CTA pays the fill
    (the ring runs on into the next tile) and the store (it drains during the next loop) once, the staging
    (registers to shared memory, in the compute partition) once per tile."""
    from measurements import calibration_rows
    from twill.machine.calibrate import fit

    machine = replace(fit(calibration_rows(), H100), sms=10, sustained_clock_ghz=1.0, launch_us=0.0)
    sched = _streaming_schedule(3)
    shape = Shape("gemm", (1000, 1000, 1000))                 # 64 tiles of 16 iterations
    one_per_tile = predict(sched, shape, machine)
    persistent = predict(sched, shape, machine, persistent=True)
    fill, staging, store = (one_per_tile.breakdown[k] for k in ("fill_cycles", "staging_cycles", "store_cycles"))
    assert min(fill, staging, store) > 0
    assert staging == pytest.approx(128 * 128 * 2 / machine.calibration.smem_bytes_per_clk)
    ii_eff, length, ii = (one_per_tile.breakdown[k] for k in ("ii_effective", "length_raw", "ii_raw"))
    assert one_per_tile.breakdown["tile_cycles"] == pytest.approx(fill + 15 * ii_eff + length + staging + store)
    assert persistent.waves == 7                               # 64 tiles over 10 CTAs
    assert persistent.cycles == pytest.approx(fill + 7 * (16 * ii_eff + staging) + length - ii + store)


def test_persistent_attention_prediction_pays_the_fill_once_and_each_blocks_pipeline_and_store():
    """Persistent attention forward: the producer loads the next query block during the current one, so the
    fill is paid once per CTA; every block still fills and drains its own loop (L − II) and stores its O."""
    from measurements import calibration_rows
    from twill.machine.calibrate import fit

    machine = replace(fit(calibration_rows(), H100), sms=10, sustained_clock_ghz=1.0, launch_us=0.0)
    graph = build_kernel("flash-fwd", machine, subtiles=2, head_dim=128)
    sched = flash_schedule(graph, machine, ahead=1, depth=2)
    shape = Shape("attention", (1, 4, 2048, 128))              # 4 heads x 16 query blocks of 16 key tiles
    one_per_block = predict(sched, shape, machine)
    persistent = predict(sched, shape, machine, persistent=True)
    fill, store = one_per_block.breakdown["fill_cycles"], one_per_block.breakdown["store_cycles"]
    assert fill > 0 and store > 0 and "staging_cycles" not in one_per_block.breakdown
    block = one_per_block.breakdown["tile_cycles"] - fill      # (n − 1)·II_eff + L + store
    assert (one_per_block.tiles, persistent.waves, one_per_block.waves) == (64, 7, 7)
    assert persistent.cycles == pytest.approx(fill + 7 * block)
    assert one_per_block.cycles - persistent.cycles == pytest.approx(6 * fill)
    assert persistent.breakdown["ctas_per_sm"] == 1


def test_a_group_that_issues_s_and_pv_apart_waits_for_its_pv_in_the_chain(monkeypatch):
    """With ``qk_ahead`` 0 the kernel waits for S = Q Kᵀ and, before its next iteration, for O += P V: the
    chain bound adds the P V latency to such a group's chain. With S issued ahead the P V runs under the next
    softmax and only the S wait counts. The tensor-core turns are the plan's in both cases."""
    from twill.machine.calibration import load_machine
    from twill.tune import predict as model

    machine = load_machine(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results",
                                        "calibration_h200.machine.json"))
    graph = build_kernel("flash-fwd", machine, subtiles=2, head_dim=128)
    for ahead in (0, 1):
        sched = flash_schedule(graph, machine, ahead=ahead, depth=2)
        chain, turns = model.chain_bound(sched, machine)["chain_ii"], model.tensor_core_turns(sched)
        with monkeypatch.context() as patch:
            patch.setattr(model, "_kernel_plan", lambda schedule: None)
            plain = model.chain_bound(sched, machine)["chain_ii"]
            assert model.tensor_core_turns(sched) == turns
        pv = sched.graph.op("pv_a")
        latency = (pv.latency if pv.latency is not None else pv.cycles) * model.cycles_per_unit(sched)
        assert chain - plain == pytest.approx(latency if ahead == 0 else 0.0)
        assert latency > 0


def test_warp_specialized_cta_reserves_whole_warp_groups_at_the_largest_budget():
    # a 1-warp producer at 24 registers and a 4-warp consumer at 240: the CTA launches 8 warps at 240
    # registers (61440 of 65536), so a second CTA never fits, however little shared memory it needs
    sched = _hand_schedule([WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "mma", 4, 240, ("mma",))],
                           {"res_mii": 10, "smem_bytes": 1000})
    assert ctas_per_sm(sched, H100) == 1
    small = _hand_schedule([WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "mma", 4, 64, ("mma",))],
                           {"res_mii": 10, "smem_bytes": 1000})
    assert ctas_per_sm(small, H100) == 65536 // (8 * 32 * 64)


def _streaming_schedule(depth: int) -> Schedule:
    """A 16 KiB streaming load feeding a 10-cycle MMA (raw cycles), ``depth`` ring slots."""
    b = GraphBuilder("stream", attrs={"kernel": "gemm", "block_m": 128, "block_n": 128, "block_k": 64})
    b.op("load_a", cycles=1, uses={"tma": 1}, variable_latency=True, smem=16384)
    b.op("mma", cycles=10, uses={"tc": 1})
    b.edge("load_a", "mma", delay=0)
    return Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=10, ii_lower_bound=10,
                    starts={"load_a": 0, "mma": 0}, streaming_depth=depth,
                    stats={"res_mii": 10, "normalization": {"enabled": False}})


def test_streaming_loads_bound_the_loop_on_a_calibrated_machine():
    from measurements import calibration_rows
    from twill.machine.calibrate import fit

    machine = replace(fit(calibration_rows(), H100), launch_us=0.0, sustained_clock_ghz=1.0)
    cal = machine.calibration
    shape = Shape("gemm", (128, 128, 6400))  # one tile, 100 iterations
    for depth in (2, 3):
        p = predict(_streaming_schedule(depth), shape, machine)
        # the buffer is used and freed in the load's own stage (span 1): d iterations of lookahead; the tile
        # lands after the L2 latency less the 16 KiB calibration tile's transfer, plus its own transfer
        bandwidth_ii = 16384 / cal.tma_l2_bytes_per_clk
        latency_ii = (cal.tma_l2_latency_cycles - 16384 / cal.tma_l2_bytes_per_clk + bandwidth_ii) / depth
        assert p.breakdown["latency_ii"] == pytest.approx(latency_ii)
        assert p.breakdown["bandwidth_ii"] == pytest.approx(bandwidth_ii)
        # one CTA on the SM: the tile (with its first loads' latency before the loop and its 128x128 fp16
        # output staged and stored after it), or its 100 iterations' bytes at the L2 rate, whichever is longer
        fill = cal.tma_l2_latency_cycles - 16384 / cal.tma_l2_bytes_per_clk
        out = 128 * 128 * 2 / cal.smem_bytes_per_clk + 128 * 128 * 2 / cal.tma_l2_bytes_per_clk
        assert p.breakdown["fill_cycles"] == pytest.approx(fill)
        tile = fill + 99 * max(10, latency_ii, bandwidth_ii) + 10 + out
        assert p.cycles == pytest.approx(max(tile, 100 * bandwidth_ii))
    # the datasheet machine prices the loads as the solver does: free
    plain = predict(_streaming_schedule(2), shape, replace(H100, launch_us=0.0))
    assert "latency_ii" not in plain.breakdown and plain.cycles == 99 * 10 + 10


def test_wave_readers_follow_the_generated_kernels_launch_order():
    """A wave's CTAs in launch order: a GEMM's grouped order puts 8 rows of output tiles side by side, so an A
    tile has as many readers as the wave has columns and a B tile as many as it has rows; an attention
    forward's query blocks of one head run together and share its K/V tiles (the backward: its Q/dO tiles)."""
    from twill.kernels.gemm.tune import gemm_tile
    from twill.tune.predict import wave_readers

    gemm = build_kernel("gemm", H100, block_m=128, block_n=256, block_k=64)
    readers = wave_readers(gemm, Shape("gemm", (8192, 8192, 8192)), 132)
    assert readers == {"load_a": 132 / 8, "load_b": 132 / 17}   # 8 rows by 16.5 columns of tiles
    assert [gemm_tile(t, 64, 32) for t in (0, 7, 8, 255, 256)] == [(0, 0), (7, 0), (0, 1), (7, 31), (8, 0)]
    # fewer tiles than SMs: the whole grid is the wave; a grid of one row shares its A tile only
    assert wave_readers(gemm, Shape("gemm", (128, 1024, 64)), 132) == {"load_a": 4.0, "load_b": 1.0}
    fwd = build_kernel("flash-fwd", H100, head_dim=128)
    assert wave_readers(fwd, Shape("attention", (4, 32, 2048, 128)), 132) == {"load_k": 132 / 9, "load_v": 132 / 9}
    bwd = build_kernel("flash-bwd", H100, head_dim=128)
    assert set(wave_readers(bwd, Shape("attention", (1, 1, 4096, 128)), 132).values()) == {32.0}
    # a load of no known role has one reader, and so has every load of a kernel whose launch order Twill does
    # not set (a Triton kernel's, which names its loads by the same roles)
    assert wave_readers(_streaming_schedule(2).graph, Shape("gemm", (4096, 4096, 4096)), 132) == {"load_a": 1.0}
    triton = replace(gemm, attrs={**gemm.attrs, "kernel": "matmul_kernel", "triton": "3.6.0"})
    assert wave_readers(triton, Shape("gemm", (8192, 8192, 8192)), 132) == {"load_a": 1.0, "load_b": 1.0}


@pytest.mark.parametrize("golden", ["gemm_128x256x64_lag1_d4", "gemm_128x256x64_lag1_d4_persistent"])
def test_gemm_tile_is_the_generated_kernels_tile_order(golden):
    """``gemm_tile`` mirrors the jitted ``tile_offsets`` of the generated GEMM kernels, which Python cannot
    call: that function and its ``GROUP_M``, taken from the pinned emitted source (tests/golden/), run here
    as plain Python (``gl.minimum`` is ``min`` on integers) and give every tile's offsets, ragged groups
    included."""
    import ast
    import pathlib
    import types

    from twill.kernels.gemm.tune import gemm_tile

    source = (pathlib.Path(__file__).parents[1] / "golden" / f"{golden}.py.golden").read_text()
    tree = ast.parse(source)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "tile_offsets"]
    (group_m,) = [n for n in tree.body if isinstance(n, ast.Assign)
                  and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["GROUP_M"]]
    fn.decorator_list = []
    env = {"gl": types.SimpleNamespace(minimum=min, constexpr=int), "BLOCK_M": 1, "BLOCK_N": 1}
    exec(compile(ast.Module([group_m, fn], []), golden, "exec"), env)
    assert env["GROUP_M"] > 1
    for num_m, num_n in ((64, 32), (13, 5), (8, 1), (1, 7), (17, 17)):
        assert [gemm_tile(t, num_m, num_n) for t in range(num_m * num_n)] == [
            env["tile_offsets"](t, num_m, num_n) for t in range(num_m * num_n)]


def test_a_wave_reading_the_same_tiles_shares_their_l2_traffic():
    """On a machine that measured one SM's intake (``tma_sm_bytes_per_clk``) the bandwidth bound is the larger
    of the SM's share of the L2's traffic (bytes over readers at the L2 rate) and its own intake; the latency
    bound keeps the unshared transfer. Without the intake it prices every byte at the L2 rate."""
    from measurements import calibration_rows
    from twill.machine.calibrate import fit

    machine = replace(fit(calibration_rows(), H100), launch_us=0.0)
    cal = machine.calibration
    assert cal.tma_sm_bytes_per_clk == 80.0
    graph = build_kernel("gemm", H100, block_m=128, block_n=256, block_k=64)
    sched = gemm_schedule(graph, H100, depth=4)
    shape = Shape("gemm", (8192, 8192, 8192))
    got = predict(sched, shape, machine).breakdown
    unique = 16384 / (132 / 8) + 32768 / (132 / 17)
    assert got["bandwidth_ii"] == pytest.approx(max(unique / cal.tma_l2_bytes_per_clk, 49152 / 80.0))
    alone = predict(sched, shape, replace(machine, calibration=replace(cal, tma_sm_bytes_per_clk=None))).breakdown
    assert alone["bandwidth_ii"] == pytest.approx(49152 / cal.tma_l2_bytes_per_clk)
    assert got["latency_ii"] == alone["latency_ii"]
    assert got["bandwidth_ii"] < alone["bandwidth_ii"]


def test_tensor_core_turns_count_the_changes_of_warp_group_around_the_cycle():
    from twill.tune.predict import tensor_core_turns

    b = GraphBuilder("pp", attrs={"kernel": "flash-fwd", "block_m": 128, "block_n": 128, "head_dim": 128})
    for name in ("qk_a", "pv_a", "qk_b", "pv_b"):
        b.op(name, cycles=10, uses={"tc": 1}, kind="mma", warps=4)
    starts = {"qk_a": 0, "qk_b": 10, "pv_a": 20, "pv_b": 30}
    groups = [WarpGroup(0, "compute", 4, 240, ("qk_a", "pv_a")), WarpGroup(1, "compute", 4, 240, ("qk_b", "pv_b"))]

    def turns(assignment):
        return tensor_core_turns(Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=40,
                                          ii_lower_bound=40, starts=starts, assignment=assignment, warps=groups))

    assert turns({"qk_a": 0, "pv_a": 0, "qk_b": 1, "pv_b": 1}) == 4      # a b a b: every op a hand-off
    assert turns({"qk_a": 0, "qk_b": 0, "pv_a": 1, "pv_b": 1}) == 2      # a a b b: the ping-pong
    assert turns({"qk_a": 0, "qk_b": 0, "pv_a": 0, "pv_b": 0}) == 0


def test_attention_chain_bound_prices_each_groups_measured_softmax_step():
    from measurements import calibration_rows
    from twill.machine.calibrate import fit
    from twill.machine.costs import ASYNC_ISSUE_CYCLES, handoff_cycles
    from twill.tune.predict import chain_bound

    steps = [{"bench": "softmax", "args": {"groups": 2, "block_n": 128, "head_dim": 64, "pv": True},
              "result": {"groups": 2, "block_n": 128, "head_dim": 64, "pv": True, "cycles_per_step": 1500.0}}]
    machine = replace(fit(calibration_rows() + steps, H100), launch_us=0.0, sustained_clock_ghz=1.0)
    schedule = ping_pong_attention()
    # per group: the measured step + the wait for its S + two wgmma issues + its share of the hand-offs
    # (the tensor core runs qk_a qk_b pv_a pv_b: four hand-offs, two per group)
    chain = 1500.0 + 300 + 2 * ASYNC_ISSUE_CYCLES + 2 * handoff_cycles(machine)
    assert chain_bound(schedule, machine) == {"chain_ii": pytest.approx(chain)}
    p = predict(schedule, Shape("attention", (1, 1, 128 * 10, 64)), machine)
    assert p.breakdown["chain_ii"] == pytest.approx(chain) and p.breakdown["ii_effective"] >= chain
    # the partial first and last iterations run at the chain's pace: L scaled by chain / II; the O tile
    # (128 x 64 fp16) is stored from registers before the CTA exits
    length = p.breakdown["length_raw"] * chain / p.breakdown["ii_raw"]
    store = 128 * 64 * 2 / machine.calibration.tma_l2_bytes_per_clk
    assert p.breakdown["store_cycles"] == pytest.approx(store) and "staging_cycles" not in p.breakdown
    assert p.breakdown["tile_cycles"] == pytest.approx(
        p.breakdown["fill_cycles"] + 9 * p.breakdown["ii_effective"] + length + store)
    # no bound without a measurement for this many groups and head dimension, on a datasheet machine, or for
    # a GEMM
    assert chain_bound(ping_pong_attention(head_dim=128), machine) == {}
    assert chain_bound(schedule, H100) == {}
    assert chain_bound(_streaming_schedule(2), machine) == {}


def test_unmeasured_softmax_tile_is_estimated_from_the_nearest_measured_key_count():
    """A tile the machine file did not measure takes the step of the same groups and head dimension with the
    nearest key count, in proportion to the keys; other groups or head dimensions do not stand in."""
    from twill.kernels.flash_fwd.tune import softmax_step

    steps = {"2x128x64": 1600.0, "2x64x128": 1000.0, "3x128x64": 2200.0}
    assert softmax_step(steps, 2, 128, 64) == 1600.0
    assert softmax_step(steps, 2, 64, 64) == pytest.approx(800.0)
    assert softmax_step(steps, 2, 128, 128) == pytest.approx(2000.0)
    assert softmax_step(steps, 3, 64, 64) == pytest.approx(1100.0)
    assert softmax_step(steps, 1, 128, 64) is None and softmax_step(steps, 3, 128, 256) is None


def test_prediction_without_normalization_uses_schedule_cycles():
    sched = _hand_schedule([], {"res_mii": 10}, scale=1.0)
    p = predict(sched, Shape("gemm", (128, 128, 640)), replace(H100, launch_us=0.0))
    assert (p.tiles, p.iterations, p.waves) == (1, 10, 1)
    assert p.cycles == 9 * 10 + 25


def test_schedule_without_warp_groups_counts_num_warps_and_its_buffers():
    b = GraphBuilder("tri", attrs={"kernel": "k", "block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8,
                                   "smem_resident": 1000})
    b.op("load_a", cycles=1, uses={"tma": 1}, variable_latency=True, smem=50_000)
    b.op("mma", cycles=10, uses={"tc": 1})
    b.edge("load_a", "mma", delay=0)
    s = Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=10, ii_lower_bound=10,
                 starts={"load_a": 0, "mma": 10}, streaming_depth=2, stats={"res_mii": 10})
    # load_a: stage 0 -> mma stage 1, two copies (= the streaming depth): 100 000 + 1 000 bytes -> 2 CTAs;
    # 8 warps -> 8 CTAs; no register limit without warp groups.
    assert ctas_per_sm(s, H100) == H100.smem_per_sm // 101_000 == 2


def test_attention_loop_extents_forward_and_backward():
    shape = Shape("attention", (2, 3, 1000, 64))
    machine = replace(H100, launch_us=0.0)
    for kernel, tiles, iters in (("flash-fwd", 2 * 3 * 8, 16), ("flash-bwd", 2 * 3 * 16, 8)):
        b = GraphBuilder("a", attrs={"kernel": kernel, "block_m": 128, "block_n": 64, "head_dim": 64})
        b.op("qk", cycles=5, uses={"tc": 1})
        s = Schedule(graph=b.build(), arch="h100", solver="manual", status="optimal", ii=5, ii_lower_bound=5,
                     starts={"qk": 0}, stats={"res_mii": 5})
        p = predict(s, shape, machine)
        assert (p.tiles, p.iterations) == (tiles, iters)


@pytest.mark.parametrize("text,problem,sizes", [("4096,4096,4096", "gemm", (4096, 4096, 4096)),
                                                ("M=64,N=32,K=16", "gemm", (64, 32, 16)),
                                                ("1,2,3,64", "attention", (1, 2, 3, 64))])
def test_parse_shape(text, problem, sizes):
    assert parse_shape(text, problem).sizes == sizes


@pytest.mark.parametrize("text", ["1,2", "a,b,c", "0,4,4", "N=1,M=2,K=3"])
def test_parse_shape_rejects(text):
    with pytest.raises(TwillError, match="shape"):
        parse_shape(text, "gemm")


def test_ptxas_log_parsing():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Function properties for k\n"
           "    24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 168 registers\n")
    assert parse_ptxas_log(log) == {"registers": 168, "spill_stores": 16, "spill_loads": 8, "spill_bytes": 24,
                                    "serialized_wgmma": 0}
    warned = log + ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
                    "serialized due to non wgmma instructions reading accumulator registers of  a wgmma between "
                    "start and end of the pipeline stage in the function 'k'\n")
    assert parse_ptxas_log(warned)["serialized_wgmma"] == 1
    # either is a reason not to rank the candidate; a clean report or no compile is not
    assert "24 bytes of spill" in ptxas_rejection(parse_ptxas_log(log))
    assert "serializes the kernel's wgmma" in ptxas_rejection({**parse_ptxas_log(warned), "spill_bytes": 0})
    assert ptxas_rejection({**parse_ptxas_log(log), "spill_bytes": 0}) is None
    assert ptxas_rejection(None) is None


# -- sweep and cache --------------------------------------------------------------------------------------
def _jobs(depths, time_limit=30.0):
    graph = graph_to_dict(build_kernel("gemm", H100, block_m=128, block_n=128, block_k=64))
    return [Job(candidate=Candidate(options=(("block_m", 128),), streaming_depth=d), machine=H100,
                time_limit=time_limit, graph=graph) for d in depths]


def test_cache_lives_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "twill" / "tune"


def test_sweep_caches_each_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = run_sweep(_jobs([2, 3]), workers=2)
    assert [r["status"] for r in first] == ["ok", "ok"] and not any(r["cached"] for r in first)
    assert len(list((tmp_path / "twill" / "tune").glob("*.json"))) == 2
    again = run_sweep(_jobs([2, 3]), workers=2)
    assert all(r["cached"] for r in again)
    assert [r["ii"] for r in again] == [r["ii"] for r in first]
    changed = run_sweep(_jobs([2, 4]), workers=1)           # depth 4 is new, depth 2 is not
    assert [r["cached"] for r in changed] == [True, False]
    other_limit = run_sweep(_jobs([2], time_limit=31.0), workers=1)
    assert other_limit[0]["cached"] is False
    other_machine = run_sweep([replace(_jobs([2])[0], machine=replace(H100, launch_us=9.0))], workers=1)
    assert other_machine[0]["cached"] is False


@pytest.mark.parametrize("status", ["infeasible", "cannot_emit", "spills", "error"])
def test_every_cacheable_status_is_read_back(tmp_path, status):
    """A record of every status a solved job can end in comes back from the cache: a candidate the generator
    refuses (``cannot_emit``) once missed every time and was solved again on every run of the same sweep.
    (``ok`` records hold a schedule, verified when read: tests/tune/test_caches.py.)"""
    from twill.tune.sweep import cache_read, cache_write

    record = {"status": status, "reason": "why", "cacheable": True, "seconds": 1.0}
    cache_write(tmp_path, "k", record)
    assert cache_read(tmp_path, "k", _jobs([2])[0]) == record
    cache_write(tmp_path, "bad", {**record, "status": "unheard-of"})
    assert cache_read(tmp_path, "bad", _jobs([2])[0]) is None


def test_candidates_differing_only_in_persistent_share_one_solve(tmp_path, monkeypatch):
    """The persistent and the one-CTA-per-tile kernel of a point have one graph and one solve: the sweep solves
    the first and emits the second from its schedule (its own record and cache entry); a point whose solve
    fails gives every kernel of it that outcome without another solve."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def inline(jobs, done, *, workers, address):
        calls.append([(job.candidate.streaming_depth, job.candidate.persistent, job.schedule is not None)
                      for job in jobs])
        for i, job in enumerate(jobs):
            done(i, sweep.run_job(job))

    monkeypatch.setattr(sweep, "_run_pool", inline)
    jobs = [replace(job, candidate=replace(job.candidate, persistent=p))
            for p in (False, True) for job in _jobs([2, 3])]
    records = run_sweep(jobs, workers=2)
    assert calls == [[(2, False, False), (3, False, False)], [(2, True, True), (3, True, True)]]
    assert [r["status"] for r in records] == ["ok"] * 4
    assert [r["ii"] for r in records[2:]] == [r["ii"] for r in records[:2]]
    assert records[2]["schedule"] == records[0]["schedule"]
    assert len({r["key"] for r in records}) == 4 and len(list((tmp_path / "twill" / "tune").glob("*.json"))) == 4
    calls.clear()
    assert all(r["cached"] for r in run_sweep(jobs, workers=2)) and calls == []
    broken = [replace(job, graph={"format": "twill-graph/1", "name": "broken"}) for job in jobs[::2]]
    records = run_sweep(broken, workers=1, use_cache=False)
    assert calls == [[(2, False, False)]]                   # the second kernel of the point is not solved again
    assert [r["status"] for r in records] == ["error", "error"] and records[0]["reason"] == records[1]["reason"]


def test_jobs_pickle_with_their_read_only_mappings():
    job = _jobs([2])[0]
    again = pickle.loads(pickle.dumps(job))
    assert again.machine == H100 and again.key("v") == job.key("v")


def test_failed_candidate_is_recorded_not_raised(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    job = replace(_jobs([2])[0], graph={"format": "twill-graph/1", "name": "broken"})
    [record] = run_sweep([job], workers=1, use_cache=False)
    assert record["status"] == "error" and record["reason"]


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty,lines", [(True, False), (False, True), (False, False)])
def test_progress_bar_on_a_terminal_lines_otherwise(tty, lines):
    stream = _Stream(tty)
    bar = Progress(total=2, stream=stream, lines=lines)
    bar.update("a=1", {"status": "ok", "seconds": 0.5}, cached=False)
    bar.update("a=2", {"status": "infeasible"}, cached=True)
    text = stream.getvalue()
    if tty:
        assert text.count("\r") == 2 and text.endswith("2/2 (1 cached, 1 failed)\n")
    elif lines:
        assert text.splitlines() == ["twill: tune 1/2 a=1: ok (0.5 s)", "twill: tune 2/2 a=2: infeasible (cached)"]
    else:
        assert text == ""


def _die(job):
    os._exit(3)


def test_a_dying_worker_fails_its_candidate_not_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sweep, "run_job", _die)
    [record] = run_sweep(_jobs([2]), workers=1)
    assert record["status"] == "error" and "worker failed" in record["reason"]
    assert not (tmp_path / "twill" / "tune").exists() or not list((tmp_path / "twill" / "tune").glob("*.json"))


# -- the command ------------------------------------------------------------------------------------------
def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_tune_end_to_end_with_two_workers(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    doc_path, kernel_path = tmp_path / "sweep.json", tmp_path / "best.py"
    argv = ["tune", "gemm", "--block-m", "128", "--block-n", "128,256", "--block-k", "64", "--warps", "8",
            "--streaming-depth", "2,3", "--persistent", "false", "--shape", "2048,2048,2048", "--workers", "2",
            "--json", str(doc_path), "-o", str(kernel_path)]
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    doc = json.loads(doc_path.read_text())
    assert doc["format"] == "twill-tune/1" and doc["shape"] == {"M": 2048, "N": 2048, "K": 2048}
    results = doc["results"]
    assert len(results) == 4 and all(r["status"] == "ok" and not r["cached"] for r in results)
    times = [r["prediction"]["seconds"] for r in results]
    assert times == sorted(times)
    assert "def launch" in kernel_path.read_text()
    assert "rank" in out and "4 ok" in out
    rc, out, _ = _run(argv, capsys)
    assert rc == 0 and "(4 cached)" in out
    assert all(r["cached"] for r in json.loads(doc_path.read_text())["results"])


@pytest.mark.parametrize("argv,message", [
    (["tune", "gemm", "--shape", "1,2"], "shape"),
    (["tune", "gemm", "--shape", "1,2,3", "-o", "/nonexistent-dir/k.py"], "cannot write '/nonexistent-dir/k.py'"),
    (["tune", "gemm", "--json", "/nonexistent-dir/s.json"], "cannot write '/nonexistent-dir/s.json'"),
    (["tune", "paper-example"], "no problem shape"),
    (["tune", "nope"], "unknown kernel"),
    (["tune", "flash-fwd", "--head-dim", "64", "--shape", "1,1,128,128"], "does not match"),
    (["tune", "gemm", "--constexpr", "BLOCK_M=64"], "Triton targets only"),
    (["tune", "gemm", "--workers", "0"], "--workers"),
    (["tune", "gemm", "--block-m", "x"], "comma list"),
    (["tune", "gemm", "--persistent", "maybe"], "comma list of bool"),
    (["tune", "flash-bwd", "--persistent", "true"], "persistent is an axis of gemm and flash-fwd"),
    (["tune", "gemm", "--extra-copies", "-1"], "--extra-copies: must be an integer in [0, 16], got -1"),
    (["tune", "k.py:fn", "--signature", "a=i32", "--extra-copies", "1"], "--extra-copies applies to built-in"),
])
def test_tune_errors_are_one_line_before_any_solve(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("twill: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "twill").exists()


def test_measure_without_a_gpu_is_a_clear_error(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch", reason="torch absent: the error path is the import one, covered below")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rc, _, err = _run(["tune", "gemm", "--measure", "2"], capsys)
    assert rc == 2 and "--measure needs a CUDA GPU" in err


def test_measure_without_torch_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)         # import torch raises ImportError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rc, _, err = _run(["tune", "gemm", "--measure", "2"], capsys)
    assert rc == 2 and "--measure needs a CUDA GPU" in err and err.count("\n") == 1


# -- Triton targets and spills ----------------------------------------------------------------------------
@pytest.mark.slow
def test_triton_matmul_spill_check_discards_the_spilling_config(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton", reason="Triton is needed to compile the kernel")
    from twill.integrations.triton.kernels import matmul

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    doc_path = tmp_path / "sweep.json"
    rc, out, err = _run(["tune", f"{matmul.__file__}:matmul_kernel", "--signature", matmul.SIGNATURE,
                         "--constexpr", "BLOCK_M=128,256", "--constexpr", "BLOCK_N=256", "--constexpr", "BLOCK_K=64",
                         "--num-warps", "8", "--check-spills", "--json", str(doc_path)], capsys)
    assert rc == 0, err
    by_m = {r["settings"]["BLOCK_M"]: r for r in json.loads(doc_path.read_text())["results"]}
    # 256x256 fp32 accumulator on 8 warps is 256 registers per thread before anything else: it must spill.
    assert by_m[256]["status"] == "spills" and by_m[256]["spills"]["spill_bytes"] > 0
    assert by_m[128]["status"] == "ok" and by_m[128]["spills"]["spill_bytes"] == 0
    assert "M=4096,N=4096,K=4096" in out
    # the compiled kernel's registers and shared memory are what the prediction counts CTAs per SM with
    records = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "twill" / "tune").glob("*.json")]
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 1
    compiled = ok[0]["schedule"]["stats"]["compiled"]
    assert compiled["registers"] == ok[0]["spills"]["registers"] > 0
    assert compiled["shared_bytes"] >= 3 * (128 * 64 + 64 * 256) * 2     # at least Triton's 3-deep A/B rings


# -- measuring Triton targets: the launch convention and the comparison with @triton.autotune ---------------
_NO_HOOK_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    for i in range(0, tl.cdiv(n, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2.0)
"""


@pytest.mark.parametrize("name,fn", [("matmul", "matmul_kernel"), ("flash_fwd", "attn_fwd"),
                                     ("flash_fwd_subtiled", "attn_fwd_subtiled")])
def test_builtin_triton_kernels_define_the_launch_hook(name, fn):
    pytest.importorskip("triton", reason="Triton is needed to import the kernels")
    import importlib
    import inspect

    from twill.tune.measure_triton import launch_hook

    mod = importlib.import_module(f"twill.integrations.triton.kernels.{name}")
    hook = launch_hook(getattr(mod, fn))
    assert hook is mod.twill_launch
    params = inspect.signature(hook).parameters
    assert list(params)[:2] == ["fn", "shape"] and params["meta"].kind is inspect.Parameter.VAR_KEYWORD


def test_measure_on_a_triton_kernel_without_the_hook_is_one_line_before_any_solve(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton", reason="Triton is needed to import the kernel")
    path = tmp_path / "user_kernel.py"
    path.write_text(_NO_HOOK_KERNEL)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rc, out, err = _run(["tune", f"{path}:scale", "--signature", "x_ptr=*fp32:16,n=i32:16",
                         "--constexpr", "BLOCK=128", "--measure", "1"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err == (f"twill: error: cannot measure Triton kernel 'scale': {path} defines no "
                   f"twill_launch(fn, shape, **meta) hook (see docs/tuning.md, 'Measuring Triton kernels')\n")
    assert not (tmp_path / "cache").exists()


def test_measure_on_a_triton_kernel_with_the_hook_still_needs_a_gpu(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton", reason="Triton is needed to import the kernel")
    from twill.integrations.triton.kernels import matmul

    monkeypatch.setitem(sys.modules, "torch", None)         # import torch raises ImportError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rc, out, err = _run(["tune", f"{matmul.__file__}:matmul_kernel", "--signature", matmul.SIGNATURE,
                         "--constexpr", "BLOCK_M=128", "--measure", "1"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--measure needs a CUDA GPU" in err
    assert not (tmp_path / "cache").exists()


def test_hooked_kernel_sets_the_stages_hook_only_around_its_launches():
    pytest.importorskip("triton", reason="the hook lives in Triton's knobs")
    from triton import knobs

    from twill.tune.measure_triton import HookedKernel

    seen = []

    class Kernel:
        def __getitem__(self, grid):
            def launch(*args, fail=False):
                seen.append((grid, args, knobs.runtime.add_stages_inspection_hook))
                if fail:
                    raise RuntimeError("compile failed")
            return launch

    marker = object()
    kernel = HookedKernel(Kernel(), marker)
    kernel[(4, 2)](1, 2)
    assert seen == [((4, 2), (1, 2), marker)] and knobs.runtime.add_stages_inspection_hook is None
    with pytest.raises(RuntimeError):
        kernel[(1,)](fail=True)
    assert seen[-1][2] is marker and knobs.runtime.add_stages_inspection_hook is None


def test_triton_meta_is_the_constexprs_warps_and_stages():
    from twill.tune.measure_triton import triton_meta
    from twill.tune.space import candidate_of

    cand = candidate_of({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4})
    assert triton_meta(cand) == {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4}
    assert triton_meta(Candidate(options=(("BLOCK", 32),))) == {"BLOCK": 32, "num_warps": 4}


def test_spearman_rank_correlation():
    from twill.tune.measure import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # ranks x = 1,2,3,4 and y = 1.5,1.5,3,4 (a tie): rho = 4.5 / sqrt(5 * 4.5)
    assert spearman([1, 2, 3, 4], [5, 5, 7, 9]) == round(4.5 / math.sqrt(5 * 4.5), 3)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def _row(label, rank, predicted, a, b):
    row = {"label": label, "predicted_rank": rank, "predicted_us": predicted, "triton_us": a, "twill_us": b}
    if a is not None and b is not None:
        row["speedup"] = round(a / b, 3)
    return row


def test_comparison_with_autotune_takes_twill_tuned_from_the_top_k_predicted_only():
    from twill.tune.measure_triton import compare_with_autotune

    rows = [_row("c0", 0, 100.0, 120.0, 110.0), _row("c1", 1, 105.0, 100.0, 104.0),
            _row("c2", 2, 130.0, 118.0, 90.0), _row("c3", None, None, 95.0, None)]
    comp = compare_with_autotune(rows, top=2)
    assert comp["autotune_choice"] == {"label": "c3", "us": 95.0}            # best Triton schedule of all
    assert comp["twill_tuned"] == {"label": "c1", "us": 104.0, "injected": True}  # c2: faster, ranked 3rd
    assert comp["twill_best"] == {"label": "c2", "us": 90.0}
    assert comp["ratio"] == round(95.0 / 104.0, 3) and comp["ratio_best"] == round(95.0 / 90.0, 3)
    assert comp["slower_than_triton"] == ["c1"]
    assert comp["spearman"] == -1.0         # predicted c0 < c1 < c2, measured Twill times the other way round


def test_triton_measurement_table_shows_both_schedules_and_the_autotune_comparison():
    from twill.tune.measure_triton import compare_with_autotune, format_triton_measured

    rows = [{**_row("BLOCK_M=128", 0, 100.0, 120.0, 100.0), "triton_status": "ok", "twill_status": "ok"},
            {**_row("BLOCK_M=64", None, None, 150.0, None), "triton_status": "ok"}]
    autotune = {"status": "ok", "settings": {"BLOCK_M": 128, "num_warps": 4, "num_stages": 3}, "us": 121.0}
    text = format_triton_measured({"rows": rows, "comparison": {**compare_with_autotune(rows, 3),
                                                                "autotune": autotune}})
    assert "autotune's choice (best Triton schedule of 2 configurations): BLOCK_M=128, 120.0 us" in text
    assert "@triton.autotune picked BLOCK_M=128 num_warps=4 num_stages=3, 121.0 us" in text
    assert "faster than Triton's): BLOCK_M=128 (Twill's schedule), 100.0 us: 1.200x autotune's choice" in text


def test_where_twill_keeps_tritons_schedule_the_shipped_kernel_is_tritons():
    """A configuration whose Twill schedule the model does not predict faster than Triton's order keeps Triton's
    own schedule: Twill-tuned is then Triton's kernel of that configuration, and its (slower) Twill schedule
    counts neither as Twill-tuned nor as 'slower than Triton'."""
    from twill.tune.measure_triton import compare_with_autotune, format_triton_measured

    rows = [{**_row("BLOCK_M=64", 0, 90.0, 100.0, 106.0), "injected": False},
            {**_row("BLOCK_M=128", 1, 95.0, 104.0, 101.0), "injected": True},
            _row("BLOCK_M=32", None, None, 130.0, None)]
    comp = compare_with_autotune(rows, 2)
    assert comp["twill_tuned"] == {"label": "BLOCK_M=64", "us": 100.0, "injected": False}
    assert comp["ratio"] == 1.0 and comp["slower_than_triton"] == [] and comp["kept"] == ["BLOCK_M=64"]
    text = format_triton_measured({"rows": rows, "comparison": {**comp, "autotune": {"status": "skipped"}}})
    assert "Triton's kept" in text and "BLOCK_M=64 (Triton's own schedule, kept), 100.0 us: 1.000x" in text


def test_measure_triton_times_every_config_with_triton_and_the_top_k_with_twill(monkeypatch, tmp_path):
    """The orchestration of ``--measure`` on a Triton target, with the GPU parts replaced by fakes."""
    import contextlib
    import types

    from twill.tune import measure_triton as measure
    from twill.tune.predict import Prediction
    from twill.tune.rank import Result
    from twill.tune.space import candidate_of

    module = types.ModuleType("_fake_triton_kernel")
    module.twill_launch = lambda fn, shape, **meta: None
    monkeypatch.setitem(sys.modules, module.__name__, module)
    fn = types.SimpleNamespace(__name__="k", fn=types.SimpleNamespace(__module__=module.__name__))
    calls = []

    def fake_config(base, hook, meta, schedule, machine, shapes, *, reps, workdir):
        calls.append((meta["BLOCK"], schedule))
        a = {16: 30.0, 32: 20.0, 64: 25.0, 128: 40.0}[meta["BLOCK"]]
        row = {"triton_us": a, "triton_status": "ok"}
        if schedule is not None:
            row.update(twill_us=a * 0.8, twill_status="ok", speedup=1.25)
        return [row]

    monkeypatch.setattr(measure, "require_gpu", lambda: None)
    monkeypatch.setattr(measure, "triton_runtime", lambda: contextlib.nullcontext(str(tmp_path)))
    monkeypatch.setattr(measure, "measure_triton_config", fake_config)
    monkeypatch.setattr(measure, "autotune_choice", lambda base, hook, metas, shape, reps:
                        {"status": "ok", "settings": dict(metas[0]), "us": 20.0, "configurations": len(metas)})
    again = []
    monkeypatch.setattr(measure, "head_to_head", lambda base, hook, auto, tuned, schedule, machine, shape, *, reps,
                        workdir: again.append((auto["BLOCK"], tuned["BLOCK"], schedule, reps)) or {"status": "ok"})

    def result(block, us):
        cand = candidate_of({"BLOCK": block, "num_warps": 4, "num_stages": 3})
        if us is None:
            return Result(cand, {"status": "spills", "reason": "spills"})
        pred = Prediction(seconds=us * 1e-6, cycles=0.0, iterations=1, tiles=1, waves=1, breakdown={})
        return Result(cand, {"status": "ok"}, schedule=f"schedule-{block}", prediction=pred)

    ranked = [result(64, 10.0), result(16, 11.0), result(32, 12.0), result(128, None)]
    ranked[1] = replace(ranked[1], injected=False)     # the model sees no gain in Twill's order: Triton's kept
    out = measure.measure_triton(fn, ranked, Shape("gemm", (64, 64, 64)), 2, H100)
    # Triton's schedule for all four configurations, Twill's for the two best predicted where it is injected
    assert calls == [(64, "schedule-64"), (16, None), (32, None), (128, None)]
    assert [r["predicted_rank"] for r in out["rows"]] == [0, 1, 2, None]
    assert [r.get("injected") for r in out["rows"]] == [None, False, None, None]
    comp = out["comparison"]
    assert comp["autotune_choice"] == {"label": "BLOCK=32 num_warps=4 num_stages=3", "us": 20.0}
    assert comp["twill_tuned"] == {"label": "BLOCK=64 num_warps=4 num_stages=3", "us": 20.0, "injected": True}
    assert comp["kept"] == ["BLOCK=16 num_warps=4 num_stages=3"]
    assert comp["ratio"] == 1.0 and comp["autotune"]["configurations"] == 4
    # the two picks are timed again together: autotune's choice with Triton's schedule, Twill-tuned with Twill's
    assert again == [(32, 64, "schedule-64", measure.HEAD_TO_HEAD_REPS)] and comp["head_to_head"] == {"status": "ok"}


def test_interleaved_timing_reverses_the_order_every_other_round(monkeypatch):
    pytest.importorskip("triton", reason="the timing calls triton.testing.do_bench")
    import triton.testing

    from twill.tune import measure_triton as measure

    order = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: order.append(fn()) or 1.0)
    times = measure.time_interleaved({"a": lambda: "a", "b": lambda: "b"}, 4)
    assert "".join(order) == "abbaabba" and times == {"a": [1e3] * 4, "b": [1e3] * 4}


def test_head_to_head_times_both_picks_together_and_refuses_a_wrong_one(monkeypatch, tmp_path):
    """The final comparison builds autotune's choice with Triton's schedule and Twill-tuned with Twill's, checks
    both, times them interleaved and reports the best of each; a wrong result is a status, not a time."""
    pytest.importorskip("triton", reason="the head-to-head builds a Triton JITFunction")
    from twill.integrations.triton.kernels import matmul
    from twill.tune import measure_triton as measure

    built, errors = [], {"autotune": 0.0, "twill": 0.0}

    def hook(fn, shape, **meta):
        name = "twill" if isinstance(fn, measure.HookedKernel) else "autotune"
        built.append((name, meta["BLOCK_N"]))
        return name, (lambda: errors[name])

    monkeypatch.setattr(measure, "time_interleaved", lambda launches, reps: {
        name: [10.0 + i for i in range(reps)] if name == "autotune" else [8.0 + i for i in range(reps)]
        for name in launches})
    import twill.integrations.triton.inject as injection

    monkeypatch.setattr(injection, "make_jit_hook", lambda *args, **kwargs: "hook")
    shape = Shape("gemm", (256, 256, 256))
    kept = measure.head_to_head(matmul.matmul_kernel, hook, {"BLOCK_N": 128}, {"BLOCK_N": 256}, None, H100, shape,
                                reps=3, workdir=str(tmp_path))
    assert built == [("autotune", 128), ("autotune", 256)]      # no schedule: Triton's own kernel, kept
    assert kept["status"] == "ok"
    built.clear()
    args = (matmul.matmul_kernel, hook, {"BLOCK_N": 128}, {"BLOCK_N": 256}, "schedule", H100, shape)
    out = measure.head_to_head(*args, reps=3, workdir=str(tmp_path))
    assert built == [("autotune", 128), ("twill", 256)]
    assert out == {"status": "ok", "reps": 3, "autotune_us_runs": [10.0, 11.0, 12.0], "twill_us_runs": [8.0, 9.0, 10.0],
                   "autotune_us": 10.0, "twill_us": 8.0, "ratio": 1.25}
    errors["twill"] = 0.5
    assert measure.head_to_head(*args, reps=3, workdir=str(tmp_path))["status"].startswith("twill: wrong")


def test_measure_picks_the_best_of_each_tiling_first():
    """``--measure K`` takes the best-ranked candidate of each tiling before a second ring depth or register
    budget of one tiling (those often tie in the prediction), then the rest in rank order; unsolved results
    are never picked."""
    from twill.tune.predict import Prediction
    from twill.tune.rank import Result, measure_picks
    from twill.tune.space import Candidate

    def result(us, depth, block_n, reg=160):
        cand = Candidate(options=(("subtiles", 2), ("block_n", block_n)), streaming_depth=depth, reg_limit=reg)
        if us is None:
            return Result(cand, {"status": "spills"})
        return Result(cand, {"status": "ok"}, schedule=None,
                      prediction=Prediction(seconds=us, cycles=0.0, iterations=1, tiles=1, waves=1, breakdown={}))

    ranked = [result(1.0, 2, 64), result(1.0, 3, 64), result(1.0, 4, 64, 200), result(1.1, 2, 128),
              result(1.2, 3, 128), result(None, 2, 32)]
    picks = measure_picks(ranked, 3)
    assert [rank for rank, _ in picks] == [1, 4, 2]
    assert [p.candidate.label() for _, p in picks] == [
        "subtiles=2 block_n=64 streaming_depth=2 reg_limit=160",
        "subtiles=2 block_n=128 streaming_depth=2 reg_limit=160",
        "subtiles=2 block_n=64 streaming_depth=3 reg_limit=160"]
    assert len(measure_picks(ranked, 10)) == 5
    # the persistent form of a tiling is no other tiling: its prediction differs by the fill of a few tiles
    persistent = [replace(r, candidate=replace(r.candidate, persistent=p)) for r in ranked[:1] for p in (True, False)]
    picks = measure_picks(persistent + ranked[3:4], 2)
    assert [(rank, p.candidate.persistent, dict(p.candidate.options)["block_n"]) for rank, p in picks] == [
        (1, True, 64), (3, None, 128)]


# -- Ray --------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_is_a_one_line_error(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'twill-gpu[ray]')")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(TwillError, match="cannot reach the Ray cluster"):
        run_sweep(_jobs([2]), ray_address=f"127.0.0.1:{_free_port()}")


@pytest.mark.slow
def test_ray_sweep_on_a_local_cluster(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'twill-gpu[ray]')")
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ray_tmp = tempfile.mkdtemp(prefix="twray", dir="/tmp")     # Ray's socket paths must stay short
    head = subprocess.Popen([sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())",
                             "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", f"--temp-dir={ray_tmp}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_port(port, head)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        records = run_sweep(_jobs([2, 3]), ray_address=f"127.0.0.1:{port}", use_cache=False)
        local = run_sweep(_jobs([2, 3]), workers=1, use_cache=False)
        assert [r["status"] for r in records] == ["ok", "ok"]
        assert [r["ii"] for r in records] == [r["ii"] for r in local]
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)         # the head and the workers it started, nothing else
            head.wait(timeout=90)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ray start exited with status {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    pytest.fail("the local Ray head did not come up")


def test_a_schedule_the_gluon_backend_refuses_is_not_ranked(monkeypatch):
    from twill.errors import UnsupportedFeatureError
    from twill.tune.space import kernel_space

    def refuse(schedule, persistent=False):
        raise UnsupportedFeatureError("cannot generate: op 'x' runs in another warp group")

    monkeypatch.setattr("twill.codegen.gluon.gluon_plan", refuse)
    space = kernel_space("gemm", H100, {"block_m": (128,), "block_n": (128,), "block_k": (64,), "warps": (4,),
                                        "streaming_depth": (3,)})
    cand = space.candidates[0]
    record = sweep.run_job(Job(candidate=cand, graph=graph_to_dict(build_kernel("gemm", H100, **dict(cand.options))),
                               machine=H100, time_limit=30.0))
    assert record["status"] == "cannot_emit" and "another warp group" in record["reason"]
    assert "schedule" in record  # the solved schedule is kept for the report


def test_a_persistent_candidate_is_emitted_persistent_and_refused_when_it_overflows():
    """The sweep asks the generator for the candidate's own kernel: a persistent 128x128x64 GEMM with a 7-deep
    ring is solved (the schedule is the same) but cannot be emitted (rings + C staging > 227 KiB)."""
    options = (("block_m", 128), ("block_n", 128), ("block_k", 64), ("warps", 8))
    graph = graph_to_dict(build_kernel("gemm", H100, **dict(options)))
    jobs = [Job(candidate=Candidate(options=options, streaming_depth=7, persistent=p), graph=graph, machine=H100,
                time_limit=30.0) for p in (False, True)]
    assert jobs[0].key("v") != jobs[1].key("v")
    plain, persistent = (sweep.run_job(job) for job in jobs)
    assert plain["status"] == "ok"
    assert persistent["status"] == "cannot_emit" and "persistent GEMM" in persistent["reason"]
    assert persistent["schedule"]["ii"] == plain["schedule"]["ii"]


def test_extra_copies_reach_every_built_in_job_and_the_cache_key():
    """``--extra-copies`` (default 0, Algorithm 1's copies) goes to every job of a built-in kernel and is part
    of its cache key."""
    from twill.cli import build_parser
    from twill.commands.tune import _request
    from twill.tune.run import plan_sweep

    argv = ["tune", "flash-fwd", "--subtiles", "2", "--block-n", "128", "--streaming-depth", "2",
            "--reg-limit", "240", "--persistent", "false"]
    _, jobs, _ = plan_sweep(_request(build_parser().parse_args(argv)), H100)
    _, more, _ = plan_sweep(_request(build_parser().parse_args(argv + ["--extra-copies", "1"])), H100)
    assert [j.extra_copies for j in jobs] == [0] and [j.extra_copies for j in more] == [1]
    assert jobs[0].key("v") != more[0].key("v")


def test_a_job_whose_extra_copies_give_no_buildable_schedule_keeps_algorithm_1s(monkeypatch):
    """When the extra copies' schedule is one the Gluon generator refuses, the job solves again with
    Algorithm 1's copies and says so (``extra_copies_dropped``)."""
    from twill.tune import sweep as sweep_module
    from twill.tune.sweep import run_job

    calls = []
    real = sweep_module._gluon_refusal

    def refuse_extra(schedule, machine, persistent):
        calls.append(schedule.stats.get("copies"))
        return "made up: no" if len(calls) == 1 else real(schedule, machine, persistent)

    monkeypatch.setattr(sweep_module, "_gluon_refusal", refuse_extra)
    graph = build_kernel("flash-fwd", H100, subtiles=2, head_dim=128)
    job = Job(candidate=Candidate(options=(("subtiles", 2), ("head_dim", 128)), streaming_depth=2),
              machine=H100, time_limit=30, graph=graph_to_dict(graph), extra_copies=1)
    record = run_job(job)
    assert record["status"] == "ok" and record["extra_copies_dropped"] == "made up: no"
    from twill.tune.rank import rank

    ranked = rank([job.candidate], [record], Shape("attention", (1, 4, 2048, 128)), H100)
    assert ranked[0].to_dict()["extra_copies_dropped"] == "made up: no"     # and so in the --json sweep


def test_causal_query_blocks_run_to_their_diagonal_heaviest_first():
    """A causal forward's query block i runs ⌈min(S, (i + 1)·block_m) / block_n⌉ key tiles; the launch order
    takes chunks of heads, heaviest first across each chunk; other loops have no such list."""
    from twill.tune.predict import causal_iterations, list_schedule

    causal = build_kernel("flash-fwd", H100, head_dim=128, subtiles=2, causal=True)   # 128 x 128 tiles
    # chunks of sms // blocks heads, heaviest first across each chunk
    assert causal_iterations(causal, Shape("attention", (1, 2, 300, 128)), 132) == [3, 3, 2, 2, 1, 1]
    assert causal_iterations(causal, Shape("attention", (1, 3, 300, 128)), 6) == [3, 3, 2, 2, 1, 1, 3, 2, 1]
    assert causal_iterations(causal, Shape("attention", (1, 2, 300, 128)), 2) == [3, 2, 1] * 2
    assert causal_iterations(build_kernel("flash-fwd", H100, head_dim=128), Shape("attention", (1, 1, 300, 128)),
                             132) is None
    # greedy list scheduling: each item goes to the slot that frees first
    assert list_schedule([4.0, 3.0, 2.0, 1.0], 2) == (5.0, [2, 2])
    assert list_schedule([1.0] * 5, 8) == (1.0, [1, 1, 1, 1, 1, 0, 0, 0])
    assert Shape("attention", (1, 1, 128, 64)).flops("flash-fwd", causal=True) == 4.0 * 128 ** 2 * 64 / 2


def test_a_causal_prediction_schedules_its_unequal_blocks_on_the_sms():
    """The causal forward's grid is its blocks of unequal length handed to the SMs in launch order; each block
    pays its fill, loop and store (persistent: one fill per CTA); the same schedule without the mask costs more."""
    from measurements import calibration_rows
    from twill.machine.calibrate import fit
    from twill.tune.predict import causal_iterations, list_schedule

    machine = replace(fit(calibration_rows(), H100), launch_us=0.0)
    shape = Shape("attention", (2, 16, 4096, 128))
    causal = flash_schedule(build_kernel("flash-fwd", H100, head_dim=128, subtiles=2, causal=True), H100)
    full = flash_schedule(build_kernel("flash-fwd", H100, head_dim=128, subtiles=2), H100)
    for persistent in (False, True):
        p = predict(causal, shape, machine, persistent=persistent)
        b = p.breakdown
        blocks = causal_iterations(causal.graph, shape, 132)
        body = [(n - 1) * b["ii_effective"] + b["length_raw"] * max(1.0, b.get("chain_ii", 0) / b["ii_raw"])
                + b["store_cycles"] for n in blocks]
        if persistent:
            expect = list_schedule(body, 132)[0] + b["fill_cycles"]
        else:
            expect = list_schedule([b["fill_cycles"] + d for d in body], 132 * b["ctas_per_sm"])[0]
        assert b["causal"] == 1.0 and p.cycles == pytest.approx(expect)
        assert p.iterations == 32 and p.tiles == 2 * 16 * 32
        assert predict(full, shape, machine, persistent=persistent).cycles > 1.6 * p.cycles


def test_the_causal_and_grouped_backward_grid_is_its_kernels():
    """The backward's CTAs are (key block, batch x K/V head); each loops over its group's query heads times the
    query blocks from its key block's diagonal on (causal), handed out in chunks of heads heaviest first."""
    from twill.tune.predict import causal_iterations, grid_heads, loop_extent

    gqa = build_kernel("flash-bwd", H100, head_dim=128, kv_heads=4, causal=True)    # 128 keys x 64 queries
    shape = Shape("attention", (2, 16, 512, 128))
    assert grid_heads(gqa, shape) == (8, 4) and loop_extent(gqa, shape) == (8 * 4, 4 * 8)
    blocks = causal_iterations(gqa, shape, 8)            # 4 key blocks per head: chunks of 2 heads
    assert blocks[:8] == [32, 32, 24, 24, 16, 16, 8, 8] and len(blocks) == 32
    assert sum(blocks) == 8 * 4 * (8 + 6 + 4 + 2)
    plain = build_kernel("flash-bwd", H100, head_dim=128)
    assert grid_heads(plain, shape) == (32, 1) and causal_iterations(plain, shape, 8) is None
    with pytest.raises(TwillError, match="not a multiple of the kernel's 4 K/V heads"):
        grid_heads(gqa, Shape("attention", (2, 6, 512, 128)))


def test_the_backward_prediction_adds_its_memory_passes():
    """The generated backward also runs a pre-pass, two zeroing launches and the dQ conversion: 14 bytes per
    query row and head-dim element at the device's memory bandwidth, plus a launch each; other kernels none."""
    from twill.tune.predict import backward_passes

    shape = Shape("attention", (2, 4, 1024, 128))
    passes = backward_passes(build_kernel("flash-bwd", H100, head_dim=128), shape, H100)
    assert passes["passes_us"] == pytest.approx(14 * 2 * 4 * 1024 * 128 / H100.dram_bytes_per_s * 1e6
                                                + 4 * H100.launch_us)
    assert backward_passes(build_kernel("flash-fwd", H100, head_dim=128), shape, H100) == {}


def test_uncalibrated_predictions_are_labelled(tmp_path, monkeypatch, capsys):
    """On a built-in machine's datasheet rates the ranking says so in a line of its own and heads its time and
    rate columns ``uncalibrated``, and the JSON says ``calibrated: false``; with a calibrated ``--machine`` file
    the columns are predictions, unlabelled."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    doc_path = tmp_path / "sweep.json"
    argv = ["tune", "gemm", "--block-m", "128", "--block-n", "128", "--block-k", "64", "--warps", "8",
            "--streaming-depth", "2", "--persistent", "false", "--workers", "1", "--json", str(doc_path)]
    rc, out, err = _run(argv + ["--arch", "h200"], capsys)
    assert rc == 0, err
    assert out.splitlines()[1].startswith("uncalibrated: h200's datasheet rates, no --machine file")
    assert "uncalibrated us" in out and "uncalibrated TFLOP/s" in out and "predicted us" not in out
    assert json.loads(doc_path.read_text())["calibrated"] is False
    machine = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results",
                           "calibration_h200.machine.json")
    rc, out, err = _run(argv + ["--machine", machine], capsys)
    assert rc == 0, err
    assert "uncalibrated" not in out and "predicted us" in out
    assert json.loads(doc_path.read_text())["calibrated"] is True


def test_sweep_workers_do_not_fork_a_process_with_jax_loaded(tmp_path, monkeypatch):
    """The sweep's workers start from a forkserver (or spawn), never by forking this process: with JAX loaded
    and its CPU backend running, a fork warns that it may deadlock; a sweep must not."""
    import warnings

    jax = pytest.importorskip("jax")
    jax.devices()                                   # the backend (and its threads) up
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert sweep._pool_context().get_start_method() in ("forkserver", "spawn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = run_sweep(_jobs([2, 3]), workers=2, use_cache=False)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]
