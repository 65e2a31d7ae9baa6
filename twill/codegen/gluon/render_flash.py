"""Render an attention-forward :class:`~twill.codegen.gluon.plan.KernelPlan` as a warp-specialized Gluon
kernel for sm_90.

Shape of the emitted kernel: ``load_partition`` (TMA producer) loads each compute partition's Q sub-tile
once, then streams K and V tiles into their rings; one ``computeN_partition`` per sub-tile (the first is the
default partition) runs the online softmax with S and O accumulators in registers and P kept in registers
as the A operand of the second wgmma. When the schedule puts ``pv`` one stage after ``qk`` (per partition)
the steady state issues ``S(j+1)`` together with ``O += P(j) V(j)`` and runs the softmax of ``j+1`` while
that PV runs; with two compute partitions each wgmma turn is guarded by a ``turn`` mbarrier (ping-pong).

Layout policy: S and O use the wgmma accumulator layout (``NVMMADistributedLayout`` v3, warps along M);
row statistics (max, sum, alpha) live in ``SliceLayout(1, ·)`` of S and are converted to O's slice layout
for the rescale; P is converted to ``DotOperandLayout(0, O layout, k_width=2)`` and never leaves registers.
"""

from __future__ import annotations

from twill.codegen.gluon.plan import DTYPES, KernelPlan, Partition, Turn
from twill.codegen.gluon.render_common import IMPORTS, render_constants, render_header


def render_constants_flash(plan: KernelPlan) -> str:
    t = plan.tile
    k, v = plan.ring("k"), plan.ring("v")
    comp = plan.compute
    items = [
        ("BLOCK_M", t["block_m"], f"query rows per CTA = {len(comp)} sub-tile(s) x SUB_M"),
        ("SUB_M", t["sub_m"], "query rows per compute partition (16 per warp: one wgmma row block)"),
        ("BLOCK_N", t["block_n"], "keys per loop iteration"),
        ("HEAD_DIM", t["head_dim"], "head dimension"),
        ("NUM_COMPUTE", len(comp), "compute partitions = sub-tiles"),
        ("K_DEPTH", k.depth, f"ring k slots: {k.why}"),
        ("V_DEPTH", v.depth, f"ring v slots: {v.why}"),
        ("K_READERS", k.arrivals, "compute partitions releasing each k slot"),
        ("V_READERS", v.arrivals, "compute partitions releasing each v slot"),
        ("COMPUTE_WARPS", comp[0].num_warps, f"warp group {comp[0].group}: default partition (num_warps)"),
        ("COMPUTE_REGS", comp[-1].regs, "setmaxnreg budget of worker compute partitions (schedule)"),
        ("LOAD_WARPS", plan.load.num_warps, f"warp group {plan.load.group}: TMA producer"),
        ("LOAD_REGS", plan.load.regs, f"warp group {plan.load.group}: setmaxnreg budget of the producer"),
    ]
    if plan.turns:
        items.append(("TURNS", len(plan.turns) // len(comp), "tensor-core turns per partition per iteration"))
    dtype = f"DTYPE = gl.constexpr(gl.{DTYPES[plan.dtype]})  # operand dtype\n"
    return dtype + render_constants(items)


def render_load_partition(plan: KernelPlan) -> str:
    sched = plan.schedule
    lines = [
        "@gluon.jit",
        "def load_partition(q_desc, k_desc, v_desc, q_smem, q_bar, k_ring, k_ready, k_empty, v_ring, v_ready,",
        "                   v_empty, q_row, kv_row, n_tiles):",
        f'    """Warp group {plan.load.group} (TMA producer): Q once, then K and V tiles into their rings."""',
        "    mbarrier.expect(q_bar, NUM_COMPUTE * q_desc.block_type.nbytes)",
        "    for sub in gl.static_range(NUM_COMPUTE):",
        "        tma.async_copy_global_to_shared(q_desc, [q_row + sub * SUB_M, 0], q_bar, q_smem.index(sub))",
        "    for j in range(n_tiles):",
    ]
    for name in plan.load.ops:
        r = next(r for r in plan.rings if r.producer == name)
        depth = f"{r.name.upper()}_DEPTH"
        lines += [
            f"        # {name}: start {sched.start(name)}, stage {sched.stage(name)} -> ring {r.name} "
            f"({r.depth} slots)",
            f"        slot = j % {depth}",
            f"        # empty: wait until every compute partition released the slot (first pass free)",
            f"        mbarrier.wait({r.name}_empty.index(slot), ((j // {depth}) & 1) ^ 1)",
            f"        mbarrier.expect({r.name}_ready.index(slot), {r.name}_desc.block_type.nbytes)",
            f"        tma.async_copy_global_to_shared({r.name}_desc, [kv_row + j * BLOCK_N, 0], "
            f"{r.name}_ready.index(slot), {r.name}_ring.index(slot))",
        ]
    return "\n".join(lines) + "\n"


SOFTMAX = '''
@gluon.jit
def online_softmax(s, m_i, l_i, kv_start, seq_len, qk_scale, col_layout: gl.constexpr):
    """One online-softmax step on S (fp32, wgmma layout): returns P = exp2(S*scale - m_new), alpha =
    exp2(m_old - m_new), m_new and l_new = l*alpha + rowsum(P). Keys past seq_len are masked to -inf."""
    if kv_start + BLOCK_N > seq_len:
        cols = gl.arange(0, BLOCK_N, col_layout)
        s = gl.where((kv_start + cols < seq_len)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # rowmax (m kept in scaled log2 units)
    alpha = gl.exp2(m_i - m_new)                      # alpha
    p = gl.exp2(s * qk_scale - m_new[:, None])        # exp: one FMA + ex2 per element
    l_new = l_i * alpha + gl.sum(p, 1)                # rowsum
    return p, alpha, m_new, l_new
'''


class _Turns:
    """Where a compute partition waits for / passes the tensor-core turn (ping-pong), from the plan."""

    def __init__(self, plan: KernelPlan, index: int):
        graph = plan.schedule.graph
        program_order = {"qk": 0, "pv": 1}   # a partition issues S = Q K^T before O += P V in its body

        def rank(op: str) -> int:
            return program_order[graph.op(op).attrs.get("role")]

        # within one turn the partition's ops are contiguous on the tensor core: issue them in program order
        self.mine: list[Turn] = [Turn(t.partition, tuple(sorted(t.ops, key=rank)))
                                 for t in plan.turns if t.partition == index]
        self.index = index
        self.count = len(self.mine)

    def _turn_of(self, op: str) -> int | None:
        for k, t in enumerate(self.mine):
            if op in t.ops:
                return k
        return None

    def before(self, op: str, ind: str, counter: str) -> list[str]:
        k = self._turn_of(op)
        if k is None or self.mine[k].ops[0] != op:
            return []
        return [f"{ind}# turn: wait until the other compute partition issued its wgmma "
                f"(tensor-core order {'/'.join(self.mine[k].ops)} fixed by the schedule)",
                f"{ind}mbarrier.wait(turn_bars.index({self.index}), ({counter} * TURNS + {k}) & 1)"]

    def after(self, op: str, ind: str) -> list[str]:
        k = self._turn_of(op)
        if k is None or self.mine[k].ops[-1] != op:
            return []
        return [f"{ind}mbarrier.arrive(turn_bars.index({1 - self.index}))  # pass the tensor core on"]


def render_compute_partition(plan: KernelPlan, index: int) -> str:
    """One compute partition (sub-tile ``index``); see the module docstring for its structure."""
    sched = plan.schedule
    part: Partition = plan.compute[index]
    graph = sched.graph
    by_role = {graph.op(n).attrs.get("role"): n for n in part.ops}
    qk, pv, exp = by_role["qk"], by_role["pv"], by_role["exp"]
    turns = _Turns(plan, index)
    i4, i8 = " " * 4, " " * 8
    head = [
        "@gluon.jit",
        f"def {part.name}(q_smem, q_bar, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty, turn_bars, o_ptr,",
        "        o_row, q_start, seq_len, n_tiles, qk_scale):",
        f'    """Warp group {part.group} ({part.num_warps} warps), sub-tile {part.subtile}: '
        f'{", ".join(part.ops)}."""',
        "    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
        "                                                       instr_shape=[16, BLOCK_N, 16])",
        "    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
        "                                                       instr_shape=[16, HEAD_DIM, 16])",
        "    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)",
        "    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)",
        "    m_i = gl.full([SUB_M], float(\"-inf\"), gl.float32, gl.SliceLayout(1, s_layout))",
        "    l_i = gl.full([SUB_M], 0.0, gl.float32, gl.SliceLayout(1, s_layout))",
        "    o = gl.zeros([SUB_M, HEAD_DIM], gl.float32, o_layout)",
        "    s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, s_layout)",
        f"    q = q_smem.index({part.subtile})",
        "    mbarrier.wait(q_bar, 0)  # Q sub-tile loaded by load_partition",
    ]

    def issue_qk(j: str, ind: str, counter: str) -> list[str]:
        return [
            f"{ind}mbarrier.wait(k_ready.index({j} % K_DEPTH), ({j} // K_DEPTH) & 1)  # ready: K tile {j}",
            *turns.before(qk, ind, counter),
            f"{ind}# {qk}: start {sched.start(qk)}, stage {sched.stage(qk)}",
            f"{ind}s_tok = warpgroup_mma(q, k_ring.index({j} % K_DEPTH).permute((1, 0)), s_zero, use_acc=False,",
            f"{ind}                      is_async=True)",
            *turns.after(qk, ind),
        ]

    def softmax(j: str, ind: str) -> list[str]:
        return [
            f"{ind}# rowmax/alpha/exp/rowsum of iteration {j} (stage {sched.stage(exp)})",
            f"{ind}p, alpha, m_i, l_i = online_softmax(s_cur, m_i, l_i, {j} * BLOCK_N, seq_len, qk_scale,",
            f"{ind}                                    gl.SliceLayout(0, s_layout))",
        ]

    def issue_pv(j: str, ind: str, counter: str | None) -> list[str]:
        """``counter`` None: outside the steady state, where tensor-core turns are not taken."""
        return [
            f"{ind}p_op = gl.convert_layout(p.to(DTYPE), p_layout)  # P stays in registers: wgmma A operand",
            f"{ind}mbarrier.wait(v_ready.index({j} % V_DEPTH), ({j} // V_DEPTH) & 1)  # ready: V tile {j}",
            *(turns.before(pv, ind, counter) if counter else []),
            f"{ind}# {pv}: start {sched.start(pv)}, stage {sched.stage(pv)}",
            f"{ind}o_tok = warpgroup_mma(p_op, v_ring.index({j} % V_DEPTH), o, is_async=True)",
            *(turns.after(pv, ind) if counter else []),
        ]

    rescale = "o = o * gl.convert_layout(alpha, row_o)[:, None]  # rescale"
    if part.qk_ahead:
        body = [
            f"    # {qk} runs one stage ahead of {pv} (stages {sched.stage(qk)} / {sched.stage(exp)} / "
            f"{sched.stage(pv)} for {qk} / {exp} / {pv}).",
            "    # The loop is rotated so that no wgmma is in flight across the back-edge (ptxas would serialize",
            "    # every wgmma otherwise, C7514): body j issues S(j+1) and O += P(j) V(j), runs the softmax of",
            "    # j+1 while O += P V runs, then retires it and rescales O.",
            f"    # prologue: {qk} and softmax of iteration 0",
            "    mbarrier.wait(k_ready.index(0), 0)  # ready: K tile 0",
            "    s_tok = warpgroup_mma(q, k_ring.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            "    s_cur = warpgroup_mma_wait(0, deps=[s_tok])",
            "    mbarrier.arrive(k_empty.index(0))  # empty: K tile 0 consumed",
            *softmax("0", i4),
            "    for j in range(0, n_tiles - 1):",
            "        jn = j + 1",
            *issue_qk("jn", i8, "j"),
            *issue_pv("j", i8, "j"),
            f"{i8}# S(j+1) complete (wgmma groups retire in order); O += P(j) V(j) still in flight",
            f"{i8}s_cur, o, p_op = warpgroup_mma_wait(1, deps=[s_tok, o_tok, p_op])",
            f"{i8}mbarrier.arrive(k_empty.index(jn % K_DEPTH))  # empty: K tile j+1 consumed",
            *softmax("jn", i8),
            f"{i8}o, p_op = warpgroup_mma_wait(0, deps=[o, p_op])  # O += P(j) V(j) complete",
            f"{i8}mbarrier.arrive(v_empty.index(j % V_DEPTH))  # empty: V tile j consumed",
            f"{i8}{rescale}",
            f"    # epilogue: {pv} of the last iteration",
            "    j = n_tiles - 1",
            *issue_pv("j", i4, None),
            "    o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])",
            "    mbarrier.arrive(v_empty.index(j % V_DEPTH))  # empty: V tile consumed",
        ]
    else:
        body = [
            f"    # {qk}, softmax and {pv} of one iteration share stage {sched.stage(qk)}: no overlap inside the "
            f"partition",
            "    for j in range(0, n_tiles):",
            *issue_qk("j", i8, "j"),
            f"{i8}s_cur = warpgroup_mma_wait(0, deps=[s_tok])",
            f"{i8}mbarrier.arrive(k_empty.index(j % K_DEPTH))  # empty: K tile j consumed",
            *softmax("j", i8),
            f"{i8}{rescale}",
            *issue_pv("j", i8, "j"),
            f"{i8}o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])",
            f"{i8}mbarrier.arrive(v_empty.index(j % V_DEPTH))  # empty: V tile j consumed",
        ]
    tail = [
        "    # normalise and store (rows past seq_len masked)",
        "    o = o / gl.convert_layout(l_i, row_o)[:, None]",
        "    rows = gl.arange(0, SUB_M, row_o)",
        "    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))",
        f"    row0 = o_row + {part.subtile} * SUB_M",
        "    ptrs = o_ptr + (row0 + rows).to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]",
        f"    gl.store(ptrs, o.to(DTYPE), mask=(q_start + {part.subtile} * SUB_M + rows < seq_len)[:, None])",
    ]
    return "\n".join(head + body + tail) + "\n"


def render_kernel(plan: KernelPlan) -> str:
    comp = plan.compute
    args_c = ("q_smem, q_bar, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty, turn_bars, o_ptr, q_row, "
              "q_start, seq_len, n_tiles, qk_scale")
    args_l = ("q_desc, k_desc, v_desc, q_smem, q_bar, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty, "
              "q_row, kv_row, n_tiles")
    lines = [
        "@gluon.jit",
        "def attention_kernel(q_desc, k_desc, v_desc, o_ptr, seq_len, qk_scale):",
        '    """O = softmax(Q K^T * scale) V for one (query block, batch*head); Q, K, V, O are [B*H*S, D]."""',
        "    pid_m = gl.program_id(0)",
        "    bh = gl.program_id(1)",
        "    kv_row = bh * seq_len",
        "    q_start = pid_m * BLOCK_M",
        "    q_row = kv_row + q_start",
        "    n_tiles = gl.cdiv(seq_len, BLOCK_N)",
        "    q_smem = gl.allocate_shared_memory(DTYPE, [NUM_COMPUTE, SUB_M, HEAD_DIM], q_desc.layout)",
        "    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
        "    mbarrier.init(q_bar, count=1)",
    ]
    for r in plan.rings:
        n, depth = r.name, f"{r.name.upper()}_DEPTH"
        lines += [
            f"    {n}_ring = gl.allocate_shared_memory(DTYPE, [{depth}, BLOCK_N, HEAD_DIM], {n}_desc.layout)",
            f"    {n}_ready = gl.allocate_shared_memory(gl.int64, [{depth}, 1], mbarrier.MBarrierLayout())",
            f"    {n}_empty = gl.allocate_shared_memory(gl.int64, [{depth}, 1], mbarrier.MBarrierLayout())",
            f"    for s in gl.static_range({depth}):",
            f"        mbarrier.init({n}_ready.index(s), count=1)  # completed by the TMA transaction bytes",
            f"        mbarrier.init({n}_empty.index(s), count={n.upper()}_READERS)  # one arrive per compute partition",
        ]
    lines += [
        "    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())",
        "    for s in gl.static_range(2):",
        "        mbarrier.init(turn_bars.index(s), count=1)",
    ]
    if plan.turns:
        first = plan.turns[0]
        lines.append(f"    mbarrier.arrive(turn_bars.index({first.partition}))  # compute{first.partition} takes the "
                     f"first tensor-core turn ({'/'.join(first.ops)})")
    lines.append("    gl.warp_specialize([")
    for p in comp:
        lines.append(f"        ({p.name}, ({args_c})),")
    lines.append(f"        (load_partition, ({args_l})),")
    workers_w = [str(p.num_warps) for p in comp[1:]] + ["LOAD_WARPS"]
    workers_r = ["COMPUTE_REGS" for _ in comp[1:]] + ["LOAD_REGS"]
    lines.append(f"    ], [{', '.join(workers_w)}], [{', '.join(workers_r)}])")
    return "\n".join(lines) + "\n"


HOST = '''
NUM_WARPS = COMPUTE_WARPS.value
KERNEL_FN = attention_kernel
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the softmax runs in base 2


def _desc_type(shape):
    layout = gl.NVMMASharedLayout.get_default_for(shape, DTYPE.value)
    name = {"fp16": "fp16", "bf16": "bf16"}[str(DTYPE.value)]
    return f"tensordesc<{name}[{shape[0]}, {shape[1]}],{layout!r}>"


def compile_signature():
    """(signature, constexprs) for ahead-of-time compilation with GluonASTSource (no GPU needed)."""
    name = {"fp16": "fp16", "bf16": "bf16"}[str(DTYPE.value)]
    sig = {"q_desc": _desc_type([SUB_M.value, HEAD_DIM.value]), "k_desc": _desc_type([BLOCK_N.value, HEAD_DIM.value]),
           "v_desc": _desc_type([BLOCK_N.value, HEAD_DIM.value]), "o_ptr": f"*{name}", "seq_len": "i32",
           "qk_scale": "fp32"}
    return sig, {}


def launch(q, k, v, sm_scale=None, out=None):
    """softmax(q k^T * sm_scale) v for q, k, v [B, H, S, D] (fp16/bf16, CUDA, non-causal); returns out."""
    import math

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    B, H, S, D = q.shape
    if D != HEAD_DIM.value or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of shape [B, H, S, {HEAD_DIM.value}], got {tuple(q.shape)}")
    q2, k2, v2 = (t.contiguous().view(B * H * S, D) for t in (q, k, v))
    if out is None:
        out = torch.empty_like(q)
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    layout = gl.NVMMASharedLayout.get_default_for
    q_desc = TensorDescriptor.from_tensor(q2, [SUB_M.value, D], layout([SUB_M.value, D], DTYPE.value))
    k_desc = TensorDescriptor.from_tensor(k2, [BLOCK_N.value, D], layout([BLOCK_N.value, D], DTYPE.value))
    v_desc = TensorDescriptor.from_tensor(v2, [BLOCK_N.value, D], layout([BLOCK_N.value, D], DTYPE.value))
    grid = (triton.cdiv(S, BLOCK_M.value), B * H)
    attention_kernel[grid](q_desc, k_desc, v_desc, out, S, sm_scale * LOG2E, num_warps=NUM_WARPS)
    return out
'''


def render_flash(plan: KernelPlan) -> str:
    """The complete emitted module for an attention-forward plan."""
    turns = "; ".join(f"compute{t.partition}: {'/'.join(t.ops)}" for t in plan.turns) or "none (one compute group)"
    extra = ["", f"decisions: stage(pv) - stage(qk) per compute partition "
                 f"{[p.qk_ahead for p in plan.compute]} (1: S(j+1) issued with PV(j), softmax overlaps PV); "
                 f"tensor-core turns (ping-pong): {turns}",
             "layouts: S, O in the wgmma accumulator layout; row max/sum in SliceLayout(1, S); P in registers as "
             "the A operand (DotOperandLayout) of O += P V"]
    header = render_header(plan, "Warp-specialized attention forward for Hopper (sm_90), Gluon / Triton 3.6.",
                           extra)
    parts = [header, '"""Generated warp-specialized Gluon attention forward; see the header comment."""\n',
             IMPORTS, "KERNEL = \"flash-fwd\"\n", render_constants_flash(plan), render_load_partition(plan),
             SOFTMAX.strip("\n") + "\n"]
    parts += [render_compute_partition(plan, i) for i in range(len(plan.compute))]
    parts += [render_kernel(plan), HOST.lstrip("\n")]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"
