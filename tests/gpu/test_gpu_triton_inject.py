"""Schedule injection into Triton 3.6.0 on a Hopper GPU: the injected matmul and flash-attention kernels
against torch in fp32 (NaN-poisoned outputs). The CPU half is tests/integrations/triton/test_triton_inject.py.

Marked ``gpu``; skipped when torch, CUDA or an sm_90 device is missing (CI has none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.machine import get_machine  # noqa: E402

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(triton.__version__ != "3.6.0", reason="injection targets Triton 3.6.0"),
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs a Hopper (sm_90) GPU")]

H100 = get_machine("h100")
ROOT = Path(__file__).resolve().parents[2]


def test_injected_matmul_and_flash_are_correct_on_gpu(tmp_path):
    import math

    from triton import knobs

    from twill.integrations.triton.kernels import flash_fwd, matmul

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    knobs.compilation.always_compile = True
    # schedules solved on a CPU machine (the GPU machine has no OR-Tools): benchmarks/triton_ab.py prepare
    from twill.ir.io import graph_from_dict
    from twill.schedule.result import Schedule

    shipped = json.loads((ROOT / "benchmarks" / "results" / "triton_ab_schedules.json").read_text())
    mm_sched, fa_sched = (Schedule.from_dict(shipped[c], graph_from_dict(shipped[c]["loop_graph"]))
                          for c in ("matmul", "flash_fwd"))
    from twill.integrations.triton.inject import make_jit_hook

    mm_fn, fa_fn = triton.jit(matmul.matmul_kernel.fn), triton.jit(flash_fwd.attn_fwd.fn)
    a, b = (torch.randn(512, 512, device="cuda", dtype=torch.float16) for _ in range(2))
    c = torch.full((512, 512), float("nan"), device="cuda", dtype=torch.float16)
    knobs.runtime.add_stages_inspection_hook = make_jit_hook("matmul_kernel", mm_sched, H100, load_lead=2,
                                                             workdir=str(tmp_path), capability=90)
    try:
        mm_fn[(4, 4)](a, b, c, 512, 512, 512, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.add_stages_inspection_hook = None
    ref = a.float() @ b.float()
    assert float((c.float() - ref).norm() / ref.norm()) < 1e-2
    S, D = 512, 128
    q, k, v = (torch.randn(2 * S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.full((2 * S, D), float("nan"), device="cuda", dtype=torch.float16)
    knobs.runtime.add_stages_inspection_hook = make_jit_hook("attn_fwd", fa_sched, H100, load_lead=2,
                                                             workdir=str(tmp_path), capability=90)
    try:
        fa_fn[(S // 128, 2)](q, k, v, o, 1 / math.sqrt(D), 2, S, HEAD_DIM=D, BLOCK_M=128, BLOCK_N=128,
                              num_warps=8, num_stages=3)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.add_stages_inspection_hook = None
    for h in range(2):
        rows = slice(h * S, (h + 1) * S)
        ref = torch.softmax(q[rows].float() @ k[rows].float().T / math.sqrt(D), -1) @ v[rows].float()
        assert float((o[rows].float() - ref).norm() / ref.norm()) < 1e-2
