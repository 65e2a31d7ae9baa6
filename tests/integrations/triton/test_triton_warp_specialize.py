"""``twill inject --ws`` of a Triton kernel: the schedule's warp groups written as the partitions of Triton 3.6's
Hopper warp specialization, compiled for sm_90 on this CPU. The GPU half (outputs against the original kernel)
is tests/gpu/test_gpu_triton_ws.py; the experiments behind it are docs/experiments/triton-warp-specialization.md."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("ortools")
pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.machine import get_machine  # noqa: E402

H100 = get_machine("h100")
KERNELS = Path(__file__).resolve().parents[3] / "twill" / "integrations" / "triton" / "kernels"


def _args(num_warps: int = 4) -> list[str]:
    from twill.integrations.triton.kernels import matmul

    args = [f"{KERNELS / 'matmul.py'}:matmul_kernel", "--signature", matmul.SIGNATURE, "--num-warps",
            str(num_warps)]
    for c in matmul.CONSTEXPRS:
        args += ["--constexpr", c]
    return args


@pytest.fixture(scope="module")
def matmul_ws():
    """The TMA matmul at num_warps 4: its loop, its warp-specialized schedule, the compiled kernel."""
    from twill.integrations.triton import lower_function_loops, spec_from_target
    from twill.integrations.triton.kernels import matmul
    from twill.integrations.triton.warp_specialize import compile_warp_specialized
    from twill.solve import schedule as solve

    spec = spec_from_target(KERNELS / "matmul.py", "matmul_kernel", signature=matmul.SIGNATURE,
                            constexprs=list(matmul.CONSTEXPRS), num_warps=4, num_stages=None, machine=H100)
    (_, lowered), = lower_function_loops(spec, H100)[0]
    schedule = solve(lowered.graph, H100)
    return spec, lowered, schedule, compile_warp_specialized(spec, schedule, H100)


def test_matmul_warp_groups_become_triton_partitions(matmul_ws):
    """The load group is the producer (default region: TMA copies only), the MMA group the consumer
    (partition0: the wgmma and the epilogue's TMA store); the PTX sets per-group register budgets."""
    _, _, schedule, result = matmul_ws
    groups = {w.role: w for w in schedule.warps}
    assert set(groups) == {"load", "mma"} and set(groups["load"].ops) == {"load_a", "load_b"}
    assert result.plan.groups == {0: groups["load"].id, 1: groups["mma"].id}
    ttgir = result.kernel.asm["ttgir"]
    assert ttgir.count("ttg.warp_specialize(") == 1
    parts = {p.region: p for p in result.partitions}
    assert set(parts) == {"default", "partition0"}
    assert parts["default"].runs == ("tma_load",) and parts["default"].num_warps == 4
    assert "mma" in parts["partition0"].runs and "tma_load" not in parts["partition0"].runs
    assert parts["partition0"].num_warps == 4
    assert int(result.kernel.metadata.num_warps) == 8          # two 4-warp groups
    assert result.requested_registers == (232,)
    assert ("dec", 232) in result.setmaxnreg and any(kind == "inc" for kind, _ in result.setmaxnreg)
    assert "wgmma.mma_async" in result.kernel.asm["ptx"]


def test_partitions_are_written_as_async_task_ids(matmul_ws):
    """Loads carry task 0; the local_alloc receiving each load, the wgmma and the store carry task 1; the index
    arithmetic carries none (the pass propagates it); the loop carries tt.warp_specialize."""
    from twill.integrations.triton.mlir import find_loops

    _, lowered, _, result = matmul_ws
    text = result.annotated_ttgir
    loop = find_loops(text)[lowered.graph.attrs["loop_index"]]
    lines = text.splitlines()
    tasks = {}
    for st in loop.body:
        line = lines[st.last_line]
        tasks.setdefault(st.op, set()).add(line.split("async_task_id = array<i32: ")[1][0]
                                           if "async_task_id" in line else None)
    assert tasks["tt.descriptor_load"] == {"0"}
    assert tasks["ttg.local_alloc"] == {"1"} and tasks["ttng.warp_group_dot"] == {"1"}
    assert tasks["arith.muli"] == {None}
    assert "tt.warp_specialize" in lines[loop.close_line]
    store = next(line for line in lines if "tt.descriptor_store" in line)
    assert "async_task_id = array<i32: 1>" in store


def test_schedules_triton_cannot_partition_are_refused(matmul_ws):
    from twill.integrations.triton.warp_specialize import plan_partitions

    _, lowered, schedule, _ = matmul_ws
    with pytest.raises(UnsupportedFeatureError, match="no warp groups"):
        plan_partitions(lowered, replace(schedule, assignment={}, warps=()))
    load = next(w.id for w in schedule.warps if w.role == "load")
    together = {name: load for name in schedule.assignment}
    with pytest.raises(UnsupportedFeatureError, match="sharing group"):
        plan_partitions(lowered, replace(schedule, assignment=together))


def test_cli_inject_ws_writes_the_partitioned_kernel(tmp_path, capsys):
    from twill.cli import main

    out = tmp_path / "mm"
    assert main(["inject", *_args(), "--ws", "-o", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["warp_specialized"] and summary["num_warps"] == 8
    rows = {row["region"]: row for row in summary["partitions"]}
    assert rows["default"]["role"] == "load" and rows["default"]["runs"] == ["tma_load"]
    assert rows["default"]["schedule_num_warps"] == 1 and rows["default"]["num_warps"] == 4
    assert rows["partition0"]["role"] == "mma" and rows["partition0"]["requested_registers"] == 232
    assert set(summary["files"]) == {"matmul_kernel.cubin", "matmul_kernel.partitioned.ttgir", "matmul_kernel.ptx",
                                     "matmul_kernel.ttgir", "schedule.json", "summary.json"}
    assert "warps" in json.loads((out / "schedule.json").read_text())


@pytest.mark.parametrize("extra,message", [
    (["--num-warps", "8"], "only at num_warps=4"),
    (["--load-lead", "1"], "--load-lead does not apply to inject --ws"),
    (["--config", "all"], "--config all does not apply to inject --ws"),
])
def test_cli_inject_ws_refusals(tmp_path, capsys, extra, message):
    from twill.cli import main

    assert main(["inject", *_args(), *extra, "--ws", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
