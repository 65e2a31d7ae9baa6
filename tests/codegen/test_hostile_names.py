"""Hostile text in graph and schedule files (issue 36): names with newlines, quotes, backslashes, unicode line
separators, terminal escape sequences or mathtext reach an emitted module only inside comments and string
constants, a terminal only as printable text, a picture as written; schedule words Twill does not write
(solver, status, warp-group role, constraint family) are refused by the verification gate.

The emitted-code check is structural: the module emitted for the renamed schedule, parsed with ``ast`` and
every string constant blanked, must dump exactly as the module emitted for the built-in names. Emitting needs
no solve: the schedules are the hand-built variants of ``twill/kernels/*/variants.py``, renamed.
"""

from __future__ import annotations

import ast
import functools
import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twill.kernels.flash_bwd.variants import flash_bwd_schedule
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.kernels.gemm.variants import gemm_schedule
from twill.cli import main
from twill.codegen.gluon import emit_gluon
from twill.codegen.pallas import emit_pallas
from twill.codegen.tilelang import emit_tilelang
from twill.schedule.document import schedule_document
from twill.errors import VerificationError
from twill.ir.graph import LoopGraph
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.quote import UnsafeNameError, identifier, literal, printable, text
from twill.schedule.pipelined import format_pipelined
from twill.schedule.report import format_report
from twill.schedule.result import Schedule
from twill.schedule.verify import admit, verify

#: Names that would break out of a comment, a docstring or a string literal if written raw, or that a terminal
#: or matplotlib would interpret.
HOSTILE = (
    "x\n__import__('os').system('echo pwned')",
    "q'); __import__('os').system('echo pwned'); ('",
    'q"); __import__("os").system("echo pwned"); ("',
    '"""\nimport os\n"""',
    "'''\nimport os\n'''",
    "back\\",
    "\\",
    "a\\nb",
    "sep\u2028import os",
    "para\u2029x",
    "vt\x0bff\x0ccr\rx",
    "nul\x00x",
    "\x1b[31mred\x1b[0m",
    "$x^2$",
    "$\\frac{$",
    "{x}{{y}}",
    "# comment",
    "\\N{DIGIT ONE}",
    "lone\ud800surrogate",
)

#: Characters the fuzz test draws names from.
ALPHABET = st.sampled_from(list("ab_1 .-'\"\\\n\r\t\x0b\x0c\x00\x1b\x85\u2028\u2029\u202e$^{}#()[];:=,")
                           + ["\ud800", "é", "λ"])


# -- schedules -----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _base(case: str) -> Schedule:
    """A hand-built, verified schedule of a built-in kernel (no solve)."""
    if case == "gemm":
        return gemm_schedule(build_kernel("gemm", H100, block_m=128, block_n=128, block_k=64), H100, lag=0,
                             depth=2, warps=4)
    if case == "flash":
        return flash_schedule(build_kernel("flash-fwd", H100, subtiles=1, head_dim=128), H100, ahead=0, depth=2)
    if case == "flash2":
        return flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, head_dim=128), H100, ahead=1, depth=2)
    return flash_bwd_schedule(build_kernel("flash-bwd", H100), H100, depth=2, dq_lag=1)


def _pipelined(schedule: Schedule) -> Schedule:
    return replace(schedule, assignment={}, warps=())


#: (schedule case, emitter): every renderer and form the built-in kernels take.
EMITS = {
    "gluon gemm": ("gemm", emit_gluon),
    "gluon gemm persistent": ("gemm", functools.partial(emit_gluon, persistent=True)),
    "gluon flash": ("flash2", emit_gluon),
    "gluon flash persistent": ("flash2", functools.partial(emit_gluon, persistent=True)),
    "gluon flash-bwd": ("bwd", emit_gluon),
    "pallas gemm": ("gemm", emit_pallas),
    "pallas flash": ("flash2", emit_pallas),
    "tilelang gemm": ("gemm", emit_tilelang),
    "tilelang flash": ("flash", emit_tilelang),
    "tilelang gemm pipelined": ("gemm", lambda s: emit_tilelang(_pipelined(s))),
    "tilelang flash pipelined": ("flash", lambda s: emit_tilelang(_pipelined(s))),
}


def renamed(schedule: Schedule, names: dict[str, str], graph: str | None = None, roles: list[str] | None = None,
            **fields) -> Schedule:
    """``schedule`` with its ops renamed by ``names`` (everywhere: graph, edges, starts, warp groups), its
    graph named ``graph``, warp group ``i`` given role ``roles[i]`` and ``fields`` replaced (``solver``...)."""
    g = schedule.graph
    new = names.get
    ops = tuple(replace(op, name=new(op.name, op.name)) for op in g.ops)
    edges = tuple(replace(e, src=new(e.src, e.src), dst=new(e.dst, e.dst)) for e in g.edges)
    loop = LoopGraph(g.name if graph is None else graph, ops, edges, g.units, dict(g.attrs))
    warps = tuple(replace(w, ops=tuple(new(n, n) for n in w.ops), role=w.role if roles is None else roles[w.id])
                  for w in schedule.warps)
    return replace(schedule, graph=loop, starts={new(k, k): v for k, v in schedule.starts.items()},
                   assignment={new(k, k): v for k, v in schedule.assignment.items()},
                   warps=warps, **fields)


def hostile_names(schedule: Schedule, pool=HOSTILE) -> dict[str, str]:
    """Each op of ``schedule`` -> a distinct hostile name from ``pool`` (cycled, numbered when reused)."""
    return {op: pool[k % len(pool)] + ("" if k < len(pool) else str(k))
            for k, op in enumerate(schedule.graph.op_names)}


def code(source: str) -> str:
    """The module's code: its ``ast`` with every string constant (docstrings, literals, f-string parts)
    blanked; comments are not in the tree. Equal codes = the modules differ only in comments and strings."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def strings(source: str) -> list[str]:
    """Every string constant of the module, in tree order."""
    return [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def assert_same_code(hostile: str, benign: str) -> None:
    """``hostile`` has ``benign``'s code, and no line of it holds an unprintable character."""
    assert all(line.isprintable() for line in hostile.split("\n"))
    assert code(hostile) == code(benign)


# -- the quoting functions -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", HOSTILE)
def test_quoting_functions(name):
    assert eval(literal(name)) == name and eval(literal(name, quote="'")) == name      # noqa: S307 - a literal
    assert eval('"""' + text(name) + '"""') == name                                    # noqa: S307
    for safe in (printable(name), text(name)):
        assert safe.isprintable()
        assert code(f"x = 1  # {safe}\ny = 2\n") == code("x = 1\ny = 2\n")


def test_plain_names_are_unchanged():
    for name in ("load_k", "qk_a", "gemm", "flash-fwd", "a.b c", "λ"):
        assert printable(name) == text(name) == name and literal(name) == f'"{name}"'
    assert identifier("A_s") == "A_s"


@pytest.mark.parametrize("name", ["1a", "a-b", "a b", "", "def", "a\nb", "x" * 65, "é"])
def test_identifier_refuses_with_one_line(name):
    with pytest.raises(UnsafeNameError) as info:
        identifier(name, "shared buffer")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot generate: shared buffer {name!r} is not")


# -- (a) adversarial names through every renderer --------------------------------------------------------
@pytest.mark.parametrize("emit", sorted(EMITS))
def test_hostile_names_are_only_text_in_the_emitted_module(emit):
    case, emitter = EMITS[emit]
    base = _base(case)
    verify(base, H100)
    benign = emitter(base)
    for shift in range(3):          # every op meets several hostile names
        pool = HOSTILE[shift:] + HOSTILE[:shift]
        names = hostile_names(base, pool)
        roles = [pool[w.id % len(pool)] for w in base.warps]
        hostile = emitter(renamed(base, names, graph=pool[-1], roles=roles, solver=pool[1]))
        assert_same_code(hostile, benign)


def test_tilelang_ws_ids_hold_the_hostile_names():
    base = _base("gemm")
    names = hostile_names(base)
    source = emit_tilelang(renamed(base, names))
    ids = set(strings(source))
    for op in ("load_a", "load_b", "mma"):
        assert names[op] in ids


def _write(tmp_path, name: str, schedule: Schedule):
    path = tmp_path / name
    path.write_text(json.dumps(schedule_document(schedule)))
    return path


@pytest.mark.parametrize("backend,case", [("gluon", "gemm"), ("pallas", "flash2"), ("tilelang", "flash")])
def test_cli_emits_hostile_names_as_text(tmp_path, capsys, backend, case):
    """``twill emit BACKEND --schedule FILE`` with hostile op and graph names: the module's code is the code of
    the module emitted for the built-in names."""
    base = _base(case)
    hostile = renamed(base, hostile_names(base), graph="g\n__import__('os').system('echo pwned')\n#")
    out = {}
    for label, schedule in (("benign", base), ("hostile", hostile)):
        target = tmp_path / f"{label}.py"
        assert main(["emit", backend, "--schedule", str(_write(tmp_path, f"{label}.json", schedule)),
                     "-o", str(target)]) == 0
        out[label] = target.read_text(encoding="utf-8")
    capsys.readouterr()
    assert_same_code(out["hostile"], out["benign"])
    assert "pwned" in out["hostile"]


# -- (b) fuzz: random hostile names through every renderer ----------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), emit=st.sampled_from(sorted(EMITS)))
def test_fuzz_names_through_the_renderers(data, emit):
    case, emitter = EMITS[emit]
    base = _base(case)
    ops = base.graph.op_names
    names = data.draw(st.lists(st.text(ALPHABET, min_size=1, max_size=12), min_size=len(ops), max_size=len(ops),
                               unique=True), label="op names")
    graph = data.draw(st.text(ALPHABET, max_size=12), label="graph name")
    solver = data.draw(st.text(ALPHABET, max_size=12), label="solver")
    roles = data.draw(st.lists(st.text(ALPHABET, max_size=8), min_size=len(base.warps), max_size=len(base.warps)),
                      label="roles")
    hostile = emitter(renamed(base, dict(zip(ops, names)), graph=graph, roles=roles, solver=solver))
    assert_same_code(hostile, _benign(emit))


@functools.lru_cache(maxsize=None)
def _benign(emit: str) -> str:
    case, emitter = EMITS[emit]
    return emitter(_base(case))


# -- (c) the gate refuses schedule words Twill does not write ------------------------------------------
def _document(**changes) -> dict:
    doc = schedule_document(_base("gemm"))
    doc.update(changes)
    return doc


@pytest.mark.parametrize("change,word", [
    ({"solver": "cpsat\n__import__('os').system('echo pwned')  #"}, "solver"),
    ({"solver": "gurobi"}, "solver"),
    ({"warps": "role"}, "role"),
    ({"stats": {"blocked_by": ["warp_count", "magic"]}}, "family"),
    ({"stats": {"blocked_by": ["register_file+\x1b[31m"]}}, "family"),
    ({"stats": {"tried": [{"ii": 1, "relaxed": ["nonsense"]}]}}, "family"),
])
def test_gate_refuses_unknown_words(tmp_path, capsys, change, word):
    doc = _document(**{k: v for k, v in change.items() if k != "warps"})
    if "warps" in change:
        doc["warps"][0]["role"] = "load\n__import__('os').system('echo pwned')  #"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "k.py"
    assert main(["emit", "gluon", "--schedule", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.isascii() and "\x1b" not in err
    assert f"VOCABULARY: " in err and (f"unknown {word}" in err or f"unknown constraint {word}" in err)
    assert not out.exists()


def test_gate_refuses_unknown_status():
    doc = _document(status="optimal\nimport os")
    with pytest.raises(Exception) as info:
        Schedule.from_dict(doc, _base("gemm").graph)
    assert "unknown schedule status" in str(info.value)


def test_gate_accepts_the_words_twill_writes():
    base = _base("gemm")
    for solver in ("cpsat", "yices", "manual"):
        admit(replace(base, solver=solver, stats={"blocked_by": ["warp_count", "register_file+cross_warp_spills"],
                                                  "tried": [{"ii": 1, "relaxed": ["concurrency"]}]}), H100)
    with pytest.raises(VerificationError, match="VOCABULARY: warp group 0 has unknown role 'boss'"):
        admit(replace(base, warps=(replace(base.warps[0], role="boss"), *base.warps[1:])), H100)


def test_every_solver_option_is_a_schedule_solver():
    from twill.schedule.vocab import SCHEDULE_SOLVERS
    from twill.solve.options import SOLVERS

    assert set(SOLVERS) <= set(SCHEDULE_SOLVERS)


# -- (d) terminals and pictures -------------------------------------------------------------------------
def test_report_escapes_control_characters():
    base = _base("gemm")
    names = {"load_a": "\x1b[31mred\x1b[0m", "load_b": "a\nb", "mma": "\x9b2J", "mma_wait": "rtl\u202eevil"}
    hostile = renamed(base, names, graph="\x1b]0;title\x07")
    for rendered in (format_report(hostile, H100), format_pipelined(hostile)):
        assert all(line.isprintable() for line in rendered.split("\n"))
        assert "\\x1b[31mred\\x1b[0m" in rendered and "\\x9b2J" in rendered
    assert format_report(base, H100) == format_report(renamed(base, {}), H100)


def test_cli_error_line_escapes_control_characters(tmp_path, capsys):
    """A verifier message names ops as they are (``DEPENDENCE: mma->wait ...``); the CLI's error line shows
    their control characters escaped, on one line."""
    base = _base("gemm")
    names = {"mma": "\x1b[2Jm\nm", "mma_wait": "w\u2028w"}
    broken = replace(base, starts={**base.starts, "mma_wait": base.starts["mma"]})
    path = _write(tmp_path, "s.json", renamed(broken, names))
    assert main(["emit", "gluon", "--schedule", str(path), "-o", str(tmp_path / "k.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.isprintable() is False and err[:-1].isprintable()
    assert "DEPENDENCE: \\x1b[2Jm\\nm->w\\u2028w" in err


@pytest.mark.parametrize("picture", ["timeline", "mrt", "graph", "pressure"])
def test_pictures_draw_mathtext_names_as_written(picture):
    pytest.importorskip("matplotlib")
    from twill.viz import _mpl, figure

    base = _base("gemm")
    names = {"load_a": "$x^$", "load_b": "$\\bad{$", "mma": "$x^2$", "mma_wait": "a$b"}
    svg = _mpl.render(figure(picture, renamed(base, names, graph="$g^$"), H100), "svg").decode()
    assert "<svg" in svg


def test_tilelang_rewrite_quotes_op_names_and_the_note():
    """``twill inject`` on a TileLang kernel with a schedule file: the op names tag statements as string
    literals and the note (solver, status, op names) stays in its comments."""
    from pathlib import Path

    from twill.codegen.tilelang.ws import LOOP_ID, Sync, WSDesign, ws_schedule_source
    from twill.integrations.tilelang import rewrite_source, rewrite_ws_source

    gemm = str(Path(__file__).parents[2] / "examples" / "tilelang" / "gemm.py")
    benign_ops, hostile_ops = ["a", "b", "c"], list(HOSTILE[:3])

    def design(ops):
        return WSDesign(8, (("load", 0, 1, 24, ops[0] + " budget 24"), ("compute0", 4, 8, 240, ops[1])),
                        (("A_s_B_s", ("A_s", "B_s"), 2, ops[2]),),
                        {"load": (Sync("producer_acquire", "A_s_B_s", 0), ops[0], ops[1],
                                  Sync("producer_commit", "A_s_B_s", 0)),
                         "compute0": (Sync("consumer_wait", "A_s_B_s", 0), ops[2],
                                      Sync("consumer_release", "A_s_B_s", 0))})

    def rewritten(ops, note):
        lines = ws_schedule_source(design(ops), {"load": [LOOP_ID], "compute0": [LOOP_ID]})
        return rewrite_ws_source(gemm, "matmul", ops, lines, LOOP_ID, note)

    assert_same_code(rewritten(hostile_ops, "\n".join(HOSTILE)), rewritten(benign_ops, "note"))
    assert set(hostile_ops) <= set(strings(rewritten(hostile_ops, "note")))
    assert_same_code(rewrite_source(gemm, "matmul", [0, 0, 3], [1, 2, 0], "\r\n".join(HOSTILE)),
                     rewrite_source(gemm, "matmul", [0, 0, 3], [1, 2, 0], "note"))
    with pytest.raises(UnsafeNameError, match="shared buffer 'A_s\\)'"):
        ws_schedule_source(replace(design(benign_ops), pipelines=(("p", ("A_s)",), 2, "why"),)), {})
