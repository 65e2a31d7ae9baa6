"""The tests' own layout: fixtures shared between test files live in ``tests/`` (``conftest.py`` puts it on
``sys.path``), never in another test file, so each test file runs on its own; and no test imports
``benchmarks/``."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_test_file_imports_another_test_file_or_a_benchmark():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for name in _imported(path):
            top = name.split(".")[0]
            if top.startswith("test_") or top in ("tests", "benchmarks"):
                offenders.append(f"{path.relative_to(TESTS)} imports {name}")
    assert not offenders, offenders


def test_the_checker_sees_a_planted_import(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text("def test_x():\n    from test_other import helper\n")
    assert "test_other" in _imported(planted)
