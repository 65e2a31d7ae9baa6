"""The words a solve is described in: solver answers (:class:`Status`), the objectives minimised after II
(:class:`Objective`) and the constraint families of docs/model.md (:class:`Family`).

One definition for the solvers (CP-SAT and Yices), the UNSAT explanation, the verifiers and the reports.
Every member is a ``str`` whose value is the word the schedule JSON and the CLI print, so a member compares
equal to that string and serialises as it. This module imports nothing from Twill: ``twill.solve`` and
``twill.schedule`` both import it.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Mapping

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:   # Python 3.10: the same behaviour for the members defined here (explicit string values)
    class StrEnum(str, Enum):
        """A :class:`str` enum whose ``str()`` and ``format()`` are its value (``enum.StrEnum`` of 3.11)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


class Status(StrEnum):
    """A solver's answer for one problem, and (``optimal``/``feasible``) the status of a schedule."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"

    @property
    def found(self) -> bool:
        """A schedule was found (``optimal`` or ``feasible``)."""
        return self in (Status.OPTIMAL, Status.FEASIBLE)


#: Statuses a :class:`~twill.schedule.result.Schedule` document may carry.
SCHEDULE_STATUSES = (Status.OPTIMAL, Status.FEASIBLE, Status.INFEASIBLE)

#: Solvers a schedule may name: the backends of ``--solver`` (``twill.solve.options.SOLVERS``) and
#: ``manual`` (a schedule built by hand, e.g. by ``twill/kernels/gemm/variants.py``).
SCHEDULE_SOLVERS = ("cpsat", "yices", "manual")

#: Roles a warp group may take (``twill.solve.joint.search.derive_role``; docs/graph-format.md).
WARP_ROLES = ("load", "mma", "compute", "softmax", "correction")


class Objective(StrEnum):
    """Objectives after II, in lexicographic order (docs/model.md §5)."""

    UNHOISTED = "unhoisted"
    LENGTH = "length"
    STAGES = "stages"
    WARPS = "warps"
    SMEM = "smem"
    PROLOGUE = "prologue"


#: Objectives after L, in order.
SECONDARY = (Objective.STAGES, Objective.WARPS, Objective.SMEM, Objective.PROLOGUE)


class Family(StrEnum):
    """The constraint families of docs/model.md, in paper order (Figures 4, 5, 6). The value is the name in
    model counters and ``blocked_by``; :attr:`heading` starts the verifier's messages."""

    UNIQUENESS = "uniqueness"
    CONSISTENCY = "consistency"
    COMPLETION = "completion"
    DEPENDENCE = "dependence"
    CAPACITY = "capacity"
    LIVENESS = "liveness"
    MEMORY_CAPACITY = "memory_capacity"
    WARP_UNIQUENESS = "warp_uniqueness"
    VARIABLE_LATENCY = "variable_latency"
    WARP_COUNT = "warp_count"
    REGISTER_FILE = "register_file"
    REGISTER_LIMIT = "register_limit"
    CROSS_WARP_SPILLS = "cross_warp_spills"
    CONCURRENCY = "concurrency"
    WARP_ISSUE = "warp_issue"

    @property
    def heading(self) -> str:
        """``CROSS-WARP SPILLS``: the family as docs/model.md and the verifier's messages write it."""
        return self.value.upper().replace("_", " ").replace("CROSS WARP", "CROSS-WARP")

    @property
    def text(self) -> str:
        """What the family limits, for the UNSAT explanation (relaxable families only)."""
        return _TEXT[self]

    def remedy(self, flags: Mapping[str, str]) -> str:
        """What the user can change when the family blocks every II (relaxable families only), naming only the
        options of ``flags`` (option -> the flag that changes it in the command given, e.g. ``reg_limit`` ->
        ``--reg-limit``); empty when no remedy applies."""
        return " or ".join(text.format(flags[option]) if option else text
                           for text, option in _REMEDY[self] if option is None or option in flags)


#: Families that the UNSAT explanation relaxes one at a time (docs/model.md §5).
RELAXABLE = (Family.REGISTER_LIMIT, Family.REGISTER_FILE, Family.WARP_COUNT, Family.CROSS_WARP_SPILLS,
             Family.CONCURRENCY, Family.WARP_ISSUE, Family.MEMORY_CAPACITY)

_TEXT = {
    Family.REGISTER_LIMIT: "register limit (live values exceed a group's per-thread budget)",
    Family.REGISTER_FILE: "register file (too few register-holding warps fit in 64K registers)",
    Family.WARP_COUNT: "warp count (not enough warps for the groups the schedule needs)",
    Family.CROSS_WARP_SPILLS: "cross-warp transfers (a value must cross warp groups)",
    Family.CONCURRENCY: "concurrency (a blocking wait would stall work in flight on its warp)",
    Family.WARP_ISSUE: "warp issue (a warp group's tile ops, run one at a time, exceed the II)",
    Family.MEMORY_CAPACITY: "memory capacity (shared memory / TMEM buffers)",
}

# A larger II does not lift these limits. Each remedy is a phrase and the option it changes (its flag fills
# ``{}``), or None for a change to the kernel itself.
_REMEDY: dict[Family, tuple[tuple[str, str | None], ...]] = {
    Family.REGISTER_LIMIT: (("raise {}", "reg_limit"), ("use smaller tiles", None)),
    Family.REGISTER_FILE: (("use smaller tiles or fewer register-holding warps", None),),
    Family.WARP_COUNT: (("raise {}", "max_warps"),),
    Family.CROSS_WARP_SPILLS: (("drop {}", "cross_warp"),),
    Family.CONCURRENCY: (("raise {}", "max_warps"),),
    Family.WARP_ISSUE: (("raise {}", "max_warps"), ("raise {}", "max_ii")),
    Family.MEMORY_CAPACITY: (("use smaller tiles", None), ("a lower {}", "streaming_depth")),
}
