"""Native solver calls that Ctrl-C and SIGTERM stop at once.

CP-SAT's ``solve`` and Yices' ``check_context`` run in native code with the GIL released. Python runs a signal
handler only when the main thread is back in the interpreter, so the ``KeyboardInterrupt`` of a Ctrl-C (or the
:class:`~twill.cli.Terminated` that ``twill``'s SIGTERM handler raises) would wait until the solver reached its
time limit. :func:`interruptible` runs the call in a helper thread while the main thread waits, which a signal
does interrupt; it then tells the solver to stop, waits for the call to return and raises the exception again.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")

#: Seconds :func:`interruptible` waits for a stopped solver call to return before raising anyway.
STOP_GRACE = 1.0


def interruptible(call: Callable[[], T], stop: Callable[[], None]) -> T:
    """``call()``, run so that an exception raised in the main thread while it runs (``KeyboardInterrupt``)
    calls ``stop()`` (which must make ``call`` return soon: CP-SAT's ``stop_search``, Yices' ``stop_search``)
    and is raised again at once, after at most :data:`STOP_GRACE` seconds for ``call`` to return.

    Outside the main thread (signals are only delivered there) ``call`` runs directly."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()

    def target() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread below
            outcome.append((False, exc))
        finally:
            done.set()

    thread = threading.Thread(target=target, name="twill-solver", daemon=True)
    thread.start()
    try:
        done.wait()
    except BaseException:
        # stop() is asked again until the call returns: a stop that comes before the solver has started its
        # search is lost (CP-SAT's stop_search does nothing before ``solve`` has set its search up)
        deadline = time.monotonic() + STOP_GRACE
        while True:
            stop()
            if done.wait(0.02) or time.monotonic() > deadline:
                break
        raise
    ok, value = outcome[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]
