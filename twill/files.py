"""Files: how Twill reads its inputs and writes its outputs.

Reading (:func:`read_file_bytes`, :func:`read_text_file`, :func:`read_json_file`): a regular file of at most
:data:`MAX_FILE_BYTES`, every failure one :class:`~twill.errors.FormatError` line. Writing
(:func:`write_bytes_atomic` and its text and JSON forms): a temporary file renamed into place, a special file
such as ``/dev/null`` written in place; inside an :func:`output_group` every output of a command is renamed
into place only when all are written. The commands' side: :func:`check_outputs` before any work,
:func:`write_all` around the writers, :func:`write_text_output` / :func:`write_json_output` (``-`` is
stdout), :func:`print_output`. :func:`user_cache_dir` is where Twill's on-disk caches live.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from twill.errors import FormatError, TwillError

#: Largest input file Twill reads (graph, schedule, machine, Triton or TileLang source, TTGIR).
MAX_FILE_BYTES = 64 * 1024 * 1024

#: Deepest nesting of JSON arrays/objects accepted (a graph file needs 4; ``attrs`` may nest a little).
MAX_NESTING = 32


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON ``text`` (brackets inside strings skipped), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for error messages)."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _need_regular(mode: int, what: str, name: str) -> None:
    if not stat.S_ISREG(mode):
        raise FormatError(f"cannot read {what} file {name!r}: it is {_file_kind(mode)}, not a regular file")


def read_file_bytes(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_FILE_BYTES,
                    stdin: bool = False) -> bytes:
    """The bytes of the ``what`` file ``path``: a regular file (a FIFO, device, socket or directory is refused
    before anything is read, so neither ``/dev/zero`` nor a FIFO without a writer can exhaust memory or hang)
    of at most ``max_bytes``. With ``stdin``, ``-`` reads standard input (at most ``max_bytes`` too). Every
    failure is one :class:`FormatError` line."""
    name = str(path)
    if stdin and name == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        try:
            _need_regular(os.stat(path).st_mode, what, name)
            # O_NONBLOCK: a file swapped for a FIFO after the stat above does not block the open
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise FormatError(f"cannot read {what} file {name!r}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            _need_regular(st.st_mode, what, name)
            if st.st_size > max_bytes:
                raise FormatError(f"{what} file {name!r} is larger than {_size(max_bytes)}")
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb") as fh:
                fd = -1
                data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise FormatError(f"cannot read {what} file {name!r}: {exc.strerror or exc}") from None
        finally:
            if fd >= 0:
                os.close(fd)
    if len(data) > max_bytes:
        raise FormatError(f"{what} file {name!r} is larger than {_size(max_bytes)}")
    return data


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n} bytes"


def read_text_file(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_FILE_BYTES,
                   stdin: bool = False) -> str:
    """The text of the ``what`` file ``path`` (:func:`read_file_bytes`: regular, size-capped): UTF-8 without
    NUL bytes, so a binary file is one :class:`FormatError` line rather than a decoding traceback."""
    raw = read_file_bytes(path, what, max_bytes=max_bytes, stdin=stdin)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: not UTF-8 text (byte {exc.start}); {what} files are UTF-8 text") from None
    if "\0" in text:
        raise FormatError(f"{path}: contains a NUL byte (byte {text.index(chr(0))}); {what} files are text, "
                          f"not binary")
    return text


def read_json_file(path: str | os.PathLike, what: str) -> Any:
    """The JSON value in ``path`` (a ``what`` file): a regular file of at most :data:`MAX_FILE_BYTES`
    (:func:`read_file_bytes`), UTF-8, nested at most :data:`MAX_NESTING` deep; every failure is one
    :class:`FormatError` line."""
    raw = read_file_bytes(path, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: not UTF-8 text (byte {exc.start}); {what} files are UTF-8 JSON") from None
    if nesting_depth(text) > MAX_NESTING:
        raise FormatError(f"{path}: JSON nested deeper than {MAX_NESTING} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:       # e.g. an integer of more digits than Python converts
        raise FormatError(f"{path}: invalid JSON: {exc}") from None


def user_cache_dir(name: str) -> Path:
    """Twill's on-disk cache ``name`` under the user's cache directory: ``$XDG_CACHE_HOME/twill/NAME``
    (default ``~/.cache/twill/NAME``); the tuner's sweep results and the PyTorch op's kernels live there."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "twill" / name


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in the calling thread inside the block (held until it ends, then delivered);
    processes started inside it inherit them blocked. Where the platform has no signal masks, nothing changes."""
    import signal

    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _OutputGroup:
    """The outputs of one :func:`output_group`: temporary files waiting to be renamed over their targets,
    writes into special files and deferred actions (stdout), and the folders this run created."""

    def __init__(self) -> None:
        self.staged: list[tuple[Path, Any]] = []   # (target, temporary Path | bytes for a special file | callable)
        self.created_dirs: list[Path] = []

    def commit(self) -> None:
        """Rename every temporary file into place, then write the special files and stdout, in order. The
        renames run with SIGINT and SIGTERM held back (they take microseconds), so an interrupt leaves all of
        them done or none. An ``OSError`` names the output it concerns (``filename``)."""
        renames = [(target, item) for target, item in self.staged if isinstance(item, Path)]
        with stop_signals_blocked():
            for target, item in renames:
                try:
                    os.replace(item, target)
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from None
                self.staged.remove((target, item))
        while self.staged:
            target, item = self.staged.pop(0)
            try:
                if isinstance(item, bytes):
                    _write_in_place(target, item)
                else:
                    item()
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from None

    def discard(self) -> None:
        """Remove the temporary files and the (empty) folders this run created; nothing else is touched."""
        for _, item in self.staged:
            if isinstance(item, Path):
                _unlink(item)
        self.staged.clear()
        for folder in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                folder.rmdir()          # only when empty: a folder that received other files stays


_group = threading.local()


@contextlib.contextmanager
def output_group() -> Iterator[None]:
    """All or nothing for the outputs written inside the block (:func:`write_bytes_atomic`,
    :func:`defer_output`, :func:`make_output_dir`): each file is first written to a temporary file beside
    it, and only when the block ends normally are they all renamed into place (special files written,
    stdout printed). When the block raises, the temporary files and the folders it created are removed and
    every file that existed before is left as it was. Nested groups join the outermost one."""
    if getattr(_group, "current", None) is not None:
        yield
        return
    group = _group.current = _OutputGroup()
    try:
        yield
        group.commit()
    except BaseException:
        group.discard()
        raise
    finally:
        _group.current = None


def defer_output(action: Callable[[], None]) -> None:
    """Run ``action`` (e.g. printing an output on stdout) when the current :func:`output_group` commits, or
    now outside one."""
    group = getattr(_group, "current", None)
    if group is None:
        action()
    else:
        group.staged.append((Path("-"), action))


def make_output_dir(path: str | os.PathLike) -> Path:
    """Create folder ``path`` and its missing parents; inside an :func:`output_group` that fails they are
    removed again (when still empty). Raises ``OSError``."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    group = getattr(_group, "current", None)
    if group is not None:
        group.created_dirs.extend(reversed(missing))
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _write_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` into the existing special file ``path`` (a device such as ``/dev/null``, a FIFO): opened
    for writing, never truncated, replaced or removed."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path``, the one way Twill writes an output file:

    * a path that exists and is not a regular file (``/dev/null``, a FIFO, a socket) is written in place,
      never replaced;
    * otherwise ``data`` goes to a temporary file in the same folder, renamed over ``path`` only when complete:
      a failure leaves neither a half-written file nor the temporary file. A symbolic link is followed (the file
      it names is replaced, the link stays). The file keeps the mode of the file it replaces; a new one gets
      ``0666 & ~umask``, like any file a program creates.

    Inside an :func:`output_group` the rename (or the in-place write) waits until the whole group is written.
    Raises ``OSError``."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    group = getattr(_group, "current", None)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        if group is None:
            _write_in_place(path, data)
        else:
            group.staged.append((path, bytes(data)))
        return
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)             # mkstemp creates 0600
        if group is None:
            os.replace(tmp, path)
        else:
            group.staged.append((path, Path(tmp)))
    except BaseException:
        _unlink(Path(tmp))
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` (:func:`write_bytes_atomic`); text that cannot be encoded fails
    before anything is written."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write JSON to ``path`` atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def check_outputs(files: Iterable[str | None] = (), folders: Iterable[str | None] = (),
                  inputs: Iterable[str | None] = ()) -> None:
    """Before any work: every output file (``None`` and ``-`` skipped) can be written (its folder exists and
    is writable, it is not a folder) and every output folder exists as a writable folder or can be created
    in a writable one; no output file is one of the ``inputs`` (the same file by any name: a symbolic or
    hard link counts) or another output. Raises a one-line :class:`TwillError` naming the first that cannot."""
    files = [name for name in files if name not in (None, "-")]
    for name in files:
        path = Path(name)
        if path.is_dir():
            raise TwillError(f"cannot write {name!r}: it is a directory")
        if not path.parent.is_dir():
            raise TwillError(f"cannot write {name!r}: no directory {str(path.parent)!r}")
        if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise TwillError(f"cannot write {name!r}: permission denied")
    refuse_inputs_as_outputs(files, inputs)
    for name in folders:
        if name is None:
            continue
        if name == "-":
            raise TwillError("'-' (stdout) cannot receive a folder of files; give a directory")
        path = Path(name)
        if path.exists() and not path.is_dir():
            raise TwillError(f"cannot write into {name!r}: it is not a directory")
        existing = next(p for p in (path, *path.parents) if p.exists())     # "." or "/" at the latest
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            raise TwillError(f"cannot write into {name!r}: {str(existing)!r} is not a writable directory")


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same inode (links, ``..``), or, for files that do not
    exist yet, the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_inputs_as_outputs(outputs: Iterable[str | None], inputs: Iterable[str | None]) -> None:
    """A one-line :class:`TwillError` when an output file is one of the ``inputs`` (writing it would destroy
    what the command reads) or when two outputs are the same file; ``None`` and ``-`` are skipped."""
    outputs = [name for name in outputs if name not in (None, "-")]
    inputs = [name for name in inputs if name not in (None, "-")]
    for k, name in enumerate(outputs):
        for source in inputs:
            if _same_file(name, source):
                raise TwillError(f"output {name!r} is the input {source!r}; write to another file")
        for other in outputs[:k]:
            if _same_file(name, other):
                raise TwillError(f"outputs {other!r} and {name!r} are the same file; give each its own")


def refuse_stdout(name: str | None, flag: str, why: str = "it is binary") -> None:
    """A one-line :class:`TwillError` when output ``flag`` is given as ``-`` (stdout) but cannot go there."""
    if name == "-":
        raise TwillError(f"{flag} cannot be '-' (stdout): {why}; give a file")


def write_all(writers: Iterable[Callable[[], Any]]) -> None:
    """Run ``writers`` in order (each writes its files with :func:`write_text_output` or another writer of
    this module) inside one :func:`output_group`: every file is staged beside its target
    and renamed into place only when all have been written, so a command leaves all of its outputs or none,
    and a failure never removes or changes a file that existed before."""
    try:
        with output_group():
            for writer in writers:
                writer()
    except OSError as exc:          # renaming or writing into place failed
        raise TwillError(f"cannot write {exc.filename!r}: {exc.strerror or exc}") from None


def write_json_output(path: str, data: Any) -> list[Path]:
    """Write ``data`` as JSON to ``path`` (:func:`write_text_output`; ``-`` is stdout). Returns ``[path]``."""
    return write_text_output(path, json.dumps(data, indent=2) + "\n")


def write_text_output(path: str, text: str) -> list[Path]:
    """Write ``text`` to ``path`` through :func:`write_text_atomic` (no partial file, no temporary
    file left, a special file such as ``/dev/null`` written in place), or print it on stdout when ``path`` is
    ``-``; an unwritable path is a one-line :class:`TwillError`. Returns ``[path]`` (``[]`` for stdout)."""
    if path == "-":
        defer_output(lambda: print_output(text, end=""))
        return []
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise TwillError(f"cannot write {path!r}: {exc.strerror or exc}") from None
    return [Path(path)]


def message_stream(*outputs: str | None) -> Any:
    """Where a command prints its summary lines: stderr when one of its ``outputs`` is ``-`` (stdout carries
    that output), else stdout."""
    return sys.stderr if "-" in outputs else sys.stdout


def print_output(text: str, end: str = "\n") -> None:
    """Print ``text`` on stdout; a reader that closed the pipe early (``| head``) ends the command quietly."""
    try:
        print(text, end=end, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0) from None
