"""The joint problem at one (II, copies) pair, and the solver-independent quantities of docs/model.md.

A :class:`JointProblem` is what a backend solves: the normalized graph, the unit capacities, ``ii``, the
number of copies ``n`` and the window ``[length_min, length_max]`` of schedule lengths that keep ``n``
copies, the machine limits (warps, registers, shared memory, TMEM) and the families switched off for an
UNSAT explanation. A :class:`JointSolution` is a backend's answer. No solver is imported here. What an op or edge means for
liveness, buffers and waits (``in_place``, ``read_cycles``, ``value_bytes`` ...) is in
:mod:`twill.ir.semantics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from twill.ir.graph import LoopGraph
from twill.machine.models import Machine
from twill.schedule.vocab import Objective, Status

#: Non-W_vl slots offered to the solver at most (docs/model.md §3).
MAX_COMPUTE_SLOTS = 7

#: Group widths a slot may take (warps).
WIDTHS = (0, 1, 2, 4, 8)

#: Register budget when neither the options nor the graph give one.
DEFAULT_REG_LIMIT = 240

@dataclass(frozen=True, kw_only=True)
class JointProblem:
    """One joint SWP + WS satisfiability/optimisation problem (docs/model.md).

    Attributes:
        graph: the normalized loop graph.
        units: unit -> capacity in force.
        ii: initiation interval I.
        copies: n, copies of the iteration in Q.
        length_min / length_max: the window of L (``length_max = n·I`` keeps ``⌈L/I⌉ = n``).
        slots: G, warp-group slots (slot 0 is W_vl).
        max_warps: warp pool size (WARP COUNT).
        reg_limit: R, per-thread budget of register-holding groups.
        light_regs: budget of groups holding no register value (``setmaxnreg`` minimum).
        reserved_regs: registers per thread of every group kept out of REGISTER LIMIT
            (:meth:`~twill.machine.models.Machine.reserved_regs`).
        regs_per_sm: 32-bit registers of the SM (REGISTER FILE).
        smem_capacity / tmem_capacity: bytes (TMEM 0 = no tensor memory: the family is skipped).
        smem_resident: bytes of shared memory held outside the loop (Q tiles...).
        streaming_depth: ring depth of streaming loads.
        cross_warp: register values may cross warp groups.
        relaxed: families switched off (UNSAT explanation).
        excluded_carries: sets of register values no solution may carry all of into a later stage
            (:attr:`SolveOptions.excluded_carries <twill.solve.options.SolveOptions.excluded_carries>`).
        excluded_orders: start orders no solution may repeat (:attr:`SolveOptions.excluded_orders
            <twill.solve.options.SolveOptions.excluded_orders>`).
    """

    graph: LoopGraph
    units: Mapping[str, int]
    ii: int
    copies: int
    length_min: int
    length_max: int
    slots: int
    max_warps: int
    reg_limit: int
    light_regs: int
    reserved_regs: int
    regs_per_sm: int
    smem_capacity: int
    tmem_capacity: int
    smem_resident: int = 0
    streaming_depth: int = 2
    cross_warp: bool = True
    relaxed: frozenset[str] = frozenset()
    excluded_carries: tuple[tuple[str, ...], ...] = ()
    excluded_orders: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "units", MappingProxyType(dict(self.units)))
        object.__setattr__(self, "relaxed", frozenset(self.relaxed))

    def active(self, family: str) -> bool:
        return family not in self.relaxed

    def horizon(self, length: int) -> int:
        """T = (n − 1)·I + L."""
        return (self.copies - 1) * self.ii + length


@dataclass(frozen=True)
class JointSolution:
    """A backend's schedule: starts, length, op -> slot, and per-slot width and budget."""

    starts: Mapping[str, int]
    length: int
    group: Mapping[str, int]
    widths: tuple[int, ...]
    budgets: tuple[int, ...]
    objectives: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", MappingProxyType(dict(self.starts)))
        object.__setattr__(self, "group", MappingProxyType(dict(self.group)))
        object.__setattr__(self, "objectives", MappingProxyType(dict(self.objectives)))


@dataclass(frozen=True)
class ModelSize:
    """Variables and constraints of a model (``Schedule.stats``), per family, and backend-specific counts
    (``extra``: the Yices model's ``booleans`` and ``horizon``)."""

    variables: int
    constraints: int
    families: Mapping[str, int]
    extra: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ObjectiveRecord:
    """One ``stats["objectives"]`` entry: an objective, its value in the schedule and whether it is proved
    minimal (given the objectives before it)."""

    name: Objective
    value: int
    proven: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": str(self.name), "value": self.value, "proven": self.proven}


@dataclass(frozen=True)
class JointOutcome:
    """What a backend reports for one solve: ``status`` (:class:`~twill.schedule.vocab.Status`), the solution
    when one was found, the seconds it took, and ``settled``: objectives before L that this solve already
    minimised and fixed (the Yices backend minimises ``unhoisted`` before it searches L)."""

    status: Status
    solution: JointSolution | None
    seconds: float
    settled: tuple[ObjectiveRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))

    @property
    def found(self) -> bool:
        return self.solution is not None


# -- machine-derived limits -------------------------------------------------------------------------------
def most_least_depth(p: "JointProblem") -> int:
    """The largest least ring depth of any op (``LoopGraph.least_depth``): bounds the depth variables."""
    return max(p.graph.least_depth(op.name, p.streaming_depth) for op in p.graph.ops)


def legal_budget(machine: Machine, regs: int) -> int:
    """Round a per-thread budget *down* to a legal ``setmaxnreg`` value (at least the minimum)."""
    step = machine.setmaxnreg_step
    return max(machine.setmaxnreg_min, min(machine.setmaxnreg_max, regs // step * step))


def reg_limit_for(graph: LoopGraph, machine: Machine, reg_limit: int | None) -> int:
    """R: ``reg_limit`` if given, else ``graph.attrs["reg_limit"]``, else 240; rounded to setmaxnreg."""
    raw = reg_limit if reg_limit is not None else int(graph.attrs.get("reg_limit", DEFAULT_REG_LIMIT))
    return legal_budget(machine, min(raw, machine.max_regs_per_thread))


def slot_count(graph: LoopGraph) -> int:
    """G = 1 + min(#non-variable-latency ops, MAX_COMPUTE_SLOTS)."""
    return 1 + min(sum(1 for op in graph.ops if not op.variable_latency), MAX_COMPUTE_SLOTS)

