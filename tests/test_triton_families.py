"""Triton frontend on the kernel families public libraries write (tests/data/triton_families.py): pointer
loads, grouped and batched matmuls, persistent matmuls, causal attention, attention backward, decorated
kernels; and the messages around them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.errors import TwillError  # noqa: E402
from twill.frontends.triton import graph_from_target  # noqa: E402
from twill.machine import get_machine  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

DATA = Path(__file__).resolve().parent / "data"
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

    assert remedy_for([]) == "raise --max-ii"
    assert "--max-ii" not in remedy_for(["memory_capacity"]) and "tiles" in remedy_for(["memory_capacity"])
    assert "--reg-limit" in remedy_for(["register_limit+memory_capacity"])


def test_emit_gluon_refuses_triton_kernels_before_solving(capsys):
    from twill.cli import main

    assert main(["emit", "gluon", f"{FAMILIES}:matmul_grouped", "-o", "unused.py"]) == 2
    err = capsys.readouterr().err
    assert "cannot emit Triton kernel" in err and "twill inject" in err and err.count("\n") == 1
    assert not Path("unused.py").exists()
