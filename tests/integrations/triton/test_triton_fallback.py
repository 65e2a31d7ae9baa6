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


#: Causal attention with its mask applied inside the one key loop, every iteration (a 128 x 128 tile on 4 warps).
MASKED_ATTENTION = '''import triton
import triton.language as tl


@triton.jit
def masked_attention(q_ptr, k_ptr, v_ptr, o_ptr, scale, n, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    keys = tl.arange(0, BN)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :])
    m = tl.full([BM], float("-inf"), tl.float32)
    total = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    for start in range(0, (tl.program_id(0) + 1) * BM, BN):
        cols = start + keys
        k = tl.load(k_ptr + cols[:, None] * D + dims[None, :])
        s = tl.where(rows[:, None] >= cols[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + cols[:, None] * D + dims[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m = m_new
    tl.store(o_ptr + rows[:, None] * D + dims[None, :], (acc / total[:, None]).to(tl.float16))
'''
MASKED_SIGNATURE = "q_ptr=*fp16:16,k_ptr=*fp16:16,v_ptr=*fp16:16,o_ptr=*fp16:16,scale=fp32,n=i32:16"


def test_a_kernel_whose_own_warps_spill_is_told_why_and_what_to_change(tmp_path, capsys):
    # 128 x 128 scores on 4 warps: 128 registers per thread for the scores alone, with the accumulator and P more
    # than a thread has; neither warp specialization nor the kernel's own groups fit, and the error says so
    src = tmp_path / "masked.py"
    src.write_text(MASKED_ATTENTION)
    args = ["schedule", f"{src}:masked_attention", "--signature", MASKED_SIGNATURE, "--constexpr", "D=64",
            "--constexpr", "BM=128", "--constexpr", "BN=128"]
    assert main(args + ["--num-warps", "4", "--max-ii", "160", "-o", str(tmp_path / "s.json")]) == 2
    error = capsys.readouterr().err
    assert "nor does the modulo-only schedule with the kernel's warp groups verify (REGISTER LIMIT: group 1 " \
           "holds " in error
    assert "each spread over its 4 warps (num_warps), hold more registers per thread than its warps have: more " \
           "warps per tile (num_warps 8) hold fewer each; use --no-ws for a schedule without" in error
    assert not (tmp_path / "s.json").exists()
    # the remedy it names works: at 8 warps the loop has a verified schedule
    assert main(args + ["--num-warps", "8", "--max-ii", "400", "-o", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["status"] in ("optimal", "feasible")
