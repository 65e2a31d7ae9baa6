"""Files a command writes and reads (issue 36, "Outputs" and "Validation"): special files are written in place,
an output that is an input is refused before any work, a failure never removes or changes a file that existed
before, new files follow the umask, ``-`` is stdout in every command that writes text, and every read is of a
regular, size-capped file (a device, a FIFO or a binary source ends in one line, exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from twill.cli import main
from twill.files import write_all, write_text_output
from twill.errors import TwillError
from twill.files import MAX_FILE_BYTES, make_output_dir, read_text_file, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
H200_RAW = ROOT / "benchmarks" / "results" / "calibration_h200_raw.json"
QUICK = ["--no-ws", "--time-limit", "20"]


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def fails(capsys, *argv, message: str) -> str:
    """The CLI exits 2 with nothing on stdout and exactly one error line containing ``message``."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("twill: error: ") and err.count("\n") == 1, err
    assert message in err, err
    return err


@pytest.fixture
def graph_file(tmp_path, capsys) -> Path:
    path = tmp_path / "g.json"
    assert main(["graph", "paper-example", "-o", str(path)]) == 0
    capsys.readouterr()
    return path


@pytest.fixture
def schedule_file(tmp_path, capsys) -> Path:
    path = tmp_path / "s.json"
    assert main(["schedule", "gemm", "--time-limit", "30", "-o", str(path)]) == 0
    capsys.readouterr()
    return path


@pytest.fixture
def no_solve(monkeypatch):
    """Any solve fails the test: the commands must refuse before any work."""
    import twill.solve

    def refuse(*args, **kwargs):
        raise AssertionError("the command solved before refusing its outputs")

    monkeypatch.setattr(twill.solve, "schedule", refuse)


# -- special files as outputs ------------------------------------------------------------------------------
@pytest.mark.skipif(not os.access("/dev/null", os.W_OK), reason="/dev/null is not writable here")
@pytest.mark.parametrize("argv", [["graph", "paper-example"], ["schedule", "paper-example", *QUICK],
                                  ["emit", "gluon", "gemm", "--time-limit", "30"]])
def test_dev_null_stays_a_character_device(capsys, argv):
    before = os.stat("/dev/null")
    rc, _, err = run(capsys, *argv, "-o", "/dev/null")
    assert rc == 0, err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_fifo_output_receives_the_bytes_and_stays_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as fh:            # blocks until the command opens the FIFO for writing
            received.append(fh.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        rc, _, err = run(capsys, "graph", "paper-example", "-o", fifo)
        thread.join(timeout=60)
    finally:
        if thread.is_alive():                   # release the reader so that the test ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert rc == 0, err
    assert not thread.is_alive()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(received[0])["name"] == "paper-example"


def test_write_into_a_special_file_does_not_replace_it(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # a reader, so the writer's open does not block
    try:
        write_text_atomic(fifo, "hello\n")
        assert os.read(fd, 100) == b"hello\n"
    finally:
        os.close(fd)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


# -- an output that is an input ----------------------------------------------------------------------------
def test_output_equal_to_the_input_graph_is_refused_before_any_work(tmp_path, capsys, graph_file, no_solve):
    original = graph_file.read_bytes()
    hard = tmp_path / "hard.json"
    os.link(graph_file, hard)
    soft = tmp_path / "soft.json"
    soft.symlink_to(graph_file.name)
    for output in (graph_file, hard, soft, tmp_path / "." / "g.json"):
        fails(capsys, "schedule", graph_file, *QUICK, "-o", output, message="is the input")
        fails(capsys, "report", graph_file, *QUICK, "-o", output, message="is the input")
        fails(capsys, "graph", graph_file, "-o", output, message="is the input")
        fails(capsys, "emit", "gluon", graph_file, "-o", output, message="is the input")
    fails(capsys, "schedule", soft, *QUICK, "-o", graph_file, message="is the input")
    assert graph_file.read_bytes() == original
    assert stat.S_ISLNK(os.lstat(soft).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "hard.json", "soft.json"]


def test_output_equal_to_the_schedule_or_machine_file_is_refused(tmp_path, capsys, schedule_file, no_solve):
    original = schedule_file.read_bytes()
    fails(capsys, "emit", "gluon", "--schedule", schedule_file, "-o", schedule_file, message="is the input")
    fails(capsys, "report", schedule_file, "-o", schedule_file, message="is the input")
    assert schedule_file.read_bytes() == original
    machine = tmp_path / "m.json"
    shutil.copy(ROOT / "benchmarks" / "results" / "calibration_h200.machine.json", machine)
    fails(capsys, "schedule", "gemm", "--machine", machine, "-o", machine, message="is the input")
    fails(capsys, "tune", "gemm", "--machine", machine, "--json", machine, message="is the input")
    fails(capsys, "calibrate", "--from-raw", machine, "-o", machine, message="is the input")
    assert machine.read_bytes() == (ROOT / "benchmarks" / "results" / "calibration_h200.machine.json").read_bytes()


def test_inject_refuses_a_folder_holding_its_schedule_file(tmp_path, capsys, no_solve):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "schedule.json").write_text("{}")
    kernel = ROOT / "twill" / "integrations" / "triton" / "kernels" / "matmul.py"
    fails(capsys, "inject", f"{kernel}:matmul_kernel", "--schedule", folder / "schedule.json", "-o", folder,
          message="is the input")
    assert (folder / "schedule.json").read_text() == "{}"


def test_two_outputs_of_one_file_are_refused(tmp_path, capsys, no_solve):
    fails(capsys, "schedule", "paper-example", *QUICK, "-o", tmp_path / "x.svg", "--plot", tmp_path / "x.svg",
          message="are the same file")
    assert list(tmp_path.iterdir()) == []


# -- all or nothing, without touching what existed ----------------------------------------------------------
def test_a_failing_later_output_leaves_an_existing_earlier_output_unchanged(tmp_path, capsys):
    picture = tmp_path / "t.svg"
    picture.write_text("old picture")
    dangling = tmp_path / "s.json"
    dangling.symlink_to(tmp_path / "missing" / "s.json")   # passes the early checks, fails when written
    fails(capsys, "schedule", "paper-example", *QUICK, "--plot", picture, "-o", dangling, message="cannot write")
    assert picture.read_text() == "old picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "t.svg"]      # no temporary file left


def test_write_all_keeps_existing_files_and_removes_only_what_it_created(tmp_path):
    old = tmp_path / "old.txt"
    old.write_text("before")
    old.chmod(0o640)

    def fail() -> None:
        raise TwillError("the second output failed")

    with pytest.raises(TwillError):
        write_all([lambda: write_text_output(str(old), "after"),
                   lambda: make_output_dir(tmp_path / "new" / "deeper"),
                   lambda: write_text_output(str(tmp_path / "new" / "deeper" / "x.txt"), "x"),
                   fail])
    assert old.read_text() == "before" and stat.S_IMODE(old.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]
    write_all([lambda: write_text_output(str(old), "after")])
    assert old.read_text() == "after"


# -- modes -------------------------------------------------------------------------------------------------
@pytest.fixture
def umask():
    """Set the umask for a test and restore it afterwards."""
    saved = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(saved)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_outputs_follow_the_umask_and_replaced_ones_keep_their_mode(tmp_path, capsys, umask):
    assert main(["schedule", "paper-example", *QUICK, "-o", str(tmp_path / "s.json"),
                 "--plot", str(tmp_path / "t.svg")]) == 0
    assert main(["emit", "gluon", "gemm", "--time-limit", "30", "-o", str(tmp_path / "k.py")]) == 0
    assert main(["report", "paper-example", *QUICK, "-o", str(tmp_path / "r.html")]) == 0
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == dict.fromkeys(["s.json", "t.svg", "k.py", "r.html"],
                                                                          0o644)
    umask(0o027)
    assert main(["graph", "paper-example", "-o", str(tmp_path / "g.json")]) == 0
    assert mode(tmp_path / "g.json") == 0o640
    (tmp_path / "s.json").chmod(0o600)
    assert main(["schedule", "paper-example", *QUICK, "-o", str(tmp_path / "s.json")]) == 0
    assert mode(tmp_path / "s.json") == 0o600
    capsys.readouterr()


# -- '-' is stdout -----------------------------------------------------------------------------------------
@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in an empty folder, so that a file named '-' would show."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return tmp_path


def test_dash_is_stdout_for_json_outputs(in_tmp, capsys):
    rc, out, err = run(capsys, "graph", "paper-example", "-o", "-")
    assert rc == 0 and json.loads(out)["format"] == "twill-graph/1" and "paper-example" in err
    rc, out, err = run(capsys, "schedule", "paper-example", *QUICK, "-o", "-")
    assert rc == 0 and json.loads(out)["format"] == "twill-schedule/1" and "II" in err
    rc, out, _ = run(capsys, "schedule", "paper-example", *QUICK, "-o", "-", "--json")
    assert rc == 0 and json.loads(out)["format"] == "twill-schedule/1"       # printed once
    rc, out, err = run(capsys, "calibrate", "--from-raw", H200_RAW, "-o", "-")
    assert rc == 0 and json.loads(out)["format"] == "twill-machine/1" and "wrote stdout" in err
    assert sorted(p.name for p in in_tmp.iterdir() if p.name != ".cache") == []


def test_dash_is_stdout_for_kernels_and_reports(in_tmp, capsys):
    rc, out, _ = run(capsys, "emit", "gluon", "gemm", "--time-limit", "30", "-o", "-")
    assert rc == 0 and out.startswith("# Warp-specialized GEMM")
    rc, out, err = run(capsys, "report", "paper-example", *QUICK, "-o", "-")
    assert rc == 0 and out.startswith("<!DOCTYPE html>") and "wrote stdout" in err
    assert sorted(p.name for p in in_tmp.iterdir() if p.name != ".cache") == []


def test_dash_is_stdout_for_tune(in_tmp, capsys):
    one = ["tune", "gemm", "--block-m", "128", "--block-n", "128", "--block-k", "64", "--streaming-depth", "2",
           "--warps", "4", "--persistent", "false", "--workers", "1", "--time-limit", "30"]
    rc, out, err = run(capsys, *one, "--json", "-")
    assert rc == 0 and json.loads(out)["format"] == "twill-tune/1" and "rank" in err
    rc, out, err = run(capsys, *one, "-o", "-")
    assert rc == 0 and out.startswith("# Warp-specialized GEMM") and "winner written to stdout" in err
    fails(capsys, *one, "-o", "-", "--json", "-", message="cannot both be '-'")
    assert sorted(p.name for p in in_tmp.iterdir() if p.name != ".cache") == []


def test_dash_is_refused_where_the_output_is_not_text(in_tmp, capsys, no_solve):
    fails(capsys, "schedule", "paper-example", "--plot", "-", message="--plot cannot be '-'")
    fails(capsys, "schedule", "paper-example", "--plot-all", "-", message="--plot-all cannot be '-'")
    fails(capsys, "inject", "k.py:fn", "-o", "-", message="'-' (stdout) cannot receive a folder")
    fails(capsys, "calibrate", "--from-raw", H200_RAW, "-o", "-", "--raw", "-", message="cannot both be '-'")
    assert list(in_tmp.iterdir()) == []


# -- inputs ------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_as_machine_or_graph_is_one_line(capsys, no_solve):
    fails(capsys, "schedule", "gemm", "--machine", "/dev/zero", message="character device, not a regular file")
    fails(capsys, "schedule", "/dev/zero", message="character device, not a regular file")
    fails(capsys, "tune", "/dev/zero", message="character device, not a regular file")


def test_a_fifo_as_graph_ends_promptly_in_one_line(tmp_path):
    fifo = tmp_path / "g.json"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "twill.cli", "schedule", str(fifo)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"twill: error: cannot read graph file '{fifo}': it is a FIFO, not a regular file\n"


def test_a_directory_or_an_oversized_file_as_input_is_one_line(tmp_path, capsys, no_solve):
    folder = tmp_path / "d.json"
    folder.mkdir()
    fails(capsys, "schedule", folder, message="it is a directory")
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)              # sparse: no 64 MiB written
    fails(capsys, "schedule", big, message="larger than 64 MiB")


def test_binary_sources_are_one_line(tmp_path, capsys, no_solve):
    ttgir = tmp_path / "k.ttgir"
    ttgir.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe binary")
    fails(capsys, "schedule", ttgir, message="not UTF-8 text (byte 0); TTGIR files are UTF-8 text")
    mlir = tmp_path / "k.mlir"
    mlir.write_bytes(b"module {\x00}")
    fails(capsys, "graph", mlir, "-o", tmp_path / "g.json", message="contains a NUL byte")
    graph = tmp_path / "g.json"
    graph.write_bytes(b"\xff\xfe{}")
    fails(capsys, "schedule", graph, message="not UTF-8 text")
    tilelang = tmp_path / "tl.py"
    tilelang.write_bytes(b"import tilelang\n\xff\xfe\n")
    fails(capsys, "schedule", f"{tilelang}:kernel", message="not UTF-8 text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "k.mlir", "k.ttgir", "tl.py"]


def test_binary_triton_source_is_one_line(tmp_path, capsys, no_solve):
    pytest.importorskip("triton")
    source = tmp_path / "k.py"
    source.write_bytes(b"import triton\n\xc3\x28\n")
    fails(capsys, "schedule", f"{source}:kernel", "--signature", "*fp16", message="not UTF-8 text")
    fifo = tmp_path / "f.py"
    os.mkfifo(fifo)
    fails(capsys, "schedule", f"{fifo}:kernel", "--signature", "*fp16", message="it is a FIFO")


def test_read_text_file_reads_stdin_only_when_asked(tmp_path, monkeypatch):
    import io

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    assert read_text_file("-", "graph", stdin=True) == "from stdin"
    with pytest.raises(TwillError, match="No such file"):
        read_text_file("-", "graph")
