"""The schedules ``twill.ops`` ships (twill/ops/schedules): current for every configuration, read through the
verifier without the solver, and ``twill.ops.prepare`` emitting a configuration's modules with OR-Tools absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from twill.codegen.gluon import emit_gluon
from twill.errors import UnsupportedFeatureError
from twill.ops import flash, shipped
from twill.ops.flash import KernelSpec

ROOT = Path(__file__).resolve().parents[2]


def _spec_dict(spec: KernelSpec) -> dict:
    return {"kernel": spec.kernel, "head_dim": spec.head_dim, "dtype": spec.dtype, "causal": spec.causal,
            "kv_heads": spec.kv_heads}


def test_every_configuration_has_a_current_verified_shipped_schedule():
    """Each configuration's graph built today has its file (the digest of what the solver sees names it), the
    file's schedule passes the verifier with the configuration's attributes, its II is proved minimal, and the
    folder holds no other file. (Solving again, which the digests make unnecessary here, is the slow test
    below.)"""
    expected = set()
    for spec in shipped.configurations():
        graph = shipped.spec_graph(spec)
        schedule, record = shipped.load(spec, graph)          # raises when missing, stale or refused
        expected.add(shipped.schedule_path(spec, shipped.solve_digest(spec, graph)))
        assert _spec_dict(spec) in record["configurations"]
        assert schedule.stats["proven"]["ii"] is True and schedule.ii == schedule.ii_lower_bound
        assert schedule.graph.attrs.get("causal", False) == spec.causal
        assert schedule.graph.attrs.get("kv_heads", 0) == spec.kv_heads
    assert set(shipped.SCHEDULE_DIR.glob("*.json")) == expected
    # 8 16-bit forward loops (D = 64 has two: three groups without the mask), 3 fp8 forward loops (one group at
    # D = 64, masked or not), 6 backward (D = 64, 128, 256 by fp16, bf16)
    assert len(expected) == 17
    fp8 = [s for s in shipped.configurations() if s.dtype == "fp8e4m3"]
    assert {(s.kernel, s.head_dim, s.causal) for s in fp8} == {("flash-fwd", d, c) for d in (64, 128, 256)
                                                               for c in (False, True)}


def test_the_shipped_backward_modules_are_the_ones_ptxas_compiled():
    """For every backward configuration, the module emitted today from the shipped schedule is the text ptxas
    compiled without spills when the file was written (so the first call compiles nothing to check it)."""
    for spec in shipped.configurations([flash.BACKWARD.name]):
        graph = shipped.spec_graph(spec)
        schedule, record = shipped.load(spec, graph)
        digest = shipped.source_digest(emit_gluon(schedule, persistent=spec.persistent()))
        [entry] = [e for e in record["ptxas"] if e["module_sha256"] == digest]
        assert (entry["causal"], entry["kv_heads"]) == (spec.causal, spec.kv_heads)
        assert entry["rejection"] is None and entry["report"]["spill_bytes"] == 0
        assert entry["report"]["serialized_wgmma"] == 0
        assert entry["triton"] == shipped.triton_version() or shipped.triton_version() is None


def test_the_shipped_schedule_emits_what_solving_emits(monkeypatch):
    """The module from the shipped schedule is the one the solver's schedule gives (the D = 128 forward, whose
    solve takes seconds)."""
    pytest.importorskip("ortools", reason="solving needs ortools")
    monkeypatch.setattr(flash, "_SOLVED", {})
    for causal, kv_heads in ((False, 0), (True, 2)):
        spec = KernelSpec("flash-fwd", 128, "bf16", causal, kv_heads)
        graph = shipped.spec_graph(spec)
        schedule, _ = shipped.load(spec, graph)
        assert emit_gluon(schedule, persistent=spec.persistent()) == flash._generate_by_solving(spec, graph)


@pytest.fixture
def no_solving(monkeypatch):
    """:func:`flash._generate_by_solving` replaced by a marker module (its calls counted)."""
    calls = []
    monkeypatch.setattr(flash, "_generate_by_solving", lambda spec, graph: calls.append(spec) or "MARK = 1\n")
    return calls


def test_a_missing_shipped_schedule_is_solved_with_a_line_saying_why(tmp_path, monkeypatch, capsys, no_solving):
    monkeypatch.setattr(shipped, "SCHEDULE_DIR", tmp_path)
    spec = KernelSpec("flash-fwd", 128, "fp16", False, 0)
    assert flash._generate(spec) == "MARK = 1\n" and no_solving == [spec]
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("twill.ops: no shipped schedule for this loop (flash_fwd_d128_fp16_")
    assert "'twill ops regenerate'" in line and line.endswith("solving the flash-fwd loop instead (needs OR-Tools)")


@pytest.mark.parametrize("damage", ["start", "graph", "record", "json"])
def test_a_shipped_schedule_the_gate_refuses_is_solved_with_a_line_saying_why(tmp_path, monkeypatch, capsys,
                                                                               no_solving, damage):
    spec = KernelSpec("flash-fwd", 128, "fp16", True, 0)
    graph = shipped.spec_graph(spec)
    source = shipped.schedule_path(spec, shipped.solve_digest(spec, graph))
    data = json.loads(source.read_text())
    if damage == "start":       # an op started before its operand is ready
        late = max(data["ops"], key=lambda o: o["start"])
        first = min(data["ops"], key=lambda o: o["start"])
        late["start"], late["stage"] = first["start"], first["start"] // data["ii"]
    elif damage == "graph":
        data["loop_graph"]["ops"][0]["cycles"] = 0
    elif damage == "record":
        data["shipped"]["solve_key"] = "0" * 64
    text = "{" if damage == "json" else json.dumps(data)
    (tmp_path / source.name).write_text(text)
    monkeypatch.setattr(shipped, "SCHEDULE_DIR", tmp_path)
    assert flash._generate(spec) == "MARK = 1\n" and no_solving == [spec]
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"twill.ops: {source.name}: ")
    assert {"start": "schedule rejected by the verifier", "graph": "cycles", "record": "not for this loop's digest",
            "json": "invalid JSON"}[damage] in line


def test_a_backward_module_no_ptxas_entry_covers_is_compiled_and_checked(monkeypatch):
    spec = KernelSpec("flash-bwd", 128, "fp16", False, 0)
    checked = []

    def check(schedule, spec, source, verdict):
        checked.append(source)
        return {"rejection": verdict}

    covered = {"ptxas": [{"module_sha256": shipped.source_digest("text"), "triton": shipped.triton_version(),
                          "rejection": None}]}
    monkeypatch.setattr(shipped, "ptxas_check", lambda schedule, spec, source: check(schedule, spec, source, None))
    shipped.check_backward(None, spec, "text", covered)
    assert checked == []                                     # the entry covers this text: nothing compiled
    shipped.check_backward(None, spec, "other text", covered)
    assert checked == ["other text"]                         # compiled and clean
    monkeypatch.setattr(shipped, "ptxas_check", lambda schedule, spec, source: check(schedule, spec, source,
                                                                                     "ptxas reports 8 bytes"))
    with pytest.raises(shipped.ShippedScheduleError, match="refused: ptxas reports 8 bytes"):
        shipped.check_backward(None, spec, "other text", covered)
    other_triton = {"ptxas": [{**covered["ptxas"][0], "triton": "0.0"}]}
    with pytest.raises(shipped.ShippedScheduleError):      # another Triton's ptxas: compiled again
        shipped.check_backward(None, spec, "text", other_triton)


#: Run in a subprocess whose imports of OR-Tools, Yices and torch fail: prepare configurations given as JSON
#: in argv[1], then check each file's digest line and import it.
_PREPARE_WITHOUT_SOLVER = """
import json, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('ortools', 'yices', 'yices_api', 'torch'):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)

sys.meta_path.insert(0, Block())
from twill.codegen.gluon import load_emitted
from twill.ops import flash, prepare

for k, (dim, dtype, causal, kv, backward) in enumerate(json.loads(sys.argv[1])):
    path = prepare(dim, dtype, causal=causal, kv_heads=kv, backward=backward)
    paths = [path]
    if backward:
        paths.append(flash.kernel_path(flash.KernelSpec(flash.BACKWARD.name, dim, path.name.split('_')[3],
                                                         causal, kv)))
    for j, p in enumerate(paths):
        assert flash.cached_source(p) is not None, p
        module = load_emitted(str(p), f'twill_prepared_{k}_{j}')
        print(p.name, module.KERNEL, module.HEAD_DIM.value)
print('solver imported:', any(m.split('.')[0] in ('ortools', 'yices') for m in sys.modules))
"""


def test_prepare_emits_modules_without_the_solver_or_torch(tmp_path):
    """``prepare`` with OR-Tools, Yices and torch blocked: each configuration's modules are written to the
    kernel cache with their digest line, import, and nothing is solved."""
    pytest.importorskip("triton", reason="the emitted modules import Triton")
    configs = [(128, "bf16", True, 0, True), (64, "float16", False, 2, True), (256, "fp16", True, 4, False),
               (128, "fp8e4m3", True, 2, False), (64, "float8_e4m3fn", False, 0, False)]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", _PREPARE_WITHOUT_SOLVER, json.dumps(configs)], capture_output=True,
                         text=True, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "solver imported: False"
    kernels = [line.split()[1:] for line in lines[:-1]]
    assert kernels == [["flash-fwd", "128"], ["flash-bwd", "128"], ["flash-fwd", "64"], ["flash-bwd", "64"],
                       ["flash-fwd", "256"], ["flash-fwd", "128"], ["flash-fwd", "64"]]
    assert [line.split()[0].split("_")[3] for line in lines[-3:-1]] == ["fp8e4m3", "fp8e4m3"]
    assert "solving" not in run.stderr and "Traceback" not in run.stderr
    assert run.stderr.count("twill.ops: generating the") == 7
    assert len(list((tmp_path / "twill" / "ops").glob("*.py"))) == 7


@pytest.mark.parametrize("args,match", [
    ((96, "bf16"), r"head dimension 96 is not supported with backward=True \(supported: 64, 128, 256\)"),
    ((512, "bf16", False, 0, False), r"head dimension 512 is not supported \(supported: 64, 128, 256\)"),
    ((True, "bf16"), "head dimension True"),
    ((128, "float32"), r"dtype 'float32' is not supported \(supported: float16, bfloat16, float8_e4m3fn\)"),
    ((128, "fp8e4m3"), r"dtype fp8e4m3 has no backward \(FA3's fp8 attention has none either\); prepare its "
                       r"forward with backward=False \('twill ops prepare --no-backward'\)"),
    ((128, "fp8e5m2", False, 0, False), "dtype 'fp8e5m2' is not supported"),
    ((128, "bf16", "yes"), "causal must be True or False, got 'yes'"),
    ((128, "bf16", False, -1), "kv_heads must be 0"),
])
def test_prepare_refuses_what_the_kernels_do_not_cover_in_one_line(tmp_path, monkeypatch, args, match):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(UnsupportedFeatureError, match=match) as info:
        flash.prepare(*args)
    assert "\n" not in str(info.value) and str(info.value).startswith("twill.ops.prepare: ")
    assert not (tmp_path / "twill").exists()


def test_prepare_without_a_backward_takes_the_d256_forward(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = flash.prepare(256, "bfloat16", backward=False)
    assert path.parent == tmp_path / "twill" / "ops" and path.name.startswith("flash_fwd_d256_bf16_full_")
    assert "HEAD_DIM" in flash.cached_source(path)
    assert [p.name for p in path.parent.glob("*.py")] == [path.name]


def test_twill_ops_prepare_prints_the_forward_path(tmp_path, monkeypatch, capsys):
    from twill.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["ops", "prepare", "--head-dim", "64", "--dtype", "fp16", "--no-backward"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == tmp_path / "twill" / "ops" and flash.cached_source(path) is not None
    assert main(["ops", "prepare", "--head-dim", "96", "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err == ("twill: error: twill.ops.prepare: head dimension 96 is not supported with backward=True "
                   "(supported: 64, 128, 256)\n")
    assert main(["ops", "prepare", "--head-dim", "256", "--dtype", "fp8e4m3", "--causal", "--no-backward"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.name.startswith("flash_fwd_d256_fp8e4m3_causal_") and "def transpose_v(" in flash.cached_source(path)
    assert main(["ops", "prepare", "--head-dim", "128", "--dtype", "fp8e4m3"]) == 2
    assert capsys.readouterr().err.startswith("twill: error: twill.ops.prepare: dtype fp8e4m3 has no backward ")


def test_twill_ops_prepare_into_an_unwritable_cache_is_one_line(tmp_path, monkeypatch, capsys):
    from twill.cli import main

    (tmp_path / "twill").write_text("")          # the cache's parent is a file
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["ops", "prepare", "--head-dim", "64", "--dtype", "fp16", "--no-backward"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"twill: error: cannot write the kernel cache {tmp_path / 'twill' / 'ops'}: ")


def test_the_forward_schedules_solved_again_are_the_shipped_ones(tmp_path, capsys):
    """``twill ops regenerate --kernel flash-fwd -o DIR`` writes the forward's files under the shipped names
    (same loops), with the shipped II and proofs; it removes a stale forward file there and keeps the rest."""
    pytest.importorskip("ortools", reason="regenerating needs the solver (ortools)")
    from twill.cli import main

    (tmp_path / "flash_fwd_d1_fp16_0000.json").write_text("{}")
    (tmp_path / "flash_bwd_d1_fp16_0000.json").write_text("{}")
    assert main(["ops", "regenerate", "--kernel", "flash-fwd", "-o", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"wrote 11 schedules to {tmp_path}\n"
    written = sorted(p.name for p in tmp_path.glob("flash_fwd_*.json"))
    assert written == sorted(p.name for p in shipped.SCHEDULE_DIR.glob("flash_fwd_*.json"))
    assert (tmp_path / "flash_bwd_d1_fp16_0000.json").exists()
    for name in written:
        new, old = (json.loads((folder / name).read_text()) for folder in (tmp_path, shipped.SCHEDULE_DIR))
        assert (new["ii"], new["stats"]["proven"], new["shipped"]) == (old["ii"], old["stats"]["proven"],
                                                                       old["shipped"])


@pytest.mark.slow
def test_the_backward_schedules_solved_again_are_the_shipped_ones(tmp_path):
    """The ptxas-checked backward search run again (minutes at D = 64) finds schedules at the shipped II whose
    kernels compile cleanly for every mask and grouping."""
    pytest.importorskip("ortools", reason="regenerating needs the solver (ortools)")
    pytest.importorskip("triton", reason="the backward search compiles with Triton's ptxas")
    paths = shipped.regenerate(tmp_path, kernels=[flash.BACKWARD.name])
    assert sorted(p.name for p in paths) == sorted(p.name for p in shipped.SCHEDULE_DIR.glob("flash_bwd_*.json"))
    for path in paths:
        new, old = (json.loads((folder / path.name).read_text()) for folder in (tmp_path, shipped.SCHEDULE_DIR))
        assert new["ii"] == old["ii"] and new["shipped"]["solve_key"] == old["shipped"]["solve_key"]
        assert all(entry["rejection"] is None for entry in new["shipped"]["ptxas"])


def test_twill_ops_regenerate_refuses_an_unwritable_folder(tmp_path, capsys):
    from twill.cli import main

    (tmp_path / "file").write_text("")
    assert main(["ops", "regenerate", "-o", str(tmp_path / "file" / "dir")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twill: error: ") and err.count("\n") == 1
