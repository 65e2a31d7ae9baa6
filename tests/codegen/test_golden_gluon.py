"""Golden files: the exact text the Gluon backend emits for a few representative hand-built schedules.

The schedules come from ``twill/kernels/*/variants.py`` (deterministic, no solver), so any change to the emitted
source shows up here as a diff to review. After an intended change, rewrite the files and review the diff:

    TWILL_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_golden_gluon.py

The full benchmark suite is regenerated, not committed: ``python benchmarks/gluon_bench.py generate DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from twill.kernels.flash_bwd.variants import flash_bwd_schedule
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
from twill.codegen.gluon import emit_gluon
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.schedule.verify import verify

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("TWILL_UPDATE_GOLDEN") == "1"


def _gemm(block_n: int, lag: int, depth: int):
    return gemm_schedule(build_kernel("gemm", H100, block_m=128, block_n=block_n, block_k=64), H100, lag=lag,
                         depth=depth, warps=8)


def _flash(subtiles: int, head_dim: int, ahead: int, depth: int, **options):
    return flash_schedule(build_kernel("flash-fwd", H100, subtiles=subtiles, head_dim=head_dim, **options), H100,
                          ahead=ahead, depth=depth)


#: name -> schedule builder: GEMM with and without a deferred wgmma wait, and persistent (the C tile staged
#: whole, and in halves beside a 4-deep ring); attention with two ping-pong compute partitions and S one stage
#: ahead (also causal), with one partition and no overlap, and with three partitions taking tensor-core turns
#: round robin; the attention backward; the fp8 (e4m3) forward, plain, causal grouped-query and persistent.
CASES = {
    "gemm_128x256x64_lag1_d4": lambda: _gemm(256, 1, 4),
    "gemm_128x256x64_lag0_d3": lambda: _gemm(256, 0, 3),
    "gemm_128x256x64_lag1_d3_persistent": lambda: _gemm(256, 1, 3),
    "gemm_128x256x64_lag1_d4_persistent": lambda: _gemm(256, 1, 4),
    "fa_d128_sub2_ahead1_d2": lambda: _flash(2, 128, 1, 2),
    "fa_d64_sub1_ahead0_d3": lambda: _flash(1, 64, 0, 3),
    "fa_d128_sub2_ahead1_d2_causal": lambda: _flash(2, 128, 1, 2, causal=True),
    "fa_d64_sub3_ahead0_d2": lambda: _flash(3, 64, 0, 2),
    "fa_bwd_d128_d2_lag1": lambda: flash_bwd_schedule(build_kernel("flash-bwd", H100), H100, depth=2, dq_lag=1),
    "fa8_d128_sub2_ahead1_d2": lambda: _flash(2, 128, 1, 2, dtype="fp8e4m3"),
    "fa8_d64_sub1_ahead1_d2_causal_gqa": lambda: _flash(1, 64, 1, 2, dtype="fp8e4m3", causal=True, kv_heads=2),
    "fa8_d256_sub2_ahead1_d2_persistent": lambda: _flash(2, 256, 1, 2, dtype="fp8e4m3", block_n=64),
}
#: Cases emitted as persistent kernels (a code-generator choice: the same schedule).
PERSISTENT = {"gemm_128x256x64_lag1_d3_persistent", "gemm_128x256x64_lag1_d4_persistent",
              "fa8_d256_sub2_ahead1_d2_persistent"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_emitted_source_matches_golden(name):
    schedule = CASES[name]()
    verify(schedule, H100)
    source = emit_gluon(schedule, persistent=name in PERSISTENT)
    path = GOLDEN / f"{name}.py.golden"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"no golden file {path.name}: run with TWILL_UPDATE_GOLDEN=1 to create it"
    assert source == path.read_text(), f"{name}: emitted source differs from {path.name} (see module docstring)"


def test_lines_quoted_in_the_docs_come_from_the_golden_files():
    """docs/codegen.md ("Reading an emitted file") quotes emitted lines; each must be in a golden file."""
    doc = (Path(__file__).parents[2] / "docs" / "codegen.md").read_text()
    section = doc[doc.index("## Reading an emitted file"):]
    block = section[section.index("```text\n") + 8:]
    quoted = [line for line in block[:block.index("```")].splitlines() if line.strip()]
    goldens = "\n".join(p.read_text() for p in GOLDEN.glob("*.py.golden")).splitlines()
    assert len(quoted) >= 4
    missing = [line for line in quoted if line not in goldens]
    assert not missing, f"docs/codegen.md quotes lines no golden file has: {missing}"
