"""Gluon backend on the CPU: schedules -> emitted kernels -> sm_90 cubins (Triton 3.6, no GPU needed).

Every variant is a different valid schedule of the same kernel (verified with twill.schedule.verify); the
emitted kernels must differ accordingly and the PTX must show what the schedule asked for: wgmma shapes,
wgmma.wait_group depths (the lag), setmaxnreg budgets, TMA copies and ring sizes in shared memory.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import pytest
from solved import solved_kernel

from twill.codegen.gluon import emit_gluon, gluon_plan, load_emitted, render_plan
from twill.codegen.plan import Turn
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
from twill.errors import UnsupportedFeatureError
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.schedule.result import Schedule
from twill.schedule.verify import verify
from twill.tune.spills import ptxas_report

triton = pytest.importorskip("triton")
aot = pytest.importorskip("twill.codegen.gluon.aot")
HAS_ORTOOLS = importlib.util.find_spec("ortools") is not None


def _compile(tmp_path, schedule: Schedule, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(emit_gluon(schedule))
    module = load_emitted(str(path), f"twill_test_{name}")
    _check_launcher_globals(module)
    return module, aot.ptx_facts(aot.compile_sm90(module))


def _check_launcher_globals(module) -> None:
    """Every global the host launcher reads exists (the launcher itself only runs on a GPU)."""
    import builtins
    import dis

    for fn in (module.launch, module.compile_signature):
        names = {i.argval for i in dis.get_instructions(fn) if i.opname == "LOAD_GLOBAL"}
        missing = [n for n in names if n not in vars(module) and not hasattr(builtins, n)]
        assert not missing, f"{fn.__name__} reads undefined globals {missing}"


# -- GEMM ----------------------------------------------------------------------------------------------
GEMM_CASES = [  # (block_m, block_n, lag, depth, warps)
    (128, 256, 1, 4, 8),
    (128, 256, 0, 3, 8),
    (128, 128, 1, 2, 8),
    (64, 128, 1, 4, 4),
]


@pytest.mark.parametrize("bm,bn,lag,depth,warps", GEMM_CASES)
def test_gemm_variant_compiles_with_scheduled_lag_and_ring(tmp_path, bm, bn, lag, depth, warps):
    graph = build_kernel("gemm", H100, block_m=bm, block_n=bn, block_k=64)
    sched = gemm_schedule(graph, H100, lag=lag, depth=depth, warps=warps)
    verify(sched, H100)
    plan = gluon_plan(sched)
    assert plan.decisions.mma_lag == lag == sched.stage("mma_wait") - sched.stage("mma")
    assert [r.depth for r in plan.rings] == [max(depth, lag + 1)] * 2
    module, facts = _compile(tmp_path, sched, f"gemm_{bm}_{bn}_{lag}_{depth}")
    assert module.MMA_LAG.value == lag and module.A_DEPTH.value == max(depth, lag + 1)
    assert facts.wgmma_shapes == (f"m64n{bn}k16",)
    assert set(facts.wait_depths) == {0, lag}
    assert ("dec", 24) in facts.setmaxnreg                 # the TMA producer's register budget
    assert facts.tma_loads >= 2 and facts.tma_stores >= 1
    ring_bytes = max(depth, lag + 1) * (bm * 64 + 64 * bn) * 2
    assert ring_bytes <= facts.shared < ring_bytes + 4096   # the ring is the shared-memory footprint


def test_gemm_variants_emit_different_kernels():
    graph = build_kernel("gemm", H100, block_m=128, block_n=256, block_k=64)
    sources = {(lag, depth): emit_gluon(gemm_schedule(graph, H100, lag=lag, depth=depth))
               for lag in (0, 1) for depth in (3, 4)}
    assert len(set(sources.values())) == 4
    assert "warpgroup_mma_wait(MMA_LAG" in sources[(1, 3)]
    assert "MMA_LAG       = gl.constexpr(1)" in sources[(1, 3)]
    assert "A_DEPTH       = gl.constexpr(4)" in sources[(0, 4)]


def test_gemm_header_documents_the_schedule():
    graph = build_kernel("gemm", H100, block_m=128, block_n=256)
    sched = gemm_schedule(graph, H100, lag=1, depth=4)
    source = emit_gluon(sched)
    header = source.split('"""')[0]
    assert f"II = {sched.ii}" in header and "stages = 2" in header
    assert "load_partition" in header and "compute_partition" in header and "24 regs" in header
    assert "a: load_a -> mma, 4 buffers, released after mma_wait" in header
    assert "mma_wait" in header and "|" in header            # the chart
    compile(source, "gemm.py", "exec")


# -- persistent GEMM -----------------------------------------------------------------------------------
PERSISTENT_CASES = [  # (block_m, block_n, lag, depth, warps); ring 4 at 128x256 stages C in halves
    (128, 256, 1, 3, 8),
    (128, 256, 1, 4, 8),
    (128, 256, 0, 3, 8),
    (128, 128, 1, 4, 8),
    (64, 128, 1, 4, 4),
]


@pytest.mark.parametrize("bm,bn,lag,depth,warps", PERSISTENT_CASES)
def test_persistent_gemm_compiles_with_the_schedules_lag_and_ring(tmp_path, bm, bn, lag, depth, warps):
    """The persistent kernel keeps the plan's schedule decisions; its C staging buffer is live with the rings,
    a whole tile when it fits beside them, else half (two TMA stores per tile)."""
    sched = gemm_schedule(build_kernel("gemm", H100, block_m=bm, block_n=bn, block_k=64), H100, lag=lag,
                          depth=depth, warps=warps)
    verify(sched, H100)
    plan = gluon_plan(sched, persistent=True)
    split = 1 if depth * (bm * 64 + 64 * bn) * 2 + bm * bn * 2 + 16 * depth <= H100.smem_per_block else 2
    one = gluon_plan(sched)
    assert plan == replace(one, persistent=True, decisions=replace(one.decisions, epilogue_split=split))
    path = tmp_path / f"gemm_p_{bm}_{bn}_{lag}_{depth}.py"
    path.write_text(emit_gluon(sched, persistent=True))
    module = load_emitted(str(path), f"twill_test_gemm_p_{bm}_{bn}_{lag}_{depth}")
    _check_launcher_globals(module)
    facts = aot.ptx_facts(aot.compile_sm90(module))
    assert module.MMA_LAG.value == lag and module.A_DEPTH.value == depth
    assert facts.wgmma_shapes == (f"m64n{bn}k16",)
    assert set(facts.wait_depths) == {0, lag}
    assert ("dec", 24) in facts.setmaxnreg
    assert facts.tma_loads >= 2 and facts.tma_stores >= split and facts.mbarrier_waits >= 2
    assert module.EPILOGUE_N.value == bn // split
    ring_bytes = depth * (bm * 64 + 64 * bn) * 2
    staging = bm * bn * 2 // split
    assert ring_bytes + staging <= facts.shared < ring_bytes + staging + 4096   # not aliased with the rings
    assert facts.shared <= H100.smem_per_block


def test_persistent_gemm_walks_tiles_with_one_running_ring():
    sched = gemm_schedule(build_kernel("gemm", H100, block_m=128, block_n=256), H100, lag=1, depth=3, warps=8)
    source = emit_gluon(sched, persistent=True)
    header = source.split('"""')[0]
    assert "persistent:" in header and "min(tiles, SMs)" in header and "tma.store_wait(0)" in header
    assert "_sm_count(a.device.index)" in source and "@functools.lru_cache" in source
    load = source[source.index("def load_partition"):source.index("def tile_offsets")]
    compute = source[source.index("def compute_partition"):source.index("def gemm_kernel")]
    for part in (load, compute):          # both partitions: tiles pid, pid + grid, ...; ring iteration i
        assert "for t in range(cta_tiles):" in part and "first = t * k_tiles" in part
        assert "tile_offsets(gl.program_id(0) + t * gl.num_programs(0), num_m, num_n)" in part
    assert "for i in range(first, first + k_tiles):" in load
    # the compute partition releases the lagged buffers after the drain and stores the tile itself, waiting
    # for the previous store only before writing the staging tile
    drain = compute.index("acc = warpgroup_mma_wait(0, deps=[acc])")
    assert compute.index("mbarrier.arrive(ab_empty.index(i % A_DEPTH))") > drain
    assert compute.index("tma.store_wait(0)") < compute.index("c_smem.store(") < compute.index(
        "tma.async_copy_shared_to_global")
    assert source != emit_gluon(sched)


def test_persistent_gemm_stages_c_in_halves_or_is_refused_when_shared_memory_is_short():
    """128x256x64 ring 4 (192 KiB) leaves no room for the 64 KiB C tile but for half of it: two stores per
    tile. 128x128x64 ring 7 (224 KiB) leaves room for neither: refused, with the numbers."""
    sched = gemm_schedule(build_kernel("gemm", H100, block_m=128, block_n=256), H100, lag=1, depth=4, warps=8)
    source = emit_gluon(sched, persistent=True)
    assert "EPILOGUE_N    = gl.constexpr(128)  # columns of the C staging buffer: BLOCK_N / 2" in source
    assert "c_desc = _descriptor(c_t, [BLOCK_M.value, EPILOGUE_N.value])" in source
    assert "for h in gl.static_range(2):" in source and "229440 bytes of shared memory" in source
    deep = gemm_schedule(build_kernel("gemm", H100, block_m=128, block_n=128), H100, lag=1, depth=7, warps=8)
    emit_gluon(deep)                                        # the kernel with one tile per CTA aliases C
    with pytest.raises(UnsupportedFeatureError, match=r"persistent GEMM .* 245872 bytes, more than the 232448"):
        emit_gluon(deep, persistent=True)


# -- the P V wait fence ------------------------------------------------------------------------------------
FENCE = "keeps ptxas from moving the wait below above the softmax"


@pytest.mark.parametrize("options,persistent", [({"subtiles": 2, "head_dim": 128}, False),
                                                ({"subtiles": 2, "head_dim": 128, "causal": True}, True)])
def test_pv_wait_follows_the_softmax_it_overlaps(tmp_path, options, persistent):
    """With S issued ahead, the steady loop's wgmma wait for O += P(j) V(j) stays after the softmax of j+1 in
    the SASS (ptxas hoists it above the first ex2 unless the emitter fences it: docs/codegen.md)."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=1, depth=2)
    verify(sched, H100)
    source = emit_gluon(sched, persistent=persistent)
    assert FENCE in source
    assert ("mbarrier.wait(q_bar, t & 1)" if persistent else "mbarrier.wait(q_bar, 0)") in source
    path = tmp_path / "fa_fence.py"
    path.write_text(source)
    compiled = aot.compile_sm90(load_emitted(str(path), f"twill_test_fa_fence_{persistent}"))
    loops = aot.sass_loops(aot.sass(compiled))
    steady = min((loop for loop in loops if any("HGMMA" in i for i in loop)
                  and any("MUFU.EX2" in i for i in loop)), key=len)
    last_ex2 = max(n for n, i in enumerate(steady) if "MUFU.EX2" in i)
    pv_wait = [n for n, i in enumerate(steady) if i.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0")]
    assert len(pv_wait) == 1 and pv_wait[0] > last_ex2


def test_pv_wait_fence_from_head_dim_128():
    """D = 64 kernels, bound by the softmax chain, go without the fence (slower with it on the H200)."""
    from twill.kernels.flash_fwd.gluon import PV_WAIT_FENCE_MIN_HEAD_DIM

    assert PV_WAIT_FENCE_MIN_HEAD_DIM == 128
    for head_dim, fenced in ((64, False), (128, True), (256, True)):
        options = {"block_n": 64} if head_dim == 256 else {}
        sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, head_dim=head_dim, **options), H100,
                               ahead=1, depth=2)
        assert (FENCE in emit_gluon(sched)) is fenced
        serial = flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, head_dim=head_dim, **options), H100,
                                ahead=0, depth=2)
        assert FENCE not in emit_gluon(serial)        # no P V in flight during the softmax: nothing to keep


def test_three_subtile_d64_128_key_kernel_does_not_spill(tmp_path):
    """With S issued ahead, P(j+1) is converted to the wgmma operand once P(j) V(j) has retired, so its fp32
    copy is dead before S(j+2) lands: the three-group D = 64 kernel with 128-key tiles (FA3's D = 64 tile)
    fits its 160 registers (it spilled 3.5 KB with P converted after S(j+1) was issued)."""
    if not HAS_ORTOOLS:
        pytest.skip("the three-group schedule with S issued ahead comes from the solver (ortools, extra 'solve')")
    sched = solved_kernel("flash-fwd", "h100", {"subtiles": 3, "head_dim": 64}, streaming_depth=2)
    assert gluon_plan(sched).decisions.qk_ahead == (1, 1, 1)
    source = emit_gluon(sched)
    assert "P(j+1), once P(j) V(j) retired" in source
    path = tmp_path / "fa_sub3_d64.py"
    path.write_text(source)
    compiled = aot.compile_sm90(load_emitted(str(path), "twill_test_fa_sub3_d64_p"))
    report = ptxas_report(compiled.asm["ptx"], 90)
    assert report["spill_bytes"] == 0 and report["serialized_wgmma"] == 0


def test_a_group_issuing_s_ahead_takes_one_tensor_core_turn():
    """The calibrated H200 model's three-group D = 64 schedule orders the wgmmas qk_a pv_a | qk_c | pv_b |
    pv_c | qk_b: five turns. The groups issue S(j+1) and P(j) V(j) at one point, so the plan gives each one
    turn, at its qk's place (cyclically qk_b -> qk_a -> qk_c), and the kernel waits once per iteration."""
    if not HAS_ORTOOLS:
        pytest.skip("the schedule comes from the solver (ortools, extra 'solve')")
    from twill.codegen.plan import cut_turns
    from twill.machine.calibration import load_machine
    from twill.solve import schedule as solve
    from twill.solve.options import SolveOptions

    machine = load_machine(str(Path(__file__).parents[2] / "benchmarks/results/calibration_h200.machine.json"))
    graph = build_kernel("flash-fwd", machine, subtiles=3, head_dim=64, block_n=128)
    sched = solve(graph, machine, SolveOptions(streaming_depth=2, reg_limit=160))
    plan = gluon_plan(sched)
    tc = [op.name for op in sched.graph.ops if op.usage("tc")]
    raw = cut_turns(sched, plan.compute, tc)
    assert plan.decisions.qk_ahead == (1, 1, 1)
    assert len(raw) > 3                                     # the schedule's order splits some group's issues
    assert sorted(t.partition for t in plan.turns) == [0, 1, 2]
    for t in plan.turns:
        assert {sched.graph.op(op).attrs["role"] for op in t.ops} == {"qk", "pv"}
    # the cyclic order of the groups' qk ops in the schedule is the order of the turns
    order = [t.partition for t in raw if any(sched.graph.op(op).attrs["role"] == "qk" for op in t.ops)]
    start = order.index(plan.turns[0].partition)
    assert [t.partition for t in plan.turns] == order[start:] + order[:start]
    source = emit_gluon(sched)
    assert "PV_TURN" not in source and "QK_PASS" not in source


def test_split_turns_stay_for_a_group_that_issues_s_and_pv_apart():
    """With S not issued ahead (stage(pv) = stage(qk)), S and P V are issued at two points of the program:
    that group keeps the schedule's split turns; only the groups issuing S ahead are merged."""
    from twill.kernels.flash_fwd.plan import one_turn_when_ahead

    graph = build_kernel("flash-fwd", H100, subtiles=3, head_dim=64)

    def merged(turns, ahead):
        return one_turn_when_ahead(graph, turns, ahead)

    turns = (Turn(0, ("qk_a",)), Turn(1, ("qk_b",)), Turn(0, ("pv_a",)), Turn(2, ("qk_c",)), Turn(1, ("pv_b",)),
             Turn(2, ("pv_c",)))
    assert merged(turns, (0, 1, 1)) == (Turn(0, ("qk_a",)), Turn(1, ("qk_b", "pv_b")), Turn(0, ("pv_a",)),
                                        Turn(2, ("qk_c", "pv_c")))
    assert merged(turns, (0, 0, 0)) == turns
    # merging a group can leave two turns of another side by side (here around the cycle): they become one
    two = (Turn(0, ("qk_a",)), Turn(1, ("qk_b",)), Turn(0, ("pv_a",)), Turn(1, ("pv_b",)))
    assert merged(two, (0, 1, 1)) == (Turn(0, ("pv_a", "qk_a")), Turn(1, ("qk_b", "pv_b")))


# -- persistent attention forward -------------------------------------------------------------------------
PERSISTENT_FLASH_CASES = [  # (kernel options, ahead)
    ({"subtiles": 2, "head_dim": 128, "causal": True}, 1),
    ({"subtiles": 2, "head_dim": 128}, 0),
    ({"subtiles": 2, "head_dim": 128, "kv_heads": 2, "dtype": "bf16"}, 1),
    ({"subtiles": 1, "head_dim": 64}, 0),
    ({"subtiles": 3, "head_dim": 64, "block_n": 64}, 1),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, 1),
]


@pytest.mark.parametrize("options,ahead", PERSISTENT_FLASH_CASES)
def test_persistent_attention_compiles_with_the_schedules_rings_and_turns(tmp_path, options, ahead):
    """The persistent attention forward keeps every decision of the plan (rings, turns, sub-tiles) and adds
    no buffer: the same wgmmas and waits as the kernel with one CTA per query block, one more mbarrier (the
    Q hand-back) and the ring and turn counters run on across the CTA's blocks."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=ahead, depth=2)
    verify(sched, H100)
    assert gluon_plan(sched, persistent=True) == replace(gluon_plan(sched), persistent=True)
    name = "_".join(f"{k}{v}" for k, v in options.items()) + f"_a{ahead}"
    plain, persistent = (tmp_path / f"fa_{name}.py", tmp_path / f"fa_p_{name}.py")
    plain.write_text(emit_gluon(sched))
    source = emit_gluon(sched, persistent=True)
    persistent.write_text(source)
    module = load_emitted(str(persistent), f"twill_test_fa_p_{name}")
    _check_launcher_globals(module)
    compiled = aot.compile_sm90(module)
    facts = aot.ptx_facts(compiled)
    base = aot.ptx_facts(aot.compile_sm90(load_emitted(str(plain), f"twill_test_fa_{name}")))
    assert (facts.wgmma, facts.wgmma_shapes, facts.wait_depths) == (base.wgmma, base.wgmma_shapes,
                                                                    base.wait_depths)
    # ptxas keeps the wgmmas pipelined (a wgmma left in flight across a branch or the loop over blocks makes
    # it serialize every one: a quarter of the kernel's speed, measured on the H200)
    assert ptxas_report(compiled.asm["ptx"], 90)["serialized_wgmma"] == 0
    assert facts.setmaxnreg == base.setmaxnreg and facts.tma_loads == base.tma_loads
    assert facts.tma_load_ranks == base.tma_load_ranks == (4,)
    # one more mbarrier, the item slot and the scalars the partitions capture (the strides of O), no buffer
    assert base.shared < facts.shared <= base.shared + 128
    assert "persistent: the launcher starts min(query blocks, SMs) CTAs and a zeroed work_counter" in source
    assert "work_counter = _work_counter(q.device)" in source and "torch.zeros(1" not in source
    assert "mbarrier.wait(q_empty, (t & 1) ^ 1)" in source and "mbarrier.arrive(q_empty)" in source
    assert "first += n_tiles" in source and "(first + j) % V_DEPTH" in source
    if sched.warps and len([g for g in sched.warps if g.role != "load"]) > 1:
        assert "* TURNS" in source and ("(first - t + j)" in source or "(first + j) * TURNS" in source
                                       or "first - t * AHEAD" in source)


@pytest.mark.parametrize("options,ahead", PERSISTENT_FLASH_CASES[:2])
def test_persistent_attention_claims_items_and_hands_them_over_behind_q_bar(tmp_path, options, ahead):
    """The dynamic scheduler: the kernel takes a work counter, the producer claims each next item with one
    relaxed atomic add per block, outside the K/V loop, and writes it to the one slot between its wait on
    q_empty and its arrive on q_bar; every read of the slot follows a wait on q_bar; every partition loops
    while its item is below n_items (the exit: the producer's plain arrive with an item past the last)."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=ahead, depth=2)
    source = emit_gluon(sched, persistent=True)
    path = tmp_path / "fa_p_items.py"
    path.write_text(source)
    module = load_emitted(str(path), f"twill_test_fa_p_items_{ahead}")
    assert module.compile_signature()[0]["work_counter"] == "*i32"
    load = source[source.index("def load_partition"):source.index("def block_coords")].splitlines()
    compute = source[source.index("def compute_partition"):source.index("def attention_kernel")].splitlines()
    code = [line.split("#")[0].strip() for line in load]
    claim = code.index('item = gl.atomic_add(work_counter, 1, sem="relaxed") + gl.num_programs(0)')
    kv_loop = code.index("for j in range(first, first + n_tiles):")
    assert kv_loop < claim and len(load[claim]) - len(load[claim].lstrip()) == 8   # after the loop, once a block
    # the last CTA to finish claiming zeroes both counters for the next launch: after the exit's hand-over
    done = code.index('done = gl.atomic_add(work_counter + 1, 1, sem="acq_rel")')
    assert claim < done and code[done + 1] == "if done == gl.num_programs(0) - 1:"
    assert code[done + 2:done + 4] == ['gl.atomic_xchg(work_counter, 0, sem="relaxed")',
                                       'gl.atomic_xchg(work_counter + 1, 0, sem="relaxed")']
    writes = [k for k, line in enumerate(code) if line == "write_item(item_smem, item)"]
    assert len(writes) == 2                                  # each block's item, then the exit item
    for k in writes:
        assert code[k - 1] == "mbarrier.wait(q_empty, (t & 1) ^ 1)"
        assert code[k + 1] in ("mbarrier.expect(q_bar, NUM_COMPUTE * q_desc.block_type.nbytes)",
                               "mbarrier.arrive(q_bar)")
    reads = [k for k, line in enumerate(compute) if "read_item(item_smem)" in line]
    assert len(reads) == 2 and all(compute[k - 1].strip().startswith("mbarrier.wait(q_bar,") for k in reads)
    assert sum(line.strip() == "while item < n_items:" for line in load + compute) == 2
    ptx = aot.compile_sm90(module).asm["ptx"]
    assert len(re.findall(r"atom\.global\.gpu\.relaxed\.add", ptx)) == 1
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add", ptx)) == 1
    assert len(re.findall(r"atom\.global\.gpu\.relaxed\.exch", ptx)) == 2


def test_persistent_is_gemm_and_attention_forward_only():
    from twill.kernels.flash_bwd.variants import flash_bwd_schedule

    sched = flash_bwd_schedule(build_kernel("flash-bwd", H100), H100)
    with pytest.raises(UnsupportedFeatureError, match="persistent 'flash-bwd' kernel is not supported"):
        emit_gluon(sched, persistent=True)


def test_cli_emit_persistent(tmp_path, capsys):
    import json

    from twill.cli import main
    from twill.schedule.document import schedule_document

    sched = gemm_schedule(build_kernel("gemm", H100, block_n=256), H100, lag=1, depth=3, warps=8)
    (tmp_path / "s.json").write_text(json.dumps(schedule_document(sched)))
    out = tmp_path / "k.py"
    assert main(["emit", "gluon", "--schedule", str(tmp_path / "s.json"), "--persistent", "-o", str(out)]) == 0
    assert out.read_text() == emit_gluon(sched, persistent=True)
    deep = gemm_schedule(build_kernel("gemm", H100, block_n=128), H100, lag=1, depth=7, warps=8)
    (tmp_path / "d.json").write_text(json.dumps(schedule_document(deep)))
    capsys.readouterr()
    bad = tmp_path / "bad.py"
    assert main(["emit", "gluon", "--schedule", str(tmp_path / "d.json"), "--persistent", "-o", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twill: error: cannot generate: a persistent GEMM") and err.count("\n") == 1
    assert not bad.exists()
    assert main(["emit", "pallas", "--schedule", str(tmp_path / "s.json"), "--persistent", "-o", str(bad)]) == 2
    assert "--persistent" in capsys.readouterr().err and not bad.exists()


# -- attention -----------------------------------------------------------------------------------------
FLASH_CASES = [  # (subtiles, head_dim, ahead, depth)
    (2, 128, 1, 2),
    (2, 128, 0, 2),
    (1, 128, 1, 2),
    (2, 64, 1, 3),
    (1, 64, 0, 3),
    (3, 64, 0, 2),
]


@pytest.mark.parametrize("subtiles,head_dim,ahead,depth", FLASH_CASES)
def test_flash_variant_compiles(tmp_path, subtiles, head_dim, ahead, depth):
    graph = build_kernel("flash-fwd", H100, subtiles=subtiles, head_dim=head_dim)
    sched = flash_schedule(graph, H100, ahead=ahead, depth=depth)
    verify(sched, H100)
    plan = gluon_plan(sched)
    assert len(plan.compute) == subtiles
    assert plan.decisions.qk_ahead == (ahead,) * subtiles
    if subtiles == 1:
        assert plan.turns == ()                               # turns only with several compute groups
    else:                                                     # turns change hands and cover every wgmma once
        assert all(t.partition != u.partition for t, u in zip(plan.turns, plan.turns[1:] + plan.turns[:1]))
        assert sorted(op for t in plan.turns for op in t.ops) == sorted(
            op.name for op in graph.ops if op.attrs["role"] in ("qk", "pv"))
    module, facts = _compile(tmp_path, sched, f"fa_{subtiles}_{head_dim}_{ahead}_{depth}")
    assert module.NUM_COMPUTE.value == subtiles and module.K_DEPTH.value == depth
    assert module.K_READERS.value == module.V_READERS.value == subtiles   # every sub-tile releases each buffer
    assert set(facts.wgmma_shapes) == {"m64n128k16", f"m64n{head_dim}k16"}
    assert facts.tma_load_ranks == (4,)                       # Q, K, V read as [B, H, S, D] with their strides
    assert set(facts.wait_depths) == ({0, 1} if ahead else {0})
    assert ("dec", 24) in facts.setmaxnreg
    if subtiles > 1:                                          # the worker compute partitions' budget
        assert graph.attrs["reg_limit"] in {v for _, v in facts.setmaxnreg}
    rows = plan.tile["block_m"]
    ring_bytes = 2 * depth * 128 * head_dim * 2 + rows * head_dim * 2
    assert ring_bytes <= facts.shared < ring_bytes + 4096


ATTENTION_MODEL_CASES = [  # (kernel options, ahead): causal, grouped-query bf16, head dim 256, one partition
    ({"subtiles": 2, "head_dim": 128, "causal": True}, 1),
    ({"subtiles": 2, "head_dim": 128, "kv_heads": 2, "dtype": "bf16"}, 1),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True}, 1),
    ({"subtiles": 1, "head_dim": 64, "causal": True, "kv_heads": 1}, 0),
]


@pytest.mark.parametrize("options,ahead", ATTENTION_MODEL_CASES)
def test_flash_causal_gqa_head_dims_compile(tmp_path, options, ahead):
    """Causal, grouped-query, head dim 256 and bf16 kernels compile to sm_90 with what they ask for: wgmma of
    the head dim and key block in the operand dtype, the causal CTA order (reads %nctaid.x) and trip count
    (min), the LSE store (log2), the Q tile plus K/V rings in shared memory, and no register spills (ptxas)."""
    from twill.tune.spills import ptxas_report

    graph = build_kernel("flash-fwd", H100, **options)
    sched = flash_schedule(graph, H100, ahead=ahead, depth=2)
    verify(sched, H100)
    plan = gluon_plan(sched)
    causal, kv_heads = options.get("causal", False), options.get("kv_heads", 0)
    assert (plan.decisions.causal, plan.decisions.kv_heads) == (causal, kv_heads)
    name = "fa_model_" + "_".join(f"{k}{v}" for k, v in options.items())
    module, facts = _compile(tmp_path, sched, name)
    ptx = aot.compile_sm90(module).asm["ptx"]
    d, bn = options["head_dim"], options.get("block_n", 128)
    assert set(facts.wgmma_shapes) == {f"m64n{bn}k16", f"m64n{d}k16"}
    assert facts.tma_load_ranks == (4,)                       # rank-4 descriptors: any strides, no copy
    assert {"o_stride_b", "o_stride_h", "o_stride_s", "heads"} <= set(module.compile_signature()[0])
    ab = "bf16" if options.get("dtype") == "bf16" else "f16"
    assert f".f32.{ab}.{ab}" in ptx
    assert set(facts.wait_depths) == ({0, 1} if ahead else {0})
    assert ("%nctaid.x" in ptx) == causal and ("min.s32" in ptx) == causal
    assert "__nv_log2f" in ptx                               # the LSE: (m + log2 l) ln 2
    assert ("group" in module.compile_signature()[0]) == bool(kv_heads)
    ring_bytes = 2 * 2 * bn * d * 2 + 128 * d * 2
    assert ring_bytes <= facts.shared < ring_bytes + 4096
    assert ptxas_report(ptx, 90)["spill_bytes"] == 0          # O of head dim 256 fits the 240-register budget


def test_flash_without_lse_drops_the_store(tmp_path):
    """``launch`` passes ``lse_ptr=None`` without an LSE output; Triton makes it a constexpr and the LSE
    store (its libdevice log2) disappears from the kernel."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, causal=True), H100, ahead=1, depth=2)
    path = tmp_path / "fa_no_lse.py"
    path.write_text(emit_gluon(sched))
    module = load_emitted(str(path), "twill_test_fa_no_lse")
    without = aot.compile_sm90(module, {"lse_ptr": None}).asm["ptx"]
    assert "__nv_log2f" not in without and "wgmma.mma_async" in without


@pytest.mark.slow
def test_flash_causal_and_grouped_kernels_differ_as_their_schedules():
    """Causal and grouped-query kernels of different schedules are different kernels; each keeps the mask
    and the K/V head mapping, and only causal kernels stop at the diagonal."""
    sources = {}
    for causal in (False, True):
        for kv_heads in (0, 4):
            graph = build_kernel("flash-fwd", H100, subtiles=2, causal=causal, kv_heads=kv_heads)
            for ahead, depth in ((1, 2), (0, 3)):
                sources[(causal, kv_heads, ahead, depth)] = emit_gluon(flash_schedule(graph, H100, ahead=ahead,
                                                                                      depth=depth))
    assert len(set(sources.values())) == len(sources) == 8
    for (causal, kv_heads, _, _), source in sources.items():
        assert ("gl.minimum(q_start + BLOCK_M + seq_k - seq_q, seq_k)" in source) == causal
        assert ("cols[None, :] <= rows[:, None]" in source) == causal
        assert ("kv_h = h // group" in source) == bool(kv_heads)
        assert ("KV_HEADS      = gl.constexpr(4)" in source) == bool(kv_heads)


def test_flash_shared_memory_overflow_cannot_be_emitted():
    """A schedule (say, read from a file) whose rings do not fit 227 KB with the Q tile: a clear error, no
    kernel (the solver and the verifier keep their schedules within shared memory)."""
    graph = build_kernel("flash-fwd", H100, subtiles=2, head_dim=128)
    sched = flash_schedule(graph, H100, ahead=1, depth=2)
    sched = Schedule(**{**sched.__dict__, "streaming_depth": 4})
    with pytest.raises(UnsupportedFeatureError, match="cannot generate: the Q tile, the K/V rings and their "
                                                      "barriers need 295936 bytes of shared memory"):
        emit_gluon(sched)


def test_flash_ping_pong_barriers_follow_the_schedule():
    graph = build_kernel("flash-fwd", H100, subtiles=2, head_dim=128)
    source = emit_gluon(flash_schedule(graph, H100, ahead=1, depth=2))
    # one compute partition function, run for sub-tiles 0 and 1: one turn wait and one pass in it, plus the
    # kernel's arrive that gives the first turn
    assert source.count("(compute_partition, (compute_args, ") == 2
    assert source.count("mbarrier.wait(turn_bars.index(SUB)") == 1
    assert source.count("mbarrier.arrive(turn_bars.index(") == 2
    single = emit_gluon(flash_schedule(build_kernel("flash-fwd", H100, subtiles=1), H100, ahead=1))
    assert "mbarrier.wait(turn_bars" not in single and "(compute_args, 1)" not in single


def test_compute_partition_takes_differing_decisions_as_constexprs(tmp_path):
    """Renderers read only the plan, so a plan whose partitions differ (S one stage ahead in sub-tile 1 only;
    turn order pv before qk in sub-tile 1) renders one compute function with those decisions as constexpr
    parameters and static ifs, and compiles with both wgmma wait depths."""
    graph = build_kernel("flash-fwd", H100, subtiles=2, head_dim=128)
    plan = gluon_plan(flash_schedule(graph, H100, ahead=1, depth=2))
    turns = (Turn(0, ("qk_a",)), Turn(1, ("pv_b",)), Turn(0, ("pv_a",)), Turn(1, ("qk_b",)))
    parts = [replace(p, turn_waits=waits, turn_passes=passes) for p, waits, passes in zip(
        plan.compute, ({"qk_a": 0, "pv_a": 1}, {"pv_b": 0, "qk_b": 1}),
        ({"qk_a": 1, "pv_a": 1}, {"pv_b": 0, "qk_b": 0}))]
    mixed = replace(plan, turns=turns, partitions=(*parts, plan.load),
                    decisions=replace(plan.decisions, qk_ahead=(0, 1)))
    source = render_plan(mixed)
    assert "def compute_partition(compute_args, SUB: gl.constexpr, AHEAD: gl.constexpr, QK_TURN: gl.constexpr, " \
           "PV_TURN: gl.constexpr):" in source
    assert "(compute_partition, (compute_args, 0, 0, 0, 1))" in source
    assert "(compute_partition, (compute_args, 1, 1, 1, 0))" in source
    assert "    if AHEAD:" in source and "TURNS         = gl.constexpr(2)" in source
    path = tmp_path / "mixed.py"
    path.write_text(source)
    facts = aot.ptx_facts(aot.compile_sm90(load_emitted(str(path), "twill_test_mixed")))
    assert set(facts.wait_depths) == {0, 1}


def test_every_wait_names_the_dependence_that_forces_it():
    gemm = gluon_plan(gemm_schedule(build_kernel("gemm", H100, block_n=256), H100, lag=1, depth=4))
    edges = {(e.src, e.dst): e for e in build_kernel("gemm", H100, block_n=256).edges}
    retire = gemm.retire("mma")
    assert (retire.source, retire.op, retire.latency) == ("mma", "mma_wait", edges[("mma", "mma_wait")].delay)
    assert {(w.source, w.op) for w in gemm.waits if w.kind == "ready"} == {("load_a", "mma"), ("load_b", "mma")}
    assert [b.rings for b in gemm.barriers] == [("a", "b")]       # equal depth and release: one barrier pair
    assert all(w.distance == 4 for w in gemm.waits if w.kind == "empty")
    source = emit_gluon(gemm_schedule(build_kernel("gemm", H100, block_n=256), H100, lag=1, depth=4))
    assert retire.why in source and "ab_ready" in source and "b_ready" not in source.replace("ab_ready", "")
    fa = gluon_plan(flash_schedule(build_kernel("flash-fwd", H100, subtiles=2), H100, ahead=1, depth=2))
    turn_waits = [w for w in fa.waits if w.kind == "turn"]
    assert len(turn_waits) == len(fa.turns) == 2
    assert all(w.source in t.ops for w, t in zip(turn_waits, fa.turns[-1:] + fa.turns[:-1]))


def test_renderers_read_only_the_plan():
    """The Gluon renderer and the families' Gluon bodies import nothing from the schedule, the graph or the
    solver: the plan is complete."""
    import ast
    from pathlib import Path

    import twill

    root = Path(twill.__file__).parent
    for path, family in (("codegen/gluon/render.py", None), ("kernels/gemm/gluon.py", "gemm"),
                         ("kernels/flash_fwd/gluon.py", "flash_fwd"), ("kernels/flash_bwd/gluon.py", "flash_bwd")):
        tree = ast.parse((root / path).read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        twill_modules = {m for m in modules if m and m.startswith("twill")}
        assert twill_modules <= {"twill.codegen.plan", "twill.codegen.chart", "twill.codegen.gluon.render",
                                 f"twill.kernels.{family}.plan"}, (path, twill_modules)


@pytest.mark.skipif(not HAS_ORTOOLS, reason="the joint solver needs OR-Tools")
@pytest.mark.parametrize("kernel,options", [("gemm", {}), ("flash-fwd", {"subtiles": 2}),
                                            ("flash-fwd", {"subtiles": 1, "head_dim": 64})])
def test_solver_schedule_compiles(tmp_path, kernel, options):
    sched = solved_kernel(kernel, "h100", options)
    module, facts = _compile(tmp_path, sched, f"solver_{kernel.replace('-', '_')}_{len(options)}")
    assert facts.wgmma > 0 and facts.tma_loads > 0
    assert ("dec", 24) in facts.setmaxnreg


@pytest.mark.skipif(not HAS_ORTOOLS, reason="the joint solver needs OR-Tools")
def test_solver_plans_match_the_fastest_hand_schedules():
    """The default solver path makes the decisions of the fastest hand-built variants (docs/codegen.md):
    GEMM 128x256 on one 8-warp consumer with the wait lagged one iteration; attention with two sub-tiles:
    S = Q K^T one stage ahead of O += P V in both groups, one tensor-core turn per group and iteration."""
    gemm = gluon_plan(solved_kernel("gemm", "h100", streaming_depth=3))
    hand = gluon_plan(gemm_schedule(build_kernel("gemm", H100), H100, lag=1, depth=3, warps=8))
    assert (gemm.decisions.mma_lag, gemm.tile, gemm.compute[0].num_warps) == (hand.decisions.mma_lag, hand.tile, 8)
    assert [r.depth for r in gemm.rings] == [r.depth for r in hand.rings] == [3, 3]
    graph = build_kernel("flash-fwd", H100, subtiles=2)
    fa = gluon_plan(solved_kernel("flash-fwd", "h100", {"subtiles": 2}))
    hand_fa = gluon_plan(flash_schedule(graph, H100, ahead=1, depth=2))
    assert fa.decisions.qk_ahead == hand_fa.decisions.qk_ahead == (1, 1)
    assert sorted(sorted(t.ops) for t in fa.turns) == sorted(sorted(t.ops) for t in hand_fa.turns) == [
        ["pv_a", "qk_a"], ["pv_b", "qk_b"]]
    assert [r.depth for r in fa.rings] == [r.depth for r in hand_fa.rings] == [2, 2]


# -- errors --------------------------------------------------------------------------------------------
CALIBRATED_H200 = Path(__file__).parents[2] / "benchmarks" / "results" / "calibration_h200.machine.json"


def _three_subtile_schedule(machine: str, head_dim: int) -> Schedule:
    """The joint solver's schedule of flash-fwd ``--subtiles 3`` on ``machine`` (``h200``, or ``calibrated``: the
    measured H200 model of benchmarks/results)."""
    if machine == "h200":
        return solved_kernel("flash-fwd", "h200", {"subtiles": 3, "head_dim": head_dim})
    from twill.machine.calibration import load_machine
    from twill.solve import SolveOptions, schedule

    calibrated = load_machine(str(CALIBRATED_H200))
    return schedule(build_kernel("flash-fwd", calibrated, subtiles=3, head_dim=head_dim), calibrated, SolveOptions())


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ORTOOLS, reason="the joint solver needs OR-Tools")
@pytest.mark.parametrize("machine,head_dim", [("h200", 64), ("h200", 128), ("calibrated", 64)])
def test_three_subtile_solver_schedules_take_turns_round_robin(tmp_path, machine, head_dim):
    """BLOCK_M 192 on three 4-warp compute groups at 160 registers (the register file less a producer group):
    the solver proves its schedule optimal and the verifier admits it; the plan passes the tensor core from
    each turn to the owner of the next one (the order the schedule chose, not a fixed one), every partition
    takes its turns in program order, and the kernel compiles to sm_90 with 16 warps, the 160-register
    budget, the Q tile for three sub-tiles plus the K/V rings in shared memory, each buffer released by all
    three partitions."""
    from twill.machine.calibration import load_machine
    from twill.machine.models import get_machine

    sched = _three_subtile_schedule(machine, head_dim)
    model = get_machine("h200") if machine == "h200" else load_machine(str(CALIBRATED_H200))
    verify(sched, model)
    assert sched.status == "optimal" and sched.ii == sched.ii_lower_bound
    plan = gluon_plan(sched)
    assert [(p.num_warps, p.regs) for p in plan.compute] == [(4, 160)] * 3 and plan.tile["block_m"] == 192
    assert sorted(op for t in plan.turns for op in t.ops) == ["pv_a", "pv_b", "pv_c", "qk_a", "qk_b", "qk_c"]
    for k, turn in enumerate(plan.turns):
        after = plan.turns[(k + 1) % len(plan.turns)].partition
        last = max(turn.ops, key=lambda op: op.startswith("pv"))     # program order: qk, then pv
        assert after != turn.partition and plan.compute[turn.partition].turn_passes[last] == after
    for i, part in enumerate(plan.compute):
        is_pv = [op.startswith("pv") for t in plan.turns if t.partition == i for op in sorted(
            t.ops, key=lambda o: o.startswith("pv"))]
        assert is_pv == sorted(is_pv)                                     # qk's turn before pv's
        assert plan.turn_counts[i] == len(part.turn_waits)
    if machine == "calibrated":     # the schedule's order splits some groups' wgmmas; each issues S ahead,
        assert plan.decisions.qk_ahead == (1, 1, 1) and plan.turn_counts == (1, 1, 1)   # so one turn
    module, facts = _compile(tmp_path, sched, f"fa_sub3_{machine}_{head_dim}")
    assert module.NUM_COMPUTE.value == 3 and facts.num_warps == 16
    assert module.K_READERS.value == module.V_READERS.value == 3
    assert ("inc", 160) in facts.setmaxnreg and ("dec", 24) in facts.setmaxnreg
    assert set(facts.wgmma_shapes) == {"m64n128k16", f"m64n{head_dim}k16"}
    ring_bytes = sum(r.depth for r in plan.rings) * 128 * head_dim * 2 + 192 * head_dim * 2
    assert ring_bytes <= facts.shared < ring_bytes + 4096


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ORTOOLS, reason="the joint solver needs OR-Tools")
def test_three_subtile_d64_kernels_fit_their_registers_with_128_and_64_key_tiles(tmp_path):
    """docs/codegen.md ("Three sub-tiles"): at 160 registers, with S one stage ahead, neither the 128-key nor
    the 64-key kernel spills (ptxas): P(j+1) is converted once P(j) V(j) retired, before S(j+2) is issued (the
    128-key kernel spilled 3.5 KB when P was converted after that issue)."""
    from twill.tune.spills import ptxas_report

    for block_n in (128, 64):
        sched = solved_kernel("flash-fwd", "h200", {"subtiles": 3, "head_dim": 64, "block_n": block_n})
        assert max(gluon_plan(sched).decisions.qk_ahead) == 1
        path = tmp_path / f"fa_sub3_bn{block_n}.py"
        path.write_text(emit_gluon(sched))
        ptx = aot.compile_sm90(load_emitted(str(path), f"twill_test_sub3_bn{block_n}")).asm["ptx"]
        assert ptxas_report(ptx, 90)["spill_bytes"] == 0, block_n


@pytest.mark.slow
def test_partitions_taking_different_numbers_of_turns_get_them_as_constexprs(tmp_path):
    """A three-group schedule that issues S and P V apart (the hand-built one at D = 128): groups 0 and 1
    take two turns per iteration, group 2 one (its qk and pv are adjacent), so the turn counts and turn
    points are constexpr parameters of ``compute_partition`` (docs/codegen.md, "Round robin"); it compiles."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=3, head_dim=128), H100, ahead=0, depth=2)
    plan = gluon_plan(sched)
    assert plan.decisions.qk_ahead == (0, 0, 0) and plan.turn_counts == (2, 2, 1)
    assert "TURNS: gl.constexpr" in emit_gluon(sched)
    module, facts = _compile(tmp_path, sched, "fa_sub3_ahead0_d128")
    assert module.NUM_COMPUTE.value == 3 and facts.num_warps == 16


def test_unsupported_graph_is_reported():
    graph = build_kernel("paper-example", H100)
    sched = Schedule(graph=graph, arch="h100", solver="manual", status="feasible", ii=2, ii_lower_bound=2,
                     starts={"S": 0, "P": 2, "O": 3})
    with pytest.raises(UnsupportedFeatureError, match="cannot generate: .*not supported by the Gluon backend"):
        emit_gluon(sched)


def test_unsupported_arch_and_missing_warps():
    graph = build_kernel("gemm", H100)
    sched = gemm_schedule(graph, H100)
    with pytest.raises(UnsupportedFeatureError, match="arch 'b200'"):
        emit_gluon(Schedule(**{**sched.__dict__, "arch": "b200"}))
    with pytest.raises(UnsupportedFeatureError, match="without warp assignment"):
        emit_gluon(Schedule(**{**sched.__dict__, "assignment": {}, "warps": ()}))


def test_cli_emit_from_schedule_file(tmp_path):
    import json

    from twill.cli import main
    from twill.schedule.document import schedule_document

    sched = gemm_schedule(build_kernel("gemm", H100, block_n=256), H100, lag=1, depth=3)
    (tmp_path / "s.json").write_text(json.dumps(schedule_document(sched)))
    out = tmp_path / "k.py"
    assert main(["emit", "gluon", "--schedule", str(tmp_path / "s.json"), "-o", str(out)]) == 0
    assert out.read_text() == emit_gluon(sched)
    assert main(["emit", "gluon", "paper-example", "--schedule", str(tmp_path / "s.json"), "-o", str(out)]) == 2


def test_cli_kernel_options_causal_and_kv_heads(tmp_path, capsys):
    """``--causal`` and ``--kv-heads`` are flash-fwd kernel options: other kernels reject them with one line."""
    from twill.cli import main

    assert main(["emit", "gluon", "gemm", "--causal", "-o", str(tmp_path / "g.py")]) == 2
    assert "twill: error: kernel 'gemm' has no option 'causal'" in capsys.readouterr().err
    assert main(["emit", "gluon", "flash-fwd", "--kv-heads", "-2", "-o", str(tmp_path / "f.py")]) == 2
    assert "kv_heads must be 0" in capsys.readouterr().err
    assert not (tmp_path / "g.py").exists() and not (tmp_path / "f.py").exists()


@pytest.mark.skipif(not HAS_ORTOOLS, reason="the joint solver needs OR-Tools")
def test_cli_emits_a_causal_grouped_kernel(tmp_path):
    from twill.cli import main

    out = tmp_path / "fa_causal.py"
    assert main(["emit", "gluon", "flash-fwd", "--subtiles", "2", "--causal", "--kv-heads", "8", "--dtype", "bf16",
                 "-o", str(out)]) == 0
    module = load_emitted(str(out), "twill_test_cli_causal")
    assert module.KV_HEADS.value == 8 and module.DTYPE.value == triton.language.bfloat16
    assert "online_softmax(s_cur, m_i, l_i, 0, q_first, qk_scale, s_layout)" in out.read_text()


def test_the_producer_issues_its_loads_by_start_time():
    """Each iteration of the TMA producer fills every ring for the same tile, so it issues its loads in the order
    the schedule starts them. In the datasheet H200 model's two-copy D = 256 schedule ``load_v`` starts a stage
    after ``load_k`` but at a smaller residue: in steady-state order the producer would wait for a free V
    buffer before it loads K (measured: 0.68-0.76x cuDNN, against 0.93-1.05x loaded K first)."""
    pytest.importorskip("ortools", reason="needs the solver (ortools)")
    from twill.codegen.gluon import emit_gluon, gluon_plan
    from twill.machine.models import get_machine
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    machine = get_machine("h200")
    graph = build_kernel("flash-fwd", machine, head_dim=256, block_n=64, subtiles=2)
    solved = schedule(graph, machine, SolveOptions(streaming_depth=2, extra_copies=1))
    assert solved.residue("load_v") < solved.residue("load_k") and solved.start("load_v") > solved.start("load_k")
    assert gluon_plan(solved, False).load.ops == ("load_k", "load_v")
    producer = emit_gluon(solved).split("def load_partition")[1].split("@gluon.jit")[0]
    assert producer.index("k_desc, [b, kv_h, j * BLOCK_N") < producer.index("v_desc, [b, kv_h, j * BLOCK_N")


@pytest.mark.slow
def test_a_warp_group_holding_two_sub_tiles_is_refused_with_the_ops_and_a_remedy():
    """With one extra copy the three-group D = 128 forward hoists its pairs with a warp group that runs the
    softmax of two sub-tiles and another their P V: the generator refuses it, naming the ops and what to try."""
    pytest.importorskip("ortools", reason="needs the solver (ortools)")
    from twill.codegen.gluon import emit_gluon
    from twill.errors import UnsupportedFeatureError
    from twill.machine.models import get_machine
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    machine = get_machine("h100")
    solved = schedule(build_kernel("flash-fwd", machine, subtiles=3), machine,
                      SolveOptions(streaming_depth=2, extra_copies=1))
    with pytest.raises(UnsupportedFeatureError, match=r"warp group \d runs .*pv_a.*one sub-tile.*--extra-copies"):
        emit_gluon(solved)


@pytest.mark.parametrize("seq,launch_order,chunked", [(2048, 1.069, 1.016), (4096, 1.035, 1.000),
                                                      (8192, 1.015, 1.003)])
def test_the_causal_forward_order_balances_its_blocks_in_list_scheduling(seq, launch_order, chunked):
    """docs/experiments/causal-launch-order.md: the benchmark's causal forward (B = 4, H = 32,
    128-row blocks of 128-key tiles, 132 SMs, one CTA each) handed out greedily one head after another, each
    heaviest first, finishes ``launch_order`` x the ideal; in the emitted order (the kernel's own lines, run
    here as Python on every CTA in launch order), ``chunked`` x; and the emitted order is a bijection."""
    import types

    from twill.kernels.flash_fwd.gluon import _setup
    from twill.kernels.flash_fwd.plan import FlashDecisions
    from twill.tune.predict import list_schedule

    sms, blocks, heads = 132, seq // 128, 4 * 32
    setup = _setup(types.SimpleNamespace(decisions=FlashDecisions((1,), causal=True)))
    code = "\n".join(line[4:] for line in setup if not line.lstrip().startswith("o_head"))   # no pointers here
    order, ours = [], []
    for pid2 in range(4):   # the grid (blocks, heads, batch) in launch order
        for pid1 in range(32):
            for pid0 in range(blocks):
                env = {"gl": types.SimpleNamespace(num_programs=(blocks, 32, 4).__getitem__, minimum=min,
                                                   program_id=(pid0, pid1, pid2).__getitem__,
                                                   cdiv=lambda a, b: -(-a // b), maximum=max),
                       "heads_per_chunk": max(1, sms // blocks), "seq_q": seq, "seq_k": seq, "BLOCK_M": 128,
                       "BLOCK_N": 128, "heads": 32}
                exec(code, env)
                assert (env["b"], env["h"]) == divmod(env["bh"], 32)
                order.append((env["pid_m"], env["bh"]))
                ours.append(env["n_tiles"])                   # query block m runs m + 1 key tiles
    assert sorted(order) == [(m, h) for m in range(blocks) for h in range(heads)]
    grid = [m + 1 for _ in range(heads) for m in reversed(range(blocks))]
    ideal = sum(grid) / sms
    assert list_schedule(grid, sms)[0] / ideal == pytest.approx(launch_order, abs=0.002)
    assert list_schedule(ours, sms)[0] / ideal == pytest.approx(chunked, abs=0.002)
