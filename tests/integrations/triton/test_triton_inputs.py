"""Triton frontend inputs and messages (tests/data/triton_inputs.py): constexprs that name a dtype, errors
inside helpers the kernel calls, a scalar exp2 on a loop-carried gate, every missing constexpr and argument
in one message, and the signature's type list."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.errors import TwillError  # noqa: E402
from twill.integrations.triton import graph_from_target  # noqa: E402
from twill.integrations.triton.compile import SCALAR_TYPES, dtype_constexpr, parse_signature  # noqa: E402
from twill.machine import get_machine  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

DATA = Path(__file__).resolve().parents[2] / "data"
INPUTS = DATA / "triton_inputs.py"
sys.path.insert(0, str(DATA))
import triton_inputs as K  # noqa: E402


def _graph(fn: str, signature: str, constexprs, **kw):
    return graph_from_target(INPUTS, fn, signature=signature, constexprs=list(constexprs),
                             num_warps=kw.pop("num_warps", 4), num_stages=3, machine=get_machine("h100"), **kw)


def _line_of(text: str) -> int:
    """The line of ``tests/data/triton_inputs.py`` holding ``text``."""
    return next(k for k, line in enumerate(INPUTS.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("value", ["bf16", "bfloat16", "tl.bfloat16", "triton.language.bfloat16",
                                   "torch.bfloat16"])
def test_constexpr_used_as_a_dtype_takes_triton_and_torch_names(value):
    g = _graph("expert_gemm", K.GEMM_SIGNATURE, K.GEMM_CONSTEXPRS + (f"compute_type={value}",))
    assert g.op("mma").attrs["dtype"] == "bf16"
    assert g.attrs["compute_type"] == value       # recorded as given, so schedule files compare it as text


def test_dtype_constexpr_names():
    tl = triton.language
    assert dtype_constexpr("fp16") == tl.float16 and dtype_constexpr("torch.float8_e4m3fn") == tl.float8e4nv
    assert dtype_constexpr("torch.half") == tl.float16 and dtype_constexpr("tl.int8") == tl.int8
    for other in ("fast", "tl.arange", "torch.nope", 128, 0.5, True):
        assert dtype_constexpr(other) == other and type(dtype_constexpr(other)) is type(other)


def test_python_api_takes_torch_and_triton_dtype_objects():
    torch = pytest.importorskip("torch")
    import twill

    for dtype in (torch.bfloat16, triton.language.bfloat16):
        g = twill.from_triton(K.expert_gemm, signature=K.GEMM_SIGNATURE,
                              constexprs={"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "compute_type": dtype})
        assert g.op("mma").attrs["dtype"] == "bf16"


def test_unknown_dtype_name_is_one_line_naming_the_string_constexpr():
    with pytest.raises(TwillError) as info:
        _graph("expert_gemm", K.GEMM_SIGNATURE, K.GEMM_CONSTEXPRS + ("compute_type=bf17",))
    msg = str(info.value)
    assert f"at triton_inputs.py:{_line_of('acc = tl.dot(x.to(compute_type)')}: AttributeError: " in msg
    assert "string constexpr compute_type='bf17'" in msg and "tl.bfloat16" in msg and "\n" not in msg


def test_error_inside_a_helper_names_its_line_and_the_call_sites():
    with pytest.raises(TwillError) as info:
        _graph("gemm_bias_helper", K.GEMM_SIGNATURE, K.GEMM_CONSTEXPRS)
    msg = str(info.value)
    helper, inner_call, call = _line_of("* bias_scale"), _line_of("return _add_bias("), _line_of("= _epilogue(")
    assert (f"at triton_inputs.py:{helper} (in _add_bias, called at triton_inputs.py:{inner_call} in _epilogue, "
            f"called at triton_inputs.py:{call}): NameError: bias_scale is not defined") in msg
    assert "\n" not in msg and "^" not in msg


def test_cli_error_inside_a_helper_is_one_line_exit_2(capsys):
    from twill.cli import main

    assert main(["graph", f"{INPUTS}:gemm_bias_helper", "--signature", K.GEMM_SIGNATURE,
                 *[a for c in K.GEMM_CONSTEXPRS for a in ("--constexpr", c)], "-o", "unused.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in _add_bias" in err and "Traceback" not in err


def test_scalar_exp2_of_a_loop_carried_gate_is_modelled():
    pytest.importorskip("ortools")
    from twill.schedule.verify import verify
    from twill.solve import SolveOptions, schedule

    g = _graph("chunk_state_decay", K.DECAY_SIGNATURE, K.DECAY_CONSTEXPRS)
    exp2 = next(op for op in g.ops if op.attrs["mlir_op"] == "math.exp2")
    assert exp2.kind == "exp2" and exp2.attrs["shape"] == []
    assert exp2.attrs["loc"].startswith(f"triton_inputs.py:{_line_of('tl.exp2(gate)')}:")
    assert {unit for row in exp2.rrt for unit, _ in row} == {"mufu"}
    # the decay is carried: this iteration's exp2 scales the state of the next one too
    scale = next(op for op in g.ops if op.kind == "alu")
    assert {e.distance for e in g.edges if e.src == exp2.name and e.dst == scale.name} == {0, 1}
    result = schedule(g, get_machine("h100"), SolveOptions(ws=False))
    verify(result, get_machine("h100"))
    assert result.status == "optimal" and any(o.name == exp2.name for o in result.graph.ops)


def test_scalar_exp2_of_a_loop_carried_gate_injects():
    pytest.importorskip("ortools")
    from twill.integrations.triton import lower_function, spec_from_target
    from twill.integrations.triton.inject import inject, solve_for_triton
    from twill.solve import SolveOptions

    machine = get_machine("h100")
    spec = spec_from_target(INPUTS, "chunk_state_decay", signature=K.DECAY_SIGNATURE,
                            constexprs=list(K.DECAY_CONSTEXPRS), num_warps=4, num_stages=3, machine=machine)
    lowered, _ = lower_function(spec, machine)
    schedule = solve_for_triton(lowered.graph, machine, spec.capability, SolveOptions(ws=False, time_limit=60))
    result = inject(spec, schedule, machine)
    exp2 = next(op.name for op in schedule.graph.ops if op.attrs["mlir_op"] == "math.exp2")
    stage, cluster = result.plan.op_places[exp2]
    assert re.search(rf"math\.exp2 %\w+ \{{loop\.cluster = {cluster} : i32, loop\.stage = {stage} : i32\}} : f32",
                     result.scheduled_ttgir)


def test_every_missing_constexpr_and_argument_in_one_message():
    with pytest.raises(TwillError) as info:
        _graph("expert_gemm", "x_ptr=*fp16:16,w_ptr=*fp16:16", ())
    msg = str(info.value)
    assert ("constexprs 'BLOCK_M', 'BLOCK_N', 'BLOCK_K', 'compute_type' have no value; pass --constexpr "
            "BLOCK_M=VALUE --constexpr BLOCK_N=VALUE --constexpr BLOCK_K=VALUE --constexpr compute_type=VALUE") in msg
    assert "arguments 'y_ptr', 'K' are missing from the signature" in msg and "\n" not in msg


def test_heuristics_constexpr_is_named_with_the_other_missing_ones():
    with pytest.raises(TwillError) as info:
        _graph("split_k_matmul", K.SPLIT_SIGNATURE, ("BLOCK_M=64",))
    msg = str(info.value)
    assert ("constexprs 'BLOCK_N', 'BLOCK_K', 'SPLIT', 'EVEN_K' (EVEN_K: computed by @triton.heuristics from the "
            "launch arguments) have no value") in msg and "\n" not in msg


def test_signature_error_lists_every_type():
    with pytest.raises(TwillError) as info:
        parse_signature("x=*fp8e4")
    msg = str(info.value)
    assert all(t in msg for t in SCALAR_TYPES) and "tensordesc<TYPE[D0, D1]>" in msg and "*kTYPE" in msg
    for typ in SCALAR_TYPES:
        assert parse_signature(f"x=*{typ}:16,y={typ},z=*k{typ}")[2].type == f"*k{typ}"
    assert parse_signature("d=tensordesc<bf16[64,128]>")[0].type == "tensordesc<bf16[64,128]>"
    with pytest.raises(TwillError):
        parse_signature("d=tensordesc<fp16>")


def test_report_says_why_stages_and_warps_differ_from_the_kernels(capsys):
    """``--num-warps 8 --num-stages 3`` on a matmul: the report shows ``stages: 1`` and a 4-warp MMA group,
    and its notes say why (streaming loads run ahead in rings; tile ops are modelled on 4-warp groups)."""
    pytest.importorskip("ortools")
    from twill.cli import main

    assert main(["schedule", f"{INPUTS}:expert_gemm", "--num-warps", "8", "--num-stages", "3", "--signature",
                 K.GEMM_SIGNATURE, "--constexpr", "BLOCK_M=128", "--constexpr", "BLOCK_N=128", "--constexpr",
                 "BLOCK_K=64", "--constexpr", "compute_type=fp16"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^L: .*stages: 1 ", out, re.M) and re.search(r"^  1 mma +4 warps", out, re.M)
    notes = out.split("\nnotes:\n", 1)[1].splitlines()
    assert notes[0].startswith("  stages: 1 counts the stages of the computation; the streaming loads (load_a, "
                               "load_b) have no latency in the model and run ahead of their consumers in rings of "
                               "3 buffers, where Triton's num_stages 3 puts them 2 stages ahead")
    assert notes[1].startswith("  warp groups: the kernel runs 8 warps; the model runs each tile op on one 4-warp "
                               "group")


def test_launch_keywords_take_a_dtype_constexpr_as_the_dtype():
    """``twill tune --measure`` launches the kernel with the candidate's constexprs: a dtype name given on the
    command line reaches the kernel as the ``tl.dtype`` it compiled with."""
    from twill.tune.measure_triton import triton_meta
    from twill.tune.space import Candidate

    cand = Candidate(options=(("BLOCK_M", 64), ("compute_type", "torch.bfloat16")), num_warps=8)
    assert triton_meta(cand) == {"BLOCK_M": 64, "compute_type": triton.language.bfloat16, "num_warps": 8}
