"""Paper-faithful Yices 2 backend: the time-indexed QF_LIA model of Twill's Figures 4, 5 and 6.

The straight-line program Q overlaps n = ⌈L/I⌉ copies of one iteration, copy i starting at i·I, over
T = (n−1)·I + L cycles. Booleans ``op[v,i,t]`` (copy i of v issues at t), ``live[v,i,t]`` (its register
result is live at t) and ``opw[v,g]`` (v runs on warp-group slot g) carry the problem; every constraint
family is one ``add_*`` function below whose docstring gives its formula. The semantics are those of
docs/model.md (shared with the CP-SAT backend and the verifier), including its deviations from the paper:
group widths, the uniform register budget and REGISTER FILE, ``busy(o)`` in CONCURRENCY, the cross-warp
receive rule, mma_wait sharing its MMA's group, and MEMORY CAPACITY as statically allocated ring buffers.

Each query is a pure satisfiability check. :class:`~twill.solve.joint.yices_joint.YicesJoint` is this backend
behind the protocol of :mod:`twill.solve.joint.backend`, driven by Algorithm 1 (:mod:`twill.solve.joint.search`): at each I, one
query at L = LEN(M), then binary search over L ≤ n·I (COMPLETION is monotone in L). The model is built once per I on the widest grid
of that window (T_max = (n−1)·I + n·I) and each L is an assumption of one query (:func:`length_formulas`,
:func:`query`); nothing can issue past T, so the extra tail changes no answer. Secondary objectives (stages,
warps, SMEM, prologue) are minimised by the same kind of queries, assuming ``objective ≤ k``.

Auxiliary terms, each defined by an equivalence so that it adds no freedom:
  * ``issued[v,i,t] ⇔ issued[v,i,t−1] ∨ op[v,i,t]`` turns the paper's quadratic DEPENDENCE and CROSS-WARP
    SPILLS clauses ("op[u,i,t] ⇒ ¬op[v,i+δ,t′] for every t′ < t + d") into one clause per (u, i, t);
  * ``same[u,v] ⇔ ∨_g opw[u,g] ∧ opw[v,g]``; ``inflight[o,t] = ∨_{i′, t′∈[t−busy(o)+1, t]} op[o,i′,t′]``;
  * integer terms ``k_v = Σ_t ⌊t/I⌋·op[v,0,t]`` (stage), ``w_g`` (slot width), ``depth_v`` (ring depth).

Yices is GPL-3.0 and optional (``pip install "twill-gpu[yices]"``), loaded lazily by
:mod:`twill.solve._yices_loader`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence

from twill.ir.graph import Edge
from twill.ir.semantics import (blocking_in, buffer_edges, can_cross, carried_consumers, holds_memory, in_place,
                                is_accumulator, read_cycles, value_bytes, waited_groups)
from twill.schedule.vocab import RELAXABLE, Family, Objective
from twill.solve.joint.problem import WIDTHS, JointProblem, most_least_depth

#: Constraint families in paper order (Figures 4, 5, 6), as :func:`build_model` adds them.
FAMILIES = tuple(Family)

#: The families that imply the issue windows of :func:`issue_windows`; without one of them the full grid.
WINDOW_FAMILIES = frozenset({Family.CONSISTENCY, Family.COMPLETION, Family.DEPENDENCE})


class YicesModel:
    """One Yices context for a :class:`JointProblem`: named Booleans, the variable maps, assertions counted
    per family.

    Variable maps: ``op_at[(v, i, t)]`` (t ∈ [0, span)), ``live_at[(v, i, t)]`` (t ∈ [0, span], register
    results only), ``warp_of[(v, g)]``, ``issued_by[(v, i, t)]``; integer terms ``stage[v]``, ``width[g]``,
    ``objective[name]``.
    """

    def __init__(self, yices: Any, problem: JointProblem, *, switched: bool = False, windowed: bool = False):
        self.y = yices
        self.problem = problem
        self.graph = problem.graph
        self.ii = problem.ii
        self.copies = problem.copies
        self.span = problem.horizon(problem.length_max)
        self.windows_on = windowed
        self.tails = issue_tails(problem) if windowed else {}
        self.windows = issue_windows(problem) if windowed else {
            v: (0, self.span - 1) for v in self.graph.op_names}
        config = yices.Config()
        config.default_config_for_logic("QF_LIA")
        self.context = yices.Context(config)
        config.dispose()
        self.counts: dict[str, int] = {}
        self.booleans = 0
        self.integers = 0
        self.op_at: dict[tuple[str, int, int], int] = {}
        self.live_at: dict[tuple[str, int, int], int] = {}
        self.warp_of: dict[tuple[str, int], int] = {}
        self.issued_by: dict[tuple[str, int, int], int] = {}
        self.stage: dict[str, int] = {}
        self.width: list[int] = []
        self.heavy: list[int] = []
        self.objective: dict[str, int] = {}
        self.floors: dict[str, list[int]] = {}
        self.model: Any = None
        self.since_seal: list[int] | None = None
        self._same: dict[tuple[str, str], int] = {}
        self._inflight: dict[tuple[str, int], int] = {}
        self._negations: dict[int, int] = {}
        self._integers: dict[int, int] = {}
        terms = yices.Terms
        self.true, self.false = terms.true(), terms.false()
        self.zero, self.one = terms.integer(0), terms.integer(1)
        self.switch: dict[str, int] = {}
        if switched:
            self.switch = {f: self.new_bool(f"on[{f}]") for f in RELAXABLE if problem.active(f)}

    def close(self) -> None:
        """Free the Yices context and the last model (terms are global to Yices and stay)."""
        if self.model is not None:
            self.model.dispose()
            self.model = None
        if self.context is not None:
            self.context.dispose()
            self.context = None

    # -- adapter ---------------------------------------------------------------------------------------
    def new_bool(self, name: str) -> int:
        self.booleans += 1
        return self.y.Terms.new_uninterpreted_term(self.y.Types.bool_type(), name)

    def new_int(self, name: str, lo: int, hi: int) -> int:
        """A fresh integer in ``[lo, hi]`` (bounds asserted under the family ``domains``)."""
        self.integers += 1
        T = self.y.Terms
        var = T.new_uninterpreted_term(self.y.Types.int_type(), name)
        self.add("domains", [T.arith_geq_atom(var, T.integer(lo)), T.arith_leq_atom(var, T.integer(hi))])
        return var

    def add(self, family: str, formulas: Sequence[int]) -> None:
        """Assert ``formulas`` and count them under ``family``; a switched relaxable family asserts
        ``on[family] ⇒ formula`` instead (see :func:`switches`)."""
        formulas = [f for f in formulas if f != self.true]
        if family in self.switch:
            formulas = [self.implies([self.switch[family]], f) for f in formulas]
        if formulas:
            self.context.assert_formulas(formulas)
        if self.since_seal is not None:
            self.since_seal += formulas
        self.counts[family] = self.counts.get(family, 0) + len(formulas)

    def seal(self) -> None:
        """Mark the model built: ``push``, and keep every later assertion (L, objective values) for
        :meth:`recover`."""
        if self.context.status() != self.y.Status.UNSAT:       # an unsat context takes no push (nor needs it)
            self.context.push()
        self.since_seal = []

    def recover(self) -> None:
        """After an interrupted check (time out): ``pop`` (the one call that returns an interrupted context
        to use), ``push`` and assert again what was asserted since :meth:`seal`."""
        self.context.pop()
        self.context.push()
        if self.since_seal:
            self.context.assert_formulas(self.since_seal)

    def on(self, family: str) -> int:
        """The switch literal of a relaxable family (true when the model is not switched)."""
        return self.switch.get(family, self.true)

    def neg(self, term: int) -> int:
        """``¬term`` (memoised: model building makes millions of these calls through ctypes)."""
        if term not in self._negations:
            self._negations[term] = self.y.Terms.ynot(term)
        return self._negations[term]

    def any(self, terms: Iterable[int]) -> int:
        terms = [t for t in terms if t != self.false]
        if self.true in terms:
            return self.true
        if not terms:
            return self.false
        return terms[0] if len(terms) == 1 else self.y.Terms.yor(terms)

    def all(self, terms: Iterable[int]) -> int:
        terms = [t for t in terms if t != self.true]
        if self.false in terms:
            return self.false
        if not terms:
            return self.true
        return terms[0] if len(terms) == 1 else self.y.Terms.yand(terms)

    def implies(self, lhs: Sequence[int], rhs: int) -> int:
        """``∧ lhs ⇒ rhs`` as one clause."""
        return self.any([self.neg(t) for t in lhs] + [rhs])

    def integer(self, value: int) -> int:
        """The constant ``value`` (memoised)."""
        if value not in self._integers:
            self._integers[value] = self.y.Terms.integer(int(value))
        return self._integers[value]

    def linear(self, terms: Sequence[tuple[int, int]], constant: int = 0) -> int:
        """``constant + Σ weight·[literal]`` over ``(literal, weight)`` pairs."""
        T = self.y.Terms
        parts = [T.ite(lit, self.integer(w), self.zero) for lit, w in terms if w and lit != self.false]
        parts.append(self.integer(constant))
        return parts[0] if len(parts) == 1 else T.sum(parts)

    def leq(self, lhs: int, rhs: int) -> int:
        return self.y.Terms.arith_leq_atom(lhs, rhs)

    def weighted_sum_leq(self, terms: Sequence[tuple[int, int]], bound: int) -> int | None:
        """``Σ weight·[literal] ≤ bound``; None when it holds whatever the literals."""
        terms = [(lit, w) for lit, w in terms if w and lit != self.false]
        if sum(w for _, w in terms) <= bound:
            return None
        return self.leq(self.linear(terms), self.integer(bound))

    def exactly_one(self, literals: Sequence[int]) -> int:
        """``Σ [literal] = 1`` (a QF_LIA cardinality atom)."""
        if not literals:
            return self.false
        return self.y.Terms.arith_eq_atom(self.linear([(lit, 1) for lit in literals]), self.one)

    # -- variable lookups ------------------------------------------------------------------------------
    def op(self, v: str, i: int, t: int) -> int:
        """``op[v,i,t]``; false outside ``[0, span)`` and for copies outside ``[0, n)``."""
        return self.op_at.get((v, i, t), self.false)

    def live(self, v: str, i: int, t: int) -> int:
        return self.live_at.get((v, i, t), self.false)

    def opw(self, v: str, g: int) -> int:
        return self.warp_of.get((v, g), self.false)

    def slots_of(self, v: str) -> list[int]:
        """Slots ``v`` may use: W_vl (0) iff variable latency (VARIABLE LATENCY), else 1 … G−1."""
        return [0] if self.graph.op(v).variable_latency else list(range(1, self.problem.slots))

    def not_issued_before(self, v: str, i: int, s: int) -> int:
        """``∧_{t′ < s} ¬op[v,i,t′]`` = ``¬issued[v,i,s−1]`` (true when s ≤ 0)."""
        if s <= 0:
            return self.true
        return self.neg(self.issued_by[(v, i, min(s, self.span) - 1)])

    def same(self, a: str, b: str) -> int:
        """``same[a,b] ⇔ ∨_g opw[a,g] ∧ opw[b,g]`` (a fresh Boolean, defined once per pair)."""
        key = (a, b) if a <= b else (b, a)
        if key not in self._same:
            lit = self.new_bool(f"same[{key[0]},{key[1]}]")
            common = [self.all([self.opw(a, g), self.opw(b, g)]) for g in range(self.problem.slots)]
            self.add("warp_definitions", [self.y.Terms.iff(lit, self.any(common))])
            self._same[key] = lit
        return self._same[key]

    def inflight(self, o: str, t: int) -> int:
        """``∨_{i′, t′ ∈ [t−busy(o)+1, t]} op[o,i′,t′]``: some copy of ``o`` holds its warp at ``t``.

        When busy(o) > cycles(o) a copy can still hold its warp after COMPLETION's end of Q, so the copy
        before Q (i′ = −1, issued at t′ ⇔ op[o,0,t′+I]) is included: Q's steady state then sees every
        overlap that the modulo rule of docs/model.md sees. Each copy's part is :func:`occupied`."""
        key = (o, t)
        if key not in self._inflight:
            op = self.graph.op(o)
            first = -1 if op.busy > op.cycles else 0
            cycles = range(op.busy)
            self._inflight[key] = self.any(occupied(self, o, 0, t + self.ii, cycles) if i < 0
                                           else occupied(self, o, i, t, cycles) for i in range(first, self.copies))
        return self._inflight[key]

    def crossing(self, edge: Edge) -> bool:
        """The edge can carry a register value to another group (docs/model.md CROSS-WARP SPILLS)."""
        return edge.src != edge.dst and can_cross(self.graph.op(edge.src))


# -- variables -------------------------------------------------------------------------------------------
def issue_tails(problem: JointProblem) -> dict[str, int]:
    """``tail(v) = max_u W(v, u) + cycles(u)`` over ``u = v`` and every op a path from ``v`` reaches
    (``twill.ir.bounds.dependence_closure``): copy 0 of ``v`` issues at least ``tail(v)`` before L, since each
    such ``u`` starts ``W(v, u)`` after ``v`` or later and completes by L."""
    from twill.ir.bounds import dependence_closure

    graph = problem.graph
    closure = dependence_closure(graph, problem.ii) or {}
    return {op.name: max([op.cycles] + [w + graph.op(u).cycles for (src, u), w in closure.items()
                                        if src == op.name]) for op in graph.ops}


def issue_windows(problem: JointProblem) -> dict[str, tuple[int, int]]:
    """Copy 0 of ``v`` issues in ``[asap(v), L_max − tail(v)]`` (:func:`issue_tails`): ``asap`` is the
    longest dependence path from a source at 0 and every op ``v`` reaches must complete by ``L ≤ L_max``.
    CONSISTENCY, COMPLETION and DEPENDENCE imply both ends (copy ``i`` is copy 0 shifted by ``i·I``, and
    every edge constrains some pair of copies: ``t_v − t_u ≥ d − δ·I`` on copy 0), so the grid outside the
    windows holds no schedule (docs/model.md, Yices backend, "Windows")."""
    from twill.ir.bounds import asap_starts

    asap = asap_starts(problem.graph, problem.ii) or {}
    tails = issue_tails(problem)
    return {op.name: (asap.get(op.name, 0), problem.length_max - tails[op.name]) for op in problem.graph.ops}


def add_variables(m: YicesModel) -> None:
    """``op[v,i,t]`` for ``t`` in copy i's issue window (:func:`issue_windows` shifted by ``i·I``; false
    elsewhere) and ``issued[v,i,t] ⇔ issued[v,i,t−1] ∨ op[v,i,t]`` (issued[v,i,−1] = false; outside the
    window ``issued`` is the previous term) for every op; ``live[v,i,t]`` for ops with a register result;
    ``opw[v,g]`` over every slot; the stage ``k_v = Σ_t ⌊t/I⌋·op[v,0,t]``, stated as
``Σ_{s ≥ 1} ¬issued[v,0,s·I−1]`` (the stage boundaries copy 0 has not reached; two terms instead of one per
cycle); per slot an integer width
    ``w_g ∈ [0, 8]`` and the term ``heavy_g = ∨_{v: regs(v) > 0} opw[v,g]``."""
    T = m.y.Terms
    definitions = []
    for op in m.graph.ops:
        v = op.name
        first, last = m.windows[v]
        for i in range(m.copies):
            previous = m.false
            for t in range(m.span):
                if not first + i * m.ii <= t <= last + i * m.ii:
                    m.issued_by[(v, i, t)] = previous
                    continue
                lit = m.new_bool(f"op[{v},i={i},t={t}]")
                m.op_at[(v, i, t)] = lit
                issued = m.new_bool(f"issued[{v},i={i},t={t}]")
                definitions.append(T.iff(issued, m.any([previous, lit])))
                m.issued_by[(v, i, t)] = issued
                previous = issued
            if op.regs > 0:
                for t in range(m.span + 1):
                    m.live_at[(v, i, t)] = m.new_bool(f"live[{v},i={i},t={t}]")
        for g in range(m.problem.slots):
            m.warp_of[(v, g)] = m.new_bool(f"opw[{v},g={g}]")
        m.stage[v] = m.linear([(m.neg(m.issued_by[(v, 0, s * m.ii - 1)]), 1)
                               for s in range(1, (m.span - 1) // m.ii + 1)])
    m.add("issued_definitions", definitions)
    for g in range(m.problem.slots):
        m.width.append(m.new_int(f"w[g={g}]", 0, max(WIDTHS)))
        m.heavy.append(m.any(m.opw(op.name, g) for op in m.graph.ops if op.regs > 0))


# -- Figure 4: a valid modulo schedule -------------------------------------------------------------------
def add_uniqueness(m: YicesModel) -> None:
    """UNIQUENESS (Fig. 4): ∀ v, i: Σ_t op[v,i,t] = 1."""
    m.add("uniqueness", [m.exactly_one([m.op(v, i, t) for t in range(m.span)])
                         for v in m.graph.op_names for i in range(m.copies)])


def add_consistency(m: YicesModel) -> None:
    """CONSISTENCY (Fig. 4): ∀ v, i ∈ [1, n), t: op[v,0,t] ⇒ op[v,i,t + i·I] (op beyond the grid is false)."""
    m.add("consistency", [m.implies([m.op(v, 0, t)], m.op(v, i, t + i * m.ii))
                          for v in m.graph.op_names for i in range(1, m.copies) for t in range(m.span)])


def completion_formulas(m: YicesModel, horizon: int) -> list[int]:
    """COMPLETION (Fig. 4) at T = ``horizon``: ∀ v, i, t: t + cycles(v) > T ⇒ ¬op[v,i,t]."""
    return [m.neg(m.op(op.name, i, t)) for op in m.graph.ops for i in range(m.copies)
            for t in range(max(0, horizon - op.cycles + 1), m.span)]


def add_completion(m: YicesModel) -> None:
    """COMPLETION at the widest horizon of the model; each L narrows it (:func:`length_formulas`)."""
    m.add("completion", completion_formulas(m, m.span))


def length_formulas(m: YicesModel, length: int) -> list[int]:
    """L = ``length``: COMPLETION at T = (n−1)·I + L; in a windowed model instead the issue windows at L,
    copy i of v issuing by ``L − tail(v) + i·I`` (:func:`issue_tails`; :func:`issue_windows` with L for
    L_max). The windows are implied by COMPLETION at T with CONSISTENCY and DEPENDENCE, and imply it
    (``tail(v) ≥ cycles(v)``, ``i ≤ n−1``): the same schedules, as unit clauses the solver needs not derive."""
    if not m.windows_on:
        return completion_formulas(m, m.problem.horizon(length))
    return [m.neg(lit) for (v, i, t), lit in m.op_at.items() if t > length - m.tails[v] + i * m.ii]


def dependence_pairs(m: YicesModel, edge: Edge) -> list[tuple[int, int, int]]:
    """``(i, j, shift)``: copy i of the source constrains copy j of the consumer, shifted by ``shift``
    cycles. The paper's pairs are ``j = i + δ < n``; an edge with δ ≥ n (its consumer is beyond Q) is kept on
    copy 0 as ``j = 0, shift = δ·I`` — the modulo dependence that docs/model.md states for every edge."""
    if edge.distance >= m.copies:
        return [(0, 0, edge.distance * m.ii)]
    return [(i, i + edge.distance, 0) for i in range(m.copies - edge.distance)]


def add_dependence(m: YicesModel) -> None:
    """DEPENDENCE (Fig. 4): ∀ (u,v,d,δ), i, t, t′ ∈ [0, t + d): op[u,i,t] ⇒ ¬op[v,i+δ,t′],
    emitted as ``op[u,i,t] ⇒ ¬issued[v,i+δ,t+d−1]``; with CONSISTENCY also in the model, the same
    statement on copy 0's integer start ``s_v = Σ_t t·op[v,0,t]`` (``s_v − s_u ≥ d − δ·I``, one linear
    atom per edge that the arithmetic solver propagates across the whole grid)."""
    T = m.y.Terms
    out = []
    if m.windows_on:
        start = {v: m.linear([(m.op(v, 0, t), t) for t in range(m.span)]) for v in m.graph.op_names}
        out += [T.arith_geq_atom(T.sub(start[e.dst], start[e.src]), m.integer(e.delay - e.distance * m.ii))
                for e in m.graph.edges if e.src != e.dst]
    for e in m.graph.edges:
        for i, j, shift in dependence_pairs(m, e):
            for t in range(m.span):
                bound = m.not_issued_before(e.dst, j, t + e.delay - shift)
                if bound != m.true:
                    out.append(m.implies([m.op(e.src, i, t)], bound))
    m.add("dependence", out)


def add_capacity(m: YicesModel) -> None:
    """CAPACITY (Fig. 4): ∀ t, f: Σ_{v, i, c ∈ [0, cycles(v))} op[v,i,t−c]·RRT[v][f,c] ≤ cap(f).

    Copy i of v issues once (UNIQUENESS), so its cycles with one count ``k`` form one term
    ``occupied(v, i, t, cycles)·k`` (:func:`occupied`). When any two terms exceed the capacity together (every
    unit of capacity 1), the sum is an at-most-one over the terms: one clause per pair, no arithmetic."""
    out = []
    for unit, cap in sorted(m.problem.units.items()):
        counts: dict[tuple[str, int], list[int]] = {}
        for op in m.graph.ops:
            for c, row in enumerate(op.rrt):
                if dict(row).get(unit):
                    counts.setdefault((op.name, dict(row)[unit]), []).append(c)
        for t in range(m.span):
            terms = [(occupied(m, v, i, t, cycles), count) for (v, count), cycles in counts.items()
                     for i in range(m.copies)]
            out += at_most(m, [(lit, w) for lit, w in terms if lit != m.false], cap)
    m.add("capacity", out)


def occupied(m: YicesModel, v: str, i: int, t: int, cycles: Sequence[int]) -> int:
    """``∨_{c ∈ cycles} op[v,i,t−c]``: each run ``[a, b]`` of consecutive cycles is
    ``issued[v,i,t−a] ∧ ¬issued[v,i,t−b−1]`` (copy i issues once)."""
    runs: list[list[int]] = []
    for c in sorted(cycles):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    parts = []
    for a, b in runs:
        if t - a < 0:
            continue
        parts.append(m.all([m.issued_by[(v, i, min(t - a, m.span - 1))], m.not_issued_before(v, i, t - b)]))
    return m.any(parts)


def at_most(m: YicesModel, terms: Sequence[tuple[int, int]], bound: int) -> list[int]:
    """``Σ weight·[literal] ≤ bound`` as formulas: a term heavier than ``bound`` is false; when any two of
    the rest exceed ``bound`` together, one clause ``¬a ∨ ¬b`` per pair; else one arithmetic atom."""
    out = [m.neg(lit) for lit, w in terms if w > bound]
    terms = [(lit, w) for lit, w in terms if 0 < w <= bound]
    weights = sorted(w for _, w in terms)
    if len(weights) >= 2 and weights[0] + weights[1] > bound:
        out += [m.any([m.neg(a), m.neg(b)]) for k, (a, _) in enumerate(terms) for b, _ in terms[k + 1:]]
    else:
        atom = m.weighted_sum_leq(terms, bound)
        out += [] if atom is None else [atom]
    return out


# -- Figure 5: liveness and memory -----------------------------------------------------------------------
def uses(m: YicesModel, v: str, i: int) -> list[tuple[str, int, int]]:
    """Consumers ``(u, j, read)`` of copy i of v: ``j = i + δ`` per out-edge (v,u,·,δ); u reads the value
    until ``read`` cycles after it issues (``read_cycles``: cycles(u), 0 when u overwrites v in place). An
    in-place accumulator (self-edge of distance 1) has only its next copy, read 0 (docs/model.md, Liveness)."""
    if in_place(m.graph, v):
        return [(v, i + 1, 0)]
    return [(e.dst, i + e.distance, read_cycles(m.graph, v, e.dst)) for e in m.graph.out_edges(v)]


def live_at_end(m: YicesModel, v: str, i: int) -> bool:
    """INIT (Fig. 5): copy i of v is live at T iff one of its consumers lies beyond Q (j ≥ n); for δ = 1
    this is the paper's "loop-carried results of the last copy"."""
    return any(j >= m.copies for _, j, _ in uses(m, v, i))


def add_liveness(m: YicesModel) -> None:
    """INIT, LIVEPROP, DEADPROP (Fig. 5) for register results, the backward dataflow over Q:

        INIT      live[v,i,T] ⇔ live_at_end(v, i)
        LIVEPROP  live[v,i,t] ∧ ¬op[v,i,t] ⇒ live[v,i,t−1];   op[v,i,t] ⇒ ¬live[v,i,t−1]
        DEADPROP  ¬live[v,i,t] ∧ use(v,i,t) ∧ ¬op[v,i,t] ⇒ live[v,i,t−1];
                  ¬live[v,i,t] ∧ ¬use(v,i,t) ⇒ ¬live[v,i,t−1]

    together ``live[v,i,t−1] ⇔ ¬op[v,i,t] ∧ (live[v,i,t] ∨ use(v,i,t))``, use(v,i,t) = ∨ op[u,j,t−read] over
    the consumers ``(u, j, read)`` of :func:`uses` inside Q (a consumer still reads the value ``read`` cycles
    after it issues). REGISTER LIMIT counts ``live ∨ op``: the value occupies ``[t_v+i·I, E_{v,i})``,
    ``E_{v,i} = max(t_v+i·I+1, max_u t_u+j·I+read)`` as docs/model.md states (one cycle when unused). The
    model spans T_max ≥ T; nothing issues past T, so live is constant on [T, T_max] and INIT sits at T_max.
    """
    T = m.y.Terms
    out = []
    for op in m.graph.ops:
        if op.regs <= 0:
            continue
        v = op.name
        for i in range(m.copies):
            end = m.live(v, i, m.span)
            out.append(end if live_at_end(m, v, i) else m.neg(end))
            consumers = [(u, j, read) for u, j, read in uses(m, v, i) if j < m.copies]
            for t in range(m.span, 0, -1):
                used = m.any(m.op(u, j, t - read) for u, j, read in consumers)
                keep = m.all([m.neg(m.op(v, i, t)), m.any([m.live(v, i, t), used])])
                out.append(T.iff(m.live(v, i, t - 1), keep))
    m.add("liveness", out)


def smem_lower_bound(p: JointProblem) -> int:
    """SMEM with every ring at its least depth (``LoopGraph.least_depth``) and nothing staged."""
    least = {op.name: 1 if is_accumulator(op) else p.graph.least_depth(op.name, p.streaming_depth)
             for op in p.graph.ops}
    return p.smem_resident + sum(op.smem * least[op.name] for op in p.graph.ops)


def add_memory_capacity(m: YicesModel) -> None:
    """MEMORY CAPACITY (Fig. 5, docs/model.md §4: statically allocated ring buffers):
    ``resident + Σ_v smem(v)·depth(v) + Σ_e staging(e) ≤ smem_per_block`` and ``Σ_v tmem(v)·depth(v) ≤ tmem``,
    ``depth(v) ≥ k_u + δ − k_v + 1`` per out-edge to another op (1 for accumulators; ≥ least_depth(v) for
    streaming loads), ``staging(u→v) ≥ bytes(u)·(k_v + δ − k_u + 1)`` when the edge crosses groups. The
    floor of ``smem`` (``m.floors``): every shared-memory ring at its least depth and nothing staged, term by
    term (the one way ``smem`` meets :func:`smem_lower_bound`)."""
    p, T = m.problem, m.y.Terms
    formulas = []
    max_depth = p.copies + max([e.distance for e in m.graph.edges] or [0]) + most_least_depth(p) + 1
    smem_terms, tmem_terms, floor = [m.integer(p.smem_resident)], [], []
    for op in m.graph.ops:
        if not holds_memory(op):
            continue
        depth = m.new_int(f"depth[{op.name}]", 1, max_depth)
        if is_accumulator(op):
            formulas.append(T.arith_eq_atom(depth, m.one))
        else:
            for e in buffer_edges(m.graph, op.name):
                need = T.sum([m.stage[e.dst], m.integer(e.distance + 1), T.neg(m.stage[op.name])])
                formulas.append(T.arith_geq_atom(depth, need))
            least = m.graph.least_depth(op.name, p.streaming_depth)
            if least > 1:
                formulas.append(T.arith_geq_atom(depth, m.integer(least)))
        smem_terms.append(T.mul(m.integer(op.smem), depth))
        tmem_terms.append(T.mul(m.integer(op.tmem), depth))
        if op.smem > 0:
            floor.append(m.leq(depth, m.integer(1 if is_accumulator(op) else
                                                m.graph.least_depth(op.name, p.streaming_depth))))
    if p.active("cross_warp_spills") and p.cross_warp:
        for e in m.graph.edges:
            if not m.crossing(e):
                continue
            nbytes = value_bytes(m.graph.op(e.src))
            staged = m.new_int(f"staging[{e.src}->{e.dst}]", 0, nbytes * (p.copies + e.distance + 1))
            need = T.mul(m.integer(nbytes),
                         T.sum([m.stage[e.dst], m.integer(e.distance + 1), T.neg(m.stage[e.src])]))
            formulas.append(m.implies([m.on("cross_warp_spills"), m.neg(m.same(e.src, e.dst))],
                                      T.arith_geq_atom(staged, need)))
            smem_terms.append(staged)
            floor.append(m.leq(staged, m.zero))
    smem = T.sum(smem_terms)
    m.objective["smem"] = smem
    m.floors["smem"] = floor
    if p.active("memory_capacity"):
        formulas.append(m.leq(smem, m.integer(p.smem_capacity)))
        if p.tmem_capacity > 0 and tmem_terms:
            formulas.append(m.leq(T.sum(tmem_terms), m.integer(p.tmem_capacity)))
    m.add("memory_capacity", formulas)


# -- Figure 6: warp assignment ---------------------------------------------------------------------------
def add_warp_uniqueness(m: YicesModel) -> None:
    """WARP UNIQUENESS (Fig. 6, docs/model.md §3): ∀ v: Σ_g opw[v,g] = 1 over all slots; a slot's width
    ``w_g ∈ {0,1,2,4,8}`` equals warps(v) for every v on it and is 0 iff the slot is empty; an ``mma_wait``
    shares the slot of its MMA. Symmetry breaking (removes no schedule up to renaming slots): for g ≥ 2,
    ``opw[v,g] ⇒ ∨_{u before v} opw[u,g−1]``."""
    T = m.y.Terms
    p, names = m.problem, m.graph.op_names
    out = [m.exactly_one([m.opw(v, g) for g in range(p.slots)]) for v in names]
    for g, width in enumerate(m.width):
        members = [v for v in names if (v, g) in m.warp_of]
        for v in members:
            out.append(m.implies([m.opw(v, g)], T.arith_eq_atom(width, m.integer(m.graph.op(v).warps))))
        out.append(m.any([m.opw(v, g) for v in members] + [T.arith_eq_atom(width, m.zero)]))
    for g in range(2, p.slots):
        for j, v in enumerate(names):
            if (v, g) in m.warp_of:
                earlier = [m.opw(u, g - 1) for u in names[:j]]
                out.append(m.implies([m.opw(v, g)], m.any(earlier)))
    for wait, mma in waited_groups(m.graph):
        out.append(m.same(wait, mma))
    m.add("warp_uniqueness", out)


def add_variable_latency(m: YicesModel) -> None:
    """VARIABLE LATENCY (Fig. 6): ∀ v: variable_latency(v) ⇔ opw[v, W_vl], W_vl being slot 0."""
    m.add("variable_latency", [m.opw(op.name, 0) if op.variable_latency else m.neg(m.opw(op.name, 0))
                               for op in m.graph.ops])


def add_warp_count(m: YicesModel) -> None:
    """WARP COUNT (docs/model.md §3): ``Σ_g w_g ≤ max_warps``."""
    total = m.y.Terms.sum(m.width)
    m.objective["warps"] = total
    if m.problem.active("warp_count"):
        m.add("warp_count", [m.leq(total, m.integer(m.problem.max_warps))])


def add_register_file(m: YicesModel) -> None:
    """REGISTER FILE (docs/model.md §3): ``Σ_g 32·w_g·budget_g ≤ regs_per_sm``, ``budget_g = R`` when slot g
    holds a register result (heavy), else the setmaxnreg minimum."""
    T, p = m.y.Terms, m.problem
    if not p.active("register_file"):
        return
    parts = [T.mul(m.integer(32 * p.light_regs), w) for w in m.width]
    parts += [T.ite(heavy, T.mul(m.integer(32 * (p.reg_limit - p.light_regs)), w), m.zero)
              for heavy, w in zip(m.heavy, m.width) if heavy != m.false]
    m.add("register_file", [m.leq(T.sum(parts), m.integer(p.regs_per_sm))])


def add_register_limit(m: YicesModel) -> None:
    """REGISTER LIMIT (Fig. 6): ∀ t, g: Σ_{v,i} (live[v,i,t] ∨ op[v,i,t])·opw[v,g]·regs(v) ≤ R −
    reserved_regs (docs/model.md: every group keeps bookkeeping registers, by default the ``setmaxnreg``
    minimum a light warp runs on; tile values get the rest). An in-place accumulator counts at every t: its
    copies are live back to back from its initial value (held from loop entry until copy 0 issues) to T, so
    their union is the whole of Q.

    Stated at the issue times only, which is the same constraint: every other value occupies one interval
    ``[t_{v,i}, E_{v,i})`` (LIVENESS), so a slot's sum can only rise where a copy issues, and its maximum over
    t is at some ``t_{v,i}``. Per copy (v, i) of a register result, ``covers[u,j,v,i] ⇐ op[v,i,t] ∧
    (live[u,j,t] ∨ op[u,j,t])`` for every t (the sum only asks covers to be false, so one direction is
    exact), and ``regs(v) + Σ_{(u,j)} covers·same[u,v]·regs(u) + Σ_{in place u} same[u,v]·regs(u) ≤ R −
    reserved_regs``; a slot of in-place accumulators alone: ``Σ opw[u,g]·regs(u) ≤ R − reserved_regs``. 20
    atoms on H100 flash-fwd ``--subtiles 2`` where one per (t, g) made 8544, the model's slowest family."""
    p = m.problem
    if not p.active("register_limit"):
        return
    out = []
    budget = p.reg_limit - p.reserved_regs
    holders = [op.name for op in m.graph.ops if op.regs > 0]
    placed = [v for v in holders if in_place(m.graph, v)]
    interval = [(v, i) for v in holders if v not in placed for i in range(m.copies)]
    regs = {v: m.graph.op(v).regs for v in holders}
    free: dict[tuple[str, int, int], int] = {}          # ¬(live[u,j,t] ∨ op[u,j,t]), built once per (u, j, t)
    for u, j in interval:
        for t in range(m.span):
            if (u, j, t) in m.op_at or (u, j, t) in m.live_at:
                free[(u, j, t)] = m.neg(m.any([m.live(u, j, t), m.op(u, j, t)]))
    for v, i in interval:
        issues = [(t, m.neg(m.op(v, i, t))) for t in range(m.span) if (v, i, t) in m.op_at]
        terms = [(m.true, regs[v])]
        for u, j in interval:
            if (u, j) == (v, i):
                continue
            covers = m.new_bool(f"covers[{u},{j},{v},{i}]")
            out += [m.any([not_issued, free[(u, j, t)], covers]) for t, not_issued in issues
                    if (u, j, t) in free]
            terms.append((m.all([covers, m.true if u == v else m.same(u, v)]), regs[u]))
        terms += [(m.same(u, v), regs[u]) for u in placed]
        out += at_most(m, terms, budget)
    for g in range(p.slots):
        out += at_most(m, [(m.opw(u, g), regs[u]) for u in placed], budget)
    m.add("register_limit", out)


def add_cross_warp_spills(m: YicesModel) -> None:
    """CROSS-WARP SPILLS (Fig. 6): ∀ (u,v,d,δ), t, i, w ≠ w′, s ∈ [0, spillcost(u)):
    op[u,i,t] ∧ opw[u,w] ∧ opw[v,w′] ⇒ ¬op[v,i+δ,t+d+s]; with DEPENDENCE this is
    ``op[u,i,t] ∧ ¬same[u,v] ⇒ ¬issued[v,i+δ,t+d+spill(u)−1]`` for register results (regs(u) > 0). With
    ``cross_warp`` off, ``same[u,v]`` holds on every such edge (the paper's third UNSAT ablation)."""
    p = m.problem
    if not p.active("cross_warp_spills"):
        return
    out = []
    for e in m.graph.edges:
        if not m.crossing(e):
            continue
        if not p.cross_warp:
            out.append(m.same(e.src, e.dst))
            continue
        spill = m.graph.op(e.src).spill_cost
        if not spill:
            continue
        crossing = m.neg(m.same(e.src, e.dst))
        for i, j, shift in dependence_pairs(m, e):
            for t in range(m.span):
                bound = m.not_issued_before(e.dst, j, t + e.delay + spill - shift)
                if bound != m.true:
                    out.append(m.implies([m.op(e.src, i, t), crossing], bound))
    m.add("cross_warp_spills", out)


def waits(m: YicesModel, v: str) -> int:
    """``waits(v)``: true for a blocking in-edge (CONCURRENCY); else ``∨ ¬same[u,v]`` over register in-edges
    (the cross-warp receive variant: receiving through shared memory blocks too); false when v never waits."""
    if blocking_in(m.graph, v):
        return m.true
    if not (m.problem.active("cross_warp_spills") and m.problem.cross_warp):
        return m.false
    crossing = m.any(m.neg(m.same(e.src, v)) for e in m.graph.in_edges(v) if m.crossing(e))
    return m.all([m.on("cross_warp_spills"), crossing]) if crossing != m.false else m.false


def add_concurrency(m: YicesModel) -> None:
    """CONCURRENCY (Fig. 6) with the cross-warp receive variant: ∀ v, i, t, o ≠ v with busy(o) > 0:
    op[v,i,t] ∧ waits(v) ∧ same[v,o] ⇒ ¬op[o,i′,t′] for all i′ and t′ ∈ [t − busy(o) + 1, t]. The paper's
    cycles(o) is ``busy(o)`` (docs/model.md: an asynchronous op holds its warp only while it issues).
    Emitted per (v, i, t) against ``∨_o same[v,o] ∧ inflight[o,t]`` (the same clauses, shared over i);
    pairs that VARIABLE LATENCY keeps apart (W_vl vs compute slots) are skipped."""
    if not m.problem.active("concurrency"):
        return
    out = []
    names = m.graph.op_names
    for v in names:
        waiting = waits(m, v)
        if waiting == m.false:
            continue
        others = [o for o in names if o != v and m.graph.op(o).busy > 0
                  and set(m.slots_of(v)) & set(m.slots_of(o))]
        for t in range(m.span):
            occupied = m.any(m.all([m.same(v, o), m.inflight(o, t)]) for o in others)
            if occupied == m.false:
                continue
            free = m.neg(occupied)
            out += [m.implies([m.op(v, i, t), waiting], free) for i in range(m.copies)]
    m.add("concurrency", out)


def add_warp_issue(m: YicesModel) -> None:
    """WARP ISSUE (docs/model.md, ours): a warp group issues in order and runs one tile op at a time —
    ∀ g, t: Σ_v inflight[v,t]·opw[v,g] ≤ 1 over ops with busy(v) > 0, and busy(v) > I ⇒ ¬opw[v,g] (an op
    that cannot repeat every I on one warp). The at-most-one over v is one clause per pair and t, over all
    slots at once: ``¬inflight[v,t] ∨ ¬inflight[u,t] ∨ ¬same[u,v]``."""
    p = m.problem
    if not p.active("warp_issue"):
        return
    out = []
    issuers = [op for op in m.graph.ops if op.busy > 0]
    for op in issuers:
        if op.busy > p.ii:
            out += [m.neg(m.opw(op.name, g)) for g in range(p.slots)]
    users = [op.name for op in issuers if op.busy <= p.ii]
    for k, v in enumerate(users):
        for u in users[k + 1:]:
            together = m.same(u, v)
            for t in range(m.span):
                out.append(m.any([m.neg(m.inflight(v, t)), m.neg(m.inflight(u, t)), m.neg(together)]))
    m.add("warp_issue", out)


def add_objective_terms(m: YicesModel) -> None:
    """Objective terms: ``stages = max_v k_v + 1`` (an integer ``top ≥ k_v``, minimised) and
    ``prologue = Σ_v (top − k_v)``."""
    T = m.y.Terms
    top = m.new_int("max_stage", 0, m.span // m.ii)
    m.add("objectives", [T.arith_geq_atom(top, k) for k in m.stage.values()])
    m.objective["stages"] = T.add(top, m.one)
    m.objective["prologue"] = T.sum([T.sub(top, k) for k in m.stage.values()])


def add_exclusions(m: YicesModel) -> None:
    """EXCLUDED (Twill's; not a paper family): for each excluded carried set X of register values,
    ``∨_{v∈X} ∧_u k_u ≤ k_v`` over the distance-0 consumers u of v; for each excluded order ``o_1 … o_k``,
    ``∨_i t_{o_{i+1}} < t_{o_i}`` with the start ``t_v = Σ_t ¬issued[v,0,t]`` (the cycles before copy 0
    issues)."""
    T = m.y.Terms
    formulas = [m.any([m.all([T.arith_leq_atom(m.stage[u], m.stage[v]) for u in carried_consumers(m.graph, v)])
                       for v in carried]) for carried in m.problem.excluded_carries]
    starts: dict[str, int] = {}

    def start(v: str) -> int:
        if v not in starts:
            starts[v] = m.linear([(m.neg(m.issued_by[(v, 0, t)]), 1) for t in range(m.span)])
        return starts[v]

    formulas += [m.any([T.arith_lt_atom(start(b), start(a)) for a, b in zip(order, order[1:])])
                 for order in m.problem.excluded_orders]
    if formulas:
        m.add("excluded", formulas)


def add_hoist_term(m: YicesModel, pairs: Sequence[tuple[str, str]]) -> None:
    """The ``unhoisted`` term over the pairs of :func:`twill.solve.joint.search.hoist_pairs`:
    ``Σ_(u,v) ite(k_v ≥ k_u + 1, 0, 1)``."""
    T = m.y.Terms
    m.objective[Objective.UNHOISTED] = T.sum([T.ite(T.arith_geq_atom(T.sub(m.stage[v], m.stage[u]), m.one),
                                                    m.zero, m.one) for u, v in pairs])


FAMILY_FUNCTIONS: dict[str, Callable[[YicesModel], None]] = {
    "uniqueness": add_uniqueness, "consistency": add_consistency, "completion": add_completion,
    "dependence": add_dependence, "capacity": add_capacity, "liveness": add_liveness,
    "memory_capacity": add_memory_capacity, "warp_uniqueness": add_warp_uniqueness,
    "variable_latency": add_variable_latency, "warp_count": add_warp_count,
    "register_file": add_register_file, "register_limit": add_register_limit,
    "cross_warp_spills": add_cross_warp_spills, "concurrency": add_concurrency, "warp_issue": add_warp_issue,
}


def build_model(yices: Any, problem: JointProblem, families: Iterable[str] = FAMILIES, *,
                switched: bool = False) -> YicesModel:
    """The time-indexed model of ``problem`` with ``families`` added in paper order (a table of contents of
    Figures 4-6). Families in ``problem.relaxed`` are skipped by their own functions; ``families`` lets a
    test leave any family out. ``switched`` guards every relaxable family with a literal ``on[family]``
    that each query assumes (:func:`switches`), so the UNSAT explanation reuses the model."""
    chosen = set(families)
    unknown = chosen - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown constraint families {sorted(unknown)}")
    m = YicesModel(yices, problem, switched=switched, windowed=WINDOW_FAMILIES <= chosen)
    add_variables(m)
    for name in FAMILIES:
        if name in chosen:
            FAMILY_FUNCTIONS[name](m)
    m.objective.setdefault("warps", m.y.Terms.sum(m.width))
    m.objective.setdefault("smem", m.zero)
    add_exclusions(m)
    add_objective_terms(m)
    m.seal()
    return m


# -- queries ---------------------------------------------------------------------------------------------
def query(m: YicesModel, assumptions: Sequence[int] = (), timeout: float | None = None) -> str:
    """One satisfiability check of the context under ``assumptions`` (``check_context_with_assumptions``:
    nothing is asserted, so the clauses Yices learns stay for the next query, where push/pop would drop
    them), stopped after ``timeout`` seconds: ``sat`` (the model is kept in ``m.model``), ``unsat`` or
    ``unknown`` (time out)."""
    from twill.solve._interrupt import interruptible

    y = m.y
    timer = None if timeout is None else threading.Timer(max(0.01, timeout), m.context.stop_search)
    if timer is not None:
        timer.start()
    try:    # Ctrl-C and SIGTERM stop the check too (twill.solve._interrupt)
        status = interruptible(lambda: m.context.check_context_with_assumptions(None, list(assumptions)),
                               m.context.stop_search)
    finally:
        if timer is not None:
            timer.cancel()
    if status == y.Status.SAT:
        if m.model is not None:
            m.model.dispose()
        m.model = y.Model.from_context(m.context, 1)
        return "sat"
    if status == y.Status.INTERRUPTED:
        m.recover()
    return "unsat" if status == y.Status.UNSAT else "unknown"


def switches(m: YicesModel, off: Iterable[str] = ()) -> list[int]:
    """Assumptions that switch every relaxable family on except ``off`` (empty for an unswitched model)."""
    off = set(off)
    return [m.neg(lit) if family in off else lit for family, lit in m.switch.items()]
