"""Matplotlib plumbing shared by the pictures: figures on the Agg canvas (never pyplot, so no global
backend is switched), deterministic SVG output with text kept as text, and atomic writes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from twill.errors import TwillError, UnsupportedFeatureError

#: Picture formats by file suffix.
FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf"}

#: Resolution of PNG pictures.
DPI = 110

#: rcParams in force while a picture is saved: SVG text stays searchable text, ids are reproducible.
SAVE_RC = {"svg.fonttype": "none", "svg.hashsalt": "twill", "font.family": "DejaVu Sans"}

#: Metadata that would make two saves of the same picture differ.
_NO_DATE = {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}, "png": {}}


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches on an Agg canvas."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def picture_format(path: Path) -> str:
    """The format named by ``path``'s suffix, or a one-line error listing the supported ones."""
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise UnsupportedFeatureError(f"cannot write picture {str(path)!r}: unknown format "
                                      f"{path.suffix or '(no suffix)'!r}; use {', '.join(FORMATS)}") from None


def render(fig: Figure, fmt: str) -> bytes:
    """The picture encoded as ``fmt``."""
    buffer = io.BytesIO()
    with matplotlib.rc_context(SAVE_RC):
        fig.savefig(buffer, format=fmt, dpi=DPI, metadata=_NO_DATE[fmt], bbox_inches="tight")
    return buffer.getvalue()


def svg_markup(fig: Figure) -> str:
    """The figure as an ``<svg>`` element to inline in HTML (XML declaration and doctype removed)."""
    text = render(fig, "svg").decode("utf-8")
    return text[text.index("<svg"):]


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`twill.files.write_bytes_atomic` (temporary file + rename, a
    special file written in place, the usual mode; part of an enclosing output group). The directory must
    exist; an OS error becomes a one-line :class:`~twill.errors.TwillError` naming the path."""
    from twill.files import write_bytes_atomic

    path = Path(path)
    try:
        write_bytes_atomic(path, data)
    except OSError as exc:
        raise TwillError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    return path


def make_directory(directory: Path) -> Path:
    """Create ``directory`` (and parents) if missing (removed again when its output group fails); an OS error
    becomes a one-line TwillError."""
    from twill.files import make_output_dir

    try:
        make_output_dir(directory)
    except OSError as exc:
        raise TwillError(f"cannot create directory {str(directory)!r}: {exc.strerror or exc}") from None
    return directory


def save_figure(fig: Figure, path: Path) -> Path:
    """Save ``fig`` to ``path`` in the format of its suffix, atomically."""
    path = Path(path)
    return write_atomic(path, render(fig, picture_format(path)))


def text_fits(label: str, width_pt: float, height_pt: float, fontsize: float) -> bool:
    """Whether ``label`` at ``fontsize`` fits a box of ``width_pt`` x ``height_pt`` points (DejaVu Sans
    averages about 0.6 em per character)."""
    return 0.6 * fontsize * len(label) <= width_pt - 2 and fontsize * 1.2 <= height_pt


def darker(color: str, factor: float = 0.6) -> tuple[float, float, float]:
    """``color`` with each RGB channel scaled by ``factor`` (bar outlines)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r * factor, g * factor, b * factor)


def legend_kwargs(**extra: Any) -> dict[str, Any]:
    """Common legend style: small, framed, outside clutter."""
    base: dict[str, Any] = {"fontsize": 8, "frameon": True, "framealpha": 0.9}
    base.update(extra)
    return base
