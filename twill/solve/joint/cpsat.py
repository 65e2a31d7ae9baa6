"""CP-SAT backend of the joint SWP + WS problem: the compact encoding of docs/model.md.

Variables (typed container :class:`ModelVars`): an integer start ``t[v]`` per op with stage/residue split
``t = k·I + s`` (``ModelVars.residue`` holds the residue ``s``); the length ``L``; Booleans ``a[v,g]`` (op v on slot g); per slot a width ``w[g] ∈ {0,1,2,4,8}``
and a register-holding flag; ``same[u,v]`` (same slot) for the pairs that need it; ring depths. Liveness is
not time-indexed: copy ``i`` of a register value is an optional interval ``[t_v + i·I, E[v,i])`` per slot,
present iff the op is on that slot, and REGISTER LIMIT is one ``Cumulative`` per slot. ``build_model`` adds
the families in paper order (Figures 4, 5, 6); each ``add_*`` function states its formula. Decoding and the
lexicographic objectives live in :class:`CpsatJoint`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from twill.ir.semantics import (blocking_in, buffer_edges, can_cross, carried_consumers, holds_memory, in_place,
                                is_accumulator, read_cycles, value_bytes, waited_groups)
from twill.schedule.vocab import SECONDARY, Family, Objective, Status
from twill.solve.joint.problem import (WIDTHS, JointOutcome, JointProblem, JointSolution, ModelSize,
                                       most_least_depth)

#: CP-SAT workers of a feasibility question (:meth:`CpsatJoint.feasible_without`: the joint relaxations and
#: the UNSAT explanation). Only its status is used, a proof either way, and one worker proves it with about
#: half the CPU time of two (Triton attn_fwd on B200, the concurrency-free relaxation at IIs 180 and 199-215:
#: 3.9 s against 7.2 s, each II the same answer).
FEASIBILITY_WORKERS = 1


@dataclass
class ModelVars:
    """Every CP-SAT variable of one joint model, keyed by op name / slot / op pair."""

    t: dict[str, Any] = field(default_factory=dict)
    stage: dict[str, Any] = field(default_factory=dict)
    residue: dict[str, Any] = field(default_factory=dict)
    length: Any = None
    horizon: Any = None
    assign: dict[tuple[str, int], Any] = field(default_factory=dict)
    width: list[Any] = field(default_factory=list)
    used: list[Any] = field(default_factory=list)
    heavy: list[Any] = field(default_factory=list)
    same: dict[tuple[str, str], Any] = field(default_factory=dict)
    depth: dict[str, Any] = field(default_factory=dict)
    objective: dict[str, Any] = field(default_factory=dict)


class _Builder:
    """Holds the model while the ``add_*`` families are added and counts constraints per family."""

    def __init__(self, problem: JointProblem):
        from twill.solve._ortools_loader import load_cp_model

        cp_model = self.cp_model = load_cp_model()
        self.p = problem
        self.g = problem.graph
        self.model = cp_model.CpModel()
        self.v = ModelVars()
        self.counts: dict[str, int] = {}
        self.names = list(self.g.op_names)
        self.index = {name: k for k, name in enumerate(self.names)}
        self.ops = {op.name: op for op in self.g.ops}
        self.allowed = {name: self._slots(name) for name in self.names}

    def _slots(self, name: str) -> list[int]:
        if self.ops[name].variable_latency:
            return [0]
        return list(range(1, self.p.slots))

    def slots_of(self, name: str) -> list[int]:
        """Slots ``name`` may use: W_vl (0) iff variable latency (VARIABLE LATENCY)."""
        return self.allowed[name]

    def can_share(self, u: str, v: str) -> bool:
        """Whether ``u`` and ``v`` may run on one slot: a slot both may use and the same width (WARP
        UNIQUENESS: ``a[v,g] ⇒ w_g = warps(v)``). When not, ``same[u,v]`` is false in every solution, so
        ``cross(u,v)`` and its spill delay are forced: the families below state them as constants, which CP-SAT
        propagates at once instead of learning them from the width variables (same solutions)."""
        return self.ops[u].warps == self.ops[v].warps and any(g in self.allowed[v] for g in self.allowed[u])

    def same(self, u: str, v: str) -> Any:
        """``same[u,v] ⇔ ∨_g a[u,g] ∧ a[v,g]`` (created on first use). With exactly one slot per op, two
        clauses per common slot define it: ``a[u,g] ∧ a[v,g] ⇒ same`` and ``same ∧ a[u,g] ⇒ a[v,g]``; false
        when the two cannot share a slot (:meth:`can_share`)."""
        key = (u, v) if self.index[u] < self.index[v] else (v, u)
        if key in self.v.same:
            return self.v.same[key]
        m = self.model
        lit = m.new_bool_var(f"same[{key[0]},{key[1]}]")
        if not self.can_share(u, v):
            m.add(lit == 0)
            self.v.same[key] = lit
            return lit
        for g in self.allowed[u]:
            au = self.v.assign[(u, g)]
            if g in self.allowed[v]:
                av = self.v.assign[(v, g)]
                m.add_bool_or([au.Not(), av.Not(), lit])
                m.add_bool_or([lit.Not(), au.Not(), av])
            else:
                m.add_implication(au, lit.Not())
        self.v.same[key] = lit
        return lit

    def count(self, family: str, before: int) -> None:
        self.counts[family] = self.counts.get(family, 0) + len(self.model.proto.constraints) - before


# -- Figure 4: a modulo schedule ------------------------------------------------------------------------------
def add_starts(b: _Builder) -> None:
    """UNIQUENESS/CONSISTENCY: one start ``t_v = k_v·I + s_v`` per op, ``s_v ∈ [0, I)``; copy i at t_v + i·I."""
    p, m = b.p, b.model
    before = len(m.proto.constraints)
    b.v.length = m.new_int_var(p.length_min, p.length_max, "L")
    b.v.horizon = (p.copies - 1) * p.ii + b.v.length
    for op in b.g.ops:
        hi = p.length_max - op.cycles
        t = m.new_int_var(0, max(0, hi), f"t[{op.name}]")
        k = m.new_int_var(0, max(0, hi) // p.ii, f"k[{op.name}]")
        s = m.new_int_var(0, p.ii - 1, f"s[{op.name}]")
        m.add(t == k * p.ii + s)
        b.v.t[op.name], b.v.stage[op.name], b.v.residue[op.name] = t, k, s
    b.count("uniqueness", before)


def add_completion(b: _Builder) -> None:
    """COMPLETION: ``t_v + cycles(v) ≤ L``."""
    before = len(b.model.proto.constraints)
    for op in b.g.ops:
        b.model.add(b.v.t[op.name] + op.cycles <= b.v.length)
    b.count("completion", before)


def add_dependence(b: _Builder) -> None:
    """DEPENDENCE (+ CROSS-WARP SPILLS delay): ``t_v + δ·I ≥ t_u + d + spill(u)·cross(u,v)``."""
    before = len(b.model.proto.constraints)
    spills = b.p.active("cross_warp_spills")
    for e in b.g.edges:
        src = b.ops[e.src]
        rhs = b.v.t[e.src] + e.delay
        if spills and e.src != e.dst and can_cross(src) and src.spill_cost:
            forced = not b.can_share(e.src, e.dst)
            rhs = rhs + (src.spill_cost if forced else src.spill_cost * (1 - b.same(e.src, e.dst)))
        b.model.add(b.v.t[e.dst] + e.distance * b.p.ii >= rhs)
    b.count("dependence", before)


def add_capacity(b: _Builder) -> None:
    """CAPACITY: per unit f and residue r, ``Σ RRT[v][c][f] over (t_v + c) mod I = r ≤ cap(f)`` — exact
    circular NoOverlap/Cumulative over slot intervals and their II-shifted copies (phase-1 encoding)."""
    from twill.solve.modulo import add_modulo_capacity

    before = len(b.model.proto.constraints)
    add_modulo_capacity(b.model, b.g, b.p.units, b.p.ii, b.v.t, b.v.residue)
    b.count("capacity", before)


# -- Figure 6: warp assignment ---------------------------------------------------------------------------------
def add_warp_uniqueness(b: _Builder) -> None:
    """WARP UNIQUENESS: ``Σ_g a[v,g] = 1``; ``a[v,g] ⇒ w_g = warps(v)``; ``w_g = 0 ⇔ slot g empty``; an
    ``mma_wait`` op shares the slot of the MMA it waits for (the warps that commit an async group wait on it).
    Symmetry breaking: for g ≥ 2, ``a[v,g] ⇒ ∨_{u before v} a[u,g−1]``."""
    m, p = b.model, b.p
    before = len(m.proto.constraints)
    for name in b.names:
        for g in b.slots_of(name):
            b.v.assign[(name, g)] = m.new_bool_var(f"a[{name},g={g}]")
        m.add_exactly_one([b.v.assign[(name, g)] for g in b.slots_of(name)])
    domain = b.cp_model.Domain.FromValues(list(WIDTHS))
    for g in range(p.slots):
        width = m.new_int_var_from_domain(domain, f"w[{g}]")
        used = m.new_bool_var(f"used[{g}]")
        members = [lit for (name, slot), lit in b.v.assign.items() if slot == g]
        if members:
            m.add_max_equality(used, members)
        else:
            m.add(used == 0)
        m.add(width == 0).only_enforce_if(used.Not())
        for (name, slot), lit in b.v.assign.items():
            if slot == g:
                m.add(width == b.ops[name].warps).only_enforce_if(lit)
        b.v.width.append(width)
        b.v.used.append(used)
    for g in range(2, p.slots):
        for j, name in enumerate(b.names):
            if (name, g) not in b.v.assign:
                continue
            earlier = [b.v.assign[(u, g - 1)] for u in b.names[:j] if (u, g - 1) in b.v.assign]
            m.add_bool_or(earlier + [b.v.assign[(name, g)].Not()])
    for name, src in waited_groups(b.g):
        m.add(b.same(name, src) == 1)
    b.count("warp_uniqueness", before)


def add_variable_latency(b: _Builder) -> None:
    """VARIABLE LATENCY: ``a[v, 0] ⇔ variable_latency(v)`` — enforced by the slot domains of
    :meth:`_Builder.slots_of` (no constraint needed); recorded for the per-family count."""
    b.counts["variable_latency"] = 0


def add_warp_count(b: _Builder) -> None:
    """WARP COUNT: ``Σ_g w_g ≤ max_warps``."""
    before = len(b.model.proto.constraints)
    b.v.objective["warps"] = sum(b.v.width)
    if b.p.active("warp_count"):
        b.model.add(sum(b.v.width) <= b.p.max_warps)
    b.count("warp_count", before)


def add_register_file(b: _Builder) -> None:
    """REGISTER FILE: ``Σ_g 32·w_g·budget_g ≤ regs_per_sm`` with ``budget_g = R`` if slot g holds a value
    with regs > 0 (``heavy_g``), else the setmaxnreg minimum."""
    m, p = b.model, b.p
    before = len(m.proto.constraints)
    total = 0
    for g in range(p.slots):
        holders = [b.v.assign[(n, g)] for n in b.names if (n, g) in b.v.assign and b.ops[n].regs > 0]
        heavy = m.new_bool_var(f"heavy[{g}]")
        if holders:
            m.add_max_equality(heavy, holders)
        else:
            m.add(heavy == 0)
        heavy_width = m.new_int_var(0, max(WIDTHS), f"wheavy[{g}]")
        m.add(heavy_width == b.v.width[g]).only_enforce_if(heavy)
        m.add(heavy_width == 0).only_enforce_if(heavy.Not())
        b.v.heavy.append(heavy)
        total = total + 32 * (p.reg_limit * heavy_width + p.light_regs * (b.v.width[g] - heavy_width))
    if p.active("register_file"):
        m.add(total <= p.regs_per_sm)
    b.count("register_file", before)


def live_end(b: _Builder, name: str, copy: int) -> Any:
    """``E[v,i] = max(t_v + i·I + 1, max over out-edges (v,u,δ) of end(u, i+δ))`` with ``end(u, j) = t_u +
    j·I + read(v, u)`` for ``j ≤ n−1`` (``read`` = cycles(u), or 0 when u overwrites v in place) and ``T``
    beyond Q (paper INIT). An in-place accumulator (self-edge of distance 1)
    is live until its next copy issues: ``E[v,i] = end(v, i+1)``."""
    p, m = b.p, b.model
    start = b.v.t[name] + copy * p.ii
    terms = [start + 1]
    if in_place(b.g, name):
        j = copy + 1
        terms.append(b.v.t[name] + j * p.ii if j <= p.copies - 1 else b.v.horizon)
        end = m.new_int_var(0, (p.copies - 1) * p.ii + p.length_max, f"E[{name},i={copy}]")
        m.add_max_equality(end, terms)
        return end
    for e in b.g.out_edges(name):
        j = copy + e.distance
        if j <= p.copies - 1:
            terms.append(b.v.t[e.dst] + j * p.ii + read_cycles(b.g, name, e.dst))
        else:
            terms.append(b.v.horizon)
    horizon_max = (p.copies - 1) * p.ii + p.length_max + max(op.cycles for op in b.g.ops)
    end = m.new_int_var(0, horizon_max, f"E[{name},i={copy}]")
    m.add_max_equality(end, terms)
    return end


def add_register_limit(b: _Builder) -> None:
    """REGISTER LIMIT: for every slot g and time τ, ``Σ_{(v,i) live at τ, a[v,g]} regs(v) ≤ budget_g``.
    Live intervals ``[t_v + i·I, E[v,i])`` (liveness derived from the schedule; an in-place accumulator's
    copy 0 from 0: its initial value is held from loop entry), one optional copy per slot,
    one Cumulative per slot with capacity ``R − reserved_regs``: every group keeps bookkeeping registers (by
    default the ``setmaxnreg`` minimum a light, producer, warp runs on), so tile values get the rest (light
    slots hold no register value)."""
    p, m = b.p, b.model
    before = len(m.proto.constraints)
    if not p.active("register_limit"):
        b.count("register_limit", before)
        return
    per_slot: dict[int, tuple[list[Any], list[int]]] = {}
    horizon_max = (p.copies - 1) * p.ii + p.length_max + max(op.cycles for op in b.g.ops)
    for name in b.names:
        op = b.ops[name]
        if op.regs <= 0:
            continue
        carried = in_place(b.g, name)
        for i in range(p.copies):
            start = 0 if carried and i == 0 else b.v.t[name] + i * p.ii
            end = live_end(b, name, i)
            size = m.new_int_var(1, horizon_max, f"live[{name},i={i}]")
            m.add(size == end - start)
            for g in b.slots_of(name):
                itv = m.new_optional_interval_var(start, size, end, b.v.assign[(name, g)],
                                                  f"live[{name},i={i},g={g}]")
                per_slot.setdefault(g, ([], []))
                per_slot[g][0].append(itv)
                per_slot[g][1].append(op.regs)
    for g, (intervals, demands) in sorted(per_slot.items()):
        m.add_cumulative(intervals, demands, p.reg_limit - p.reserved_regs)
    b.count("register_limit", before)


def add_cross_warp_spills(b: _Builder) -> Any:
    """CROSS-WARP SPILLS: ``cross(u,v) = regs(u) > 0 ∧ ¬same[u,v]`` adds ``spill(u)`` to the edge delay
    (in :func:`add_dependence`) and stages the value in SMEM; ``cross_warp=False`` forbids ``cross(u,v)``.
    Returns the staging bytes expression."""
    p, m = b.p, b.model
    before = len(m.proto.constraints)
    staging = 0
    if p.active("cross_warp_spills"):
        for e in b.g.edges:
            src = b.ops[e.src]
            if e.src == e.dst or not can_cross(src):
                continue
            same = b.same(e.src, e.dst)
            if not p.cross_warp:
                m.add(same == 1)
                continue
            nbytes = value_bytes(src)
            hi = nbytes * (p.copies + e.distance + 1)
            stage_bytes = m.new_int_var(0, hi, f"staging[{e.src}->{e.dst}]")
            m.add(stage_bytes >= nbytes * (b.v.stage[e.dst] + e.distance - b.v.stage[e.src] + 1)
                  ).only_enforce_if(same.Not())
            staging = staging + stage_bytes
    b.count("cross_warp_spills", before)
    return staging


def waits_literal(b: _Builder, name: str) -> Any | None:
    """``waits(v)``: True for a blocking in-edge; else the OR of ``cross(u,v)`` over register in-edges;
    None when v never waits."""
    if blocking_in(b.g, name):
        return True
    if not (b.p.active("cross_warp_spills") and b.p.cross_warp):
        return None
    sources = [e.src for e in b.g.in_edges(name) if e.src != name and can_cross(b.ops[e.src])]
    if any(not b.can_share(src, name) for src in sources):
        return True                      # a register value that always crosses (Builder.can_share)
    crosses = [b.same(src, name).Not() for src in sources]
    if not crosses:
        return None
    lit = b.model.new_bool_var(f"waits[{name}]")
    b.model.add_bool_or(crosses + [lit.Not()])
    for cross in crosses:
        b.model.add_implication(cross, lit)
    return lit


def add_concurrency(b: _Builder) -> None:
    """CONCURRENCY: ``waits(v) ∧ same[v,o] ⇒ (t_v − t_o) mod I ≥ busy(o)`` for o ≠ v, busy(o) > 0; on the
    slots: ``s_v − s_o ∈ [busy(o), I) ∪ [busy(o) − I, 0)``."""
    p, m = b.p, b.model
    before = len(m.proto.constraints)
    if not p.active("concurrency"):
        b.count("concurrency", before)
        return
    for v in b.names:
        waits = waits_literal(b, v)
        if waits is None:
            continue
        for o in b.names:
            busy = b.ops[o].busy
            if o == v or busy <= 0 or not b.can_share(v, o):
                continue
            cond = [b.same(v, o)] + ([] if waits is True else [waits])
            if busy >= p.ii:
                m.add_bool_or([lit.Not() for lit in cond])
                continue
            after = m.new_bool_var(f"after[{v},{o}]")
            diff = b.v.residue[v] - b.v.residue[o]
            m.add(diff >= busy).only_enforce_if(cond + [after])
            m.add(diff <= -1).only_enforce_if(cond + [after.Not()])
            m.add(diff >= busy - p.ii).only_enforce_if(cond + [after.Not()])
    b.count("concurrency", before)


def add_warp_issue(b: _Builder) -> None:
    """WARP ISSUE (ours): a warp group issues in order and runs one tile op at a time — for ops v ≠ o on the
    same slot, the windows ``[t_v, t_v + busy(v))`` and ``[t_o, t_o + busy(o))`` are disjoint modulo I.
    One NoOverlap per slot over optional slot intervals and their II-shifted copies; ``busy(v) > I`` cannot
    repeat every I on one warp and is infeasible."""
    p, m = b.p, b.model
    before = len(m.proto.constraints)
    if not p.active("warp_issue"):
        b.count("warp_issue", before)
        return
    per_slot: dict[int, list[Any]] = {}
    for name in b.names:
        busy = b.ops[name].busy
        if busy <= 0:
            continue
        for g in b.slots_of(name):
            lit = b.v.assign[(name, g)]
            if busy > p.ii:
                m.add(lit == 0)
                continue
            for shift in (0, p.ii):
                per_slot.setdefault(g, []).append(m.new_optional_fixed_size_interval_var(
                    b.v.residue[name] + shift, busy, lit, f"issue[{name},g={g},+{shift}]"))
    for g, intervals in sorted(per_slot.items()):
        m.add_no_overlap(intervals)
    b.count("warp_issue", before)


# -- Figure 5: memory capacity -----------------------------------------------------------------------------------
def add_memory_capacity(b: _Builder, staging: Any) -> None:
    """MEMORY CAPACITY: ``resident + Σ_v smem(v)·depth(v) + staging ≤ smem_per_block`` and
    ``Σ_v tmem(v)·depth(v) ≤ tmem_bytes``; ``depth(v) ≥ k_u + δ − k_v + 1`` per out-edge (1 for
    accumulators), ``≥ least_depth(v)`` (``streaming_depth`` or the load's pinned ring depth) for streaming
    loads."""
    p, m = b.p, b.model
    before = len(m.proto.constraints)
    smem, tmem = p.smem_resident, 0
    max_depth = p.copies + max([e.distance for e in b.g.edges] or [0]) + most_least_depth(p) + 1
    for name in b.names:
        op = b.ops[name]
        if not holds_memory(op):
            continue
        depth = m.new_int_var(1, max_depth, f"depth[{name}]")
        if not is_accumulator(op):
            for e in buffer_edges(b.g, name):
                m.add(depth >= b.v.stage[e.dst] + e.distance - b.v.stage[name] + 1)
            least = b.g.least_depth(name, p.streaming_depth)
            if least > 1:
                m.add(depth >= least)
        else:
            m.add(depth == 1)
        b.v.depth[name] = depth
        smem = smem + op.smem * depth
        tmem = tmem + op.tmem * depth
    smem = smem + staging
    b.v.objective["smem"] = smem
    if p.active("memory_capacity"):
        m.add(smem <= p.smem_capacity)
        if p.tmem_capacity > 0:
            m.add(tmem <= p.tmem_capacity)
    b.count("memory_capacity", before)


def add_exclusions(b: _Builder) -> None:
    """EXCLUDED (Twill's; not a paper family): for each excluded carried set X of register values,
    ``∨_{v∈X} kept[v]`` with ``kept[v] ⇒ k_u ≤ k_v`` for every distance-0 consumer u of v: some value of X is
    consumed in the stage it is produced in (:meth:`~twill.schedule.result.Schedule.carried`); for each
    excluded order ``o_1 … o_k``, ``∨_i t_{o_{i+1}} < t_{o_i}``: two consecutive ops start the other way round
    (:meth:`~twill.schedule.result.Schedule.register_order`)."""
    m = b.model
    before = len(m.proto.constraints)
    for carried in b.p.excluded_carries:
        kept = []
        for name in carried:
            lit = m.new_bool_var(f"kept[{name}]")
            for u in carried_consumers(b.g, name):
                m.add(b.v.stage[u] <= b.v.stage[name]).only_enforce_if(lit)
            kept.append(lit)
        m.add_bool_or(kept)
    for order in b.p.excluded_orders:
        swapped = []
        for first, second in zip(order, order[1:]):
            lit = m.new_bool_var(f"swapped[{first},{second}]")
            m.add(b.v.t[second] < b.v.t[first]).only_enforce_if(lit)
            swapped.append(lit)
        m.add_bool_or(swapped)
    b.count("excluded", before)


def add_stage_objective(b: _Builder) -> None:
    """Objective helpers: ``length = L``, ``stages = max_v k_v + 1`` and ``prologue = Σ_v (max_u k_u − k_v)``
    (op-stages issued ahead of the last stage: the work the prologue and epilogue duplicate)."""
    m = b.model
    top = m.new_int_var(0, b.p.length_max // b.p.ii, "max_stage")
    m.add_max_equality(top, list(b.v.stage.values()))
    b.v.objective["stages"] = top + 1
    b.v.objective["length"] = b.v.length
    b.v.objective["prologue"] = sum(top - k for k in b.v.stage.values())


def build_model(problem: JointProblem) -> _Builder:
    """The whole model, families in paper order (Fig. 4, 5, 6)."""
    b = _Builder(problem)
    add_starts(b)
    add_warp_uniqueness(b)
    add_variable_latency(b)
    add_completion(b)
    add_dependence(b)
    add_capacity(b)
    add_warp_count(b)
    add_register_file(b)
    add_register_limit(b)
    staging = add_cross_warp_spills(b)
    add_concurrency(b)
    add_warp_issue(b)
    add_memory_capacity(b, staging)
    add_exclusions(b)
    add_stage_objective(b)
    return b


def add_hoist_objective(b: _Builder, pairs: list[tuple[str, str]]) -> None:
    """The ``unhoisted`` objective ``Σ_(u,v) [stage(v) = stage(u)]`` over the tensor-core pairs of
    :func:`twill.solve.joint.search.hoist_pairs`: a literal ``h_uv ⇒ k_v ≥ k_u + 1`` per pair and
    ``unhoisted = |pairs| − Σ h_uv``."""
    m, stage = b.model, b.v.stage
    hoisted = []
    for u, v in pairs:
        h = m.new_bool_var(f"hoisted[{u},{v}]")
        m.add(stage[v] >= stage[u] + 1).only_enforce_if(h)
        hoisted.append(h)
    b.v.objective[Objective.UNHOISTED] = len(pairs) - sum(hoisted)


class CpsatJoint:
    """One CP-SAT model of a :class:`JointProblem`, solved for a sequence of lexicographic objectives: the
    :class:`~twill.solve.joint.backend.JointModel` protocol."""

    def __init__(self, problem: JointProblem, *, hoist: list[tuple[str, str]] = (), workers: int = 2,
                 seed: int = 0):
        self.problem = problem
        self.builder = build_model(problem)
        self.workers = workers
        self.seed = seed
        if hoist:
            add_hoist_objective(self.builder, list(hoist))
        lead = (Objective.UNHOISTED,) if hoist else ()
        self.objectives = (*lead, Objective.LENGTH, *SECONDARY)
        self.tie_break = f"first optimal solution of the last objective, 1 CP-SAT worker, seed {seed}"
        #: The last schedule a relaxed question of :meth:`feasible_without` found: the next one's hint.
        self.witness: JointSolution | None = None

    def size(self) -> ModelSize:
        proto = self.builder.model.proto
        return ModelSize(len(proto.variables), len(proto.constraints), dict(self.builder.counts))

    def hint(self, starts: Mapping[str, int]) -> None:
        m = self.builder.model
        m.clear_hints()
        for name, value in starts.items():
            if name in self.builder.v.t:
                m.add_hint(self.builder.v.t[name], value)

    def pin(self, starts: Mapping[str, int]) -> None:
        """``t_v = starts[v]`` in every later solve."""
        b = self.builder
        for name, value in starts.items():
            b.model.add(b.v.t[name] == value)

    def fix(self, objective: Objective, value: int) -> None:
        """Keep ``objective`` at ``value`` in later solves (lexicographic order)."""
        self.builder.model.add(self.builder.v.objective[objective] == value)

    def bound(self, objective: Objective, value: int) -> None:
        """``objective ≤ value`` in later solves."""
        self.builder.model.add(self.builder.v.objective[objective] <= value)

    def hint_solution(self, solution: JointSolution) -> None:
        """Suggest every start, stage, residue, slot and width of ``solution`` (a schedule of this problem with
        other families relaxed) to the next solve, L at the closest value of this model's window. A hint only
        orders CP-SAT's search: the status it proves and the optimum it reaches do not depend on it."""
        b, p = self.builder, self.problem
        self.hint(solution.starts)
        m = b.model
        for name, value in solution.starts.items():
            m.add_hint(b.v.stage[name], value // p.ii)
            m.add_hint(b.v.residue[name], value % p.ii)
        for (name, g), lit in b.v.assign.items():
            m.add_hint(lit, int(solution.group[name] == g))
        for g, width in enumerate(solution.widths):
            m.add_hint(b.v.width[g], width)
            m.add_hint(b.v.used[g], int(width > 0))
        m.add_hint(b.v.length, min(max(solution.length, p.length_min), p.length_max))

    def feasible_without(self, families: tuple[Family, ...], seconds: float) -> Status:
        """A fresh model of the problem with ``families`` relaxed (this one when they are already relaxed),
        solved for feasibility with :data:`FEASIBILITY_WORKERS`. The UNSAT explanation asks this model one
        relaxed problem after another: each fresh model is hinted with the last solution found
        (:meth:`hint_solution`), which breaks at most the one family the new question keeps (Triton
        ``attn_fwd_subtiled`` on B200 at II 294: the two re-solves that find a schedule take about 1 s each
        instead of about 2); the statuses, all proofs, are the same."""
        model = self
        if not set(families) <= self.problem.relaxed:
            relaxed = replace(self.problem, relaxed=self.problem.relaxed | set(families))
            model = CpsatJoint(relaxed, workers=self.workers, seed=self.seed)
            if self.witness is not None:
                model.hint_solution(self.witness)
        outcome = model.solve(None, time_limit=seconds, workers=FEASIBILITY_WORKERS)
        if outcome.found:
            self.witness = outcome.solution
            return Status.FEASIBLE
        return Status.UNKNOWN if outcome.status == Status.UNKNOWN else Status.INFEASIBLE

    def close(self) -> None:
        """Nothing to free: the model lives in Python."""

    def solve(self, objective: Objective | None, *, time_limit: float, workers: int | None = None) -> JointOutcome:
        """Minimise ``objective`` (None = satisfiability only) within ``time_limit`` seconds."""
        from twill.solve._ortools_loader import new_solver, solve_model

        cp_model = self.builder.cp_model
        m = self.builder.model
        m.clear_objective()
        if objective is not None:
            m.minimize(self.builder.v.objective[objective])
        solver = new_solver()
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
        solver.parameters.num_workers = workers or self.workers
        solver.parameters.random_seed = self.seed
        began = time.perf_counter()
        code = solve_model(solver, m)
        seconds = time.perf_counter() - began
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            proven = code == cp_model.OPTIMAL or objective is None
            return JointOutcome(Status.OPTIMAL if proven else Status.FEASIBLE, self.decode(solver), seconds)
        if code == cp_model.INFEASIBLE:
            return JointOutcome(Status.INFEASIBLE, None, seconds)
        if code == cp_model.MODEL_INVALID:
            raise RuntimeError(f"CP-SAT rejected the joint model: {m.validate()}")
        return JointOutcome(Status.UNKNOWN, None, seconds)
    def decode(self, solver: Any) -> JointSolution:
        """Read starts, L, op -> slot (exactly one true literal), widths and budgets."""
        v, p = self.builder.v, self.problem
        starts = {name: int(solver.value(var)) for name, var in v.t.items()}
        group: dict[str, int] = {}
        for name in self.builder.names:
            chosen = [g for g in self.builder.slots_of(name) if solver.boolean_value(v.assign[(name, g)])]
            assert len(chosen) == 1, f"op {name} decoded to slots {chosen}"
            group[name] = chosen[0]
        widths = tuple(int(solver.value(w)) for w in v.width)
        budgets = tuple(0 if widths[g] == 0 else (p.reg_limit if solver.boolean_value(v.heavy[g])
                                                  else p.light_regs) for g in range(p.slots))
        objectives = {name: int(solver.value(expr)) for name, expr in v.objective.items()}
        return JointSolution(starts, int(solver.value(v.length)), group, widths, budgets, objectives)
