"""Ctrl-C (SIGINT) and SIGTERM stop any ``twill`` command within seconds: one line on stderr, exit status 130 or
143, no output file and no worker process left behind.

The commands run as real subprocesses on workloads that keep CP-SAT busy far longer than the bounds below (a
random 120-op graph without cost normalization: several seconds per II; the B200 flash-bwd tuning space), and
the signal is sent only once the solver is known to be running (its progress line, or the tune workers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from twill.ir.io import graph_to_dict
from twill.solve._interrupt import interruptible

from randgraphs import random_graph

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

ROOT = Path(__file__).resolve().parents[2]
#: Seconds within which an interrupted command must have exited (the goal is 2 s; a loaded CI machine gets
#: a generous margin).
BOUND = 5.0
LINE = {signal.SIGINT: "twill: interrupted", signal.SIGTERM: "twill: terminated"}
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


# -- the mechanism, in this process ----------------------------------------------------------------------
@pytest.fixture
def usr1_interrupts():
    """SIGUSR1 raises KeyboardInterrupt in the main thread while the test runs (as SIGINT does, without
    touching pytest's own SIGINT handling)."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    yield lambda delay: threading.Timer(delay, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    signal.signal(signal.SIGUSR1, previous)


def test_an_interrupt_stops_the_call_and_is_raised(usr1_interrupts):
    stopped = threading.Event()
    usr1_interrupts(0.2)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interruptible(lambda: stopped.wait(60), stopped.set)
    assert stopped.is_set()
    assert time.monotonic() - began < BOUND


def test_the_call_s_result_and_exception_come_back():
    assert interruptible(lambda: 42, lambda: None) == 42
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 // 0, lambda: None)


def test_a_cpsat_search_stops_on_an_interrupt(usr1_interrupts):
    from twill.solve._ortools_loader import load_cp_model, new_solver, solve_model

    cp_model = load_cp_model()
    model = cp_model.CpModel()
    xs = [model.new_int_var(0, 1000, f"x{i}") for i in range(30)]
    for i, a in enumerate(xs):          # 30 disjoint intervals of length 7: far from proved in 60 s
        for b in xs[i + 1:]:
            before = model.new_bool_var("")
            model.add(a + 7 <= b).only_enforce_if(before)
            model.add(b + 7 <= a).only_enforce_if(~before)
    model.minimize(sum(xs))
    solver = new_solver()
    assert solver.parameters.catch_sigint_signal is False
    solver.parameters.max_time_in_seconds = 60
    solver.parameters.num_workers = 2
    usr1_interrupts(0.5)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        solve_model(solver, model)
    assert time.monotonic() - began < BOUND


def test_a_yices_check_stops_on_an_interrupt(usr1_interrupts):
    from twill.solve._yices_loader import yices_available

    if not yices_available():
        pytest.skip("Yices is not installed")
    from twill.solve._yices_loader import load_yices

    y = load_yices()
    context = y.Context(y.Config())
    n = 13      # 13 pigeons, 12 holes: unsat, and far beyond a minute of CDCL
    boolean = y.Types.bool_type()
    p = [[y.Terms.new_uninterpreted_term(boolean, f"p{i}_{j}") for j in range(n - 1)] for i in range(n)]
    for row in p:
        context.assert_formula(y.Terms.yor(row))
    for j in range(n - 1):
        for i in range(n):
            for k in range(i + 1, n):
                context.assert_formula(y.Terms.ynot(y.Terms.yand([p[i][j], p[k][j]])))
    usr1_interrupts(0.5)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interruptible(lambda: context.check_context_with_assumptions(None, []), context.stop_search)
    assert time.monotonic() - began < BOUND
    context.dispose()


def test_an_interrupt_while_writing_outputs_leaves_none(tmp_path):
    """A command's outputs are written together (:func:`twill.files.write_all`): an interrupt
    before the last is written leaves no new file, no temporary file, and an existing file as it was."""
    from twill.files import write_all, write_text_output

    (tmp_path / "old.txt").write_text("before")

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_all([lambda: write_text_output(str(tmp_path / "new.txt"), "new"),
                   lambda: write_text_output(str(tmp_path / "old.txt"), "after"), interrupted])
    assert [p.name for p in tmp_path.iterdir()] == ["old.txt"]
    assert (tmp_path / "old.txt").read_text() == "before"


# -- real commands -----------------------------------------------------------------------------------------
def start(tmp_path: Path, *argv: str) -> subprocess.Popen:
    """``python -m twill.cli ARGV`` in a new session (a process group of its own, like a terminal job), with
    its own cache folder."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "twill.cli", *argv], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for_line(proc: subprocess.Popen, needle: str) -> list[str]:
    """stderr lines up to the first that contains ``needle`` (the command still running then)."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if needle in line:
            break
    assert lines and needle in lines[-1], "".join(lines)
    assert proc.poll() is None, "the command ended before the signal"
    return lines


def stop(proc: subprocess.Popen, sig: int, *, group: bool = False) -> tuple[int, list[str], float]:
    """Send ``sig`` (to the whole process group, as a terminal's Ctrl-C does, when ``group``); the exit
    status, the stderr lines after it and the seconds until the command exited."""
    began = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err.splitlines(), time.monotonic() - began


def check_one_line(sig: int, rc: int, err: list[str], seconds: float) -> None:
    assert rc == STATUS[sig], err
    assert seconds < BOUND
    assert err and err[-1] == LINE[sig], err
    assert not any(line in LINE.values() for line in err[:-1]), err
    assert not any("Traceback" in line for line in err), err


@pytest.fixture(scope="module")
def busy_graph(tmp_path_factory) -> Path:
    """A random 120-op graph that CP-SAT works on for seconds at every II without cost normalization."""
    path = tmp_path_factory.mktemp("graphs") / "random120.json"
    path.write_text(json.dumps(graph_to_dict(random_graph(120, 1))))
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_schedule_stops_during_the_solve_and_writes_nothing(tmp_path, busy_graph, sig):
    proc = start(tmp_path, "schedule", str(busy_graph), "--no-normalize", "--time-limit", "120", "--progress",
                 "-o", "out.json", "--json")
    wait_for_line(proc, "phase 1")
    rc, err, seconds = stop(proc, sig, group=sig == signal.SIGINT)
    check_one_line(sig, rc, err, seconds)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == []


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["sigint", "sigterm"])
def test_tune_stops_its_workers_and_writes_nothing(tmp_path, sig):
    """The workers are the children of the sweep's forkserver (a child of the command, beside
    multiprocessing's resource tracker): they, the forkserver and the tracker all end with the command."""
    proc = start(tmp_path, "tune", "flash-bwd", "--arch", "b200", "--workers", "2", "--progress",
                 "--json", "sweep.json", "-o", "kernel.py")
    deadline = time.monotonic() + 60
    helpers: set[int] = set()
    workers: set[int] = set()
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        helpers = _children(proc.pid)
        workers = {pid for helper in helpers for pid in _children(helper)}
    assert len(workers) >= 2, "the tune workers did not start"
    time.sleep(1.0)         # the workers are solving
    assert proc.poll() is None
    rc, err, seconds = stop(proc, sig, group=sig == signal.SIGINT)
    check_one_line(sig, rc, err, seconds)
    assert not (tmp_path / "sweep.json").exists() and not (tmp_path / "kernel.py").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]     # no temporary file either
    deadline = time.monotonic() + BOUND        # the forkserver ends once it sees the command gone
    while [pid for pid in workers | helpers if Path(f"/proc/{pid}").exists()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "a worker outlived the command"
    assert not [pid for pid in helpers if Path(f"/proc/{pid}").exists()], "the forkserver outlived the command"
    # a cache record only for each job that finished before the signal (its progress line)
    finished = sum(line.startswith("twill: tune ") for line in err)
    records = list((tmp_path / "cache").rglob("*.json"))
    assert len(records) == finished
