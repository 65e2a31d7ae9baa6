"""Golden files: the exact text the Gluon backend emits for a few representative hand-built schedules.

The schedules come from ``benchmarks/variants.py`` (deterministic, no solver), so any change to the emitted
source shows up here as a diff to review. After an intended change, rewrite the files and review the diff:

    TWILL_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_gluon.py

The full benchmark suite is regenerated, not committed: ``python benchmarks/gluon_bench.py generate DIR``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from benchmarks.variants import flash_bwd_schedule, flash_schedule, gemm_schedule
from twill.codegen.gluon import emit_gluon
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.schedule.verify import verify

GOLDEN = Path(__file__).parent / "golden"
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
#: round robin; the attention backward.
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
}
#: Cases emitted as persistent kernels (a code-generator choice: the same schedule).
PERSISTENT = {"gemm_128x256x64_lag1_d3_persistent", "gemm_128x256x64_lag1_d4_persistent"}


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
    doc = (Path(__file__).parents[1] / "docs" / "codegen.md").read_text()
    section = doc[doc.index("## Reading an emitted file"):]
    block = section[section.index("```text\n") + 8:]
    quoted = [line for line in block[:block.index("```")].splitlines() if line.strip()]
    goldens = "\n".join(p.read_text() for p in GOLDEN.glob("*.py.golden")).splitlines()
    assert len(quoted) >= 4
    missing = [line for line in quoted if line not in goldens]
    assert not missing, f"docs/codegen.md quotes lines no golden file has: {missing}"


@pytest.mark.parametrize("name", ["fa_d128_sub2_ahead1_d2", "fa_d128_sub2_ahead1_d2_causal"])
def test_attention_probes_still_apply_to_the_emitted_forward(name, tmp_path):
    """benchmarks/attention_probe.py and attention_phases.py edit emitted modules by exact text; every forward
    probe and the phase counters must still find their text in what the generator emits today (a probe that
    stops matching exits with its name rather than timing an unchanged kernel)."""
    from benchmarks.attention_phases import PHASES, instrument
    from benchmarks.attention_probe import PROBES, apply

    text = (GOLDEN / f"{name}.py.golden").read_text()
    for probe, (kernel, _) in PROBES.items():
        if kernel == "flash-fwd":
            assert apply(text, probe) != text, probe
    # the producer without its loads (after the first fill) is still a kernel: it compiles for sm_90
    from twill.codegen.gluon import aot, load_emitted

    probed = tmp_path / f"{name}_no_loads.py"
    probed.write_text(apply(text, "no-loads"))
    facts = aot.ptx_facts(aot.compile_sm90(load_emitted(str(probed), f"twill_probe_{name}")))
    assert facts.wgmma > 0 and facts.tma_loads > 0 and "mbarrier.arrive(k_ready.index(buffer))" in probed.read_text()
    counted = instrument(text)
    assert counted.count("_clock64(j)") == 7
    assert all(f"_acc{i} += " in counted for i in range(len(PHASES)))
    assert counted.count("gl.store(lse_ptr + _base + ") == len(PHASES) + 3  # phases, iterations, span
    assert counted.count("_globaltimer(n_tiles)") == 2


def test_the_backward_phase_probe_still_applies_and_compiles(tmp_path):
    """benchmarks/bwd_phases.py edits the emitted backward by exact text: the probe argument reaches the kernel,
    its compute partition and the launcher; a mark opens every phase (at each wait and partition barrier) of
    the main loop and closes the last, and the instrumented kernel still compiles for sm_90."""
    from benchmarks.bwd_phases import PHASE_START, instrument
    from twill.codegen.gluon import aot, load_emitted

    text = (GOLDEN / "fa_bwd_d128_d2_lag1.py.golden").read_text()
    counted, labels = instrument(text)
    loop = text.split("    for j in range(0, n_iters):\n")[1].split("\n    # dK = sm_scale")[0]
    first = loop.splitlines()[0]
    starts = [line.strip() for line in loop.splitlines() if PHASE_START.match(line)]
    assert labels == ([] if PHASE_START.match(first) else [first.strip()]) + starts and len(labels) > 5
    assert counted.count("_clock32(j))") == len(labels) + 1
    assert "probe_ptr):" in counted and "_PROBE, num_warps=NUM_WARPS)" in counted
    path = tmp_path / "bwd_probe.py"
    path.write_text(counted)
    facts = aot.ptx_facts(aot.compile_sm90(load_emitted(str(path), "twill_bwd_probe")))
    assert facts.wgmma > 0


@pytest.mark.parametrize("name", ["gemm_128x256x64_lag1_d4", "gemm_128x256x64_lag1_d4_persistent",
                                  "fa_d128_sub2_ahead1_d2", "fa_d64_sub3_ahead0_d2"])
def test_kernel_clock_probe_still_applies_to_the_emitted_kernels(name):
    """benchmarks/kernel_clock.py edits an emitted module by exact text: the kernel function gains the span
    buffer, reads the counters at its start and end, and the launcher passes the buffer."""
    from benchmarks.kernel_clock import instrument

    text = (GOLDEN / f"{name}.py.golden").read_text()
    counted = instrument(text)
    compile(counted, name, "exec")
    kernel = re.search(r"^KERNEL_FN = (\w+)$", text, flags=re.M).group(1)
    assert re.search(rf"^def {kernel}\(.*, clk_ptr\):$", counted, flags=re.M)
    assert counted.count("_clock64(gl.program_id(0))") == 2 and counted.count("_globaltimer(gl.program_id(0))") == 2
    assert counted.count("clk_ptr=_CLK[0], num_warps=NUM_WARPS)") == 1
    # the end reads come after the kernel's last statement and before the next top-level definition
    body = counted[counted.index(f"def {kernel}("):]
    body = body[:re.search(r"\n(?=\S)", body).start()]
    assert body.rstrip().endswith("(_g1 - _g0).to(gl.float32))")
