"""Every `twill` command shown in README.md, docs/cli.md and docs/triton.md runs, and where the docs show its
output, prints that output.

Conventions of the docs (so that they cannot drift from the tool):

* in a ``bash`` block, every line starting with ``twill`` (or ``.venv/bin/twill``) is a command; ``&&`` chains
  several; a trailing ``\\`` continues a line;
* in a ``text`` block, a line starting with ``$ twill`` is a command and the lines up to the next ``$`` line are
  its output. A line ``...`` in the output stands for omitted lines; a ``solve time:`` line matches any time.

The commands of one document run in order in one scratch directory (later commands read the files earlier
ones write), with ``examples/``, ``twill/``, ``tests/`` and ``benchmarks/`` of the repository linked into it. Commands that need
a GPU (``twill calibrate`` measuring, ``--measure``) are skipped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/cli.md", "docs/triton.md", "docs/calibration.md")
#: Commands that take more than a few seconds here (solves with warp specialization, pictures, compiles).
SLOW = ("--arch b200", "flash-bwd", "--plot", "report ", "inject ", "--subtiles 2", "triton_families.py",
        "tune ", "ops regenerate")
GPU_ONLY = ("calibrate --arch", "--measure")
NEEDS_TRITON = (".py:", ".ttgir", "inject ", "ops prepare")
NEEDS_TILELANG = ("examples/tilelang/",)
#: Options whose value is a file the command writes.
OUTPUT_FLAGS = ("-o", "--raw", "--json", "--plot", "--plot-all")
ANY_TIME = re.compile(r"^solve time: \d+\.\d+ s$")


@dataclass(frozen=True)
class DocCommand:
    """A command of a document: where it is, its argument list, and the output the document shows."""

    doc: str
    line: int
    argv: tuple[str, ...]
    expected: tuple[str, ...] | None

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in lines:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1].rstrip())
            continue
        pending = None
        out.append((number, line))
    return out


def _argv(command: str) -> list[tuple[str, ...]]:
    parts = []
    for piece in command.split("&&"):
        words = shlex.split(piece, comments=True)
        if words and words[0] in ("twill", ".venv/bin/twill"):
            parts.append(tuple(words[1:]))
    return parts


def doc_commands(doc: str) -> list[DocCommand]:
    """The commands of ``doc`` in order, with the output shown for each (``None``: not shown)."""
    lines = (ROOT / doc).read_text().splitlines()
    found: list[DocCommand] = []
    k = 0
    while k < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[k])
        if not fence:
            k += 1
            continue
        end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
        body = _logical_lines([(j + 1, lines[j]) for j in range(k + 1, end)])
        if fence.group(1) == "bash":
            for number, line in body:
                found += [DocCommand(doc, number, argv, None) for argv in _argv(line)]
        elif body and body[0][1].startswith("$ twill"):
            for number, argvs, output in _sessions(body):
                found += [DocCommand(doc, number, argv, None) for argv in argvs[:-1]]
                found.append(DocCommand(doc, number, argvs[-1], _trim(output)))
        k = end + 1
    return found


def _sessions(body: list[tuple[int, str]]) -> list[tuple[int, list[tuple[str, ...]], list[str]]]:
    """(line, commands, output lines) per ``$`` line of a text block."""
    out: list[tuple[int, list[tuple[str, ...]], list[str]]] = []
    for number, line in body:
        if line.startswith("$ "):
            out.append((number, _argv(line[2:]), []))
        else:
            out[-1][2].append(line)
    return out


def _trim(expected: list[str]) -> tuple[str, ...] | None:
    rows = list(expected)
    while rows and not rows[-1].strip():
        rows.pop()
    return tuple(rows) if rows else None


def output_matches(expected: tuple[str, ...], actual: list[str]) -> str | None:
    """``None`` when every run of ``expected`` lines between ``...`` lines appears, in order and contiguous, in
    ``actual``; else the first run that does not."""
    runs: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(line.rstrip())
    at = 0
    for run in (r for r in runs if r):
        hit = next((i for i in range(at, len(actual) - len(run) + 1)
                    if all(_same(e, a) for e, a in zip(run, actual[i:i + len(run)]))), None)
        if hit is None:
            return "\n".join(run)
        at = hit + len(run)
    return None


def _same(expected: str, actual: str) -> bool:
    return expected == actual.rstrip() or bool(ANY_TIME.match(expected) and ANY_TIME.match(actual.rstrip()))


def _params():
    out = []
    for doc in DOCS:
        for cmd in doc_commands(doc):
            marks = []
            if any(s in f"{cmd.text} " for s in SLOW):
                marks.append(pytest.mark.slow)
            if any(s in cmd.text for s in GPU_ONLY):
                marks.append(pytest.mark.skip(reason="needs a GPU"))
            out.append(pytest.param(cmd, id=f"{doc}:{cmd.line}", marks=marks))
    return out


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    dirs = {}
    for doc in DOCS:
        d = tmp_path_factory.mktemp(doc.replace("/", "_").replace(".", "_"))
        for name in ("examples", "twill", "tests", "benchmarks"):
            (d / name).symlink_to(ROOT / name)
        dirs[doc] = d
    return dirs


def test_docs_have_commands_and_no_abbreviations():
    for doc in DOCS:
        cmds = doc_commands(doc)
        assert cmds, doc
        for cmd in cmds:
            assert "..." not in cmd.argv, f"{doc}:{cmd.line}: an abbreviated command cannot be run"


@pytest.mark.parametrize("cmd", _params())
def test_documented_command(cmd, workdirs, monkeypatch, capsys):
    pytest.importorskip("ortools")
    if any(s in cmd.text for s in NEEDS_TRITON):
        pytest.importorskip("triton")
    if any(s in cmd.text for s in NEEDS_TILELANG):
        pytest.importorskip("tilelang")
    from twill.cli import main

    missing = _unproduced_inputs(cmd, workdirs[cmd.doc])
    if missing:
        pytest.skip(f"{missing[0]} is written by an earlier command of {cmd.doc} that did not run in this session "
                    f"(skipped or deselected)")
    monkeypatch.chdir(workdirs[cmd.doc])
    monkeypatch.setenv("XDG_CACHE_HOME", str(workdirs[cmd.doc] / ".cache"))  # twill tune's cache
    code = main(list(cmd.argv))
    out, err = capsys.readouterr()
    assert code == 0, f"{cmd.doc}:{cmd.line}: twill {cmd.text} failed: {err.strip()}"
    if cmd.expected:
        missing = output_matches(cmd.expected, out.splitlines())
        assert missing is None, f"{cmd.doc}:{cmd.line}: output differs from the docs at:\n{missing}"


def _unproduced_inputs(cmd: DocCommand, workdir: Path) -> list[str]:
    """The arguments of ``cmd`` that name a file which an earlier command of its document also names but which
    does not exist in ``workdir``: the earlier command that writes it did not run (it needs a GPU, Triton or
    TileLang that is absent, or ``-m`` deselected it), so ``cmd`` cannot run either."""
    earlier: set[str] = set()
    for other in doc_commands(cmd.doc):
        if other == cmd:
            break
        earlier.update(a for a in other.argv if not a.startswith("-"))
    written = {b for a, b in zip(cmd.argv, cmd.argv[1:]) if a in OUTPUT_FLAGS}
    return [a for a in cmd.argv
            if a in earlier and a not in written and _scratch_file(a) and not (workdir / a).exists()]


def _scratch_file(arg: str) -> bool:
    """``arg`` names a file in the document's scratch directory (``mm.json``; not a repository path such as
    ``twill/...`` or a target ``path.py:fn``)."""
    return "." in arg and "/" not in arg and ":" not in arg


def test_a_command_whose_input_an_earlier_command_did_not_write_is_recognised(tmp_path):
    cmds = [c for c in doc_commands("docs/cli.md") if "gemm.json" in c.argv]
    writer, reader = cmds[0], next(c for c in cmds if c.argv[0] == "report")
    assert _unproduced_inputs(reader, tmp_path) == ["gemm.json"]
    (tmp_path / "gemm.json").write_text("{}")
    assert _unproduced_inputs(reader, tmp_path) == []
    assert _unproduced_inputs(writer, tmp_path / "empty") == []
    rewriter = [c for c in doc_commands("docs/calibration.md") if "h200.machine.json" in c.argv][1]
    assert _unproduced_inputs(rewriter, tmp_path / "empty") == []      # writes the file an earlier one wrote


def test_output_matching_rules():
    actual = ["a", "solve time: 1.23 s", "b", "c", "d"]
    assert output_matches(("a", "solve time: 9.99 s", "b"), actual) is None
    assert output_matches(("a", "...", "d"), actual) is None
    assert output_matches(("b", "...", "a"), actual) == "a"
    assert output_matches(("c", "b"), actual) == "c\nb"


def test_progress_flag_prints_progress_when_stderr_is_not_a_terminal(capsys):
    pytest.importorskip("ortools")
    from twill.cli import main

    assert main(["schedule", "paper-example", "--no-ws"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["schedule", "paper-example", "--no-ws", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "twill: II 2: solving" in err and all(line.startswith("twill: ") for line in err.splitlines())


def _subcommands(parser, prefix=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _subcommands(sub, prefix + (name,))


def test_cli_md_documents_every_command_and_option():
    from twill.cli import build_parser

    text = (ROOT / "docs" / "cli.md").read_text()
    missing = []
    for path, sub in _subcommands(build_parser()):
        if f"## `twill {' '.join(path)}" not in text and not any(a.__class__.__name__ == "_SubParsersAction"
                                                                   for a in sub._actions):
            missing.append("twill " + " ".join(path))
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and f"`{flag}" not in text:
                    missing.append(f"twill {' '.join(path)} {flag}")
    assert not missing, f"docs/cli.md does not document: {', '.join(sorted(set(missing)))}"
