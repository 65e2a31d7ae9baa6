"""The package imports cleanly: no import circle, every module importable on its own, and the solvers stay
lazy (docs/architecture.md)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "twill"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, *, lazy: bool) -> set[str]:
    """The twill modules ``path`` imports (at module level, or anywhere when ``lazy``), with the packages
    each import runs, leaving out the module's own parent packages."""
    me = module_name(path)
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if lazy else tree.body
    named: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("twill"):
            named.add(node.module)
            named |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
        elif isinstance(node, ast.Import):
            named |= {a.name for a in node.names if a.name.startswith("twill")}
    out = set()
    for name in named:
        parts = name.split(".")
        out |= {".".join(parts[:k]) for k in range(1, len(parts) + 1)}
    return {m for m in out if m in MODULES and m != me and not me.startswith(m + ".")}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (module -> modules it imports), or [] when there is none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_module_level_imports_have_no_circle():
    graph = {name: imports(path, lazy=False) for name, path in MODULES.items()}
    assert len(graph) > 50
    assert cycle(graph) == []


def test_no_circle_even_through_imports_inside_functions():
    """Data flows one way, also where a module imports on first use (the solver, Triton, the verifier's
    bounds): no module reaches itself through its imports, lazy ones included."""
    graph = {name: imports(path, lazy=True) & MODULES.keys() for name, path in MODULES.items()}
    assert {"twill.solve.joint.search", "twill.schedule.verify", "twill.machine.calibration"} <= graph.keys()
    assert cycle(graph) == []


def test_cycle_finds_a_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []


#: Modules on the solver's edges, imported alone in the quick test (the slow one covers every module).
EDGES = ["twill.solve", "twill.solve.joint.search", "twill.solve.joint.cpsat", "twill.solve.joint.yices_joint",
         "twill.solve.strategies", "twill.schedule.verify", "twill.schedule.vocab", "twill.ir.semantics",
         "twill.integrations.triton.inject", "twill.cli"]


def import_alone(names: list[str]) -> str:
    """Import each of ``names`` in one fresh interpreter, every twill module dropped from ``sys.modules``
    before each, so that it is the first of the package to load (third-party packages stay loaded, which
    keeps this fast). Returns one line per module that fails."""
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for key in [k for k in sys.modules if k == 'twill' or k.startswith('twill.')]:\n"
        "        del sys.modules[key]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(name, type(exc).__name__, exc)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          check=True).stdout


def test_the_solver_edges_import_on_their_own():
    assert set(EDGES) <= MODULES.keys()
    assert import_alone(EDGES) == ""


@pytest.mark.slow
def test_every_module_imports_on_its_own():
    """About 12 s on a 2-core machine: each of the ~90 modules re-runs the package code it needs."""
    assert import_alone(sorted(MODULES)) == ""


def test_code_generation_and_the_cli_import_no_solver():
    code = ("import sys, twill.codegen.plan, twill.codegen.gluon, twill.cli, twill.solve\n"
            "print(sorted(m for m in ('ortools', 'yices') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert run.stdout.strip() == "[]"


#: A ``sitecustomize`` module that hides OR-Tools from every Python process started with it on the path: the
#: command and the tune sweep's worker processes (started from a forkserver, not forked from the command).
_HIDE_ORTOOLS = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'ortools' or name.startswith('ortools.'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n")

_WITHOUT_ORTOOLS = (
    "import sys\n"
    "from twill.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")


def test_solving_without_or_tools_says_what_to_install_in_one_line(tmp_path):
    """Where OR-Tools is absent (a GPU machine running a checkout), a solve stops with one line, and a tune
    sweep records the reason without caching it (installing OR-Tools changes the answer)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_HIDE_ORTOOLS)
    path = os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": path}
    run = subprocess.run([sys.executable, "-c", _WITHOUT_ORTOOLS, "schedule", "gemm"], capture_output=True,
                         text=True, cwd=ROOT, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and "solving needs OR-Tools' CP-SAT" in run.stderr
    assert "pip install 'ortools" in run.stderr
    run = subprocess.run([sys.executable, "-c", _WITHOUT_ORTOOLS, "tune", "gemm", "--block-m", "128",
                          "--block-n", "128", "--block-k", "64", "--warps", "8", "--streaming-depth", "2",
                          "--persistent", "false"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert run.returncode == 0 and "Traceback" not in run.stderr
    assert "no candidate was scheduled; the first reason: solving needs OR-Tools' CP-SAT" in run.stdout
    assert not list((tmp_path / "twill" / "tune").glob("*.json"))
