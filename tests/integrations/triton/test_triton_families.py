"""Triton frontend on the kernel families public libraries write (tests/data/triton_families.py): pointer
loads, grouped and batched matmuls, persistent matmuls, causal attention, attention backward, decorated
kernels; and the messages around them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.errors import TwillError  # noqa: E402
from twill.integrations.triton import graph_from_target  # noqa: E402
from twill.machine import get_machine  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

DATA = Path(__file__).resolve().parents[2] / "data"
FAMILIES = DATA / "triton_families.py"
sys.path.insert(0, str(DATA))
import triton_families as F  # noqa: E402

MATMUL = ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=64")
BMM_SIGNATURE = ("a_ptr=*fp16:16,b_ptr=*fp16:16,c_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16,stride_ab=i32:16,"
                 "stride_am=i32:16,stride_ak=i32,stride_bb=i32:16,stride_bk=i32:16,stride_bn=i32,stride_cb=i32:16,"
                 "stride_cm=i32:16,stride_cn=i32")
ATTN = ("HEAD_DIM=128", "BLOCK_M=128", "BLOCK_N=128")


def _graph(fn: str, signature: str, constexprs, arch: str = "h100", **kw):
    return graph_from_target(FAMILIES, fn, signature=signature, constexprs=list(constexprs), num_warps=8,
                             num_stages=3, machine=get_machine(arch), **kw)


@pytest.mark.parametrize("fn,signature,constexprs", [
    ("matmul_grouped", F.MATMUL_SIGNATURE, MATMUL + ("GROUP_M=8",)),
    ("bmm_block_ptr", BMM_SIGNATURE, MATMUL),
])
def test_pointer_loads_take_the_bytes_of_the_loaded_element(fn, signature, constexprs):
    g = _graph(fn, signature, constexprs)
    assert {op.attrs["role"] for op in g.ops} == {"load_a", "load_b", "mma"}
    for load in ("load_a", "load_b"):
        assert g.op(load).smem == 128 * 64 * 2 and g.op(load).attrs["dtype"] == "fp16"


def test_bare_type_signature_goes_to_the_runtime_arguments_in_order():
    bare = ",".join(part.split("=", 1)[1] for part in F.MATMUL_SIGNATURE.split(","))
    g = _graph("matmul_grouped", bare, MATMUL + ("GROUP_M=8",))
    assert g.op("load_a").smem == 128 * 64 * 2
    with pytest.raises(TwillError, match="lists 11 types but the kernel has 12"):
        _graph("matmul_grouped", bare.rsplit(",", 1)[0], MATMUL + ("GROUP_M=8",))
    with pytest.raises(TwillError, match="mixes NAME=TYPE and bare TYPE"):
        _graph("matmul_grouped", "a_ptr=*fp16," + bare.split(",", 1)[1], MATMUL + ("GROUP_M=8",))


def test_compilation_error_keeps_its_reason_and_python_line(tmp_path):
    src = tmp_path / "broken.py"
    src.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                   "def broken(x_ptr, B: tl.constexpr):\n    offs = tl.arange(0, B)\n"
                   "    y = tl.load(x_ptr + offs) + no_such_name\n    tl.store(x_ptr + offs, y)\n")
    with pytest.raises(TwillError) as info:
        graph_from_target(src, "broken", signature="x_ptr=*fp32", constexprs=["B=128"], num_warps=4,
                          num_stages=3, machine=get_machine("h100"))
    msg = str(info.value)
    assert "broken.py:8" in msg and "no_such_name is not defined" in msg and "\n" not in msg


def test_remedy_follows_the_blocking_family():
    from twill.solve.joint.search import remedy_for
    from twill.solve.options import COMMAND_FLAGS

    flags = dict(COMMAND_FLAGS)
    assert remedy_for([], flags) == "raise --max-ii"
    memory = remedy_for(["memory_capacity"], flags)
    assert "--max-ii" not in memory and "tiles" in memory
    assert "--reg-limit" in remedy_for(["register_limit+memory_capacity"], flags)


def test_emit_gluon_refuses_triton_kernels_before_solving(capsys):
    from twill.cli import main

    assert main(["emit", "gluon", f"{FAMILIES}:matmul_grouped", "-o", "unused.py"]) == 2
    err = capsys.readouterr().err
    assert "a Triton kernel or a graph extracted from one" in err and "twill inject" in err and err.count("\n") == 1
    assert not Path("unused.py").exists()


CAUSAL = ATTN + ("CAUSAL=True",)


def test_causal_attention_lists_its_loops_and_takes_loop_by_index_or_python_line():
    with pytest.raises(TwillError) as info:
        _graph("attn_fwd_ptr", F.ATTN_SIGNATURE, CAUSAL)
    msg = str(info.value)
    inner_for = _line_of("    for start_n in range(lo, hi, BLOCK_N):")
    # a call spanning lines is located on its last line, where Triton puts the call site
    calls = [_line_of("                                    qk_scale, 0, start_m"),
             _line_of("                                    qk_scale, start_m * BLOCK_M")]
    assert "--loop" in msg and "loop 0 at" in msg and "loop 1 at" in msg
    assert f"triton_families.py:{inner_for} (called at triton_families.py:{calls[0]})" in msg
    first = _graph("attn_fwd_ptr", F.ATTN_SIGNATURE, CAUSAL, loop=0)
    second = _graph("attn_fwd_ptr", F.ATTN_SIGNATURE, CAUSAL, loop=f"line:{calls[1]}")
    assert first.attrs["loop_line"] < second.attrs["loop_line"]
    for g, call in ((first, calls[0]), (second, calls[1])):
        assert g.attrs["loop_source"] == f"triton_families.py:{inner_for} (called at triton_families.py:{call})"
    for g in (first, second):
        assert {"qk", "pv", "exp", "load_k", "load_v"} <= {op.attrs["role"] for op in g.ops}
        assert g.op("load_k").smem == 128 * 128 * 2
    with pytest.raises(TwillError, match="out of range"):
        _graph("attn_fwd_ptr", F.ATTN_SIGNATURE, CAUSAL, loop=5)
    with pytest.raises(TwillError, match="matches 2 loops"):
        _graph("attn_fwd_ptr", F.ATTN_SIGNATURE, CAUSAL, loop=f"line:{inner_for}")


def _line_of(text: str, nth: int = 0) -> int:
    lines = [k + 1 for k, line in enumerate(FAMILIES.read_text().splitlines()) if line.startswith(text)]
    return lines[nth]


def test_autotuned_kernel_takes_a_config_and_heuristics():
    with pytest.raises(TwillError) as info:
        _graph_tuned()
    assert "autotuned over 2 configs" in str(info.value) and "1: BLOCK_M=64 BLOCK_N=128 BLOCK_K=32" in str(info.value)
    with pytest.raises(TwillError, match=r"'EVEN_K' \(computed by @triton.heuristics"):
        _graph_tuned(config=1)
    g = _graph_tuned(config=1, constexprs=["EVEN_K=True"])
    assert g.op("mma").attrs["m"] == 64 and g.op("mma").attrs["k"] == 32 and g.attrs["num_warps"] == 4
    assert g.attrs["num_stages"] == 4 and g.attrs["even_k"] is True
    with pytest.raises(TwillError, match="out of range"):
        _graph_tuned(config=2, constexprs=["EVEN_K=True"])
    with pytest.raises(TwillError, match="--config applies to @triton.autotune"):
        _graph("matmul_grouped", F.MATMUL_SIGNATURE, MATMUL + ("GROUP_M=8",), config=0)


def _graph_tuned(config=None, constexprs=()):
    return graph_from_target(FAMILIES, "matmul_tuned", signature=F.MATMUL_SIGNATURE, constexprs=list(constexprs),
                             num_warps=None, num_stages=None, machine=get_machine("h100"), config=config)


#: Unit strides as constexprs: what Triton's launcher specializes when a stride is 1 at run time; without it the
#: loads are not known to be contiguous and Triton does not pipeline them.
UNIT_STRIDES = ("stride_ak=1", "stride_bn=1", "stride_cn=1")
PERSISTENT_SIGNATURE = ",".join(p for p in F.MATMUL_SIGNATURE.split(",")
                                if p.split("=")[0] not in ("stride_ak", "stride_bn", "stride_cn"))
PERSISTENT = MATMUL + UNIT_STRIDES + ("NUM_SMS=132",)


def test_persistent_matmul_models_its_epilogue_as_one_conditional_op():
    g = _graph("matmul_persistent", PERSISTENT_SIGNATURE, PERSISTENT)
    cond = [op for op in g.ops if op.kind == "conditional"]
    assert len(cond) == 1, "the tile switch (index arithmetic only) is folded, the epilogue is one op"
    epilogue = cond[0]
    assert epilogue.attrs["region_ops"] == ["arith.truncf", "ttg.convert_layout", "tt.store"]
    assert epilogue.name == "if_alu_convert_store"
    units = [{unit for unit, _ in row} for row in epilogue.rrt]
    assert units[0] == {"alu"} and units[-1] == {"tma"} and {"smem"} in units
    edges = {(e.src, e.dst, e.distance) for e in g.edges}
    assert ("mma", epilogue.name, 0) in edges and (epilogue.name, "mma", 1) in edges
    assert {"load_a", "load_b", "mma"} <= set(g.op_names)


def test_persistent_matmul_injects():
    pytest.importorskip("ortools")
    from twill.integrations.triton.inject import inject, solve_for_triton
    from twill.integrations.triton import lower_function, spec_from_target

    machine = get_machine("h100")
    spec = spec_from_target(FAMILIES, "matmul_persistent", signature=PERSISTENT_SIGNATURE,
                            constexprs=list(PERSISTENT), num_warps=8, num_stages=3, machine=machine)
    lowered, _ = lower_function(spec, machine)
    from twill.solve import SolveOptions

    schedule = solve_for_triton(lowered.graph, machine, spec.capability, SolveOptions(ws=False, time_limit=60))
    result = inject(spec, schedule, machine)
    cond = next(op.name for op in schedule.graph.ops if op.kind == "conditional")
    assert result.plan.op_places[cond][0] == result.plan.op_places["mma"][0]
    assert "loop.stage" in result.scheduled_ttgir and result.rings and result.rings[0][0] >= 2


BWD = ("HEAD_DIM=128", "BLOCK_M=64", "BLOCK_N=128")
DQ_SIGNATURE = ("Q=*fp16:16,K=*fp16:16,V=*fp16:16,DO=*fp16:16,M=*fp32:16,D=*fp32:16,DQ=*fp16:16,stride_tok=i32:16,"
                "N_CTX=i32:16")


def test_attention_backward_ops_are_named_from_what_they_compute():
    g = _graph("attn_bwd_dkdv", F.BWD_SIGNATURE, BWD)
    roles = {op.attrs["role"]: op for op in g.ops}
    assert {"qk", "dp", "exp", "ds", "dv", "dk", "load_q", "load_do", "load_lse", "load_delta"} <= set(roles)
    assert not any(name.endswith(("_a", "_b")) or name.startswith("pv") for name in g.op_names)
    edges = {(e.src, e.dst, e.distance) for e in g.edges}
    assert {("load_q", "qk", 0), ("load_do", "dp", 0), ("load_do", "dv", 0)} <= edges
    assert any(("dp", x, 0) in edges and (x, "ds", 0) in edges for x in g.op_names)      # dS = P * (dP - D)
    assert {("dv", "dv", 1), ("dk", "dk", 1), ("load_q", "dk", 0)} <= edges
    dq = _graph("attn_bwd_dq", DQ_SIGNATURE, BWD)
    names = set(dq.op_names)
    assert {"qk", "dp", "exp", "ds", "dq", "load_k", "load_v"} <= names and not {"dk", "dv"} & names
    assert ("load_k", "dq", 0) in {(e.src, e.dst, e.distance) for e in dq.edges}



@pytest.mark.parametrize("arch,mlir_op", [("h100", "ttng.warp_group_dot"), ("b200", "ttng.tc_gen5_mma_scaled")])
def test_block_scaled_matmul(arch, mlir_op):
    g = _graph("matmul_block_scaled", F.SCALED_SIGNATURE,
               ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=128", "VEC_SIZE=32"), arch=arch)
    mma = g.op("mma")
    assert mma.attrs["mlir_op"] == mlir_op
    # fp8 tiles by TMA; on sm_90 the scaled dot is an upcast to bf16 and a wgmma, whose operands still trace
    # back to the fp8 tiles
    assert g.op("load_a").smem == g.op("load_b").smem == 128 * 128
    scales = [op for op in g.ops if op.kind == "load" and op.attrs["dtype"] == "i8"]
    assert len(scales) == 2 and all(op.smem == 128 * 4 for op in scales)


def test_grouped_gemm_schedules_its_k_loop():
    g = graph_from_target(FAMILIES, "grouped_gemm", signature=F.GROUP_GEMM_SIGNATURE,
                          constexprs=["NUM_SM=132", "BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=64"], num_warps=4,
                          num_stages=3, machine=get_machine("h100"))
    assert {op.attrs["role"] for op in g.ops} == {"load_a", "load_b", "mma"}
    assert g.attrs["loop_source"] == f"triton_families.py:{_line_of('            for kk in range(')}"


@pytest.mark.slow
def test_pointer_attention_gets_a_joint_schedule():
    """With loads charged the bytes they load, the pointer-load attention fits in shared memory and gets an
    optimal joint schedule (charged 4 bytes a pointer, every II was blocked by memory capacity)."""
    pytest.importorskip("ortools")
    from twill.solve import SolveOptions, schedule

    g = _graph("attn_fwd_ptr", F.ATTN_SIGNATURE, ATTN + ("CAUSAL=False",))
    s = schedule(g, get_machine("h100"), SolveOptions(time_limit=300))
    assert s.status == "optimal" and s.assignment


def test_failing_triton_pass_reports_its_diagnostic(tmp_path, capfd):
    """Triton 3.6's Hopper warp specialization rejects this kernel inside an MLIR pass; the exception says only
    'PassManager::run failed', the reason is the diagnostic the pass prints, which the error must carry."""
    src = tmp_path / "wsdesc.py"
    src.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                   "def wsdesc(a_desc, b_desc, c_desc, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):\n"
                   "    acc = tl.zeros((BM, BN), dtype=tl.float32)\n"
                   "    for k in tl.range(0, K, BK, warp_specialize=True):\n"
                   "        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)\n"
                   "    c_desc.store([0, 0], acc.to(tl.float16))\n")
    with pytest.raises(TwillError) as info:
        graph_from_target(src, "wsdesc", signature="tensordesc<fp16[128, 64]>,tensordesc<fp16[64, 128]>,"
                          "tensordesc<fp16[128, 128]>,i32", constexprs=["BM=128", "BN=128", "BK=64"], num_warps=4,
                          num_stages=3, machine=get_machine("h100"))
    msg = str(info.value)
    assert re.search(r"at wsdesc\.py:10: RuntimeError: PassManager::run failed: \S", msg) and "\n" not in msg
    assert "module {" not in capfd.readouterr().err      # the MLIR reproducer dump is not passed on


def test_scan_and_libdevice_calls_are_modelled(tmp_path):
    src = tmp_path / "scan_k.py"
    src.write_text("import triton\nimport triton.language as tl\nfrom triton.language.extra.cuda import libdevice\n\n\n"
                   "@triton.jit\ndef scan_k(x_ptr, y_ptr, N, B: tl.constexpr):\n"
                   "    acc = tl.zeros((B, B), dtype=tl.float32)\n    offs = tl.arange(0, B)\n"
                   "    for i in range(0, N, B):\n"
                   "        x = tl.load(x_ptr + i * B + offs[:, None] * B + offs[None, :])\n"
                   "        acc += libdevice.exp(tl.cumsum(x, 1)) + tl.dot(x.to(tl.float16), x.to(tl.float16))\n"
                   "    tl.store(y_ptr + offs[:, None] * B + offs[None, :], acc)\n")
    g = graph_from_target(src, "scan_k", signature="x_ptr=*fp32:16,y_ptr=*fp32:16,N=i32:16", constexprs=["B=64"],
                          num_warps=4, num_stages=3, machine=get_machine("h100"))
    by_op = {op.attrs["mlir_op"]: op for op in g.ops}
    assert by_op["tt.scan"].kind == "scan" and by_op["tt.extern_elementwise"].kind == "mufu"
    assert {unit for row in by_op["tt.extern_elementwise"].rrt for unit, _ in row} == {"mufu"}


TMA_PERSISTENT = ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=64", "NUM_SMS=132")


@pytest.mark.parametrize("arch", ["h100", "b200"])
def test_tma_persistent_matmul_with_split_epilogue_injects(arch):
    pytest.importorskip("ortools")
    from twill.integrations.triton.inject import inject, solve_for_triton
    from twill.integrations.triton import lower_function, spec_from_target
    from twill.solve import SolveOptions

    machine = get_machine(arch)
    spec = spec_from_target(FAMILIES, "matmul_tma_persistent", signature=F.TMA_PERSISTENT_SIGNATURE,
                            constexprs=list(TMA_PERSISTENT + ("SPLIT_EPILOGUE=True",)), num_warps=8, num_stages=3,
                            machine=machine)
    lowered, _ = lower_function(spec, machine)
    epilogue = next(op for op in lowered.graph.ops if op.kind == "conditional")
    assert epilogue.attrs["region_ops"].count("tt.descriptor_store") == 2
    schedule = solve_for_triton(lowered.graph, machine, spec.capability, SolveOptions(ws=False, time_limit=60))
    result = inject(spec, schedule, machine)
    assert result.plan.op_places[epilogue.name][0] == result.plan.op_places["mma"][0]
    assert [depth for depth, _, _ in result.rings] == [3, 3]


def test_nested_conditionals_are_one_op(tmp_path):
    src = tmp_path / "nested.py"
    src.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                   "def nested(x_ptr, y_ptr, N, flag, B: tl.constexpr):\n    offs = tl.arange(0, B)\n"
                   "    acc = tl.zeros((B, B), dtype=tl.float32)\n    for i in range(0, N):\n"
                   "        acc = tl.dot(tl.load(x_ptr + i * B * B + offs[:, None] * B + offs[None, :]), "
                   "tl.load(x_ptr + offs[:, None] * B + offs[None, :]), acc)\n"
                   "        if i % 4 == 3:\n            if flag > 0:\n                acc = acc * 0.5\n"
                   "            tl.store(y_ptr + offs[:, None] * B + offs[None, :], acc.to(tl.float16))\n")
    g = graph_from_target(src, "nested", signature="x_ptr=*fp16:16,y_ptr=*fp16:16,N=i32,flag=i32",
                          constexprs=["B=64"], num_warps=4, num_stages=3, machine=get_machine("h100"))
    (cond,) = [op for op in g.ops if op.kind == "conditional"]
    assert cond.attrs["region_ops"][0] == "scf.if" and "tt.store" in cond.attrs["region_ops"]
    inner_alu = 64 * 64 // get_machine("h100").fma_per_clk          # acc * 0.5 inside the nested if
    assert cond.cycles > inner_alu


@pytest.mark.slow
def test_inject_schedules_the_loop_chosen_with_loop(tmp_path, capsys):
    pytest.importorskip("ortools")
    import json

    from twill.cli import main

    call = _line_of("                                    qk_scale, start_m * BLOCK_M")
    args = ["inject", f"{FAMILIES}:attn_fwd_ptr", "--num-warps", "8", "--signature", F.ATTN_SIGNATURE,
            "--constexpr", "HEAD_DIM=128", "--constexpr", "BLOCK_M=128", "--constexpr", "BLOCK_N=64",
            "--constexpr", "CAUSAL=True", "--loop", f"line:{call}", "--time-limit", "60", "-o", str(tmp_path)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["loop"].endswith(f"(called at triton_families.py:{call})")
    from twill.integrations.triton.mlir import find_loops

    text = (tmp_path / "attn_fwd_ptr.scheduled.ttgir").read_text()
    first, second = [lp for lp in find_loops(text) if lp.innermost]
    assert re.search(r"tt\.scheduled_max_stage = (\d+)", text.splitlines()[second.close_line]).group(1) == \
        str(summary["stages"] - 1)


@pytest.mark.parametrize("arch", ["h100", "b200"])
def test_fp4_block_scaled_matmul(arch):
    machine = get_machine(arch)
    g = _graph("matmul_fp4_scaled", F.SCALED_SIGNATURE.replace("fp8e4nv", "u8"),
               ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=256", "VEC_SIZE=32"), arch=arch)
    mma = g.op("mma")
    if arch == "b200":
        # tcgen05 reads the packed operands (K = 128 bytes = 256 fp4 values); fp4 runs at twice the fp8 rate
        assert mma.attrs["dtype"] == "fp4" and mma.attrs["k"] == 128
        assert mma.cycles == 2 * 128 * 128 * 256 // (2 * machine.tc_flops_per_clk["fp8"])
    else:
        # sm_90 upcasts fp4 to bf16 (ttg.fp4_to_fp, ALU) before a bf16 wgmma over the unpacked K
        assert mma.attrs["dtype"] == "bf16" and mma.attrs["k"] == 256
        assert any(op.attrs["mlir_op"] == "ttg.fp4_to_fp" and op.kind == "alu" for op in g.ops)
    assert g.op("load_a").smem == 128 * 128


def test_runtime_masked_softmax_step_is_one_conditional_charged_for_its_costlier_branch():
    g = _graph("attn_fwd_runtime_mask", F.ATTN_SIGNATURE, ATTN)
    (cond,) = [op for op in g.ops if op.kind == "conditional"]
    assert cond.attrs["regions"] == 2
    ops = cond.attrs["region_ops"]
    assert "arith.select" in ops and ops.count("tt.reduce") == 1      # the masked branch, not both
    edges = {(e.src, e.dst, e.distance) for e in g.edges}
    assert ("qk", cond.name, 0) in edges and (cond.name, "exp", 0) in edges
    assert {"qk", "pv", "exp", "alpha", "load_k", "load_v"} <= {op.attrs["role"] for op in g.ops}


@pytest.mark.slow
def test_inject_config_all_schedules_every_config_and_injects_the_fastest(tmp_path, capsys):
    pytest.importorskip("ortools")
    import json

    from twill.cli import main

    args = ["inject", f"{FAMILIES}:matmul_tuned", "--signature", F.MATMUL_SIGNATURE, "--constexpr", "EVEN_K=True",
            "--config", "all", "--time-limit", "60", "-o", str(tmp_path)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = summary["configs"]
    assert [row["config"] for row in rows] == [0, 1]
    peak = get_machine("h100").tc_flops_per_clk["fp16"]
    assert all(0 < row["flop_per_cycle"] <= peak for row in rows)
    best = max(rows, key=lambda row: (row["flop_per_cycle"], -row["config"]))
    assert summary["config"] == best["config"] and summary["ii_cycles"] == best["ii_cycles"]
    assert summary["num_warps"] == (8 if best["config"] == 0 else 4)


def test_config_all_is_refused_where_it_does_not_apply(tmp_path, capsys):
    from twill.cli import main

    assert main(["schedule", f"{FAMILIES}:matmul_tuned", "--signature", F.MATMUL_SIGNATURE, "--config", "all"]) == 2
    assert "--config all applies to twill inject only" in capsys.readouterr().err
    assert main(["inject", f"{FAMILIES}:matmul_grouped", "--signature", F.MATMUL_SIGNATURE, "--config", "all",
                 "-o", str(tmp_path / "x")]) == 2
    assert "applies to @triton.autotune kernels" in capsys.readouterr().err
    assert main(["graph", f"{FAMILIES}:matmul_tuned", "--config", "x", "-o", str(tmp_path / "g.json")]) == 2
    assert "--config takes a config index N or 'all'" in capsys.readouterr().err


def test_emit_gluon_refuses_a_graph_extracted_from_triton(tmp_path, capsys):
    from twill.cli import main

    graph = tmp_path / "mm.json"
    assert main(["graph", f"{FAMILIES}:matmul_grouped", "--signature", F.MATMUL_SIGNATURE,
                 *[f"--constexpr={c}" for c in MATMUL + ("GROUP_M=8",)], "-o", str(graph)]) == 0
    capsys.readouterr()
    assert main(["emit", "gluon", str(graph), "-o", str(tmp_path / "k.py")]) == 2
    assert "a Triton kernel or a graph extracted from one" in capsys.readouterr().err
    assert not (tmp_path / "k.py").exists()


def test_a_score_summed_over_two_dots_is_one_qk_and_the_loop_gets_warp_groups():
    # MLA-style decode: s = q_rope k_ropeᵀ accumulated onto q_nope cᵀ, then P c: the second dot of the score is
    # part of QK (it reads no softmax output), not a PV
    pytest.importorskip("ortools")
    from twill.solve import SolveOptions, schedule

    g = graph_from_target(FAMILIES, "mla_decode_step", signature=F.MLA_DECODE_SIGNATURE,
                          constexprs=["HEADS=16", "LATENT=512", "ROPE=64", "BLOCK_N=32"], num_warps=4,
                          num_stages=None, machine=get_machine("h100"))
    roles = sorted(op.attrs["role"] for op in g.ops if op.kind == "mma")
    assert roles == ["pv", "qk", "qk"]
    result = schedule(g, get_machine("h100"), SolveOptions(time_limit=60))
    assert result.status == "optimal" and not result.stats.get("fallback")
    assert result.warps[0].role == "load" and len(result.warps) >= 2
    assert {op.name for op in g.ops if op.kind == "mma"} <= {n for w in result.warps[1:] for n in w.ops}
