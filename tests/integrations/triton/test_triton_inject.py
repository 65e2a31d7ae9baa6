"""Schedule injection into Triton 3.6.0: stage/cluster mapping, text edits, compile to cubin, buffers follow
the injected stages, refusals (wgmma before the last stage, other Triton versions), CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.integrations.triton.inject import (annotate, constrain_for_triton, default_load_lead,  # noqa: E402
                                              heuristic_plan, inject, read_schedule_attrs, set_loop_max_stage,
                                              set_schedule_attrs, solve_for_triton)
from twill.schedule.stages import op_places  # noqa: E402
from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.integrations.triton import kernel_spec, lower_function  # noqa: E402
from twill.integrations.triton.compile import compile_with_edit  # noqa: E402
from twill.integrations.triton.mlir import find_loops  # noqa: E402
from twill.machine import get_machine  # noqa: E402
from twill.solve import SolveOptions, schedule  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="injection targets Triton 3.6.0")

H100 = get_machine("h100")
KERNELS = Path(__file__).resolve().parents[3] / "twill" / "integrations" / "triton" / "kernels"


def _spec(name: str, fn: str, machine=H100, **over):
    import importlib

    mod = importlib.import_module(f"twill.integrations.triton.kernels.{name}")
    return kernel_spec(getattr(mod, fn), signature=mod.SIGNATURE, constexprs=list(over.get("constexprs",
                       mod.CONSTEXPRS)), num_warps=mod.NUM_WARPS, num_stages=over.get("num_stages",
                       mod.NUM_STAGES), machine=machine)


@pytest.fixture(scope="module")
def matmul():
    pytest.importorskip("ortools")
    spec = _spec("matmul", "matmul_kernel")
    lowered, text = lower_function(spec, H100)
    sched = solve_for_triton(lowered.graph, H100, 90, SolveOptions(ws=False, time_limit=30))
    return spec, lowered, text, sched


@pytest.fixture(scope="module")
def flash():
    """The attention kernel's Triton-compatible schedule within 15 s (the window search proves its optimum in
    about a minute; the tests below check properties every verified schedule has). The tests that use it are
    ``slow``."""
    pytest.importorskip("ortools")
    spec = _spec("flash_fwd", "attn_fwd", constexprs=("HEAD_DIM=64", "BLOCK_M=128", "BLOCK_N=64"))
    lowered, text = lower_function(spec, H100)
    sched = solve_for_triton(lowered.graph, H100, 90, SolveOptions(ws=False, time_limit=15), per_ii_limit=8)
    return spec, lowered, text, sched


# -- stage / cluster mapping ------------------------------------------------------------------------------
def test_matmul_injection_reproduces_triton_ring_and_shared_memory(matmul):
    spec, lowered, text, sched = matmul
    default, _ = compile_with_edit(spec, None)
    result = inject(spec, sched, H100)
    assert result.plan.load_lead == default_load_lead(3) == 2
    assert result.plan.op_places["mma"][0] == 2 and result.plan.op_places["load_a"][0] == 0
    assert [d for d, _, _ in result.rings] == [3, 3]
    assert result.shared_bytes == default.metadata.shared
    assert len(result.kernel.asm["cubin"]) > 1000 and "wgmma.mma_async" in result.kernel.asm["ptx"]
    # Triton's heuristic puts loads in stage 0 and the dot in stage 2 too
    triton_stages = {i: s for i, (s, _) in heuristic_plan(text).items()}
    ours = {i: s for i, (s, _) in result.plan.statements.items()}
    assert ours == triton_stages


def test_buffers_follow_the_injected_stages(matmul):
    spec, _, _, sched = matmul
    one = inject(spec, sched, H100, load_lead=1)
    three = inject(spec, sched, H100, load_lead=3)
    assert [d for d, _, _ in one.rings] == [2, 2] and [d for d, _, _ in three.rings] == [4, 4]
    tile_bytes = (128 * 64 + 64 * 128) * 2        # one A buffer + one B buffer
    extra = three.shared_bytes - one.shared_bytes  # two more buffers per ring, plus their 8-byte mbarriers
    assert 0 <= extra - 2 * tile_bytes <= 64


@pytest.mark.slow
def test_every_body_statement_gets_stage_and_cluster(flash):
    spec, lowered, text, sched = flash
    result = inject(spec, sched, H100)
    loop = next(lp for lp in find_loops(result.scheduled_ttgir) if lp.innermost)
    written = read_schedule_attrs(result.scheduled_ttgir, loop)
    assert set(written) == {st.index for st in loop.body}
    assert written == dict(result.plan.statements)
    assert f"tt.scheduled_max_stage = {result.plan.max_stage} : i32" in result.scheduled_ttgir
    # folded index arithmetic takes its consumer's place; the local_alloc of a load sits with its wgmma
    body = {st.index: st for st in loop.body}
    for idx, consumers in lowered.folded_into.items():
        if body[idx].op == "ttg.local_alloc":
            assert written[idx] in {result.plan.op_places[n] for n, _ in consumers}


@pytest.mark.slow
def test_flash_injection_compiles_with_wgmma_in_the_last_stage(flash):
    spec, _, _, sched = flash
    assert sched.stats["triton_sm90_window"]
    result = inject(spec, sched, H100)
    top = result.plan.max_stage
    assert {result.plan.op_places[n][0] for n in ("qk", "pv")} == {top}
    compute = {n: s for n, (s, _) in result.plan.op_places.items() if not n.startswith("load_")}
    assert set(compute.values()) == {top}
    assert {result.plan.op_places["load_k"][0], result.plan.op_places["load_v"][0]} == {top - 2}
    assert [d for d, _, _ in result.rings] == [3, 3]
    assert result.kernel.asm["ptx"].count("wgmma.mma_async") >= 2 and result.kernel.asm["cubin"]
    # clusters follow start times modulo II: qk is emitted before the softmax, which precedes pv
    places = result.plan.op_places
    assert places["qk"][1] < places["exp"][1] < places["pv"][1]
    smaller = inject(spec, sched, H100, load_lead=1)
    assert [d for d, _, _ in smaller.rings] == [2, 2] and smaller.shared_bytes < result.shared_bytes


@pytest.mark.slow
def test_unconstrained_schedule_with_early_wgmma_is_refused(flash):
    spec, lowered, _, _ = flash
    free = schedule(lowered.graph, H100, SolveOptions(ws=False, time_limit=30))
    if free.stage("qk") == free.stage("pv"):
        pytest.skip("the unconstrained optimum happens to keep both wgmma in one stage")
    with pytest.raises(UnsupportedFeatureError, match="cannot predicate warp_group_dot"):
        inject(spec, free, H100)


@pytest.mark.slow
def test_window_constraint_keeps_compute_in_one_stage(flash):
    _, lowered, _, sched = flash
    g = constrain_for_triton(lowered.graph, 90)
    assert len(g.edges) > len(lowered.graph.edges) and constrain_for_triton(lowered.graph, 100) is lowered.graph
    places = op_places(sched, 2)
    assert len({s for n, (s, _) in places.items() if not n.startswith("load_")}) == 1


def test_blackwell_injection_compiles():
    pytest.importorskip("ortools")
    spec = _spec("matmul", "matmul_kernel", machine=get_machine("b200"))
    lowered, _ = lower_function(spec, get_machine("b200"))
    sched = solve_for_triton(lowered.graph, get_machine("b200"), 100, SolveOptions(ws=False, time_limit=30))
    result = inject(spec, sched, get_machine("b200"))
    assert "tcgen05.mma" in result.kernel.asm["ptx"] and [d for d, _, _ in result.rings] == [3, 3]


def test_other_triton_version_is_refused(matmul, monkeypatch):
    spec, _, _, sched = matmul
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    with pytest.raises(UnsupportedFeatureError, match="3.6.0"):
        inject(spec, sched, H100)


# -- text edits -------------------------------------------------------------------------------------------
def test_set_schedule_attrs_replaces_and_inserts():
    line = "      %k = arith.addi %a, %b {loop.cluster = 2 : i32, loop.stage = 0 : i32} : i32 loc(#loc71)"
    assert "loop.cluster = 5 : i32, loop.stage = 1 : i32" in set_schedule_attrs(line, 1, 5)
    bare = "      %k = arith.addi %a, %b : i32 loc(#loc71)"
    assert set_schedule_attrs(bare, 3, 4) == ("      %k = arith.addi %a, %b {loop.cluster = 4 : i32, "
                                              "loop.stage = 3 : i32} : i32 loc(#loc71)")
    other = "      %q = ttng.warp_group_dot %a, %b, %c {inputPrecision = 0 : i32} : !x * !y -> tensor<1xf32>"
    assert "{inputPrecision = 0 : i32, loop.cluster = 0 : i32, loop.stage = 2 : i32}" in \
        set_schedule_attrs(other, 2, 0)
    region = "      }) : (tensor<128x64xf32, #mma>) -> tensor<128xf32, #ttg.slice<{dim = 1, parent = #mma}>> loc(#l)"
    assert set_schedule_attrs(region, 1, 1).startswith("      }) {loop.cluster = 1 : i32, loop.stage = 1 : i32} :")
    assert set_loop_max_stage("    } {tt.scheduled_max_stage = 2 : i32} loc(#l)", 4) == \
        "    } {tt.scheduled_max_stage = 4 : i32} loc(#l)"
    assert set_loop_max_stage("    } loc(#l)", 1) == "    } {tt.scheduled_max_stage = 1 : i32} loc(#l)"
    # the closing line of an scf.if carries its attributes after the region
    assert set_schedule_attrs("        } loc(#loc2)", 1, 2) == \
        "        } {loop.cluster = 2 : i32, loop.stage = 1 : i32} loc(#loc2)"


def test_annotate_is_identity_for_triton_own_plan(matmul):
    _, lowered, text, _ = matmul
    from twill.integrations.triton.inject import StagePlan

    own = heuristic_plan(text)
    plan = StagePlan(ii=1, op_places={}, statements=own, max_stage=max(s for s, _ in own.values()), load_lead=2)
    assert annotate(text, lowered.loop, plan).splitlines() == text.splitlines()


# -- command line -----------------------------------------------------------------------------------------
def _triton_args(name: str) -> list[str]:
    import importlib

    mod = importlib.import_module(f"twill.integrations.triton.kernels.{name}")
    fn = {"matmul": "matmul_kernel", "flash_fwd": "attn_fwd"}[name]
    args = [f"{KERNELS / (name + '.py')}:{fn}", "--signature", mod.SIGNATURE, "--num-warps", str(mod.NUM_WARPS),
            "--num-stages", str(mod.NUM_STAGES)]
    for c in mod.CONSTEXPRS:
        args += ["--constexpr", c]
    return args


def test_cli_graph_and_inject(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main
    from twill.ir import load_graph

    assert main(["graph", *_triton_args("matmul"), "-o", str(tmp_path / "g.json")]) == 0
    g = load_graph(tmp_path / "g.json")
    assert g.op_names == ("load_a", "load_b", "mma") and g.attrs["source"] == "triton"
    capsys.readouterr()
    out = tmp_path / "inj"
    assert main(["inject", *_triton_args("matmul"), "--time-limit", "30", "-o", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stages"] == 3 and summary["shared_memory_bytes"] == 98328
    assert [b["depth"] for b in summary["buffers"]] == [3, 3] and summary["ii_cycles"] == 512
    names = {p.name for p in out.iterdir()}
    assert {"matmul_kernel.cubin", "matmul_kernel.ttgir", "matmul_kernel.scheduled.ttgir", "summary.json",
            "schedule.json"} <= names
    assert set(summary["files"]) == names
    assert summary["ii_lower_bound"] <= summary["ii"] and summary["ii_lower_bound_cycles"] <= summary["ii_cycles"]
    again = tmp_path / "again"
    assert main(["inject", *_triton_args("matmul"), "--schedule", str(out / "schedule.json"), "--load-lead", "1",
                 "-o", str(again)]) == 0
    assert json.loads(capsys.readouterr().out)["shared_memory_bytes"] == 65552


def test_cli_errors_are_one_line(tmp_path, capsys):
    from twill.cli import main

    assert main(["inject", "twill-no-such-kernel", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("twill: error:") and "path.py:fn" in err and "\n" not in err
    args = _triton_args("matmul")
    args[args.index("--signature") + 1] = "a_ptr=*fp16:16"
    assert main(["inject", *args, "-o", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip()
    assert "arguments 'b_ptr', 'c_ptr', 'M', 'N', 'K' are missing from the signature" in err and "\n" not in err


@pytest.mark.parametrize("flag,message", [
    (["--solver", "yices"], "--solver applies to warp specialization"),
    (["--reg-limit", "128"], "--reg-limit applies to warp specialization"),
    (["--max-warps", "8"], "--max-warps applies to warp specialization"),
    (["--no-cross-warp"], "--no-cross-warp applies to warp specialization"),
    (["--ws"], "only at num_warps=4"),
])
def test_inject_refuses_warp_specialization_options(tmp_path, capsys, flag, message):
    from twill.cli import main

    assert main(["inject", *_triton_args("matmul"), *flag, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_window_search_tries_every_ii_between_bound_and_answer(matmul, monkeypatch):
    """An undecided II makes bisection skip the IIs below it; they are tried before the answer is final."""
    import twill.solve.modulo as modulo

    _, lowered, _, sched = matmul
    real = modulo.solve_modulo
    answer = sched.ii + 12

    def scripted(graph, units, ii, **kw):
        if ii >= answer:
            return real(graph, units, ii, **kw)
        status = "unknown" if ii == answer - 3 else "infeasible"
        return modulo.ModuloResult(status=status, starts={}, length=0, proven=status == "infeasible",
                                   length_bound=0, ii=ii, seconds=0.0)

    monkeypatch.setattr(modulo, "solve_modulo", scripted)
    result = solve_for_triton(lowered.graph, H100, 90, SolveOptions(ws=False, time_limit=60))
    tried = {row["ii"] for row in result.stats["tried"]}
    low = result.stats["mii"]
    assert set(range(low, answer + 1)) <= tried
    assert result.ii == answer and result.status == "feasible" and result.ii_lower_bound == answer - 3

