"""docs/architecture.md stays true: a section per package and top-level module, every subpackage and kernel
family named, every path it names exists, and its worked example of a kernel family is the real folder and
the real registry line. (Its layer rule is checked by tests/architecture/test_layering.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "twill"


def test_every_package_and_module_has_a_section():
    headings = [line for line in DOC.read_text().splitlines() if line.startswith("### ")]
    names = sorted([f"twill/{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")]
                   + [f"twill/{p.name}" for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")])
    assert len(names) > 10, "no packages found under twill/"
    missing = [n for n in names if not any(f"`{n}`" in h for h in headings)]
    assert not missing, f"docs/architecture.md has no section for {missing}"


def test_every_subpackage_and_family_is_named():
    from twill.kernels import families

    text = DOC.read_text()
    family_packages = {f.package.replace(".", "/") for f in families()}
    subpackages = sorted(str(p.parent.relative_to(ROOT)) for p in PACKAGE.glob("*/**/__init__.py")
                         if str(p.parent.relative_to(ROOT)) not in family_packages)
    assert "twill/codegen/gluon" in subpackages
    assert not [p for p in subpackages if p not in text], "subpackages the page does not name"
    assert not [f.name for f in families() if f"`{f.name}`" not in text], "kernel families the page does not name"


def test_every_named_path_exists():
    paths = set(re.findall(r"`((?:twill|benchmarks|tests)/[\w/.]*)`", DOC.read_text()))
    paths |= set(re.findall(r"(?<![\w/])((?:twill|benchmarks|tests)/[\w/]+(?:\.py)?)", DOC.read_text()))
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_worked_family_is_the_real_folder_and_registry_line():
    from twill.kernels import PACKAGES

    text = DOC.read_text()
    listing = re.search(r"```text\ntwill/kernels/(\w+)/\n((?:  \S.*\n)+)```", text)
    assert listing, "no listing of a family's folder"
    folder = PACKAGE / "kernels" / listing.group(1)
    named = {line.split()[0] for line in listing.group(2).splitlines()}
    assert named == {p.name for p in folder.glob("*.py")}, f"the listing of {folder} is not its files"
    line = "PACKAGES = (" + ", ".join(f'"{p}"' for p in PACKAGES) + ")"
    assert line in text, f"the registry line is not twill.kernels.PACKAGES: {line}"


def test_readme_links_the_page():
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
