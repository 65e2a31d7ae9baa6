"""The cases of ``benchmarks/solve_time.py``: each Triton case is a command ``twill`` parses, and every row
finds its configuration again after the JSON round trip."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("_bench_solve_time", ROOT / "benchmarks" / "solve_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _script()
TRITON = [c for c in S.CONFIGS if ".py:" in c[0]]


def _row(config, arch: str) -> dict:
    kernel, options, solve_options, _, _ = config
    return {"kernel": kernel, "options": options, "solve_options": solve_options, "arch": arch}


def test_every_row_finds_its_configuration_after_the_json_round_trip():
    rows = [json.loads(json.dumps(_row(c, arch))) for c in S.CONFIGS for arch in c[4]]
    assert [S.label_of(r) for r in rows] == [c[3] for c in S.CONFIGS for _ in c[4]]
    assert len({c[3] for c in S.CONFIGS}) == len(S.CONFIGS)


@pytest.mark.parametrize("config", TRITON, ids=[c[3] for c in TRITON])
def test_triton_case_is_a_command_twill_parses(config):
    from twill.cli import build_parser

    for arch in config[4]:
        argv = shlex.split(S.triton_command(_row(config, arch)))
        args = build_parser().parse_args(argv[1:])
        path, fn = config[0].rsplit(":", 1)
        assert args.target == config[0] and args.arch == arch
        assert (args.signature, list(args.constexpr)) == (config[1]["signature"], config[1]["constexprs"])
        assert (args.num_warps, args.num_stages) == (config[1]["num_warps"], config[1]["num_stages"])
        assert f"def {fn}(" in (ROOT / path).read_text()
        assert (argv[1] == "inject") == bool(config[2].get("inject"))


def test_only_selects_by_name():
    kernels = {c[0] for c in S.CONFIGS}
    assert {k for k in kernels if S.selected(k, "triton")} == {c[0] for c in TRITON}
    assert {k for k in kernels if S.selected(k, "flash-fwd")} == {"flash-fwd"}
    assert all(S.selected(k, None) for k in kernels)


@pytest.mark.slow
def test_triton_cases_build_their_graphs():
    triton = pytest.importorskip("triton")
    if triton.__version__ != "3.6.0":
        pytest.skip("the frontend targets Triton 3.6.0")
    from twill.machine import get_machine

    for kernel, options, _, _, _ in {c[0]: c for c in TRITON}.values():
        graph = S.build_graph(kernel, options, get_machine("h100"))
        assert graph.attrs["kernel"] == kernel.rsplit(":", 1)[1]
        assert any(op.kind == "mma" for op in graph.ops)
