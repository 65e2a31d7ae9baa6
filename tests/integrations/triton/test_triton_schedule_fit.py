"""``twill inject --schedule``: a schedule is injected only into the loop it was solved for. Its
``graph_digest`` (ops, costs, edges, constexprs, num_warps, num_stages) and the graph it carries are compared
with the kernel being compiled; another configuration is refused in one line naming both, exit 2, before
anything is written."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("ortools")

from twill.cli import main  # noqa: E402
from twill.schedule.document import schedule_document  # noqa: E402
from twill.integrations.triton.inject import solve_for_triton  # noqa: E402
from twill.integrations.triton import kernel_spec, lower_function  # noqa: E402
from twill.ir.digest import graph_digest  # noqa: E402
from twill.integrations.triton.kernels import matmul  # noqa: E402
from twill.machine import get_machine  # noqa: E402
from twill.solve import SolveOptions  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="injection targets Triton 3.6.0")

H100 = get_machine("h100")
KERNEL = f"{Path(matmul.__file__)}:matmul_kernel"
SMALL = ("BLOCK_M=64", "BLOCK_N=64", "BLOCK_K=32")


def _args(constexprs, num_warps) -> list[str]:
    args = [KERNEL, "--signature", matmul.SIGNATURE, "--num-warps", str(num_warps), "--num-stages",
            str(matmul.NUM_STAGES)]
    for c in constexprs:
        args += ["--constexpr", c]
    return args


@pytest.fixture(scope="module")
def small_schedule():
    """The schedule document of the matmul at 64x64x32 on 4 warps."""
    spec = kernel_spec(matmul.matmul_kernel, signature=matmul.SIGNATURE, constexprs=list(SMALL), num_warps=4,
                       num_stages=matmul.NUM_STAGES, machine=H100)
    lowered, _ = lower_function(spec, H100)
    schedule = solve_for_triton(lowered.graph, H100, 90, SolveOptions(ws=False, time_limit=30))
    assert schedule.graph_digest == graph_digest(lowered.graph)
    return schedule_document(schedule)


def _inject(tmp_path, capsys, doc, constexprs=SMALL, num_warps=4):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    rc = main(["inject", *_args(constexprs, num_warps), "--schedule", str(path), "-o", str(out)])
    captured = capsys.readouterr()
    return rc, captured, out


def test_the_schedule_document_records_the_graph_digest(small_schedule):
    assert len(small_schedule["graph_digest"]) == 64
    assert small_schedule["loop_graph"]["attrs"]["block_m"] == 64


def test_a_schedule_of_another_configuration_is_refused(tmp_path, capsys, small_schedule):
    rc, captured, out = _inject(tmp_path, capsys, small_schedule, matmul.CONSTEXPRS, matmul.NUM_WARPS)
    err = captured.err
    assert rc == 2 and err.count("\n") == 1 and captured.out == ""
    assert ("the schedule was solved for BLOCK_M=64 BLOCK_N=64 BLOCK_K=32 num_warps=4 num_stages=3; this kernel "
            "compiles with BLOCK_M=128 BLOCK_N=128 BLOCK_K=64 num_warps=8 num_stages=3") in err
    assert not out.exists()


def test_a_schedule_of_its_own_configuration_is_injected(tmp_path, capsys, small_schedule):
    rc, captured, out = _inject(tmp_path, capsys, small_schedule)
    assert rc == 0, captured.err
    assert json.loads((out / "schedule.json").read_text())["graph_digest"] == small_schedule["graph_digest"]


def _shorter_delay(edge: dict) -> None:
    edge["delay"] -= 1


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(graph_digest="0" * 64), "graph_digest differs"),
    # the same configuration, but the graph it carries is cheaper than the kernel's (with or without a digest)
    (lambda d: d["loop_graph"]["ops"][0].update(footprint={"smem": 1024}), "op 'load_a' differs (footprint)"),
    (lambda d: (d.pop("graph_digest"), _shorter_delay(d["loop_graph"]["edges"][2])), "edges"),
])
def test_a_schedule_whose_graph_is_not_the_kernels_is_refused(tmp_path, capsys, small_schedule, edit, message):
    doc = copy.deepcopy(small_schedule)
    edit(doc)
    rc, captured, out = _inject(tmp_path, capsys, doc)
    assert rc == 2 and captured.err.count("\n") == 1 and message in captured.err, captured.err
    assert not out.exists()
