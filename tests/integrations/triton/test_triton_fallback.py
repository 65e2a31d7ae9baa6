"""A Triton kernel whose joint search finds nothing within its budget still gets a schedule: the modulo-only
schedule with the kernel's own warp groups, status ``feasible``, the reason on the report's ``fallback:`` line
and in the JSON (issue 38)."""

from __future__ import annotations

import json

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("ortools")

from twill.cli import main  # noqa: E402
from twill.solve.joint import cpsat  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

#: A weight-only quantized GEMM in the style of the issue's kernels: int8 weights scaled per column in the loop.
KERNEL = '''import triton
import triton.language as tl


@triton.jit
def dequant_matmul(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    scale = tl.load(s_ptr + cols)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(x_ptr + rows[:, None] * K + (k + ks)[None, :])
        w = tl.load(w_ptr + (k + ks)[:, None] * N + cols[None, :])
        acc = tl.dot(x, (w.to(tl.float32) * scale[None, :]).to(tl.float16), acc)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.float16))
'''
SIGNATURE = "x_ptr=*fp16:16,w_ptr=*i8:16,s_ptr=*fp32:16,y_ptr=*fp16:16,M=i32:16,N=i32:16,K=i32:16"


def test_a_triton_kernel_falls_back_to_its_own_warp_groups(monkeypatch, tmp_path, capsys):
    def time_out(self, objective, *, time_limit, workers=None):     # every joint solve runs out of time
        return cpsat.JointOutcome("unknown", None, time_limit)

    monkeypatch.setattr(cpsat.CpsatJoint, "solve", time_out)
    src, out = tmp_path / "dequant.py", tmp_path / "s.json"
    src.write_text(KERNEL)
    assert main(["schedule", f"{src}:dequant_matmul", "--signature", SIGNATURE, "--constexpr", "BM=64",
                 "--constexpr", "BN=64", "--constexpr", "BK=64", "--num-warps", "4", "--time-limit", "5",
                 "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "\nstatus: feasible" in report
    assert "\nfallback: the modulo-only schedule with the kernel's warp groups, because: no joint schedule of " \
           "graph 'dequant_matmul' found within the time limit of 5 s (" in report
    doc = json.loads(out.read_text())
    assert doc["status"] == "feasible" and doc["stats"]["fallback"]
    # the kernel's warps: its loads on W_vl, the dequantization and the dot on one 4-warp group
    loads = {op["name"] for op in doc["loop_graph"]["ops"] if op.get("variable_latency")}
    groups = doc["warps"]
    assert [(g["role"], g["num_warps"], set(g["ops"]) == loads) for g in groups] == [
        ("load", 1, True), ("compute", 4, False)]
