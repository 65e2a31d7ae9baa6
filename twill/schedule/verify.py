"""Independent verifier: re-checks a schedule against the model's formulas without any solver code.

Families (each violation message starts with its name and names the ops involved):

* ``START`` — every op has an integer start ``t_v ≥ 0``;
* ``DEPENDENCE`` — ``t_dst + δ·II ≥ t_src + d`` for every edge;
* ``CAPACITY`` — for every unit ``f`` and residue ``r ∈ [0, II)``:
  ``Σ_v Σ_{c : (t_v + c) mod II = r} RRT[v][c][f] ≤ cap(f)`` (graph units override the machine's);
* ``UNIT`` — every unit an op uses exists;
* ``BOUND`` / ``STATUS`` — ``II ≥ max(ResMII, RecMII)`` recomputed from the graph and ``II ≥
  ii_lower_bound``; at most ``MAX_COPIES`` overlapped copies; ``optimal`` implies ``II = ii_lower_bound``
  and every entry of ``stats["proven"]``; recorded length / copies / stage statistics match the start times;
* warp-specialization families, through ``twill.schedule.verify_ws.ws_violations`` when the schedule has a
  warp assignment;
* ``EXCLUDED`` — the schedule carries no set of ``options.excluded_carries`` whole and repeats no order of
  ``options.excluded_orders``;
* ``VOCABULARY`` — the words a schedule file gives are words Twill writes: ``solver`` (``cpsat``, ``yices``,
  ``manual``), ``status``, each warp group's ``role`` and the constraint families of ``stats["blocked_by"]``
  and of the ``relaxed`` field of ``stats["tried"]`` rows (:mod:`twill.schedule.vocab`). Nothing else is
  checked when one is unknown: its text is not trusted further.
"""

from __future__ import annotations

from typing import Any, Mapping

from twill.errors import VerificationError
from twill.ir.bounds import rec_mii, res_mii
from twill.ir.validate import effective_units, validate_graph
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.schedule.verify_ws import ws_violations
from twill.schedule.vocab import SCHEDULE_SOLVERS, SCHEDULE_STATUSES, WARP_ROLES, Family, Status

#: Most copies of an iteration (⌈L/II⌉) a schedule may overlap; the built-in kernels need at most 4.
MAX_COPIES = 256


def start_violations(schedule: Schedule) -> list[str]:
    """START: integer starts, none negative."""
    out = []
    for name in schedule.graph.op_names:
        t = schedule.starts[name]
        if not isinstance(t, int) or isinstance(t, bool):
            out.append(f"START: op {name!r} has a non-integer start {t!r}")
        elif t < 0:
            out.append(f"START: op {name!r} starts at {t} < 0")
    return out


def dependence_violations(schedule: Schedule) -> list[str]:
    """DEPENDENCE: ``t_dst + δ·II ≥ t_src + d``."""
    out = []
    ii, t = schedule.ii, schedule.starts
    for e in schedule.graph.edges:
        lhs = t[e.dst] + e.distance * ii
        if lhs < t[e.src] + e.delay:
            left = f"t({e.dst})={t[e.dst]}" if e.distance == 0 else \
                f"t({e.dst})+{e.distance}·{ii}={lhs}"
            out.append(f"{Family.DEPENDENCE.heading}: {e.src}->{e.dst} (d={e.delay}, δ={e.distance}) "
                       f"violated: {left} < t({e.src})+{e.delay}={t[e.src] + e.delay}")
    return out


def modulo_usage(schedule: Schedule) -> dict[str, dict[int, dict[str, int]]]:
    """Per unit, per residue ``r`` that some op uses: op name -> instances of the unit it holds at ``r``
    (sparse: linear in the ops' cycles whatever the II)."""
    ii = schedule.ii
    usage: dict[str, dict[int, dict[str, int]]] = {}
    for op in schedule.graph.ops:
        start = schedule.starts[op.name]
        for c, row in enumerate(op.rrt):
            for unit, count in row:
                cell = usage.setdefault(unit, {}).setdefault((start + c) % ii, {})
                cell[op.name] = cell.get(op.name, 0) + count
    return usage


def capacity_violations(schedule: Schedule, machine: Machine) -> list[str]:
    """UNIT and CAPACITY: modulo resource usage per unit per residue within the unit's capacity."""
    units = effective_units(schedule.graph, machine.units)
    out = []
    for unit, cells in sorted(modulo_usage(schedule).items()):
        if unit not in units:
            users = sorted({name for cell in cells.values() for name in cell})
            out.append(f"UNIT: unit {unit!r} used by {', '.join(users)} does not exist "
                       f"(known: {', '.join(sorted(units)) or 'none'})")
            continue
        for r, cell in sorted(cells.items()):
            total = sum(cell.values())
            if total > units[unit]:
                holders = ", ".join(f"{n}×{c}" if c > 1 else n for n, c in cell.items())
                out.append(f"{Family.CAPACITY.heading}: unit {unit!r} at residue {r} (mod II={schedule.ii}) holds "
                           f"{total} > capacity {units[unit]}: {holders}")
    return out


def bound_violations(schedule: Schedule, machine: Machine) -> list[str]:
    """BOUND: ``II ≥ max(ResMII, RecMII)``, both recomputed from the graph (nothing read from the schedule)."""
    units = effective_units(schedule.graph, machine.units)
    res, rec = res_mii(schedule.graph, units), rec_mii(schedule.graph)
    if schedule.ii < max(res, rec):
        return [f"BOUND: II {schedule.ii} is below the lower bound {max(res, rec)} (ResMII {res}, RecMII {rec})"]
    return []


def consistency_violations(schedule: Schedule) -> list[str]:
    """BOUND and STATUS: II against its recorded lower bound; recorded length/copies/stages against the start
    times; ``optimal`` only with every entry of ``stats["proven"]`` True."""
    out = []
    if schedule.ii < schedule.ii_lower_bound:
        out.append(f"BOUND: II {schedule.ii} is below the proven lower bound {schedule.ii_lower_bound}")
    if schedule.status == Status.OPTIMAL and schedule.ii != schedule.ii_lower_bound:
        out.append(f"STATUS: status 'optimal' but II {schedule.ii} > lower bound {schedule.ii_lower_bound}")
    stats = schedule.stats
    if "length" in stats and stats["length"] != schedule.length:
        out.append(f"BOUND: recorded length L={stats['length']} but the start times give L={schedule.length}")
    if "copies" in stats and stats["copies"] != schedule.copies:
        out.append(f"BOUND: recorded {stats['copies']} copies but the start times give {schedule.copies}")
    if "stages" in stats and stats["stages"] != schedule.num_stages:
        out.append(f"BOUND: recorded {stats['stages']} stages but the start times give {schedule.num_stages}")
    if "length_lower_bound" in stats and schedule.length < stats["length_lower_bound"]:
        out.append(f"BOUND: length L={schedule.length} is below the proven lower bound "
                   f"{stats['length_lower_bound']}")
    unproven = [name for name, ok in dict(stats.get("proven", {})).items() if not ok]
    if schedule.status == Status.OPTIMAL and unproven:
        out.append(f"STATUS: status 'optimal' but {unproven[0]!r} is not proven")
    unknown = sorted(set(schedule.assignment) - set(schedule.graph.op_names))
    if unknown:
        out.append(f"STATUS: warp assignment names unknown op {unknown[0]!r}")
    return out


def exclusion_violations(schedule: Schedule, options: Any) -> list[str]:
    """EXCLUDED: no set of ``options.excluded_carries`` has every value carried into a later stage, and no order
    of ``options.excluded_orders`` has its ops started in that order (each no later than the next)."""
    carried = set(schedule.carried())
    out = [f"EXCLUDED: the schedule carries every value of the excluded set {sorted(values)} into a later stage"
           for values in getattr(options, "excluded_carries", None) or () if set(values) <= carried]
    starts = schedule.starts
    out += [f"EXCLUDED: the schedule starts {', '.join(order)} in the excluded order"
            for order in getattr(options, "excluded_orders", None) or ()
            if all(starts[a] <= starts[b] for a, b in zip(order, order[1:]))]
    return out


def _known(value: Any, known: tuple[str, ...]) -> bool:
    return isinstance(value, str) and value in known


def vocabulary_violations(schedule: Schedule) -> list[str]:
    """VOCABULARY: ``solver``, ``status``, warp-group roles and the families of ``stats["blocked_by"]`` (one
    family or ``a+b``) and ``stats["tried"][i]["relaxed"]`` are words Twill writes (:mod:`twill.schedule.vocab`).
    Messages quote the unknown word with ``repr``."""
    out = []
    if not _known(schedule.solver, SCHEDULE_SOLVERS):
        out.append(f"VOCABULARY: unknown solver {schedule.solver!r} (known: {', '.join(SCHEDULE_SOLVERS)})")
    if not _known(schedule.status, SCHEDULE_STATUSES):
        out.append(f"VOCABULARY: unknown status {schedule.status!r} (known: {', '.join(SCHEDULE_STATUSES)})")
    out += [f"VOCABULARY: warp group {w.id} has unknown role {w.role!r} (known: {', '.join(WARP_ROLES)})"
            for w in schedule.warps if not _known(w.role, WARP_ROLES)]
    families = tuple(str(f) for f in Family)
    blocked = schedule.stats.get("blocked_by", ())
    entries = blocked if isinstance(blocked, (list, tuple)) else [blocked]
    for entry in entries:
        if not isinstance(entry, str) or not all(_known(f, families) for f in entry.split("+")):
            out.append(f"VOCABULARY: stats 'blocked_by' names unknown constraint family {entry!r}")
    tried = schedule.stats.get("tried", ())
    for row in tried if isinstance(tried, (list, tuple)) else [tried]:
        relaxed = row.get("relaxed", ()) if isinstance(row, Mapping) else ()
        for family in relaxed if isinstance(relaxed, (list, tuple)) else [relaxed]:
            if not _known(family, families):
                out.append(f"VOCABULARY: stats 'tried' relaxes unknown constraint family {family!r}")
    return out


def violations(schedule: Schedule, machine: Machine, options: Any = None) -> list[str]:
    """Every violated constraint of ``schedule`` on ``machine``, one message each (empty when valid). A schedule
    with an unknown word (:func:`vocabulary_violations`) is not checked further."""
    out = vocabulary_violations(schedule) or start_violations(schedule)
    if out:
        return out
    if schedule.copies > MAX_COPIES:
        return [f"BOUND: L={schedule.length} at II {schedule.ii} overlaps {schedule.copies} copies of the "
                f"iteration; Twill supports at most {MAX_COPIES}"]
    out += bound_violations(schedule, machine)
    out += dependence_violations(schedule)
    out += capacity_violations(schedule, machine)
    out += consistency_violations(schedule)
    if schedule.assignment:
        out += ws_violations(schedule, machine, options)
    out += exclusion_violations(schedule, options)
    return out


def verify(schedule: Schedule, machine: Machine, options: Any = None) -> None:
    """Raise :class:`VerificationError` listing every violation, if there is any."""
    found = violations(schedule, machine, options)
    if found:
        raise VerificationError(found)


def admit(schedule: Schedule, machine: Machine) -> Schedule:
    """The gate of every schedule that enters Twill from a file: its graph must pass
    :func:`~twill.ir.validate.validate_graph` on ``machine`` and the schedule :func:`verify` (which
    recomputes II bounds, length and copies itself). Returns ``schedule``; raises
    :class:`~twill.errors.GraphError` or :class:`VerificationError` naming the first problem."""
    validate_graph(schedule.graph, machine.units)
    verify(schedule, machine)
    return schedule
