"""The layer rule of docs/architecture.md, checked statically with ``ast`` over every module of ``twill/``
(imports at module level and inside functions alike):

* a module imports only its own layer and the layers below it (:data:`LAYERS`, lowest first); the one
  exception is that ``twill.codegen`` finds a family's plan builder and bodies through the registry module
  ``twill.kernels`` (never a module under it);
* a renderer (``twill.codegen.gluon``, ``.pallas``, ``.tilelang``) never imports another renderer, and a
  family's body for one backend never imports another backend's renderer;
* a kernel family (``twill/kernels/<family>/``) never imports another family, and the registry
  (``twill/kernels/__init__.py``) imports no family at all (it imports them by name when asked);
* a kernel string (a family's name or alias, or one of the family role names of :data:`ROLES`) is a string
  constant only inside the folder of a family it belongs to, or where :data:`ALLOWED_STRINGS` says why.

Docstrings are prose and are not checked; every other string constant is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "twill"

#: The layers, lowest first: the packages (or top-level modules) of ``twill/`` in each. A module may import
#: its own layer and every layer below it. ``twill`` is the package's ``__init__`` (its public names, and
#: ``from_triton``, which reads a Triton kernel). docs/architecture.md shows this order verbatim
#: (:func:`layer_line`).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "quote", "files"),
    ("ir",),
    ("machine",),
    ("schedule",),
    ("solve",),
    ("codegen",),
    ("kernels",),
    ("integrations", "targets", "twill"),
    ("tune", "ops", "viz"),
    ("integrations.transformers",),
    ("commands",),
    ("cli",),
)

#: Subpackages in a layer of their own, above their package's (entries of :data:`LAYERS` with a dot): the
#: transformers integration hands a model's attention to ``twill.ops``.
SUBPACKAGE_UNITS = ("integrations.transformers",)

#: The renderers: none imports another, and a family's body for one backend imports no other's.
RENDERERS = ("gluon", "pallas", "tilelang")

#: Role names that belong to kernel families (which families: those whose graphs have an op with the role).
ROLES = ("qk", "pv", "dq", "dk", "dv")

#: Kernel strings allowed outside their family's folder, by module: each is a name of something else that
#: happens to be spelled like a kernel.
ALLOWED_STRINGS: dict[str, frozenset[str]] = {
    # the registry's one line per family: PACKAGES names the family packages (gemm, flash_fwd, ...)
    "twill/kernels/__init__.py": frozenset({"gemm", "flash_fwd"}),
    # "gemm" is also a tuning problem (M, N, K), beside "attention" (B, H, S, D): the problem's axes, default
    # sizes and the inputs the measurement allocates; the families name their problem in their tune.py
    "twill/tune/predict.py": frozenset({"gemm"}),
    "twill/tune/measure.py": frozenset({"gemm"}),
    # the calibration's microbenchmarks: the GEMM clock-model fit and the softmax step's P @ V flag
    "twill/machine/calibrate.py": frozenset({"gemm", "pv"}),
    "twill/machine/microbench.py": frozenset({"pv"}),
    # the Triton integration infers the roles of a Triton kernel's ops: that vocabulary is the families' roles
    "twill/integrations/triton/lower.py": frozenset({"qk", "pv", "dq", "dk", "dv"}),
    "twill/integrations/triton/roles.py": frozenset({"qk", "dq", "dk", "dv"}),
}


def layer_line() -> str:
    """The layer order as docs/architecture.md writes it: ``a, b -> c -> ...`` in backquotes."""
    return " -> ".join(", ".join(f"`{name}`" for name in layer) for layer in LAYERS)


# -- reading modules ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    """One import: the module that imports, the module it names, and the line."""

    importer: str
    target: str
    line: int


def module_name(path: Path) -> str:
    """``twill/codegen/gluon/render.py`` -> ``twill.codegen.gluon.render`` (a package's ``__init__`` is the
    package)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path = PACKAGE.parent) -> bool:
    """Whether ``name`` (dotted) is a module or package of the source tree under ``root``."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(name: str, source: str, is_package: bool = False,
               is_module=is_module) -> list[Import]:
    """Every ``twill`` module that module ``name`` imports, anywhere in its source: ``from a import b`` names
    ``a.b`` when ``b`` is a module, else ``a``; relative imports are resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(name, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            for alias in node.names:
                child = f"{parent}.{alias.name}"
                found.append(Import(name, child if is_module(child) else parent, node.lineno))
    found = [i for i in found if i.target == "twill" or i.target.startswith("twill.")]
    return sorted(set(found), key=lambda i: (i.line, i.target))


def string_constants(source: str) -> list[tuple[int, str]]:
    """``(line, value)`` of every string constant that is not a docstring."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


# -- the rules ----------------------------------------------------------------------------------------------
def unit(module: str) -> str:
    """The entry of :data:`LAYERS` a module belongs to: ``twill.codegen.plan`` -> ``codegen``,
    ``twill.integrations.transformers.attention`` -> ``integrations.transformers``."""
    parts = module.split(".")
    if ".".join(parts[1:3]) in SUBPACKAGE_UNITS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "twill"


def layer_of(module: str) -> int:
    name = unit(module)
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"{module}: twill/{name} is in no layer of LAYERS (add it, and to docs/architecture.md)")


def renderer(module: str) -> str | None:
    """The renderer a module belongs to (``twill.codegen.gluon.render`` -> ``gluon``), or None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "codegen" and parts[2] in RENDERERS else None


def family(module: str) -> str | None:
    """The family package a module belongs to (``twill.kernels.gemm.plan`` -> ``gemm``), or None: a package
    under ``twill/kernels/`` (the modules beside the registry, such as ``_common.py``, serve every family)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "kernels" and (PACKAGE / "kernels" / parts[2] / "__init__.py").is_file():
        return parts[2]
    return None


def import_violations(imports: list[Import]) -> list[str]:
    """Each import that breaks the layer rule, the renderer rule or the family rule, as one line."""
    bad = []
    for i in imports:
        where = f"{i.importer} (line {i.line}) imports {i.target}"
        low, high = layer_of(i.target), layer_of(i.importer)
        registry = unit(i.importer) == "codegen" and i.target == "twill.kernels"
        if low > high and not registry:
            bad.append(f"{where}: {unit(i.target)} is above {unit(i.importer)}")
        mine, theirs = renderer(i.importer), renderer(i.target)
        if mine and theirs and mine != theirs:
            bad.append(f"{where}: a renderer imports another renderer")
        mine_family, their_family = family(i.importer), family(i.target)
        if mine_family and their_family and mine_family != their_family:
            bad.append(f"{where}: a family imports another family (go through the registry, twill.kernels)")
        if i.importer == "twill.kernels" and their_family:
            bad.append(f"{where}: the registry imports a family at import time")
        backend = i.importer.rpartition(".")[2]
        if mine_family and backend in RENDERERS and theirs and theirs != backend:
            bad.append(f"{where}: the family's {backend} body imports the {theirs} renderer")
    return bad


def kernel_strings() -> dict[str, set[str]]:
    """Each kernel string -> the families (package names) it belongs to: every family's name and aliases,
    and each role of :data:`ROLES` that an op of the family's graph has on an H100 or a B200."""
    from twill.kernels import families
    from twill.machine import get_machine

    owners: dict[str, set[str]] = {}
    for fam in families():
        package = fam.package.rpartition(".")[2]
        for word in (fam.name, *fam.aliases):
            owners.setdefault(word, set()).add(package)
        for arch in ("h100", "b200"):
            roles = {op.attrs.get("role") for op in fam.build(get_machine(arch)).ops}
            for role in roles & set(ROLES):
                owners.setdefault(role, set()).add(package)
    return owners


def string_violations(path: str, module: str, source: str, owners: dict[str, set[str]],
                      allowed: dict[str, frozenset[str]] = ALLOWED_STRINGS) -> list[str]:
    """Each kernel string constant of a module outside the folders of the families it belongs to."""
    home = family(module)
    return [f"{path}:{line}: kernel string {value!r} outside twill/kernels/{{{','.join(sorted(owners[value]))}}}/"
            for line, value in string_constants(source)
            if value in owners and home not in owners[value] and value not in allowed.get(path, ())]


def modules() -> list[tuple[str, str, Path]]:
    """``(relative path, module name, path)`` of every module under ``twill/``."""
    return [(str(p.relative_to(ROOT)), module_name(p), p) for p in sorted(PACKAGE.rglob("*.py"))]


def all_imports() -> list[Import]:
    return [i for _, name, p in modules() for i in imports_of(name, p.read_text(), p.name == "__init__.py")]


# -- the tests ----------------------------------------------------------------------------------------------
def test_every_package_is_in_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__main__.py") or (p / "__init__.py").is_file()}
    names = {"twill" if n == "__init__" else n for n in names}
    placed = {n for layer in LAYERS for n in layer if n not in SUBPACKAGE_UNITS}
    assert all((PACKAGE / n.replace(".", "/") / "__init__.py").is_file() for n in SUBPACKAGE_UNITS)
    assert names == placed, f"in twill/ but in no layer: {sorted(names - placed)}; gone: {sorted(placed - names)}"


def test_no_module_imports_a_higher_layer_another_renderer_or_another_family():
    imports = all_imports()
    assert len(imports) > 300
    bad = import_violations(imports)
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_kernel_strings_stay_in_their_family():
    owners = kernel_strings()
    assert {"gemm", "flash-fwd", "flash-bwd", "paper-example", *ROLES} <= set(owners)
    bad = [line for path, name, p in modules() for line in string_violations(path, name, p.read_text(), owners)]
    assert not bad, "kernel strings outside their family:\n" + "\n".join(bad)


def test_every_allowed_string_is_still_used():
    """An allow-list entry whose string left the module goes too."""
    owners = kernel_strings()
    for path, words in ALLOWED_STRINGS.items():
        used = {value for _, value in string_constants((ROOT / path).read_text())}
        assert words <= used, f"{path}: allowed but no longer used: {sorted(words - used)}"
        assert words <= set(owners), f"{path}: not kernel strings: {sorted(words - set(owners))}"


def test_the_doc_states_the_same_layers():
    assert layer_line() in (ROOT / "docs" / "architecture.md").read_text()


# -- the checker catches planted violations -----------------------------------------------------------------
PLANTED = {
    # (module, source, is package) -> the words the violation's line must contain
    "upward": ("twill.ir.graph", "def f():\n    from twill.solve import schedule\n", "solve is above ir"),
    "relative upward": ("twill.schedule.verify", "from ..codegen import plan\n", "codegen is above schedule"),
    "renderer": ("twill.codegen.pallas.render", "from twill.codegen.gluon.render import x\n",
                 "a renderer imports another renderer"),
    "family": ("twill.kernels.flash_bwd.plan", "import twill.kernels.flash_fwd.plan\n",
               "a family imports another family"),
    "registry": ("twill.kernels", "from twill.kernels import gemm\n", "the registry imports a family"),
    "codegen to family": ("twill.codegen.plan", "from twill.kernels.gemm import plan\n",
                          "kernels is above codegen"),
    "body to other renderer": ("twill.kernels.gemm.pallas", "from twill.codegen.tilelang import render\n",
                               "the family's pallas body imports the tilelang renderer"),
    "integration to ops": ("twill.integrations.triton.launch", "from twill.ops import attention\n",
                           "ops is above integrations"),
    "ops to transformers": ("twill.ops.api", "import twill.integrations.transformers\n",
                            "integrations.transformers is above ops"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_checker_catches_a_planted_import(case):
    module, source, words = PLANTED[case]
    bad = import_violations(imports_of(module, source, is_package=module == "twill.kernels"))
    assert len(bad) >= 1 and any(words in line for line in bad), bad


def test_the_checker_allows_what_the_rule_allows():
    sources = {
        "twill.codegen.plan": "def f():\n    from twill.kernels import family\n",          # the registry
        "twill.kernels.gemm.gluon": "from twill.codegen.gluon.render import KernelBody\n",  # its own renderer
        "twill.kernels.flash_fwd.graph": "from twill.kernels import _common as k\n",         # shared helpers
        "twill.solve.modulo": "from twill.schedule.vocab import Status\n",
        "twill.cli": "import twill.commands.tune\n",
        "twill.integrations.transformers.attention": "from twill.ops import attention\n",
    }
    for module, source in sources.items():
        assert not import_violations(imports_of(module, source)), module


def test_the_checker_catches_a_planted_kernel_string():
    owners = {"gemm": {"gemm"}, "qk": {"flash_fwd", "flash_bwd"}}
    source = '"""A docstring may say gemm and "qk"."""\nKIND = "gemm"\ndef f(op):\n    return op.role == "qk"\n'
    bad = string_violations("twill/tune/x.py", "twill.tune.x", source, owners, allowed={})
    assert [line.split(": ")[0] for line in bad] == ["twill/tune/x.py:2", "twill/tune/x.py:4"]
    assert not string_violations("twill/kernels/flash_bwd/plan.py", "twill.kernels.flash_bwd.plan",
                                 'ROLE = "qk"\n', owners, allowed={})
    assert string_violations("twill/kernels/gemm/plan.py", "twill.kernels.gemm.plan", 'ROLE = "qk"\n', owners,
                             allowed={})
    assert not string_violations("twill/tune/x.py", "twill.tune.x", source, owners,
                                 allowed={"twill/tune/x.py": frozenset({"gemm", "qk"})})
