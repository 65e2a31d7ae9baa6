"""Twill as TileLang's pipeline planner: ``twill schedule`` / ``twill inject`` on TileLang kernels
(``examples/tilelang``). The plan must obey TileLang's stage/order rules, the rewritten kernel must carry it,
and its CUDA (lowered on the CPU) must keep ``num_stages`` buffer versions. Bad inputs: one line, exit 2."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from twill.cli import main
from twill.integrations.tilelang import rewrite_source, rewrite_ws_source, ws_root_ops

ROOT = Path(__file__).resolve().parents[3]
GEMM = str(ROOT / "examples" / "tilelang" / "gemm.py")
FLASH = str(ROOT / "examples" / "tilelang" / "flash_fwd.py")
GEMM_ARGS = ["--arg", "M=1024", "--arg", "N=1024", "--arg", "K=1024"]
FLASH_ARGS = ["--arg", "batch=1", "--arg", "heads=2", "--arg", "seq_len=1024", "--arg", "dim=128"]
HAS_TILELANG = importlib.util.find_spec("tilelang") is not None
needs_tilelang = pytest.mark.skipif(not HAS_TILELANG, reason="TileLang is not installed (the tilelang extra, "
                                                             "README 'TileLang')")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _check_tilelang_rules(doc: dict) -> None:
    """TileLang's validity rules for every same-iteration dependence of the loop graph: in one stage the
    producer is ordered first; across stages the producer's stage is not later."""
    plan = doc["tilelang"]
    index = {op: i for i, op in enumerate(plan["ops"])}
    stage, order = plan["stage"], plan["order"]
    assert sorted(order) == list(range(len(order))) and len(stage) == len(order)
    for e in doc["loop_graph"]["edges"]:
        if e.get("distance", 0) == 0:
            i, j = index[e["src"]], index[e["dst"]]
            assert stage[i] < stage[j] or (stage[i] == stage[j] and order[i] < order[j]), e


def _versions(cuda: str) -> set[int]:
    found = {int(n) for n in re.findall(r"\bk(?:_\d)? % (\d+)\)", cuda)}
    return found | {int(n) + 1 for n in re.findall(r"\bk(?:_\d)? & (\d+)\)", cuda)}


# -- without TileLang ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["schedule", GEMM + ":matmul", "--arg", "M"], "--arg takes NAME=VALUE, got 'M'"),
    (["schedule", GEMM + ":matmul", "--num-warps", "4"], "--num-warps does not apply to TileLang kernel"),
    (["schedule", GEMM + ":matmul", "--block-m", "64"], "--block-m does not apply to TileLang kernel"),
    (["schedule", "gemm", "--arg", "M=1"], "--arg applies to TileLang kernels"),
    (["inject", GEMM + ":matmul", "--load-lead", "2", "-o", "{tmp}"], "--load-lead applies to Triton kernels"),
])
def test_bad_inputs_are_one_line(capsys, tmp_path, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path / "out")) for a in argv]
    if argv[0] == "inject" and not HAS_TILELANG:
        pytest.skip("needs TileLang to reach the option check")
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("twill: error: ") and message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(HAS_TILELANG, reason="checks the message when TileLang is missing")
def test_missing_tilelang_is_one_line(capsys):
    rc, out, err = run(capsys, "schedule", GEMM + ":matmul", *GEMM_ARGS)
    assert rc == 2 and err.startswith("twill: error: TileLang is not available") and err.count("\n") == 1


def test_rewrite_replaces_the_pipeline_keywords():
    text = rewrite_source(GEMM, "matmul", [0, 0, 3], [1, 2, 0], "note")
    call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and
                getattr(n.func, "attr", "") == "Pipelined")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kw == {"stage": [0, 0, 3], "order": [1, 2, 0]} and len(call.args) == 1
    assert "# note\n" in text


def test_rewrite_refuses_two_pipelined_loops(tmp_path):
    src = tmp_path / "two.py"
    src.write_text("import tilelang.language as T\ndef f():\n    for i in T.Pipelined(4):\n        pass\n"
                   "    for j in T.Pipelined(4):\n        pass\n")
    with pytest.raises(Exception, match="has 2 T.Pipelined"):
        rewrite_source(str(src), "f", [0], [0], "x")


def test_ws_rewrite_tags_every_statement():
    """The warp-specialized rewrite: the schedule after the allocations, one ``T.ws_op`` per statement of the
    prologue, the loop (now ``T.serial`` with the loop id) and the epilogue, the loop's in the given ops."""
    ops = ["tma_load_A_s", "tma_load_B_s", "mma_C_l"]
    text = rewrite_ws_source(GEMM, "matmul", ops, ["T.annotate_ws_schedule(SCHEDULE)"], "k_loop", "note")
    tree = ast.parse(text)
    withs = sorted((n for n in ast.walk(tree) if isinstance(n, ast.With)), key=lambda n: n.lineno)
    tags = [ast.literal_eval(n.items[0].context_expr.args[0]) for n in withs
            if getattr(n.items[0].context_expr.func, "attr", "") == "ws_op"]
    assert tags == ["prologue0", *ops, "epilogue0"]
    assert ws_root_ops(GEMM, "matmul", "k_loop") == ["prologue0", "k_loop", "epilogue0"]
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.For))
    assert ast.unparse(loop.iter) == "T.serial(T.ceildiv(K, block_K), annotations={T.WSID: 'k_loop'})"
    assert [ast.unparse(w.items[0].context_expr) for w in loop.body] == [f"T.ws_op('{op}')" for op in ops]
    assert "Pipelined(" not in text.split("def matmul")[1] and text.index("# note") < text.index("SCHEDULE") \
        < text.index('T.ws_op("prologue0")')
    with pytest.raises(Exception, match="has 3 statements in its source and 2 tile statements"):
        rewrite_ws_source(GEMM, "matmul", ops[:2], [], "k_loop", "note")


# -- with TileLang -------------------------------------------------------------------------------------
@needs_tilelang
def test_gemm_plan_obeys_tilelang_rules(capsys):
    rc, out, err = run(capsys, "schedule", GEMM + ":matmul", *GEMM_ARGS, "--no-ws", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["tilelang"]["ops"] == ["tma_load_A_s", "tma_load_B_s", "mma_C_l"]
    assert doc["tilelang"]["num_stages"] == 3      # the example's num_stages: the ring the schedule keeps
    _check_tilelang_rules(doc)
    own = doc["loop_graph"]["attrs"]["tilelang_plan"]       # TileLang's PipelinePlanning, for comparison
    _check_tilelang_rules({"tilelang": {"ops": doc["tilelang"]["ops"], **own}, "loop_graph": doc["loop_graph"]})
    assert "TileLang's own plan (PipelinePlanning; " in run(
        capsys, "schedule", GEMM + ":matmul", *GEMM_ARGS, "--no-ws")[1]


@needs_tilelang
def test_unpipelined_loop_is_refused(capsys):
    rc, out, err = run(capsys, "schedule", GEMM + ":matmul", *GEMM_ARGS, "--arg", "num_stages=0", "--no-ws")
    assert rc == 2 and out == "" and err == ("twill: error: the kernel has 0 T.Pipelined loops; twill plans exactly "
                                             "one (a T.Pipelined loop with num_stages=0 is a plain loop)\n")


@needs_tilelang
def test_gemm_inject_round_trip(capsys, tmp_path):
    rc, out, err = run(capsys, "inject", GEMM + ":matmul", *GEMM_ARGS, "-o", str(tmp_path / "o"))
    assert rc == 0, err
    summary = json.loads(out)
    plan = summary["tilelang"]
    kernel = (tmp_path / "o" / "gemm_twill.py").read_text()
    assert f"block_K), stage={plan['stage']}, order={plan['order']})" in kernel
    cuda = (tmp_path / "o" / "gemm_twill.cu").read_text()
    assert _versions(cuda) == {plan["num_stages"]} and "cp_async" in cuda and "warpgroup_reg" not in cuda
    _check_tilelang_rules({"tilelang": plan, **json.loads((tmp_path / "o" / "schedule.json").read_text())})


@needs_tilelang
def test_loop_without_gemm_is_refused(capsys, tmp_path):
    src = tmp_path / "copy_only.py"
    src.write_text(Path(GEMM).read_text().replace("T.gemm(A_s, B_s, C_l)", "T.copy(A_s, C_l[0:block_M, 0:block_K])"))
    rc, out, err = run(capsys, "schedule", str(src) + ":matmul", *GEMM_ARGS, "--no-ws")
    assert rc == 2 and err == "twill: error: the T.Pipelined loop has no T.gemm: Twill schedules tensor-core " \
                              "loops\n"


def _check_ws_kernel(out: Path, stem: str, summary: dict) -> None:
    """The warp-specialized rewrite: its T.WSSchedule takes the schedule's warp groups (load group on warp 0,
    compute group from warp 4, their budgets) and ring depths, and its CUDA shows them."""
    doc = json.loads((out / "schedule.json").read_text())
    load, comp = (next(w for w in doc["warps"] if w["role"] == role) for role in ("load", summary["compute_role"]))
    kernel = (out / f"{stem}_twill_ws.py").read_text()
    assert f'T.WSRole("load", warps_lo=0, warps_hi={load["num_warps"]}, max_nreg={load["regs"]})' in kernel
    assert (f'T.WSRole("compute0", warps_lo=4, warps_hi={4 + comp["num_warps"]}, max_nreg={comp["regs"]})'
            in kernel)
    cuda = (out / f"{stem}_twill_ws.cu").read_text()
    assert f"warpgroup_reg_dealloc<{load['regs']}>" in cuda and f"warpgroup_reg_alloc<{comp['regs']}>" in cuda
    assert f"__launch_bounds__({32 * (4 + comp['num_warps'])}, 1)" in cuda and "cp_async" not in cuda
    for p in summary["ws_schedule"]["pipelines"]:
        assert re.search(rf'T\.WSPipeline\("{p["name"]}", \[[\w, ]+\], depth={p["depth"]}\)', kernel)
        assert f"{p['name']}_full_mem[{p['depth']}]" in cuda and f"{p['name']}_empty_mem[{p['depth']}]" in cuda
    assert _versions(cuda) == {p["depth"] for p in summary["ws_schedule"]["pipelines"]}


@needs_tilelang
@pytest.mark.slow
def test_gemm_inject_ws_keeps_the_warp_assignment(capsys, tmp_path):
    rc, out, err = run(capsys, "inject", GEMM + ":matmul", *GEMM_ARGS, "--ws", "-o", str(tmp_path / "o"))
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["ws_schedule"]["pipelines"] == [{"name": "A_s_B_s", "depth": summary["tilelang"]["num_stages"]}]
    assert {"gemm_twill_ws.py", "gemm_twill_ws.cu", "gemm_twill.py"} <= set(summary["files"])
    _check_ws_kernel(tmp_path / "o", "gemm", {**summary, "compute_role": "mma"})
    doc = json.loads((tmp_path / "o" / "schedule.json").read_text())
    for w in doc["warps"]:
        w["num_warps"] = 8 if w["role"] == "mma" else w["num_warps"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    rc, out, err = run(capsys, "inject", GEMM + ":matmul", *GEMM_ARGS, "--schedule", str(tmp_path / "bad.json"),
                       "-o", str(tmp_path / "bad"))
    assert rc == 2 and out == "" and err == ("twill: error: cannot emit tilelang: a 8-warp compute group (the kernel "
                                             "launches 128 threads for its tile statements)\n")
    assert not (tmp_path / "bad").exists()


@needs_tilelang
@pytest.mark.slow
def test_flash_inject_round_trip(capsys, tmp_path):
    rc, out, err = run(capsys, "inject", FLASH + ":flashattn", *FLASH_ARGS, "--resolution", "60", "--ws", "-o",
                       str(tmp_path / "o"))
    assert rc == 0, err
    summary = json.loads(out)
    plan = summary["tilelang"]
    assert len(plan["ops"]) == 13 and sum(op.startswith("mma_") for op in plan["ops"]) == 2
    cuda = (tmp_path / "o" / "flash_fwd_twill.cu").read_text()
    assert _versions(cuda) == {plan["num_stages"]}
    _check_tilelang_rules({"tilelang": plan, **json.loads((tmp_path / "o" / "schedule.json").read_text())})
    assert [p["name"] for p in summary["ws_schedule"]["pipelines"]] == ["K_shared", "V_shared"]
    _check_ws_kernel(tmp_path / "o", "flash_fwd", {**summary, "compute_role": "compute"})
