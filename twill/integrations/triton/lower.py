"""Turn the body of an ``scf.for`` (pre-pipeline TTGIR) into a Twill loop graph.

Mapping (docs/triton.md has the full table):

* ``tt.descriptor_load`` / ``tt.load`` / async copies -> variable-latency loads (``tma_load`` / ``load``) that
  own their shared-memory tile (``smem`` footprint = tile bytes);
* ``tt.dot`` / ``ttng.warp_group_dot`` / ``ttng.tc_gen5_mma`` -> ``mma`` on the tensor core, cost
  ``mma_cost(M, N, K)`` from the operand tile shapes;
* ``math.exp2`` (and other special functions) -> ``exp2`` on MUFU; ``tt.reduce`` -> ``reduce`` on the ALU pipe;
  floating-point elementwise arithmetic -> ``alu`` with cost from its element count; elementwise tile ops are
  ``in_place`` (computed register by register, their result takes the registers of an input they read last);
* ``ttg.convert_layout`` / register->shared copies -> ``smem`` traffic; TMEM loads/stores -> ``tmem`` traffic;
* index, mask, pointer and shape arithmetic (integer or pointer results, ``expand_dims``, ``broadcast``,
  ``splat``, views of shared memory, the ``local_alloc`` that receives a load) are *folded*: they have no
  node; their operands' producers connect directly to their consumers, and at injection time they take
  their consumer's stage and cluster;
* SSA uses become edges (delay = the producer's latency); values yielded by ``scf.yield`` and read through
  the loop's iteration arguments become loop-carried edges of distance 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Mapping

from twill.errors import UnsupportedFeatureError
from twill.ir.graph import Edge, LoopGraph, Op
from twill.integrations.triton.mlir import (ELEMENT_BYTES, ForLoop, Statement, TileType, region_statements,
                                            resolve_location, source_positions)
from twill.integrations.triton.roles import backward_roles
from twill.machine.costs import (OpCost, alu_cost, exp2_cost, mma_cost, reduce_cost, regs_per_thread, smem_cost,
                                 tma_load_cost, tma_store_cost, tmem_cost)
from twill.machine.models import Machine

LOAD_OPS = {"tt.descriptor_load": "tma_load", "tt.descriptor_gather": "tma_load", "tt.load": "load",
            "ttg.async_copy_global_to_local": "load", "ttng.async_tma_copy_global_to_local": "tma_load"}
MMA_OPS = {"tt.dot", "tt.dot_scaled", "ttng.warp_group_dot", "ttng.tc_gen5_mma", "ttng.tc_gen5_mma_scaled"}
MUFU_OPS = {"math.exp2", "math.exp", "math.log2", "math.log", "math.rsqrt", "math.sqrt", "math.sin", "math.cos",
            "math.tanh", "math.erf", "arith.divf", "tt.extern_elementwise"}
STORE_OPS = {"tt.store": "store", "tt.descriptor_store": "tma_store", "tt.descriptor_reduce": "tma_store",
             "tt.atomic_rmw": "atomic", "tt.atomic_cas": "atomic", "ttng.async_tma_copy_local_to_global": "tma_store"}
#: Ops without cost of their own: shape and view changes, synchronisation the pipeliner inserts, constants.
FOLD_OPS = {"tt.expand_dims", "tt.broadcast", "tt.splat", "tt.reshape", "tt.trans", "tt.make_range", "tt.addptr",
            "tt.join", "tt.split", "tt.get_program_id", "tt.get_num_programs", "tt.advance", "tt.make_tensor_ptr",
            "tt.assume", "tt.assert", "tt.print", "ttg.memdesc_trans", "ttg.memdesc_subslice", "ttg.memdesc_index",
            "ttg.memdesc_reshape", "ttg.memdesc_reinterpret", "ttg.async_commit_group", "ttg.async_wait",
            "ttng.warp_group_dot_wait", "ttng.wait_barrier", "ttng.barrier_expect", "ttng.arrive_barrier",
            "ttng.fence_async_shared", "ttng.tc_gen5_commit", "ub.poison", "arith.constant", "gpu.barrier",
            "ttg.local_dealloc", "ttng.tensormap_fenceproxy_acquire", "tt.bitcast", "tt.int_to_ptr", "tt.ptr_to_int"}
#: Ops the pipeliner inserts: their presence means the loop is already software pipelined, and its
#: dependences run through multi-buffered memory instead of SSA values.
PIPELINED_MARKERS = {"ttg.async_wait", "ttng.wait_barrier", "ttng.warp_group_dot_wait", "ttng.barrier_expect"}
CONTROL_OPS = {"scf.if", "scf.for", "scf.while", "scf.execute_region", "tt.call", "ttg.warp_specialize",
               "cf.br", "cf.cond_br"}
#: Elementwise floating-point ops whose cost is one ALU/FMA operation per element.
ALU_PREFIXES = ("arith.", "math.", "tt.fp_to_fp", "tt.precise_", "tt.clampf", "tt.mulhiui", "ttg.fp4_to_fp")

MMA_DTYPES = {"f16": "fp16", "bf16": "bf16", "f8E4M3FN": "fp8", "f8E5M2": "fp8", "f32": "tf32"}
#: Ops a tile op of the softmax occupies: a warp group (4 warps) runs each tile-wide instruction.
WARPGROUP = 4


@dataclass(frozen=True)
class SequenceCost:
    """The cost of a conditional region scheduled as one op: its ops one after another, each occupying its
    own units (the reservation tables concatenated), the result ready when the last one is."""

    parts: tuple[OpCost | SequenceCost, ...]

    @property
    def cycles(self) -> int:
        return sum(p.cycles for p in self.parts)

    @property
    def latency(self) -> int:
        return sum(p.cycles for p in self.parts[:-1]) + self.parts[-1].latency

    @property
    def warp_busy(self) -> int | None:
        return None

    def rrt(self) -> tuple[dict[str, int], ...]:
        return tuple(row for p in self.parts for row in p.rrt())


@dataclass(frozen=True)
class Node:
    """One graph op before naming: the statement it comes from and its cost-model description."""

    stmt: Statement
    kind: str
    cost: OpCost | SequenceCost
    regs: int = 0
    smem: int = 0
    tmem: int = 0
    warps: int = 1
    variable_latency: bool = False
    spill_cost: int = 0
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoweredLoop:
    """The result of lowering: the graph, and for every body statement the graph op that owns it (its own
    op, or for folded statements the consumers they were folded into)."""

    graph: LoopGraph
    loop: ForLoop
    owner: Mapping[int, str]
    folded_into: Mapping[int, tuple[tuple[str, int], ...]]


# -- classification ----------------------------------------------------------------------------------------
def _is_index(t: TileType | None) -> bool:
    return t is None or not t.is_float


def _is_fold(st: Statement, producers: Mapping[str, Statement]) -> bool:
    """Whether ``st`` is index/mask/shape arithmetic or a view that gets no node of its own."""
    if st.op in FOLD_OPS:
        return True
    if st.op == "ttg.local_alloc":
        src = producers.get(st.operands[0]) if st.operands else None
        return src is None or src.op in LOAD_OPS
    if st.op == "ttng.tmem_alloc":
        return not st.operands
    if st.op == "ttg.convert_layout" or st.op.startswith(ALU_PREFIXES) and st.op not in MUFU_OPS:
        return _is_index(st.result_type) or not st.result_type.shape
    return False


def _mma_shape(st: Statement) -> tuple[int, int, int, str, str]:
    """(M, N, K, dtype, rate dtype) of a tensor-core op. A block-scaled MMA names its operand formats
    (``lhs = e2m1``): fp4 operands are packed two per byte, so K counts bytes; their rate is twice the fp8
    rate (Blackwell), so K bytes at the fp8 rate cost what 2K fp4 elements cost."""
    if len(st.types) < 2:
        raise UnsupportedFeatureError(f"{st.op} at body position {st.index}: cannot read its operand shapes")
    a, b = st.types[0], st.types[1]
    dtype = MMA_DTYPES.get(a.element, a.element)
    formats = re.search(r"lhs = (\w+) rhs = (\w+)", st.text)
    if formats:
        dtype = "fp4" if formats.group(1) == formats.group(2) == "e2m1" else "fp8"
    return a.shape[-2], b.shape[-1], a.shape[-1], dtype, "fp8" if dtype == "fp4" else dtype


def _reduce_kind(st: Statement) -> str:
    ops = set(st.region_ops)
    if ops & {"arith.maxnumf", "arith.maximumf", "arith.maxf", "arith.maxsi", "arith.maxui"}:
        return "max"
    if ops & {"arith.minnumf", "arith.minimumf", "arith.minsi", "arith.minui"}:
        return "min"
    if ops & {"arith.addf", "arith.addi"}:
        return "sum"
    return "other"


def classify(st: Statement, machine: Machine, num_warps: int,
             producers: Mapping[str, Statement]) -> Node | None:
    """The node of a statement, ``None`` if it is folded; raises for ops the frontend does not model."""
    if st.op == "scf.if":
        return _conditional(st, machine, num_warps, producers)
    if _is_fold(st, producers):
        return None
    t = st.result_type
    reg_warps = max(1, num_warps)

    def regs_of(tile: TileType | None) -> int:
        """32-bit registers per thread of a register tile spread over the CTA's warps."""
        if tile is None or tile.space != "registers" or not tile.shape:
            return 0
        rows = tile.shape[0] if len(tile.shape) > 1 else 1
        dtype = {1: "fp8", 2: "fp16"}.get(ELEMENT_BYTES.get(tile.element, 4), "fp32")
        return regs_per_thread(rows, tile.elements // rows, dtype, reg_warps)

    def spill(tile: TileType | None) -> int:
        return smem_cost(machine, tile.nbytes).cycles if tile is not None and tile.space == "registers" else 0

    if st.op in LOAD_OPS:
        tile = t if t is not None else (st.types[-1] if st.types else None)
        tile = tile.pointed_to() if tile is not None else None
        nbytes = tile.nbytes if tile is not None else 0
        return Node(st, LOAD_OPS[st.op], tma_load_cost(machine, nbytes), smem=nbytes, variable_latency=True,
                    info={"shape": list(tile.shape) if tile else [], "dtype": tile.dtype if tile else None})
    if st.op in MMA_OPS:
        M, N, K, dtype, rate = _mma_shape(st)
        cost = mma_cost(machine, M, N, K, rate)
        in_tmem = st.op.startswith("ttng.tc_gen5")
        acc = TileType((M, N), "f32", "tmem" if in_tmem else "registers")
        return Node(st, "mma", cost, regs=0 if in_tmem else regs_of(acc), tmem=acc.nbytes if in_tmem else 0,
                    warps=1 if in_tmem else WARPGROUP, spill_cost=0 if in_tmem else spill(acc),
                    info={"m": M, "n": N, "k": K, "dtype": dtype, "shape": [M, N]})
    if st.op in STORE_OPS:
        tile = next((ty for ty in reversed(st.types) if ty.space == "registers"), None)
        tile = tile.pointed_to() if tile is not None else None
        nbytes = tile.nbytes if tile is not None else 0
        return Node(st, STORE_OPS[st.op], tma_store_cost(machine, nbytes), warps=1,
                    info={"shape": list(tile.shape) if tile else []})
    if st.op in ("tt.reduce", "tt.scan"):
        src = st.types[0] if st.types else None
        if src is None or not src.shape:
            raise UnsupportedFeatureError(f"{st.op} at body position {st.index}: cannot read its input shape")
        rows = src.shape[0] if len(src.shape) > 1 else 1
        cols = src.elements // rows
        return Node(st, st.op.split(".")[1], reduce_cost(machine, rows, cols), regs=regs_of(t), warps=WARPGROUP,
                    spill_cost=spill(t), info={"shape": list(src.shape), "combiner": _reduce_kind(st)})
    if st.op in ("ttng.tmem_load", "ttng.tmem_store", "ttng.tmem_alloc"):
        tile = next((ty for ty in st.types if ty.space == "tmem"), t)
        nbytes = tile.nbytes if tile is not None else 0
        kind = "tmem_load" if st.op == "ttng.tmem_load" else "tmem_store"
        return Node(st, kind, tmem_cost(machine, nbytes), regs=regs_of(t) if kind == "tmem_load" else 0,
                    tmem=nbytes if st.op == "ttng.tmem_alloc" else 0, warps=WARPGROUP,
                    info={"shape": list(tile.shape) if tile else []})
    if st.op in ("ttg.convert_layout", "ttg.local_alloc", "ttg.local_store", "ttg.local_load"):
        tile = t if st.op != "ttg.local_store" else (st.types[0] if st.types else None)
        nbytes = tile.nbytes if tile is not None else 0
        kind = {"ttg.convert_layout": "convert", "ttg.local_load": "smem_load"}.get(st.op, "smem_store")
        return Node(st, kind, smem_cost(machine, nbytes), regs=regs_of(t) if kind != "smem_store" else 0,
                    smem=nbytes if kind == "smem_store" else 0, warps=WARPGROUP,
                    info={"shape": list(tile.shape) if tile else []})
    if st.op in MUFU_OPS and t is not None and t.is_float:
        return Node(st, "exp2" if st.op in ("math.exp2", "math.exp") else "mufu", exp2_cost(machine, t.elements),
                    regs=regs_of(t), warps=WARPGROUP, spill_cost=spill(t),
                    info={"shape": list(t.shape), "in_place": True})
    if st.op in MUFU_OPS and t is None and _scalar_element(st).startswith(("f", "bf")):
        # a scalar special function (a gate exp2(g) carried from one iteration to the next): one element,
        # computed by every thread, so it costs the MUFU issue of one element on the tile ops' warp group
        return Node(st, "exp2" if st.op in ("math.exp2", "math.exp") else "mufu", exp2_cost(machine, 1),
                    warps=WARPGROUP, info={"shape": []})
    if st.op.startswith(ALU_PREFIXES) and t is not None and t.is_float:
        return Node(st, "alu", alu_cost(machine, t.elements), regs=regs_of(t), warps=WARPGROUP,
                    spill_cost=spill(t), info={"shape": list(t.shape), "in_place": True})
    raise _Unsupported(st)


def _conditional(st: Statement, machine: Machine, num_warps: int,
                 producers: Mapping[str, Statement]) -> Node | None:
    """An ``scf.if`` in the loop body (the tile switch and the epilogue of a persistent kernel, a masked
    and an unmasked softmax step): folded when its regions hold only index arithmetic, else one
    ``conditional`` op that runs the modelled ops of its costlier region (nested ``scf.if`` included) in
    sequence. It is charged on every iteration, as a predicated op would be: the schedule must leave room for
    it in the iterations where the condition holds."""
    regions = region_statements(st)
    known = {**producers, **{r: s for region in regions for s in region for r in s.results}}
    branches: list[list[Node]] = []
    for region in regions:
        nodes = []
        for s in region:
            if s.op in CONTROL_OPS and s.op != "scf.if":
                raise _Unsupported(s)
            node = classify(s, machine, num_warps, known)
            if node is not None:
                nodes.append(node)
        branches.append(nodes)
    nodes = max(branches, key=lambda ns: sum(n.cost.cycles for n in ns))
    if not nodes:
        return None
    kinds = list(dict.fromkeys(n.kind for n in nodes))
    return Node(st, "conditional", SequenceCost(tuple(n.cost for n in nodes)), regs=max(n.regs for n in nodes),
                smem=sum(n.smem for n in nodes), tmem=sum(n.tmem for n in nodes),
                warps=max(n.warps for n in nodes), spill_cost=max(n.spill_cost for n in nodes),
                info={"computes": kinds, "region_ops": [n.stmt.op for n in nodes], "regions": len(regions)})


def _scalar_element(st: Statement) -> str:
    """The MLIR type of a scalar result (``f32`` in ``%x = math.exp2 %g : f32``), ``""`` if none is written."""
    m = re.search(r":\s*([a-z]+\d*)\s*(?:loc\(.*\))?\s*$", st.text.splitlines()[-1].strip())
    return m.group(1) if m else ""


def _unsupported_label(st: Statement) -> str:
    """The op and, when the op itself is modelled on other types, the type it was given here."""
    if st.op in MUFU_OPS or st.op.startswith(ALU_PREFIXES):
        t = st.result_type
        element = (t.element if t is not None else _scalar_element(st)) or "an unknown type"
        return f"{st.op} on {element}{'' if t is None or not t.shape else ' tiles'}"
    return st.op


class _Unsupported(Exception):
    def __init__(self, st: Statement):
        super().__init__(st.op)
        self.stmt = st


# -- data flow through folded statements -------------------------------------------------------------------
def _sources(loop: ForLoop, nodes: Mapping[int, Node]) -> dict[str, frozenset[tuple[str, int]]]:
    """For every value of the body: the node statements (``("op", index)``) and iteration arguments
    (``("arg", k)``) it is computed from, looking through folded statements."""
    arg_index = {a: k for k, a in enumerate(loop.iter_args)}
    defined: dict[str, Statement] = {r: st for st in loop.body for r in st.results}
    memo: dict[str, frozenset[tuple[str, int]]] = {}

    def of(value: str) -> frozenset[tuple[str, int]]:
        base = value.split("#")[0]
        if value in memo:
            return memo[value]
        if value in arg_index:
            return frozenset({("arg", arg_index[value])})
        st = defined.get(value) or defined.get(base)
        if st is None:
            return frozenset()
        if st.index in nodes:
            out = frozenset({("op", st.index)})
        else:
            memo[value] = frozenset()
            out = frozenset().union(*(of(v) for v in st.operands)) if st.operands else frozenset()
        memo[value] = out
        return out

    for st in loop.body:
        for r in st.results:
            of(r)
    for a in loop.iter_args:
        memo[a] = of(a)
    for y in loop.yields:
        memo[y] = of(y)
    return memo


def _edges_in(loop: ForLoop, nodes: Mapping[int, Node],
              sources: Mapping[str, frozenset[tuple[str, int]]]) -> set[tuple[int, int, int]]:
    """(src index, dst index, distance) for every dependence between nodes. Iteration arguments resolve to
    what the previous iteration yielded (distance + 1), through chains of pass-through arguments."""

    def resolve(src: tuple[str, int], distance: int, seen: frozenset[int]) -> set[tuple[int, int]]:
        kind, k = src
        if kind == "op":
            return {(k, distance)}
        if k in seen or k >= len(loop.yields):
            return set()
        out: set[tuple[int, int]] = set()
        for s in sources.get(loop.yields[k], frozenset()):
            out |= resolve(s, distance + 1, seen | {k})
        return out

    edges: set[tuple[int, int, int]] = set()
    for idx, node in nodes.items():
        for operand in node.stmt.operands:
            for src in sources.get(operand, frozenset()):
                for s_idx, dist in resolve(src, 0, frozenset()):
                    if s_idx == idx and dist == 0:
                        continue
                    edges.add((s_idx, idx, dist))
    return edges


def _consumers_of_folded(loop: ForLoop, nodes: Mapping[int, Node]) -> dict[int, set[tuple[int, int]]]:
    """For each folded statement: the node statements that consume it (directly or through other folded
    statements), with the iteration distance (0, or 1 when reached through ``scf.yield``)."""
    users: dict[str, list[int]] = {}
    for st in loop.body:
        for v in st.operands:
            users.setdefault(v.split("#")[0], []).append(st.index)
            if "#" in v:
                users.setdefault(v, []).append(st.index)
    arg_of_yield = {y.split("#")[0]: k for k, y in enumerate(loop.yields)}
    out: dict[int, set[tuple[int, int]]] = {}

    def consumers(index: int, seen: frozenset[int]) -> set[tuple[int, int]]:
        st = loop.body[index]
        found: set[tuple[int, int]] = set()
        for r in st.results:
            names = {r, r.split("#")[0]}
            for name in names:
                for u in users.get(name, []):
                    if u in nodes:
                        found.add((u, 0))
                    elif u not in seen:
                        found |= consumers(u, seen | {u})
                if name in arg_of_yield:
                    arg = loop.iter_args[arg_of_yield[name]]
                    for u in users.get(arg, []):
                        if u in nodes:
                            found.add((u, 1))
                        elif u not in seen and u != index:
                            found |= {(c, 1) for c, _ in consumers(u, seen | {u})}
        return found

    for st in loop.body:
        if st.index not in nodes:
            out[st.index] = consumers(st.index, frozenset({st.index}))
    return out


# -- roles -------------------------------------------------------------------------------------------------
def _ancestors(edges: AbstractSet[tuple[int, int, int]]) -> dict[int, set[int]]:
    """Distance-0 ancestors of every node."""
    preds: dict[int, set[int]] = {}
    for (s, d, dist) in edges:
        if dist == 0:
            preds.setdefault(d, set()).add(s)
    memo: dict[int, set[int]] = {}

    def anc(n: int) -> set[int]:
        if n not in memo:
            memo[n] = set()
            out: set[int] = set()
            for p in preds.get(n, ()):
                out |= {p} | anc(p)
            memo[n] = out
        return memo[n]

    for n in list(preds):
        anc(n)
    return memo


def _operand_sources(node: Node, position: int, sources: Mapping[str, frozenset[tuple[str, int]]]) -> set[int]:
    if position >= len(node.stmt.operands):
        return set()
    return {k for kind, k in sources.get(node.stmt.operands[position], frozenset()) if kind == "op"}


def assign_roles(nodes: Mapping[int, Node], edges: AbstractSet[tuple[int, int, int]],
                 sources: Mapping[str, frozenset[tuple[str, int]]]) -> dict[int, tuple[str, int | None]]:
    """(role, subtile) per node. Recognises GEMM loops (``load_a``, ``load_b``, ``mma``), attention-backward
    loops (:mod:`twill.integrations.triton.roles`) and attention loops (``load_k``, ``load_v``, ``qk``,
    ``rowmax``, ``exp``, ``alpha``, ``rowsum``, ``rescale``, ``pv`` and on Blackwell ``s_load``, ``p_store``,
    ``o_load``, ``o_store``); other nodes get their kind as role."""
    anc = _ancestors(edges)
    roles: dict[int, tuple[str, int | None]] = {i: (n.kind, None) for i, n in nodes.items()}
    mmas = sorted(i for i, n in nodes.items() if n.kind == "mma")
    backward = backward_roles({i: n.kind for i, n in nodes.items()},
                              {i: len(n.info.get("shape", [])) for i, n in nodes.items()}, edges, anc)
    if backward is not None:
        roles.update({i: (role, None) for i, role in backward.items()})
        return roles
    # A dot whose accumulator is another dot's result adds a second product to it (a score over two K ranges,
    # q_nope·kvᵀ + q_pe·k_peᵀ in MLA): it takes that dot's role, and the roles are found among the others.
    chained = {i: a for i in mmas for a in _operand_sources(nodes[i], 2, sources) if a in mmas}
    pv = [i for i in mmas if i not in chained and any(nodes[a].kind == "mma" for a in anc.get(i, ()))]
    qk = [i for i in mmas if i not in chained and i not in pv]
    if len(mmas) == 1:
        roles[mmas[0]] = ("mma", None)
        for pos, role in ((0, "load_a"), (1, "load_b")):
            direct = _load_ancestors(mmas[0], pos, nodes, sources)
            if not direct:          # an operand computed from loads (an upcast of fp8 or of a scaled operand)
                computed = _operand_sources(nodes[mmas[0]], pos, sources)
                below = {a for c in computed for a in anc.get(c, set()) | {c}}
                tiles = [a for a in below if nodes[a].kind in ("tma_load", "load")]
                direct = {max(tiles, key=lambda a: (nodes[a].smem, -a))} if tiles else set()
            for s in direct:
                roles[s] = (role, None)
        return roles
    if not qk or not pv:
        return roles
    multi = len(qk) > 1
    subtile_of: dict[int, int | None] = {}
    for i in nodes:
        hits = [j for j, q in enumerate(qk) if q in anc.get(i, ()) or q == i]
        subtile_of[i] = hits[0] if len(hits) == 1 and multi else None
    for i in sorted(nodes, reverse=True):
        if subtile_of[i] is None and multi and nodes[i].kind not in ("tma_load", "load"):
            below = {subtile_of[d] for (s, d, dist) in edges if s == i and dist == 0}
            if len(below) == 1 and None not in below:
                subtile_of[i] = below.pop()
    alphas: set[int] = set()
    for i, n in nodes.items():
        sub = subtile_of[i]
        from_qk = any(q in anc.get(i, ()) for q in qk)
        if i in qk:
            roles[i] = ("qk", sub)
        elif i in pv:
            roles[i] = ("pv", sub)
        elif n.kind == "reduce" and from_qk:
            roles[i] = ("rowmax" if n.info.get("combiner") == "max" else "rowsum", sub)
        elif n.kind == "exp2" and from_qk:
            is_tile = len(n.info.get("shape", [])) > 1
            roles[i] = ("exp" if is_tile else "alpha", sub)
            if not is_tile:
                alphas.add(i)
        elif n.kind == "tmem_load" and any(q in anc.get(i, ()) or _feeds(q, i, edges) for q in qk):
            roles[i] = ("s_load", sub)
        else:
            roles[i] = (n.kind, sub)
    for i, n in nodes.items():
        below_pv = any(i in anc.get(p, ()) for p in pv)
        after_alpha = any(a in anc.get(i, ()) for a in alphas)
        if n.kind == "alu" and len(n.info.get("shape", [])) > 1 and after_alpha and below_pv:
            roles[i] = ("rescale", subtile_of[i])
        elif n.kind == "tmem_load" and roles[i][0] != "s_load" and below_pv:
            roles[i] = ("o_load", subtile_of[i])
        elif n.kind == "tmem_store" and below_pv:
            from_exp = any(roles.get(a, ("",))[0] == "exp" for a in anc.get(i, ()))
            roles[i] = ("p_store" if from_exp and not after_alpha else "o_store", subtile_of[i])
    for i in chained:
        root = i
        while root in chained:
            root = chained[root]
        roles[i] = (roles[root][0], subtile_of[i])
    for q in qk + [i for i in chained if roles[i][0] == "qk"]:
        for s in _load_ancestors(q, 1, nodes, sources):
            roles[s] = ("load_k", None)
    for p in pv + [i for i in chained if roles[i][0] == "pv"]:
        for s in _load_ancestors(p, 1, nodes, sources):
            roles[s] = ("load_v", None)
    return roles


def _feeds(src: int, dst: int, edges: AbstractSet[tuple[int, int, int]]) -> bool:
    return (src, dst, 0) in edges


def _load_ancestors(mma: int, position: int, nodes: Mapping[int, Node],
                    sources: Mapping[str, frozenset[tuple[str, int]]]) -> set[int]:
    return {s for s in _operand_sources(nodes[mma], position, sources) if nodes[s].kind in ("tma_load", "load")}


# -- the graph ---------------------------------------------------------------------------------------------
def _names(nodes: Mapping[int, Node], roles: Mapping[int, tuple[str, int | None]],
           locations: Mapping[int, tuple[str | None, str | None]]) -> dict[int, str]:
    """Readable unique op names: the role for recognised ops (``qk``, ``exp``; ``qk_a``/``qk_b`` per
    sub-tile), else ``<source variable>_<op>`` (``l_i_mulf``); sub-tiles add ``_a``, ``_b``."""
    named = {"load_a", "load_b", "mma", "load_k", "load_v", "qk", "rowmax", "exp", "alpha", "rowsum", "rescale",
             "pv", "s_load", "p_store", "o_load", "o_store", "dp", "ds", "dv", "dk", "dq", "load_q", "load_do",
             "load_lse", "load_delta"}
    out: dict[int, str] = {}
    used: set[str] = set()
    for i in sorted(nodes):
        role, sub = roles[i]
        if role in named:
            base = role + _suffix(sub)
        elif role == "conditional":
            base = "if_" + "_".join(nodes[i].info["computes"]) + _suffix(sub)
        else:
            var = locations[i][0] or nodes[i].stmt.short
            base = f"{var}_{nodes[i].stmt.short}".replace(".", "_") + _suffix(sub)
        name, k = base, 2
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        out[i] = name
    return out


def lower_loop(loop: ForLoop, machine: Machine, *, num_warps: int, name: str, loc_table: Mapping[str, str],
               attrs: Mapping[str, Any] | None = None) -> LoweredLoop:
    """Build the loop graph of ``loop``; raises :class:`UnsupportedFeatureError` listing every op the
    frontend cannot model."""
    markers = sorted({st.op for st in loop.body} & PIPELINED_MARKERS)
    if markers:
        raise UnsupportedFeatureError(
            f"loop at line {loop.header_line + 1} is already software pipelined (it contains "
            f"{', '.join(markers)}): give the TTGIR before Triton's pipeliner, e.g. `twill graph kernel.py:fn "
            f"--signature ...` or a file written by `twill inject`")
    producers = {r: st for st in loop.body for r in st.results}
    nodes: dict[int, Node] = {}
    unsupported: list[Statement] = []
    for st in loop.body:
        if st.op in CONTROL_OPS and st.op != "scf.if":
            unsupported.append(st)
            continue
        try:
            node = classify(st, machine, num_warps, producers)
        except _Unsupported as exc:
            unsupported.append(exc.stmt)
            continue
        if node is not None:
            nodes[st.index] = node
    if unsupported:
        listed = ", ".join(f"{_unsupported_label(st)} ({_where(st.loc, st.first_line, loc_table)})"
                           for st in unsupported)
        raise UnsupportedFeatureError(
            f"loop at {_where(loop.loc, loop.header_line, loc_table)}: the Triton frontend cannot model {listed}; "
            f"supported are "
            f"loads, dots, reductions, special functions (exp2, log2, rsqrt, ...) and elementwise arithmetic on "
            f"float tiles and scalars, layout and shared/tensor-memory copies (index arithmetic is folded), and "
            f"scf.if regions of those")
    if not nodes:
        raise UnsupportedFeatureError(f"loop at line {loop.header_line + 1} has no operation to schedule")
    sources = _sources(loop, nodes)
    edge_keys = _edges_in(loop, nodes, sources)
    roles = assign_roles(nodes, edge_keys, sources)
    locations = {i: resolve_location(n.stmt.loc, dict(loc_table)) for i, n in nodes.items()}
    for i, n in nodes.items():
        if locations[i][0] is None and n.stmt.results:
            locations[i] = (_ssa_var(n.stmt.results[0]), locations[i][1])
    names = _names(nodes, roles, locations)
    ops = []
    for i in sorted(nodes):
        n = nodes[i]
        role, sub = roles[i]
        op_attrs: dict[str, Any] = {"role": role, "mlir_op": n.stmt.op, "body_index": i,
                                    "line": n.stmt.first_line + 1, **dict(n.info)}
        if locations[i][1]:
            op_attrs["loc"] = locations[i][1]
        if sub is not None:
            op_attrs["subtile"] = sub
        ops.append(Op(name=names[i], rrt=n.cost.rrt(), latency=n.cost.latency, kind=n.kind, regs=n.regs,
                      warps=n.warps, variable_latency=n.variable_latency, spill_cost=n.spill_cost, smem=n.smem,
                      tmem=n.tmem, warp_busy=n.cost.warp_busy, attrs=op_attrs))
    blocking_kinds = {"mma", "tmem_load"}
    edges = [Edge(names[s], names[d], nodes[s].cost.latency, dist, nodes[s].kind in blocking_kinds)
             for (s, d, dist) in sorted(edge_keys)]
    folded = _consumers_of_folded(loop, nodes)
    graph = LoopGraph(name, tuple(ops), tuple(edges), None, dict(attrs or {}))
    owner = {i: names[i] for i in nodes}
    folded_into = {i: tuple(sorted((names[c], d) for c, d in cs)) for i, cs in folded.items()}
    return LoweredLoop(graph=graph, loop=loop, owner=owner, folded_into=folded_into)


def _where(loc: str | None, line: int, table: Mapping[str, str]) -> str:
    """``"kernel.py:57, TTGIR line 93"``: the Python source line when the location table has one."""
    positions = source_positions(loc, dict(table))
    return f"{positions[0]}, TTGIR line {line + 1}" if positions else f"TTGIR line {line + 1}"


def _suffix(subtile: int | None) -> str:
    """``_a``, ``_b``... per sub-tile, as the built-in kernel graphs name them."""
    if subtile is None:
        return ""
    return "_" + (chr(ord("a") + subtile) if subtile < 26 else str(subtile))


def _ssa_var(result: str) -> str:
    base = result.lstrip("%").split("#")[0]
    parts = base.split("_")
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    return "_".join(parts)
