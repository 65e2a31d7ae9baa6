"""The result of scheduling: start cycles, stages, warp groups; the ``twill-schedule/1`` JSON format.

Times are in the units of the graph the solver saw (normalized cycles when cost normalization is on;
``Schedule.graph`` is that graph and ``stats["normalization"]`` maps back to raw cycles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Mapping

from twill.errors import FormatError
from twill.ir.graph import Edge, LoopGraph, frozen_attrs
from twill.ir.semantics import carried_consumers
from twill.ir.validate import MAX_DEPTH
from twill.schedule.vocab import SCHEDULE_STATUSES

SCHEDULE_FORMAT = "twill-schedule/1"


@dataclass(frozen=True)
class WarpGroup:
    """A set of warps that runs the same ops (a Gluon partition).

    Attributes:
        id: index in ``Schedule.warps``; ``ScheduledOp.warp`` refers to it.
        role: readable role (``load``, ``mma``, ``compute``, ``softmax``, ``correction``...).
        num_warps: warps in the group (1, 4, 8).
        regs: per-thread register budget (``setmaxnreg`` value) for the group.
        ops: names of the ops the group executes, in steady-state order.
    """

    id: int
    role: str
    num_warps: int
    regs: int
    ops: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))


@dataclass(frozen=True)
class Schedule:
    """A modulo schedule (optionally with a warp assignment) of ``graph`` at initiation interval ``ii``.

    Attributes:
        graph: the loop graph the start times refer to.
        arch: machine name (``h100``).
        solver: the solver that produced it (``cpsat``, ``yices``, ``manual``).
        status: ``optimal`` (II and L proved minimal), ``feasible`` (best found within the time limit).
        ii: initiation interval.
        ii_lower_bound: max(ResMII, RecMII), or a better proven bound.
        starts: op name -> start cycle of iteration 0 (the modulo schedule M).
        assignment: op name -> warp-group id, or empty for a schedule without warp specialization.
        warps: the warp groups, or empty.
        solve_seconds: wall time of the search.
        streaming_depth: buffers in flight for streaming (TMA) loads, a tuning parameter (paper §5.3).
        stats: solver statistics and explanations (``res_mii``, ``rec_mii``, ``normalization``, ``gap``,
            ``blocked_by``, ``tried``, ``objectives``, ``variables``, ``constraints``...).
        graph_digest: the SHA-256 (hex) of the loop graph the schedule was solved for, before normalization
            (:func:`twill.ir.digest.graph_digest`), or None when not known (a schedule written by hand or by
            an older Twill).
    """

    graph: LoopGraph
    arch: str
    solver: str
    status: str
    ii: int
    ii_lower_bound: int
    starts: Mapping[str, int]
    assignment: Mapping[str, int] = field(default_factory=dict)
    warps: tuple[WarpGroup, ...] = ()
    solve_seconds: float = 0.0
    streaming_depth: int = 2
    stats: Mapping[str, Any] = field(default_factory=dict)
    graph_digest: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", MappingProxyType(dict(self.starts)))
        object.__setattr__(self, "assignment", MappingProxyType(dict(self.assignment)))
        object.__setattr__(self, "warps", tuple(self.warps))
        object.__setattr__(self, "stats", frozen_attrs(self.stats))
        if self.status not in SCHEDULE_STATUSES:
            raise FormatError(f"unknown schedule status {self.status!r}")
        if self.ii < 1:
            raise FormatError(f"initiation interval must be >= 1, got {self.ii}")
        if not isinstance(self.streaming_depth, int) or not 1 <= self.streaming_depth <= MAX_DEPTH:
            raise FormatError(f"streaming depth must be an integer in [1, {MAX_DEPTH}], got {self.streaming_depth!r}")
        missing = set(self.graph.op_names) - set(self.starts)
        if missing:
            raise FormatError(f"schedule has no start time for op {sorted(missing)[0]!r}")

    # -- derived quantities ------------------------------------------------------------------------------
    def start(self, name: str) -> int:
        return self.starts[name]

    def stage(self, name: str) -> int:
        """Pipeline stage ⌊t / II⌋."""
        return self.starts[name] // self.ii

    def carried(self) -> tuple[str, ...]:
        """The register values (ops with ``regs > 0``) that a consumer in a later stage reads, over distance-0
        edges (:func:`~twill.ir.semantics.carried_consumers`), in graph order: values the loop body holds from
        one trip into the next, beside the accumulators. What :attr:`SolveOptions.excluded_carries
        <twill.solve.options.SolveOptions.excluded_carries>` names."""
        return tuple(op.name for op in self.graph.ops
                     if any(self.stage(u) > self.stage(op.name) for u in carried_consumers(self.graph, op.name)))

    def register_order(self) -> tuple[str, ...]:
        """The ops with a register result (``regs > 0``) by start time (graph order among equal starts): what
        :attr:`SolveOptions.excluded_orders <twill.solve.options.SolveOptions.excluded_orders>` names."""
        index = {op.name: k for k, op in enumerate(self.graph.ops)}
        return tuple(sorted((op.name for op in self.graph.ops if op.regs > 0),
                            key=lambda n: (self.starts[n], index[n])))

    def residue(self, name: str) -> int:
        """Cycle within the steady state, t mod II."""
        return self.starts[name] % self.ii

    @property
    def length(self) -> int:
        """Schedule length L = max over ops of start + cycles."""
        return max(self.starts[op.name] + op.cycles for op in self.graph.ops)

    @property
    def num_stages(self) -> int:
        return max(self.stage(n) for n in self.graph.op_names) + 1

    @property
    def copies(self) -> int:
        """⌈L / II⌉: overlapped copies of the iteration in the pipelined program."""
        return math.ceil(self.length / self.ii)

    def steady_state_order(self) -> list[str]:
        """Ops in steady-state emission order: by t mod II, then older iterations (higher stage) first."""
        return list(self._positions)

    @cached_property
    def _positions(self) -> dict[str, int]:
        """Op -> position in the steady-state order (computed once: O(n log n))."""
        names = self.graph.op_names
        ranked = sorted(range(len(names)), key=lambda k: (self.residue(names[k]), -self.stage(names[k]), k))
        return {names[k]: pos for pos, k in enumerate(ranked)}

    def order(self, name: str) -> int:
        """Position of ``name`` in :meth:`steady_state_order`."""
        return self._positions[name]

    def warp_of(self, name: str) -> WarpGroup | None:
        if name not in self.assignment:
            return None
        return self.warps[self.assignment[name]]

    def buffer_depth(self, edge: Edge) -> int:
        """Copies of ``edge.src``'s result in flight: stage(dst) + distance - stage(src) + 1; streaming loads
        use at least their least depth (``LoopGraph.least_depth``)."""
        depth = self.stage(edge.dst) + edge.distance - self.stage(edge.src) + 1
        return max(depth, self.graph.least_depth(edge.src, self.streaming_depth))

    def result_depth(self, name: str, streaming_depth: int | None = None) -> int:
        """Buffers allocated for ``name``'s result (docs/model.md §4): 1 for an accumulator (updated in place)
        or a value no other op reads, else max over out-edges to other ops of stage(dst) + distance -
        stage(name) + 1; streaming loads at least their least depth (``LoopGraph.least_depth`` with
        ``streaming_depth``, default: the schedule's)."""
        op = self.graph.op(name)
        edges = [e for e in self.graph.out_edges(name) if e.dst != name]
        depth = 1
        if edges and not op.attrs.get("accumulator", False):
            depth = max(1, max(self.stage(e.dst) + e.distance - self.stage(name) + 1 for e in edges))
        return max(depth, self.graph.least_depth(
            name, self.streaming_depth if streaming_depth is None else streaming_depth))

    def buffers(self) -> list[dict[str, Any]]:
        return [{"src": e.src, "dst": e.dst, "depth": self.buffer_depth(e)} for e in self.graph.edges]

    # -- JSON --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        ops = []
        for name in self.graph.op_names:
            d: dict[str, Any] = {"name": name, "start": self.starts[name], "stage": self.stage(name),
                                 "order": self.order(name)}
            if name in self.assignment:
                d["warp"] = self.assignment[name]
            ops.append(d)
        out: dict[str, Any] = {
            "format": SCHEDULE_FORMAT, "graph": self.graph.name, "arch": self.arch, "solver": self.solver,
            "status": self.status, "ii": self.ii, "ii_lower_bound": self.ii_lower_bound,
            "length": self.length, "stages": self.num_stages, "solve_seconds": round(self.solve_seconds, 3),
            "streaming_depth": self.streaming_depth, "ops": ops, "buffers": self.buffers(),
        }
        if self.warps:
            out["warps"] = [{"id": w.id, "role": w.role, "num_warps": w.num_warps, "regs": w.regs,
                             "ops": list(w.ops)} for w in self.warps]
        if self.stats:
            out["stats"] = _jsonable(dict(self.stats))
        if self.graph_digest is not None:
            out["graph_digest"] = self.graph_digest
        return out

    @classmethod
    def from_dict(cls, data: Any, graph: LoopGraph) -> "Schedule":
        """Rebuild a schedule from its JSON object and the graph it refers to (stage/order are re-derived
        and must match)."""
        if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
            raise FormatError(f"not a {SCHEDULE_FORMAT} object")
        try:
            if data["graph"] != graph.name:
                raise FormatError(f"schedule is for graph {data['graph']!r}, not {graph.name!r}")
            ops = _objects(data["ops"], "ops")
            names = [_text(o["name"], "op name") for o in ops]
            if sorted(names) != sorted(graph.op_names):
                raise FormatError(f"schedule ops {_diff(names, graph.op_names)} do not match the graph's ops")
            starts = {o["name"]: _integer(o["start"], f"start of op {o['name']!r}") for o in ops}
            assignment = {o["name"]: _integer(o["warp"], f"warp of op {o['name']!r}") for o in ops if "warp" in o}
            warps = tuple(WarpGroup(_integer(w["id"], "warp group id"), _text(w["role"], "role"),
                                    _integer(w["num_warps"], "num_warps"), _integer(w["regs"], "regs"),
                                    tuple(_text(n, "op name") for n in _list(w["ops"], f"warps[{k}].ops")))
                          for k, w in enumerate(_objects(data.get("warps", []), "warps")))
            stats = data.get("stats", {})
            if not isinstance(stats, dict):
                raise FormatError("'stats' must be an object")
            check_stats(stats)
            seconds = data.get("solve_seconds", 0)
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
                raise FormatError(f"'solve_seconds' must be a number, got {seconds!r}")
            sched = cls(graph=graph, arch=_text(data["arch"], "arch"), solver=_text(data["solver"], "solver"),
                        status=data["status"], ii=_integer(data["ii"], "ii"),
                        ii_lower_bound=_integer(data["ii_lower_bound"], "ii_lower_bound"), starts=starts,
                        assignment=assignment, warps=warps, solve_seconds=float(seconds),
                        streaming_depth=_integer(data.get("streaming_depth", 2), "streaming_depth"), stats=stats,
                        graph_digest=_digest(data.get("graph_digest")))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"malformed {SCHEDULE_FORMAT} object: {exc!r}") from None
        for o in data["ops"]:
            if "stage" in o and o["stage"] != sched.stage(o["name"]):
                raise FormatError(f"op {o['name']!r}: stage {o['stage']} does not match start {o['start']} "
                                  f"at II {sched.ii}")
        return sched


def _list(value: Any, what: str) -> list[Any]:
    """``value`` when it is a JSON array, else a :class:`FormatError` naming ``what``."""
    if not isinstance(value, list):
        raise FormatError(f"'{what}' must be an array, got {type(value).__name__}")
    return value


def _objects(value: Any, what: str) -> list[dict[str, Any]]:
    """``value`` when it is a JSON array of objects, else a :class:`FormatError` naming ``what``."""
    for k, item in enumerate(_list(value, what)):
        if not isinstance(item, dict):
            raise FormatError(f"'{what}[{k}]' must be an object, got {type(item).__name__}")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


#: ``stats`` entries that Twill reads back (the report, the prediction, the verifier) and that must be
#: non-negative integers; :func:`check_stats` checks them and the other entries it reads. Entries it does not
#: read (explanations, ``blocked_by``...) are kept as they are.
STATS_COUNTS = ("res_mii", "rec_mii", "mii", "modulo_ii", "length", "length_lower_bound", "copies", "stages",
                "smem_bytes", "res_mii_cycles", "variables", "constraints", "reg_limit", "max_warps")


def check_stats(stats: Mapping[str, Any]) -> None:
    """Check the ``stats`` of a schedule file where Twill reads it back: the :data:`STATS_COUNTS` are
    non-negative integers, ``gap`` a non-negative number, ``proven`` an object of booleans, ``tried`` and
    ``objectives`` arrays of objects (a ``tried`` row's ``ii`` an integer), ``normalization`` the record of
    :meth:`twill.solve.normalize.Normalization.to_dict` (or ``{"enabled": false}``), ``compiled`` an object of
    counts and ``registers`` an object whose ``steps`` are objects. Raises a :class:`FormatError` naming the
    first entry that is not."""
    def bad(key: str, want: str) -> FormatError:
        return FormatError(f"stats '{key}' must be {want}, got {stats[key]!r}"[:300])

    for key in STATS_COUNTS:
        if key in stats and not _count(stats[key]):
            raise bad(key, "a non-negative integer")
    if "gap" in stats and stats["gap"] is not None and not _number(stats["gap"]):
        raise bad("gap", "a non-negative number")
    if "proven" in stats and (not isinstance(stats["proven"], dict)
                              or not all(isinstance(v, bool) for v in stats["proven"].values())):
        raise bad("proven", "an object of true/false")
    for key in ("tried", "objectives"):
        if key in stats and (not isinstance(stats[key], list) or not all(isinstance(r, dict) for r in stats[key])):
            raise bad(key, "an array of objects")
    if any(not _count(row.get("ii", 0)) for row in stats.get("tried", ())):
        raise bad("tried", "rows whose 'ii' is an integer")
    norm = stats.get("normalization")
    if norm is not None:
        if not isinstance(norm, dict) or not isinstance(norm.get("enabled", True), bool):
            raise bad("normalization", "an object with 'enabled' true or false")
        mapping = norm.get("map", {})
        fields_ok = (all(_count(norm.get(k, 0)) for k in ("F", "U"))
                     and _number(norm.get("cycles_per_unit", 1)) and norm.get("cycles_per_unit", 1) > 0
                     and _number(norm.get("max_relative_error", 0))
                     and isinstance(norm.get("proven", False), bool)
                     and isinstance(norm.get("floored", []), list) and all(_count(v) for v in norm.get("floored", []))
                     and isinstance(mapping, dict)
                     and all(isinstance(k, str) and k.isascii() and k.isdigit() and _count(v) for k, v in mapping.items()))
        if not fields_ok:
            raise bad("normalization", "a normalization record (integer 'map', 'F', 'U' and 'floored', a positive "
                                       "'cycles_per_unit')")
    compiled = stats.get("compiled")
    if compiled is not None and (not isinstance(compiled, dict)
                                 or not all(v is None or _count(v) for v in compiled.values())):
        raise bad("compiled", "an object of non-negative integers")
    registers = stats.get("registers")
    if registers is not None:
        steps = registers.get("steps", []) if isinstance(registers, dict) else None
        if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("ptxas", {}), dict)
                                                  for s in steps):
            raise bad("registers", "an object whose 'steps' are objects with a 'ptxas' object")


def _integer(value: Any, what: str) -> int:
    """``value`` when it is a JSON integer (not a boolean, float or string), else a :class:`FormatError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{what} must be an integer, got {value!r}")
    return value


def _digest(value: Any) -> str | None:
    """``graph_digest``: absent (None), or 64 lowercase hex digits."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise FormatError(f"'graph_digest' must be 64 lowercase hex digits, got {value!r}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{what} must be a string, got {value!r}")
    return value


def _diff(names: list[str], expected: tuple[str, ...]) -> str:
    """The first difference between the schedule's op names and the graph's, for an error message."""
    extra = sorted(set(names) - set(expected))
    missing = sorted(set(expected) - set(names))
    if extra:
        return f"(unknown op {extra[0]!r})"
    if missing:
        return f"(no start for op {missing[0]!r})"
    return "(an op is listed twice)"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 6)
    return value
