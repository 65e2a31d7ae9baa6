"""Triton kernels with several loops and declared ``num_stages`` (tests/data/triton_loops.py): every loop that
holds dots is scheduled unless ``--loop`` picks one, and the streaming depth follows the kernel's
``num_stages`` unless ``--streaming-depth`` overrides it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from twill.integrations.triton import graph_from_target  # noqa: E402
from twill.machine import get_machine  # noqa: E402

pytestmark = pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the frontend targets Triton 3.6.0")

DATA = Path(__file__).resolve().parents[2] / "data"
LOOPS = DATA / "triton_loops.py"
sys.path.insert(0, str(DATA))
import triton_loops as L  # noqa: E402


def _matmul(fn: str, num_stages: int | None = None):
    return graph_from_target(LOOPS, fn, signature=L.MATMUL_SIGNATURE, constexprs=list(L.MATMUL_CONSTEXPRS),
                             num_warps=None, num_stages=num_stages, machine=get_machine("h100"))


def test_streaming_depth_is_the_kernels_num_stages():
    assert _matmul("matmul_one_stage").attrs["streaming_depth"] == 1          # its autotune config's
    assert _matmul("matmul_one_stage", num_stages=3).attrs["streaming_depth"] == 3    # --num-stages
    # the loop's own tl.range(..., num_stages=4) wins over the kernel's
    assert _matmul("matmul_ranged", num_stages=2).attrs["streaming_depth"] == 4


def test_streaming_depth_flag_overrides_num_stages(tmp_path, capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    base = ["schedule", f"{LOOPS}:matmul_one_stage", "--signature", L.MATMUL_SIGNATURE, "--no-ws"]
    assert main(base + ["-o", str(tmp_path / "own.json")]) == 0
    assert main(base + ["--streaming-depth", "3", "-o", str(tmp_path / "three.json")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "own.json").read_text())["streaming_depth"] == 1
    assert json.loads((tmp_path / "three.json").read_text())["streaming_depth"] == 3
