"""The ``twill-graph/1`` JSON format (documented in ``docs/graph-format.md``), loaded and saved losslessly."""

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
from typing import Any, Callable, Iterator

from twill.errors import FormatError, GraphError
from twill.ir.graph import Edge, LoopGraph, Op
from twill.ir.validate import MAX_CYCLES, MAX_EDGES, MAX_OPS, MAX_TOTAL_CYCLES

#: Largest input file Twill reads (graph, schedule, machine, Triton or TileLang source, TTGIR).
MAX_FILE_BYTES = 64 * 1024 * 1024

#: Deepest nesting of JSON arrays/objects accepted (a graph file needs 4; ``attrs`` may nest a little).
MAX_NESTING = 32

GRAPH_FORMAT = "twill-graph/1"

_OP_KEYS = {"name", "cycles", "uses", "rrt", "latency", "regs", "warps", "variable_latency", "spill_cost",
            "footprint", "kind", "warp_busy", "attrs"}
_EDGE_KEYS = {"src", "dst", "delay", "distance", "blocking"}
_TOP_KEYS = {"format", "name", "units", "ops", "edges", "attrs"}


def graph_to_dict(graph: LoopGraph) -> dict[str, Any]:
    """The JSON object for ``graph``. Uniform RRTs are written as ``uses`` + ``cycles``."""
    ops = []
    for op in graph.ops:
        d: dict[str, Any] = {"name": op.name, "cycles": op.cycles}
        if all(row == op.rrt[0] for row in op.rrt):
            d["uses"] = dict(op.rrt[0])
        else:
            d["rrt"] = [dict(row) for row in op.rrt]
        if op.kind != "op":
            d["kind"] = op.kind
        if op.latency is not None:
            d["latency"] = op.latency
        if op.regs:
            d["regs"] = op.regs
        if op.warps != 1:
            d["warps"] = op.warps
        if op.variable_latency:
            d["variable_latency"] = True
        if op.spill_cost:
            d["spill_cost"] = op.spill_cost
        footprint = {k: v for k, v in (("smem", op.smem), ("tmem", op.tmem)) if v}
        if footprint:
            d["footprint"] = footprint
        if op.warp_busy is not None:
            d["warp_busy"] = op.warp_busy
        if op.attrs:
            d["attrs"] = dict(op.attrs)
        ops.append(d)
    edges = []
    for e in graph.edges:
        d = {"src": e.src, "dst": e.dst, "delay": e.delay, "distance": e.distance}
        if e.blocking:
            d["blocking"] = True
        edges.append(d)
    out: dict[str, Any] = {"format": GRAPH_FORMAT, "name": graph.name}
    if graph.units is not None:
        out["units"] = dict(graph.units)
    out["ops"] = ops
    out["edges"] = edges
    if graph.attrs:
        out["attrs"] = dict(graph.attrs)
    return out


def _need(obj: dict, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise FormatError(f"{where}: missing required key {key!r}")
    value = obj[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        tname = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise FormatError(f"{where}: {key!r} must be {tname}, got {value!r}")
    return value


def _flag(obj: dict, key: str, where: str) -> bool:
    """A JSON boolean (``true``/``false``); a missing key is False; anything else is an error."""
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise FormatError(f"{where}: {key!r} must be true or false, got {value!r}")
    return value


def _unknown(obj: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise FormatError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(sorted(allowed))})")


def graph_from_dict(data: Any) -> LoopGraph:
    """Parse a ``twill-graph/1`` object; raise :class:`FormatError`/:class:`GraphError` naming the problem."""
    if not isinstance(data, dict):
        raise FormatError("graph file must contain a JSON object")
    fmt = data.get("format")
    if fmt != GRAPH_FORMAT:
        raise FormatError(f"unsupported graph format {fmt!r} (expected {GRAPH_FORMAT!r})")
    _unknown(data, _TOP_KEYS, "graph")
    name = _need(data, "name", str, "graph")
    units = data.get("units")
    if units is not None:
        if not isinstance(units, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in units.values()):
            raise FormatError("graph: 'units' must map unit names to integer capacities")
    op_list, edge_list = _need(data, "ops", list, "graph"), _need(data, "edges", list, "graph")
    if len(op_list) > MAX_OPS or len(edge_list) > MAX_EDGES:
        raise GraphError(f"graph has {len(op_list)} ops and {len(edge_list)} edges; Twill supports at most "
                         f"{MAX_OPS} ops and {MAX_EDGES} edges")
    ops = []
    total_cycles = 0
    for k, od in enumerate(op_list):
        if not isinstance(od, dict):
            raise FormatError(f"ops[{k}] must be an object")
        where = f"op {od.get('name', k)!r}"
        _unknown(od, _OP_KEYS, where)
        oname = _need(od, "name", str, where)
        if "rrt" in od:
            if "uses" in od:
                raise FormatError(f"{where}: give either 'uses' or 'rrt', not both")
            rrt = _need(od, "rrt", list, where)
            if "cycles" in od and od["cycles"] != len(rrt):
                raise FormatError(f"{where}: 'cycles' is {od['cycles']} but 'rrt' has {len(rrt)} rows")
            if not all(isinstance(r, dict) for r in rrt):
                raise FormatError(f"{where}: every 'rrt' row must be an object of unit counts")
            total_cycles += len(rrt)
        else:
            uses = _need(od, "uses", dict, where)
            cycles = _need(od, "cycles", int, where)
            if not 1 <= cycles <= MAX_CYCLES:
                raise GraphError(f"{where}: cycles must be in [1, {MAX_CYCLES}], got {cycles}")
            total_cycles += cycles
            if total_cycles > MAX_TOTAL_CYCLES:
                raise GraphError(f"graph has more than {MAX_TOTAL_CYCLES} op cycles in all; Twill supports at "
                                 f"most {MAX_TOTAL_CYCLES}")
            rrt = [dict(uses) for _ in range(cycles)]
        footprint = od.get("footprint", {})
        if not isinstance(footprint, dict) or set(footprint) - {"smem", "tmem"}:
            raise FormatError(f"{where}: 'footprint' may only hold 'smem' and 'tmem' byte counts")
        ops.append(Op(
            name=oname, rrt=tuple(rrt), latency=od.get("latency"), kind=od.get("kind", "op"),
            regs=od.get("regs", 0), warps=od.get("warps", 1),
            variable_latency=_flag(od, "variable_latency", where), spill_cost=od.get("spill_cost", 0),
            smem=footprint.get("smem", 0), tmem=footprint.get("tmem", 0), warp_busy=od.get("warp_busy"),
            attrs=od.get("attrs", {})))
    edges = []
    for k, ed in enumerate(edge_list):
        if not isinstance(ed, dict):
            raise FormatError(f"edges[{k}] must be an object")
        where = f"edges[{k}]"
        _unknown(ed, _EDGE_KEYS, where)
        edges.append(Edge(_need(ed, "src", str, where), _need(ed, "dst", str, where),
                          _need(ed, "delay", int, where), ed.get("distance", 0), _flag(ed, "blocking", where)))
    return LoopGraph(name, tuple(ops), tuple(edges), units, data.get("attrs", {}))


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


def load_graph(path: str | os.PathLike) -> LoopGraph:
    """Read a ``twill-graph/1`` file."""
    return graph_from_dict(read_json_file(path, "graph"))


def user_cache_dir(name: str) -> Path:
    """Twill's on-disk cache ``name`` under the user's cache directory: ``$XDG_CACHE_HOME/twill/NAME``
    (default ``~/.cache/twill/NAME``); the tuner's sweep results and the PyTorch op's kernels live there."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "twill" / name


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM are held back (delivered when the block ends) in the main thread; elsewhere, or
    where the platform has no signal masks, nothing changes."""
    import signal

    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
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
        with _signals_held():
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


def save_graph(graph: LoopGraph, path: str | os.PathLike) -> None:
    """Write ``graph`` as ``twill-graph/1`` (atomically)."""
    write_json_atomic(path, graph_to_dict(graph))
