"""The ``twill-graph/1`` JSON format (documented in ``docs/graph-format.md``), loaded and saved losslessly."""

from __future__ import annotations

import os
from typing import Any

from twill.errors import FormatError, GraphError
from twill.files import read_json_file, write_json_atomic
from twill.ir.graph import Edge, LoopGraph, Op
from twill.ir.validate import MAX_CYCLES, MAX_EDGES, MAX_OPS, MAX_TOTAL_CYCLES

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


def load_graph(path: str | os.PathLike) -> LoopGraph:
    """Read a ``twill-graph/1`` file."""
    return graph_from_dict(read_json_file(path, "graph"))


def save_graph(graph: LoopGraph, path: str | os.PathLike) -> None:
    """Write ``graph`` as ``twill-graph/1`` (atomically)."""
    write_json_atomic(path, graph_to_dict(graph))
