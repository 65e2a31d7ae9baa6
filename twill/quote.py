"""Quoting of input text: the one way a string from a graph or schedule file (graph and op names, solver,
status, warp-group roles...) reaches a generated module or the terminal.

Every such string goes through one of these functions, so that in an emitted module it can only ever be text
inside a comment or a string constant, never code, and on a terminal only ever text, never a control
sequence:

* :func:`printable` for text in a ``#`` comment or printed to a terminal: characters that are not printable
  (``str.isprintable``: line breaks of any kind, control characters such as ESC, unicode separators and
  format characters, lone surrogates) are written as their Python escapes (``\\n``, ``\\x1b``, ``\\u2028``), so a
  comment ends where the renderer ends it and a report line cannot move the cursor or change colours;
* :func:`text` for text inside a string literal or docstring (and anywhere :func:`printable` is fine): as
  :func:`printable`, and backslashes and both quote characters escaped too, so the literal holds exactly the
  input text;
* :func:`literal` for a complete string literal of the input text;
* :func:`identifier` for a name generated code uses as a Python identifier: checked against
  :data:`IDENTIFIER` and refused otherwise.

Each function returns a plain name (letters, digits, ``_``, ``-``, ``.``, spaces) unchanged, so the modules
emitted for the built-in kernels and the reports of ordinary schedules do not depend on this module.
docs/codegen.md, "Input text in emitted code".
"""

from __future__ import annotations

import keyword
import re

from twill.errors import UnsupportedFeatureError

#: What :func:`identifier` accepts: an ASCII Python identifier of at most 64 characters (and not a keyword).
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

#: Escapes of :func:`text` besides those of the unprintable characters.
_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "'": "\\'"}


class UnsafeNameError(UnsupportedFeatureError):
    """An input name that generated code would use as an identifier is not one (:data:`IDENTIFIER`)."""


def _escape(ch: str) -> str:
    """The Python escape of one unprintable character, as ``repr`` writes it: ``\\n``, ``\\t``, ``\\r``,
    else ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    return repr(ch)[1:-1]


def printable(value: str) -> str:
    """``value`` safe in a ``#`` comment and on a terminal: every character that is not printable written as
    its escape (``a\\nb`` for a newline, ``\\x1b[31m`` for a colour sequence); printable text unchanged."""
    value = str(value)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in value)


def text(value: str) -> str:
    """``value`` as the body of a Python string literal (``"..."``, ``'...'`` or a triple-quoted docstring, not
    a raw one): backslashes and quotes escaped, unprintable characters as in :func:`printable`. The literal's
    value is ``value`` itself; the result is also safe in a comment. A name without backslashes, quotes or
    unprintable characters is returned unchanged; two different names never give the same text."""
    value = str(value)
    return "".join(_LITERAL_ESCAPES.get(ch) or (ch if ch.isprintable() else _escape(ch)) for ch in value)


def literal(value: str, quote: str = '"') -> str:
    """A Python string literal whose value is ``value``, between ``quote`` characters (``"load_k"`` for
    ``load_k``; ``quote="'"``: ``'load_k'``)."""
    if quote not in ("'", '"'):
        raise ValueError(f"quote must be ' or \", not {quote!r}")
    return f"{quote}{text(value)}{quote}"


def identifier(value: str, what: str = "name") -> str:
    """``value`` when it is an identifier generated code may use (:data:`IDENTIFIER`, not a keyword);
    otherwise a one-line :class:`UnsafeNameError` naming it (``what``: what the name is, for the message)."""
    if not isinstance(value, str) or not IDENTIFIER.fullmatch(value) or keyword.iskeyword(value):
        raise UnsafeNameError(f"cannot generate: {what} {value!r} is not an identifier "
                              f"(letters, digits and '_', not starting with a digit, at most 64 characters)")
    return value
