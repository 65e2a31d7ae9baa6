"""Render a GEMM :class:`~twill.codegen.gluon.plan.KernelPlan` as a warp-specialized Gluon kernel for sm_90.

Shape of the emitted kernel: ``load_partition`` (the TMA producer warp group) fills the A and B rings;
``compute0_partition`` (default partition) runs the wgmma loop with the schedule's wait lag split into a
prologue (iterations whose wait is deferred), a steady state and an epilogue that drains the lag; the kernel
body stores the accumulator through shared memory with a TMA store (tails clipped by TMA).
"""

from __future__ import annotations

from twill.codegen.gluon.plan import DTYPES, KernelPlan
from twill.codegen.gluon.render_common import IMPORTS, render_constants, render_header

#: Output tiles grouped along M so CTAs resident together reuse B tiles from L2 (tile-order policy).
GROUP_M = 8


def _shared_barriers(plan: KernelPlan) -> bool:
    """A and B share one ready/empty barrier pair when their rings agree on depth and release point."""
    a, b = plan.ring("a"), plan.ring("b")
    return a.depth == b.depth and a.release == b.release


def render_constants_gemm(plan: KernelPlan) -> str:
    sched = plan.schedule
    t, comp, load = plan.tile, plan.compute[0], plan.load
    a, b = plan.ring("a"), plan.ring("b")
    mma = next(n for n in comp.ops if sched.graph.op(n).attrs.get("role") == "mma")
    wait = a.release
    items = [
        ("DTYPE", f"gl.{DTYPES[plan.dtype]}", "operand dtype"),
        ("BLOCK_M", t["block_m"], "output tile rows"),
        ("BLOCK_N", t["block_n"], "output tile columns"),
        ("BLOCK_K", t["block_k"], "K extent of one loop iteration"),
        ("A_DEPTH", a.depth, f"ring a slots: {a.why}"),
        ("B_DEPTH", b.depth, f"ring b slots: {b.why}"),
        ("MMA_LAG", plan.mma_lag, f"wgmma groups left in flight: stage({wait})={sched.stage(wait)} - "
                                  f"stage({mma})={sched.stage(mma)}"),
        ("COMPUTE_WARPS", comp.num_warps, f"warp group {comp.group}: wgmma partition (default, num_warps)"),
        ("LOAD_WARPS", load.num_warps, f"warp group {load.group}: TMA producer"),
        ("LOAD_REGS", load.regs, f"warp group {load.group}: setmaxnreg budget of the producer"),
        ("GROUP_M", GROUP_M, "tile order: output tiles grouped along M for L2 reuse"),
    ]
    text = render_constants([(n, v, w) for n, v, w in items if n != "DTYPE"])
    return f"DTYPE = gl.constexpr({items[0][1]})  # {items[0][2]}\n" + text


def _barrier_names(plan: KernelPlan) -> tuple[str, str]:
    """Barrier parameter names the partitions use for rings a and b (b reuses a's when shared)."""
    return ("a", "a") if _shared_barriers(plan) else ("a", "b")


def render_load_partition(plan: KernelPlan) -> str:
    sched = plan.schedule
    bar_a, bar_b = _barrier_names(plan)
    shared = _shared_barriers(plan)
    lines = [
        "@gluon.jit",
        "def load_partition(a_desc, b_desc, a_ring, b_ring, a_ready, a_empty, b_ready, b_empty, off_m, off_n,",
        "                   k_tiles):",
        f'    """Warp group {plan.load.group} (TMA producer, {plan.load.num_warps} warp): streams A and B tiles into '
        f'the rings."""',
        "    for i in range(k_tiles):",
    ]
    for name in plan.load.ops:
        r = next(r for r in plan.rings if r.producer == name)
        desc = f"{r.name}_desc"
        coords = "[off_m, i * BLOCK_K]" if r.name == "a" else "[i * BLOCK_K, off_n]"
        bar = bar_a if r.name == "a" else bar_b
        depth = f"{r.name.upper()}_DEPTH"
        lines.append(f"        # {name}: start {sched.start(name)}, stage {sched.stage(name)} -> ring {r.name} "
                     f"({r.depth} slots)")
        lines.append(f"        slot = i % {depth}")
        if not (shared and r.name == "b"):
            nbytes = ("a_desc.block_type.nbytes + b_desc.block_type.nbytes" if shared
                      else f"{desc}.block_type.nbytes")
            lines += [
                f"        # wait until slot is released by the wgmma partition (first pass free: phase flipped)",
                f"        mbarrier.wait({bar}_empty.index(slot), ((i // {depth}) & 1) ^ 1)",
                f"        mbarrier.expect({bar}_ready.index(slot), {nbytes})",
            ]
        lines.append(f"        tma.async_copy_global_to_shared({desc}, {coords}, {bar}_ready.index(slot), "
                     f"{r.name}_ring.index(slot))")
    return "\n".join(lines) + "\n"


def render_compute_partition(plan: KernelPlan) -> str:
    sched = plan.schedule
    comp = plan.compute[0]
    mma = next(n for n in comp.ops if sched.graph.op(n).attrs.get("role") == "mma")
    wait = plan.ring("a").release
    bar_a, bar_b = _barrier_names(plan)
    shared = _shared_barriers(plan)
    waits_ready = [f"mbarrier.wait({bar_a}_ready.index(i % A_DEPTH), (i // A_DEPTH) & 1)"]
    if not shared:
        waits_ready.append(f"mbarrier.wait({bar_b}_ready.index(i % B_DEPTH), (i // B_DEPTH) & 1)")
    issue = ["acc = warpgroup_mma(a_ring.index(i % A_DEPTH), b_ring.index(i % B_DEPTH), acc, is_async=True)"]
    release = [f"mbarrier.arrive({bar_a}_empty.index((i - MMA_LAG) % A_DEPTH))"]
    if not shared:
        release.append(f"mbarrier.arrive({bar_b}_empty.index((i - MMA_LAG) % B_DEPTH))")
    ind = " " * 8
    lines = [
        "@gluon.jit",
        "def compute0_partition(a_ring, b_ring, a_ready, a_empty, b_ready, b_empty, k_tiles):",
        f'    """Warp group {comp.group} ({comp.num_warps} warps): wgmma over the K loop; returns the fp32 '
        f'accumulator."""',
        "    # layout policy: wgmma accumulator layout, warps stacked along M, one m64nNk16 per warp group",
        "    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
        "                                                         instr_shape=[16, BLOCK_N, 16])",
        "    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)",
    ]
    if plan.mma_lag > 0:
        lines += [
            f"    # prologue: iterations 0 .. MMA_LAG-1 issue {mma} (stage {sched.stage(mma)}); their {wait} "
            f"(stage {sched.stage(wait)}) is deferred",
            "    for i in range(0, gl.minimum(k_tiles, MMA_LAG)):",
            f"{ind}# ready: ring slot filled by load_partition",
            *(ind + w for w in waits_ready),
            *(ind + s for s in issue),
            f"{ind}# returns at once (fewer than MMA_LAG groups in flight); keeps acc a plain tensor",
            f"{ind}acc = warpgroup_mma_wait(MMA_LAG, deps=[acc])",
        ]
    lines += [
        f"    # steady state: {mma} of iteration i, then {wait} of iteration i - MMA_LAG "
        f"(stage distance {plan.mma_lag})",
        "    for i in range(MMA_LAG, k_tiles):",
        f"{ind}# ready: ring slot filled by load_partition",
        *(ind + w for w in waits_ready),
        *(ind + s for s in issue),
        f"{ind}# {wait}: at most MMA_LAG wgmma groups in flight, so iteration i - MMA_LAG has completed",
        f"{ind}acc = warpgroup_mma_wait(MMA_LAG, deps=[acc])",
        f"{ind}# empty: release iteration i - MMA_LAG's slot(s) to the producer",
        *(ind + r for r in release),
        f"    # epilogue: drain the last MMA_LAG wgmma groups ({wait} of the final iterations)",
        "    acc = warpgroup_mma_wait(0, deps=[acc])",
        "    return (acc,)",
    ]
    return "\n".join(lines) + "\n"


def render_kernel(plan: KernelPlan) -> str:
    shared = _shared_barriers(plan)
    bar_a, bar_b = ("ab", "ab") if shared else ("a", "b")
    rings = [
        "    a_ring = gl.allocate_shared_memory(DTYPE, [A_DEPTH, BLOCK_M, BLOCK_K], a_desc.layout)",
        "    b_ring = gl.allocate_shared_memory(DTYPE, [B_DEPTH, BLOCK_K, BLOCK_N], b_desc.layout)",
    ]
    names = ["ab"] if shared else ["a", "b"]
    for n in names:
        depth = "A_DEPTH" if n in ("a", "ab") else "B_DEPTH"
        rings += [
            f"    {n}_ready = gl.allocate_shared_memory(gl.int64, [{depth}, 1], mbarrier.MBarrierLayout())",
            f"    {n}_empty = gl.allocate_shared_memory(gl.int64, [{depth}, 1], mbarrier.MBarrierLayout())",
            f"    for s in gl.static_range({depth}):",
            f"        mbarrier.init({n}_ready.index(s), count=1)  # completed by the TMA transaction bytes",
            f"        mbarrier.init({n}_empty.index(s), count=1)  # one arrive by the wgmma partition",
        ]
    args_c = f"a_ring, b_ring, {bar_a}_ready, {bar_a}_empty, {bar_b}_ready, {bar_b}_empty, k_tiles"
    args_l = (f"a_desc, b_desc, a_ring, b_ring, {bar_a}_ready, {bar_a}_empty, {bar_b}_ready, {bar_b}_empty, "
              f"off_m, off_n, k_tiles")
    lines = [
        "@gluon.jit",
        "def gemm_kernel(a_desc, b_desc, c_desc, M, N, K):",
        '    """C[M, N] = A[M, K] @ B[K, N]; one CTA per output tile; M, N, K tails are TMA-padded/clipped."""',
        "    pid = gl.program_id(0)",
        "    num_m = gl.cdiv(M, BLOCK_M)",
        "    num_n = gl.cdiv(N, BLOCK_N)",
        "    tiles_per_group = GROUP_M * num_n",
        "    first_m = (pid // tiles_per_group) * GROUP_M",
        "    group_m = gl.minimum(num_m - first_m, GROUP_M)",
        "    off_m = (first_m + (pid % tiles_per_group) % group_m) * BLOCK_M",
        "    off_n = ((pid % tiles_per_group) // group_m) * BLOCK_N",
        "    k_tiles = gl.cdiv(K, BLOCK_K)",
        *rings,
        "    acc, = gl.warp_specialize([",
        f"        (compute0_partition, ({args_c})),",
        f"        (load_partition, ({args_l})),",
        "    ], [LOAD_WARPS], [LOAD_REGS])",
        "    # epilogue: registers -> shared memory -> TMA store (rows/columns past M, N are clipped by TMA)",
        "    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)",
        "    c_smem.store(acc.to(c_desc.dtype))",
        "    fence_async_shared()  # order the generic-proxy stores before the async-proxy TMA read",
        "    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)",
        "    tma.store_wait(0)",
    ]
    return "\n".join(lines) + "\n"


HOST = '''
NUM_WARPS = COMPUTE_WARPS.value
KERNEL_FN = gemm_kernel


def _desc_type(shape):
    layout = gl.NVMMASharedLayout.get_default_for(shape, DTYPE.value)
    name = {"fp16": "fp16", "bf16": "bf16"}[str(DTYPE.value)]
    return f"tensordesc<{name}[{shape[0]}, {shape[1]}],{layout!r}>"


def compile_signature():
    """(signature, constexprs) for ahead-of-time compilation with GluonASTSource (no GPU needed)."""
    sig = {"a_desc": _desc_type([BLOCK_M.value, BLOCK_K.value]), "b_desc": _desc_type([BLOCK_K.value, BLOCK_N.value]),
           "c_desc": _desc_type([BLOCK_M.value, BLOCK_N.value]), "M": "i32", "N": "i32", "K": "i32"}
    return sig, {}


def _tma_ready(t, rows, cols):
    """t itself when its row stride is 16-byte aligned, else a zero-padded copy (TMA needs aligned strides)."""
    import torch

    if t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0:
        return t
    out = torch.zeros(rows, cols, dtype=t.dtype, device=t.device)
    out[: t.shape[0], : t.shape[1]] = t
    return out


def launch(a, b, c=None):
    """c = a @ b for a [M, K], b [K, N] (fp16/bf16, CUDA); returns c. Unaligned strides are padded."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    k8, n8 = -(-K // 8) * 8, -(-N // 8) * 8
    a_t = _tma_ready(a, M, k8)
    b_t = _tma_ready(b, k8, n8)
    if c is None:
        c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    c_t = c if c.stride(-1) == 1 and (c.stride(0) * c.element_size()) % 16 == 0 else torch.empty(
        M, n8, dtype=a.dtype, device=a.device)
    def desc(t, rows, cols):
        return TensorDescriptor.from_tensor(t, [rows, cols], gl.NVMMASharedLayout.get_default_for([rows, cols], DTYPE.value))

    a_desc = desc(a_t, BLOCK_M.value, BLOCK_K.value)
    b_desc = desc(b_t, BLOCK_K.value, BLOCK_N.value)
    c_desc = desc(c_t, BLOCK_M.value, BLOCK_N.value)
    grid = (triton.cdiv(M, BLOCK_M.value) * triton.cdiv(N, BLOCK_N.value),)
    gemm_kernel[grid](a_desc, b_desc, c_desc, M, N, K, num_warps=NUM_WARPS)
    if c_t is not c:
        c.copy_(c_t[:, :N])
    return c
'''


def render_gemm(plan: KernelPlan) -> str:
    """The complete emitted module for a GEMM plan."""
    extra = ["", f"decisions: wgmma wait lag {plan.mma_lag}; "
                 f"{'A and B share one ready/empty barrier pair' if _shared_barriers(plan) else 'A, B: own barriers'}; "
                 f"tile order grouped along M by {GROUP_M}; epilogue through shared memory + TMA store"]
    header = render_header(plan, "Warp-specialized GEMM for Hopper (sm_90), Gluon / Triton 3.6.", extra)
    parts = [header, '"""Generated warp-specialized Gluon GEMM; see the header comment."""\n', IMPORTS,
             "KERNEL = \"gemm\"\n", render_constants_gemm(plan), render_load_partition(plan),
             render_compute_partition(plan), render_kernel(plan), HOST.lstrip("\n")]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"
