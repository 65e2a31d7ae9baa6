"""Caches are verified, not trusted: a ``twill tune`` cache record that does not parse, is not of the shape the
sweep writes, or whose schedule does not verify against its job's graph and machine is a miss (solved again
and overwritten); a ``twill.ops`` kernel cache file whose digest line does not match the code under it is
generated again, never imported."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from twill.ir.io import graph_to_dict
from twill.kernels import build_kernel
from twill.machine import get_machine
from twill.ops import flash
from twill.ops.flash import KernelSpec
from twill.tune import sweep
from twill.tune.space import Candidate
from twill.tune.sweep import Job, cache_read, cache_write, record_problem, run_job, run_sweep, twill_version

H100 = get_machine("h100")


def _job(depth: int = 2) -> Job:
    graph = graph_to_dict(build_kernel("gemm", H100, block_m=128, block_n=128, block_k=64))
    return Job(candidate=Candidate(options=(("block_m", 128),), streaming_depth=depth), machine=H100,
               time_limit=30.0, graph=graph)


@pytest.fixture(scope="module")
def solved():
    """The record of the GEMM job, solved once (II 93 on the H100 model), as it comes back from JSON."""
    pytest.importorskip("ortools")
    record = json.loads(json.dumps(run_job(_job())))
    assert record["status"] == "ok" and record["ii"] == 93
    return record


@pytest.fixture(scope="module")
def cheaper(solved):
    """The record of the GEMM with half the K tile (a lower II), as if copied over the 128x128x64 job's entry."""
    graph = graph_to_dict(build_kernel("gemm", H100, block_m=128, block_n=128, block_k=32))
    record = json.loads(json.dumps(run_job(replace(_job(), graph=graph))))
    assert record["status"] == "ok" and record["ii"] < solved["ii"]
    return record


def _lowered_ii(record: dict, ii: int = 10) -> dict:
    """``record`` claiming II ``ii``: record and schedule agree, the per-op stage and order fields (which would
    give the edit away on loading) dropped."""
    out = copy.deepcopy(record)
    out["ii"] = out["schedule"]["ii"] = out["schedule"]["ii_lower_bound"] = ii
    for op in out["schedule"]["ops"]:
        op.pop("stage", None)
        op.pop("order", None)
    return out


# -- tune cache: the verified record ---------------------------------------------------------------------
def test_a_solved_record_reads_back(tmp_path, solved):
    cache_write(tmp_path, "k", solved)
    assert cache_read(tmp_path, "k", _job()) == solved


def test_a_record_of_another_job_is_a_miss(tmp_path, solved, cheaper):
    """A valid schedule of a cheaper tile, the same graph at another streaming depth, and a schedule for another
    machine, do not answer."""
    cache_write(tmp_path, "k", cheaper)
    assert cache_read(tmp_path, "k", _job()) is None
    assert record_problem(cheaper, _job()).startswith("not a schedule of this job's graph")
    cache_write(tmp_path, "k", solved)
    assert cache_read(tmp_path, "k", _job(depth=3)) is None
    assert "streaming depth" in record_problem(solved, _job(depth=3))
    other = replace(_job(), machine=get_machine("b200"))
    assert cache_read(tmp_path, "k", other) is None


@pytest.mark.parametrize("edit,why", [
    (lambda r: _lowered_ii(r), "BOUND"),
    (lambda r: {**r, "ii": 10}, "the record says II 10"),
    (lambda r: {**r, "solve_status": "feasible"}, "the record says"),
    (lambda r: _set(r, ["schedule", "stats", "normalization", "map", "512"], 1), "normalization"),
    (lambda r: _set(r, ["schedule", "arch"], "b200"), ""),
    (lambda r: {**r, "reason": "why"}, "does not fit status"),
    (lambda r: {**r, "schedule": "x"}, "loop_graph"),
    (lambda r: {**r, "unheard": 1}, "unknown key"),
    (lambda r: {k: v for k, v in r.items() if k != "schedule"}, "without its schedule"),
    (lambda r: {**r, "seconds": -1}, "duration"),
    (lambda r: {**r, "spills": [1]}, "ptxas report"),
    (lambda r: _set(r, ["schedule", "ops", 0, "start"], "0"), "does not load"),
    (lambda r: _set(r, ["schedule", "loop_graph", "ops"], None), "does not load"),
])
def test_a_tampered_record_is_a_miss(tmp_path, solved, edit, why):
    record = edit(copy.deepcopy(solved))
    problem = record_problem(record, _job())
    assert problem is not None and why in problem
    cache_write(tmp_path, "k", record)
    assert cache_read(tmp_path, "k", _job()) is None


def _set(record: dict, path: list, value) -> dict:
    node = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return record


@pytest.mark.parametrize("data", [
    b"\x00\xff\xfe\x89PNG garbage", b"", b"{", b"[]", b"null", b'"ok"', b'{"status": "ok"}',
    b'{"status": "ok", "reason": null, "cacheable": true, "ii": "93", "schedule": []}',
    b'{"status": "done", "reason": "x", "cacheable": true}',
    b'{"status": ["ok"], "reason": "x", "cacheable": true}',
    b'{"status": "infeasible", "reason": 3, "cacheable": true}',
    b'{"status": "infeasible", "reason": "x", "cacheable": true, "seconds": "1"}',
    b"[" * 100000,
], ids=["binary", "empty", "truncated", "list", "null", "string", "ok-without-schedule", "wrong-types",
        "unknown-status", "list-status", "number-reason", "string-seconds", "deep"])
def test_unparsable_or_wrong_shape_records_are_misses(tmp_path, data):
    (tmp_path / "k.json").write_bytes(data)
    assert cache_read(tmp_path, "k", _job()) is None


def test_a_binary_or_tampered_entry_is_solved_again_and_overwritten(tmp_path, monkeypatch, solved):
    """The sweep does not crash on a binary entry nor trust a tampered one: each job is solved again (II 93,
    not cached) and its file rewritten with the verified record, which the next run reads back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    jobs = [_job(2), _job(3)]
    directory = sweep.cache_dir()
    directory.mkdir(parents=True)
    keys = [job.key(twill_version()) for job in jobs]
    (directory / f"{keys[0]}.json").write_bytes(b"\x00\xff binary \xfe")
    cache_write(directory, keys[1], {**_lowered_ii(solved), "schedule": {
        **_lowered_ii(solved)["schedule"], "streaming_depth": 3}})
    records = run_sweep(jobs, workers=1)
    assert [(r["status"], r["ii"], r["cached"]) for r in records] == [("ok", 93, False)] * 2
    for key, job in zip(keys, jobs):
        assert json.loads((directory / f"{key}.json").read_text())["ii"] == 93
        assert cache_read(directory, key, job) is not None
    assert all(r["cached"] and r["ii"] == 93 for r in run_sweep(jobs, workers=1))


def test_tune_emits_the_verified_schedule_not_the_tampered_one(tmp_path, monkeypatch, capsys):
    """``twill tune -o``: a cache entry claiming II 10 is solved again; the ranking says II 93, not cached, and
    the kernel written is the II-93 schedule's."""
    pytest.importorskip("ortools")
    from twill.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["tune", "gemm", "--block-m", "128", "--block-n", "128", "--block-k", "64", "--warps", "4",
            "--streaming-depth", "2", "--persistent", "false", "--shape", "1024,1024,1024", "--workers", "1"]
    assert main(argv) == 0
    capsys.readouterr()
    [entry] = (tmp_path / "cache" / "twill" / "tune").glob("*.json")
    entry.write_text(json.dumps(_lowered_ii(json.loads(entry.read_text()))))
    kernel = tmp_path / "k.py"
    assert main([*argv, "--json", str(tmp_path / "s.json"), "-o", str(kernel)]) == 0
    out = capsys.readouterr().out
    assert "(0 cached)" in out
    [result] = json.loads((tmp_path / "s.json").read_text())["results"]
    assert result["ii"] == 93 and result["cached"] is False
    assert "# II = 93 (lower bound 93)" in kernel.read_text()
    assert json.loads(entry.read_text())["ii"] == 93


# -- twill.ops kernel cache -------------------------------------------------------------------------------
FRESH = "MARK = 'fresh'\n"


@pytest.fixture
def ops_cache(tmp_path, monkeypatch):
    """The kernel cache file of one spec under ``tmp_path``, with :func:`flash._generate` returning
    :data:`FRESH` (and counting its calls)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sweep, "twill_version", lambda: "test+0")
    spec = KernelSpec("flash-fwd", 64, "fp16", False, 0)
    calls = []
    monkeypatch.setattr(flash, "_generate", lambda s: calls.append(s) or FRESH)
    flash.kernel_module.cache_clear()
    path = flash.cache_dir() / spec.file_name("test+0")
    path.parent.mkdir(parents=True)
    yield spec, path, calls
    flash.kernel_module.cache_clear()


def test_a_generated_kernel_is_stored_with_its_digest_and_read_back(ops_cache):
    spec, path, calls = ops_cache
    assert flash.kernel_module(spec).MARK == "fresh" and len(calls) == 1
    assert path.read_text() == flash.cache_text(FRESH) and flash.cached_source(path) == FRESH
    flash.kernel_module.cache_clear()
    assert flash.kernel_module(spec).MARK == "fresh" and len(calls) == 1     # imported, not generated


@pytest.mark.parametrize("damage", ["empty", "truncated", "appended", "tampered", "no-digest-line", "digest-only",
                                    "binary"])
def test_a_damaged_kernel_file_is_regenerated_never_imported(ops_cache, tmp_path, damage):
    """The bad file's code would write ``ran``: it never runs; the module is the regenerated one and the file
    is rewritten whole."""
    spec, path, calls = ops_cache
    ran = tmp_path / "ran"
    payload = f"open({str(ran)!r}, 'w').write('x')\nMARK = 'bad'\n"
    good = flash.cache_text(FRESH)
    path.write_bytes({
        "empty": b"",
        "truncated": good[:-4].encode(),
        "appended": good.encode() + payload.encode(),
        "tampered": good.splitlines(keepends=True)[0].encode() + payload.encode(),
        "no-digest-line": payload.encode(),
        "digest-only": good.splitlines(keepends=True)[0].encode(),
        "binary": flash.DIGEST_PREFIX.encode() + b"\xff\xfe\n" + payload.encode(),
    }[damage])
    module = flash.kernel_module(spec)
    assert module.MARK == "fresh" and len(calls) == 1
    assert not ran.exists()
    assert path.read_text() == good
