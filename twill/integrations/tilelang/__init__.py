"""TileLang integration: a kernel ``path.py:fn`` (a ``@T.prim_func``, or a factory - plain or ``@tilelang.jit`` -
called with the ``--arg NAME=VALUE`` values) -> the loop graph of its ``T.Pipelined`` loop
(:mod:`~twill.integrations.tilelang.lower`), and the kernel source rewritten with Twill's ``stage=[...]``,
``order=[...]``, or with a ``T.WSSchedule`` over ``T.ws_op``-tagged statements (:func:`rewrite_ws_source`).

A ``path.py:fn`` target is a TileLang kernel when its file imports ``tilelang`` (else it is a Triton kernel).
TileLang is imported on use (the ``tilelang`` extra).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from typing import Any, Sequence

from twill import quote
from twill.errors import FormatError, TwillError
from twill.integrations.tilelang.lower import PipelinedLoop, lower_pipelined
from twill.machine.models import Machine

__all__ = ["import_tilelang", "is_tilelang_source", "load_loop", "load_prim_func", "parse_args", "rewrite_source",
           "rewrite_ws_source", "ws_root_ops"]

_IMPORTS_TILELANG = re.compile(r"^\s*(import|from)\s+tilelang\b", re.MULTILINE)


def import_tilelang() -> Any:
    """``tilelang``, or a one-line error naming the extra to install."""
    try:
        import tilelang
    except ImportError as exc:
        raise TwillError(f"TileLang is not available ({exc}); install twill-gpu[tilelang] (README, "
                         f"'TileLang')") from None
    return tilelang


def _read(path: str) -> str:
    """The text of Python source ``path`` (:func:`twill.files.read_text_file`: a regular, size-capped UTF-8
    file, else one :class:`FormatError` line)."""
    from twill.files import read_text_file

    return read_text_file(path, "TileLang source")


def is_tilelang_source(path: str) -> bool:
    """Whether the Python file ``path`` imports ``tilelang`` (a missing file is not)."""
    return os.path.isfile(path) and bool(_IMPORTS_TILELANG.search(_read(path)))


def parse_args(items: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` strings -> keyword arguments (Python literals, else the text)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise TwillError(f"--arg takes NAME=VALUE, got {item!r}")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text
    return out


def _load_module(path: str) -> Any:
    import_tilelang()
    name = "twill_tilelang_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise TwillError(f"importing {path!r} exited (status {exc.code}); guard its script part with "
                         f"'if __name__ == \"__main__\":'") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module is one error line
        raise TwillError(f"importing {path!r} failed: {type(exc).__name__}: {exc}") from None
    return module


def _prim_func(path: str, fn: str, args: dict[str, Any]) -> Any:
    module = _load_module(path)      # imports tilelang, which puts its tvm on the path
    from tvm.tirx import PrimFunc

    obj = getattr(module, fn, None)
    if obj is None:
        raise TwillError(f"{path!r} has no {fn!r}")
    if isinstance(obj, PrimFunc):
        if args:
            raise TwillError(f"{fn!r} is a T.prim_func: it takes no --arg")
        return obj
    build = getattr(obj, "get_tir", obj)    # @tilelang.jit: the prim_func without compiling it
    if not callable(build):
        raise TwillError(f"{fn!r} in {path!r} is neither a T.prim_func nor a kernel factory")
    try:
        func = build(**args)
    except TypeError as exc:
        raise TwillError(f"calling {fn}({', '.join(f'{k}={v!r}' for k, v in args.items())}) failed: {exc}; give "
                         f"its arguments with --arg NAME=VALUE") from None
    except Exception as exc:  # noqa: BLE001 - the user's factory
        raise TwillError(f"calling {fn!r} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(func, PrimFunc):
        raise TwillError(f"{fn!r} returned {type(func).__name__}, not a T.prim_func")
    return func


def load_prim_func(path: str, fn: str, args: Sequence[str]) -> Any:
    """The prim_func of ``path:fn`` built with the ``--arg`` values ``args``."""
    if not os.path.isfile(path):
        raise FormatError(f"cannot read TileLang source {path!r}: no such file")
    return _prim_func(path, fn, parse_args(args))


def load_loop(path: str, fn: str, args: Sequence[str], machine: Machine) -> tuple[Any, PipelinedLoop]:
    """The prim_func of ``path:fn`` (built with ``args``) and its :class:`PipelinedLoop`."""
    func = load_prim_func(path, fn, args)
    return func, lower_pipelined(func, machine, fn)


def _pipelined_call(tree: ast.AST, fn: str) -> ast.Call:
    """The one ``T.Pipelined(...)`` call in function ``fn`` (nested functions included)."""
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn]
    calls = [n for f in funcs[:1] for n in ast.walk(f) if isinstance(n, ast.Call) and
             isinstance(n.func, ast.Attribute) and n.func.attr == "Pipelined"]
    if len(calls) != 1:
        raise TwillError(f"function {fn!r} has {len(calls)} T.Pipelined(...) calls in its source; twill rewrites "
                         f"exactly one")
    return calls[0]


def rewrite_source(path: str, fn: str, stage: list[int], order: list[int], note: str) -> str:
    """The source of ``path`` with the ``T.Pipelined`` call of ``fn`` given ``stage`` and ``order`` (keywords
    ``stage``, ``order`` and ``num_stages`` replaced: with ``num_stages``, TileLang 0.1.15's automatic warp
    specialization takes the loop on Hopper and ignores stage and order), and a comment ``note`` above its
    line."""
    source = _read(path)
    call = _pipelined_call(ast.parse(source), fn)
    keep = [ast.get_source_segment(source, a) for a in call.args]
    keep += [ast.get_source_segment(source, k) for k in call.keywords if k.arg not in ("num_stages", "stage",
                                                                                           "order")]
    text = f"{ast.get_source_segment(source, call.func)}({', '.join(keep)}, stage={stage}, order={order})"
    lines = source.splitlines(keepends=True)
    start = sum(len(x) for x in lines[:call.lineno - 1]) + call.col_offset
    end = sum(len(x) for x in lines[:call.end_lineno - 1]) + call.end_col_offset
    line_start = sum(len(x) for x in lines[:call.lineno - 1])
    indent = re.match(r"\s*", lines[call.lineno - 1]).group(0)
    comment = "".join(f"{indent}# {quote.printable(x)}\n" for x in note.splitlines())
    return source[:line_start] + comment + source[line_start:start] + text + source[end:]


def _alloc(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` is ``name = T.alloc_...(...)``."""
    value = getattr(stmt, "value", None) if isinstance(stmt, ast.Assign) else None
    return isinstance(value, ast.Call) and getattr(value.func, "attr", "").startswith("alloc_")


def _tagged(lines: list[str], stmt: ast.stmt, op: str, indent: str) -> list[str]:
    """``with T.ws_op(op):`` over the source lines of ``stmt`` (indented one level more): one op per statement,
    as TileLang wires a barrier only to an asynchronous copy it schedules directly."""
    body = [("    " + x if x.strip() else x) for x in lines[stmt.lineno - 1:stmt.end_lineno]]
    return [f"{indent}with T.ws_op({quote.literal(op)}):", *body]


def _loop_parts(source: str, fn: str) -> tuple[ast.Call, ast.For, list[ast.stmt], list[ast.stmt]]:
    """The ``T.Pipelined`` call of ``fn``, its ``for`` loop, the statements between the kernel's allocations and
    the loop, and the statements after the loop."""
    tree = ast.parse(source)
    call = _pipelined_call(tree, fn)
    loop = next((n for n in ast.walk(tree) if isinstance(n, ast.For) and n.iter is call), None)
    parent = next((n for n in ast.walk(tree) if loop is not None and loop in getattr(n, "body", [])), None)
    if loop is None or parent is None or loop.orelse:
        raise TwillError(f"the T.Pipelined(...) call of {fn!r} is not the iterator of a plain for loop")
    siblings = parent.body
    at = siblings.index(loop)
    first = max((i + 1 for i, s in enumerate(siblings[:at]) if _alloc(s)), default=0)
    return call, loop, siblings[first:at], siblings[at + 1:]


def ws_root_ops(path: str, fn: str, loop_id: str) -> list[str]:
    """The root-scope ops of the compute role in :func:`rewrite_ws_source`'s kernel: ``prologue<i>`` for each
    statement between the allocations and the loop, ``loop_id``, ``epilogue<i>`` for each statement after it."""
    _, _, before, after = _loop_parts(_read(path), fn)
    return [f"prologue{i}" for i in range(len(before))] + [loop_id] + [f"epilogue{i}" for i in range(len(after))]


def rewrite_ws_source(path: str, fn: str, ops: Sequence[str], schedule_lines: Sequence[str], loop_id: str,
                      note: str) -> str:
    """The source of ``path`` with the ``T.Pipelined`` loop of ``fn`` warp-specialized: ``schedule_lines`` (the
    ``T.annotate_ws_schedule(...)`` call) after the kernel's allocations, the statements between them and the
    loop each under ``with T.ws_op("prologue<i>")``, the loop as ``T.serial(extent, annotations={T.WSID:
    loop_id})`` with its i-th statement under ``with T.ws_op(ops[i])``, the statements after it each under
    ``with T.ws_op("epilogue<i>")``, and comment ``note`` above the schedule."""
    source = _read(path)
    call, loop, before, after = _loop_parts(source, fn)
    if len(loop.body) != len(ops):
        raise TwillError(f"the T.Pipelined loop of {fn!r} has {len(loop.body)} statements in its source and "
                         f"{len(ops)} tile statements; the warp-specialized rewrite tags one op per statement")
    lines = source.splitlines()
    indent = re.match(r"\s*", lines[loop.lineno - 1]).group(0)
    inner = re.match(r"\s*", lines[loop.body[0].lineno - 1]).group(0)
    start = before[0].lineno if before else loop.lineno
    out = lines[:start - 1] + [f"{indent}# {quote.printable(x)}" for x in note.splitlines()]
    out += [indent + x for x in schedule_lines]
    for i, stmt in enumerate(before):
        out += _tagged(lines, stmt, f"prologue{i}", indent)
    extent = ast.get_source_segment(source, call.args[0])
    out.append(f"{indent}for {ast.get_source_segment(source, loop.target)} in T.serial({extent}, "
               f"annotations={{T.WSID: {quote.literal(loop_id)}}}):")
    for op, stmt in zip(ops, loop.body):
        out += _tagged(lines, stmt, op, inner)
    for i, stmt in enumerate(after):
        out += _tagged(lines, stmt, f"epilogue{i}", indent)
    out += lines[(after[-1].end_lineno if after else loop.end_lineno):]
    return "\n".join(out) + "\n"
