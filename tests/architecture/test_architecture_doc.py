"""docs/architecture.md stays true: a section per package, and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def test_every_package_has_a_section():
    headings = [line for line in DOC.read_text().splitlines() if line.startswith("### ")]
    packages = sorted(p.parent.name for p in (ROOT / "twill").glob("*/__init__.py"))
    assert packages, "no packages found under twill/"
    missing = [p for p in packages if not any(f"`twill/{p}`" in h for h in headings)]
    assert not missing, f"docs/architecture.md has no section for {missing}"


def test_every_named_path_exists():
    paths = set(re.findall(r"`((?:twill|benchmarks|tests)/[\w/.]*)`", DOC.read_text()))
    paths |= set(re.findall(r"(?<![\w/])((?:twill|benchmarks)/[\w/]+(?:\.py)?)", DOC.read_text()))
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_readme_links_the_page():
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
