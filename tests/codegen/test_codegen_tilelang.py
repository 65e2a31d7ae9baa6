"""TileLang backend: schedules -> emitted TileLang 0.1.15 modules -> CUDA C++ (lowered on the CPU, no GPU).

Every variant is a different valid schedule (verified with twill.schedule.verify): warp-specialized ones become
a ``T.WSSchedule``, ones without a warp assignment a ``T.Pipelined(num_stages, stage, order)`` loop. Where
TileLang is installed (the ``tilelang`` extra), each module is lowered to CUDA for sm_90a and the CUDA must show
what the schedule asked for: the ring depth (mbarrier arrays, buffer versions), the producer and consumer roles
with their setmaxnreg budgets, or the cp.async pipeline without warp specialization.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import replace
from functools import lru_cache

import pytest

from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
from twill.cli import main
from twill.codegen.tilelang import emit_tilelang, tilelang_plan
from twill.schedule.document import schedule_document
from twill.errors import UnsupportedFeatureError
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.schedule.verify import verify

HAS_TILELANG = importlib.util.find_spec("tilelang") is not None
needs_tilelang = pytest.mark.skipif(not HAS_TILELANG, reason="TileLang is not installed (the tilelang extra, "
                                                             "README 'TileLang')")


@lru_cache(maxsize=None)
def _gemm(depth: int, warps: int, ws: bool, lag: int = 0):
    block_n = 256 if warps == 8 else 128
    sched = gemm_schedule(build_kernel("gemm", H100, block_n=block_n), H100, lag=lag, depth=depth, warps=warps)
    verify(sched, H100)
    return sched if ws else replace(sched, assignment={}, warps=())


@lru_cache(maxsize=None)
def _flash(depth: int, ws: bool, subtiles: int = 1):
    sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=subtiles), H100, ahead=0, depth=depth)
    verify(sched, H100)
    return sched if ws else replace(sched, assignment={}, warps=())


def _constant(source: str, name: str):
    """The value of module constant ``name`` in an emitted module."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no constant {name}")


def _module(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"twill_tilelang_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda(tmp_path, source: str, name: str, *args) -> str:
    from twill.integrations.tilelang.cuda import lower_cuda

    module = _module(tmp_path, source, name)
    return lower_cuda(module.make_kernel(*args), module.PASS_CONFIGS)


def _versions(cuda: str) -> set[int]:
    """Buffer versions the loop indexes: ``k % n`` or ``k & (n - 1)``."""
    found = {int(n) for n in re.findall(r"\bk(?:_\d)? % (\d+)\)", cuda)}
    return found | {int(n) + 1 for n in re.findall(r"\bk(?:_\d)? & (\d+)\)", cuda)}


# -- without TileLang: the mapping ----------------------------------------------------------------------
def test_gemm_variants_emit_different_modules():
    sources = {(d, ws): emit_tilelang(_gemm(d, 4, ws)) for d in (2, 3) for ws in (True, False)}
    assert len(set(sources.values())) == 4
    for (depth, ws), source in sources.items():
        compile(source, "gemm.py", "exec")
        assert ("T.annotate_ws_schedule" in source) == ws and ("T.Pipelined" in source) != ws
        if ws:
            assert f'T.WSPipeline("ab", [A_s, B_s], depth={depth})' in source
        else:
            assert _constant(source, "NUM_STAGES") == depth


@pytest.mark.parametrize("kernel,depth", [("gemm", 2), ("gemm", 4), ("flash", 2), ("flash", 3)])
def test_pipelined_stage_and_order_are_valid_for_tilelang(kernel, depth):
    """TileLang's rules for stage/order: one entry per effectful statement; in one stage a producer is
    ordered before its consumer; across stages the producer's stage is not later; loads run NUM_STAGES ahead
    of their reader and after it in the body (so TileLang keeps NUM_STAGES versions)."""
    sched = _gemm(depth, 4, False) if kernel == "gemm" else _flash(depth, False)
    source = emit_tilelang(sched)
    stage, order = _constant(source, "STAGE"), _constant(source, "ORDER")
    lines = source.split("for k in T.Pipelined(")[1].splitlines()[1:]
    body = lines[:next(i for i, line in enumerate(lines) if not line.startswith(" " * 16))]
    statements = [line.strip() for line in body if not line.startswith(" " * 20)]
    assert len(stage) == len(order) == len(statements) and sorted(order) == list(range(len(order)))
    loads = {i: re.match(r"T\.copy\([ABKV]\[.*, (\w+)\)$", line) for i, line in enumerate(statements)}
    loads = {i: m.group(1) for i, m in loads.items() if m}
    assert len(loads) == 2 and _constant(source, "NUM_STAGES") == depth
    for i, buffer in loads.items():
        reader = next(j for j, line in enumerate(statements) if line.startswith("T.gemm(") and buffer in line)
        assert stage[reader] - stage[i] == depth and order[i] > order[reader]
    assert len({s for i, s in enumerate(stage) if i not in loads}) == 1


def test_plan_roles_become_ws_roles_with_budgets():
    sched = _gemm(3, 8, True)
    plan = tilelang_plan(sched)
    source = emit_tilelang(sched)
    load, comp = plan.load, plan.compute[0]
    assert f'T.WSRole("load", warps_lo=0, warps_hi={load.num_warps}, max_nreg={load.regs})' in source
    assert f'T.WSRole("compute0", warps_lo=4, warps_hi={4 + comp.num_warps}, max_nreg={comp.regs})' in source
    assert f"num_warps={4 + comp.num_warps}," in source


def test_lagged_wgmma_wait_cannot_be_emitted():
    with pytest.raises(UnsupportedFeatureError, match=r"^cannot emit tilelang: wgmma wait lag 1 \(stage\(mma_wait\) "
                                                      r"- stage\(mma\)\) \(T.wgmma_gemm \+ T.wait_wgmma would keep"):
        emit_tilelang(_gemm(3, 8, True, lag=1))
    with pytest.raises(UnsupportedFeatureError, match=r"^cannot emit tilelang: 'mma_wait' in stage 1 and 'mma' "
                                                      r"in stage 0 \(TileLang's T.gemm waits"):
        emit_tilelang(_gemm(3, 8, False, lag=1))


def test_wait_lag_counts_stages_from_the_first_compute_op():
    """A lag-0 schedule translated so that ``mma_wait`` crosses a multiple of II has stage(mma_wait) -
    stage(mma) = 1 in absolute time, but still waits within II of the wgmma: it is emitted (synchronous
    ``T.gemm``)."""
    sched = _gemm(3, 8, True)
    shift = sched.ii - sched.start("mma_wait") + sched.start("mma") + 1
    moved = replace(sched, starts={n: t + shift for n, t in sched.starts.items()})
    verify(moved, H100)
    assert moved.stage("mma_wait") - moved.stage("mma") == 1
    assert "T.gemm(A_s, B_s, C_l" in emit_tilelang(moved)


def test_two_subtiles_cannot_be_emitted():
    with pytest.raises(UnsupportedFeatureError, match="cannot emit tilelang: attention graph with 2 qk ops"):
        emit_tilelang(_flash(2, True, subtiles=2))


def test_softmax_a_stage_behind_qk_cannot_be_emitted():
    sched = flash_schedule(build_kernel("flash-fwd", H100), H100, ahead=1, depth=2)
    with pytest.raises(UnsupportedFeatureError, match=r"^cannot emit tilelang: '\w+' in stage 1 and 'qk' in stage 0"):
        emit_tilelang(sched)


def test_cli_emits_and_refuses(capsys, tmp_path):
    out = tmp_path / "gemm_tl.py"
    assert main(["emit", "tilelang", "gemm", "--block-n", "128", "--no-ws", "-o", str(out)]) == 0
    assert "T.Pipelined(" in out.read_text()
    bad = tmp_path / "lag1.json"
    import json

    bad.write_text(json.dumps(schedule_document(_gemm(3, 8, True, lag=1))))
    target = tmp_path / "never.py"
    capsys.readouterr()
    assert main(["emit", "tilelang", "--schedule", str(bad), "-o", str(target)]) == 2
    out_text, err = capsys.readouterr()
    assert out_text == "" and err.startswith("twill: error: cannot emit tilelang: ") and err.count("\n") == 1
    assert not target.exists()


# -- with TileLang: the CUDA shows the schedule ---------------------------------------------------------
@needs_tilelang
@pytest.mark.parametrize("depth,warps", [(3, 8), (4, 4)])
def test_ws_gemm_cuda_has_the_ring_and_roles(tmp_path, depth, warps):
    sched = _gemm(depth, warps, True)
    plan = tilelang_plan(sched)
    cuda = _cuda(tmp_path, emit_tilelang(sched), f"gemm_ws_{depth}", 1024, 1024, 1024)
    assert f"ab_full_mem[{depth}]" in cuda and f"ab_empty_mem[{depth}]" in cuda
    assert _versions(cuda) == {depth}
    assert f"warpgroup_reg_dealloc<{plan.load.regs}>" in cuda
    assert f"warpgroup_reg_alloc<{plan.compute[0].regs}>" in cuda
    assert f"__launch_bounds__({32 * (4 + warps)}" in cuda and "tma_load" in cuda and "cp_async" not in cuda
    assert "tl::warpgroup_wait<0>();" in cuda and "wait_wgmma<1>" not in cuda    # lag 0: T.gemm waits


@needs_tilelang
@pytest.mark.parametrize("depth", [3])
def test_pipelined_gemm_cuda_has_the_stages(tmp_path, depth):
    cuda = _cuda(tmp_path, emit_tilelang(_gemm(depth, 4, False)), f"gemm_pipe_{depth}", 1024, 1024, 1024)
    assert _versions(cuda) == {depth}
    assert f"cp_async_wait<{depth - 1}>" in cuda and "warpgroup_reg" not in cuda and "_full_mem" not in cuda


@needs_tilelang
@pytest.mark.parametrize("depth,ws", [(2, True), (3, False)])
def test_flash_cuda_has_the_rings(tmp_path, depth, ws):
    sched = _flash(depth, ws)
    cuda = _cuda(tmp_path, emit_tilelang(sched), f"fa_{depth}_{ws}", 2, 4, 1024, 0.125)
    assert _versions(cuda) == {depth}
    if ws:
        plan = tilelang_plan(sched)
        assert f"k_full_mem[{depth}]" in cuda and f"v_full_mem[{depth}]" in cuda
        assert f"warpgroup_reg_alloc<{plan.compute[0].regs}>" in cuda
        assert f"warpgroup_reg_dealloc<{plan.load.regs}>" in cuda
    else:
        assert "warpgroup_reg" not in cuda and "cp_async" in cuda


def _async_gemm(source: str, release_stage: int) -> str:
    """The emitted lag-0 GEMM with its wgmma left in flight: ``T.wgmma_gemm`` + ``T.wait_wgmma(1)`` (op
    ``retire``) and the A/B buffer released at ``release_stage``, ``T.wait_wgmma(0)`` after the loop."""
    swaps = {'T.gemm(A_s, B_s, C_l, annotations={T.WSID: "mma"})':
             'T.wgmma_gemm(A_s, B_s, C_l, annotations={T.WSID: "mma"})\n'
             '                with T.ws_op("retire"):\n                    T.wait_wgmma(1)',
             '"mma", T.WSSync.consumer_release("ab", stage=0)':
             f'"mma", "retire", T.WSSync.consumer_release("ab", stage={release_stage})',
             "'k_loop', 'store'": "'k_loop', 'drain', 'store'",
             'with T.ws_op("store"):': 'with T.ws_op("drain"):\n                T.wait_wgmma(0)\n'
                                       '            with T.ws_op("store"):'}
    for old, new in swaps.items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


@needs_tilelang
def test_wgmma_in_flight_is_refused_for_tilelangs_reason(tmp_path):
    """Why a lag-1 schedule is refused, against the installed TileLang: releasing the buffer a stage after its
    wait (where the schedule releases it) is rejected; releasing it in the wait's stage lowers, but the CUDA
    hands buffer ``k`` back right after ``wait_wgmma<1>``, which retires wgmma ``k - 1`` while wgmma ``k`` still
    reads the buffer."""
    source = emit_tilelang(_gemm(3, 8, True))
    with pytest.raises(Exception, match="acquire/wait of pipeline 'ab' in role compute0 is at stage 0 but its "
                                        "commit/release is at stage 1; pairs must share one stage"):
        _cuda(tmp_path, _async_gemm(source, 1), "gemm_lag_1", 1024, 1024, 1024)
    cuda = _cuda(tmp_path, _async_gemm(source, 0), "gemm_lag_0", 1024, 1024, 1024)
    assert re.search(r"tl::wait_wgmma<1>\(\);\s*ab_empty\[\(k_1 % 3\)\]\.arrive\(\);", cuda)
    assert "wgmma_ss<" in cuda and "tl::wait_wgmma<0>();" in cuda
