"""The GEMM body of the shared Gluon module (:mod:`~twill.codegen.gluon.render`): its compute partition,
tile order, TMA-store epilogue and launcher.

Shape of the emitted kernel: ``load_partition`` (the TMA producer warp group) fills the A and B rings;
``compute_partition`` (the default partition) runs the wgmma loop with the schedule's wait lag split into a
prologue (iterations whose wait is deferred), a steady state and an epilogue that drains the lag; the kernel
body stores the accumulator through shared memory with a TMA store (tails clipped by TMA).

Persistent kernel (``plan.persistent``): the launcher starts ``min(tiles, SMs)`` CTAs; each walks the output
tiles ``pid, pid + grid, ...`` in the same grouped order (:data:`TILE_OFFSETS`). Both partitions run the
same K loop per tile, with the ring counter ``i`` running on across tiles (tile ``t`` of the CTA uses ring
iterations ``t·k_tiles .. (t+1)·k_tiles − 1``), so the producer loads the next tile while the compute
partition drains and stores the previous one. The compute partition stores each tile itself and leaves the
TMA store in flight: it waits for it (``tma.store_wait(0)``) only before it writes the staging buffer again.
When rings and a whole staging tile do not fit shared memory, the tile goes out in two column halves
through a half-width buffer (``epilogue_split`` of the plan's
:class:`~twill.kernels.gemm.plan.GemmDecisions`); only the second half's store then overlaps the next tile.
"""

from __future__ import annotations

from twill.codegen.gluon.render import SM_COUNT, KernelBody, compute_def, depth_name
from twill.codegen.plan import KernelPlan
from twill.kernels.gemm.plan import GemmDecisions, persistent_smem

#: Output tiles grouped along M so CTAs resident together reuse B tiles from L2 (tile-order policy).
GROUP_M = 8
#: Parameters of the compute partition after the rings and barriers (the kernel passes the same names).
COMPUTE_PARAMS = ("k_tiles",)
#: The same for the persistent kernel, which stores its tiles itself.
PERSISTENT_COMPUTE_PARAMS = ("c_desc", "c_smem", "num_m", "num_n", "cta_tiles", "k_tiles")

#: The grouped tile order, shared by the kernel (one tile per CTA) and both persistent partitions.
TILE_OFFSETS = '''
@gluon.jit
def tile_offsets(tile, num_m, num_n):
    """(off_m, off_n) of output tile ``tile``: tiles grouped along M by GROUP_M (CTAs resident together reuse
    B tiles from L2)."""
    tiles_per_group = GROUP_M * num_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_m = gl.minimum(num_m - first_m, GROUP_M)
    off_m = (first_m + (tile % tiles_per_group) % group_m) * BLOCK_M
    off_n = ((tile % tiles_per_group) // group_m) * BLOCK_N
    return off_m, off_n
'''

#: The launcher's grid line: one CTA per output tile, or (persistent) at most one per SM.
GRID = {False: "    grid = (tiles,)",
        True: "    grid = (min(tiles, _sm_count(a.device.index)),)  # persistent: at most one CTA per SM"}


LAUNCH = '''
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
    a_desc = _descriptor(a_t, [BLOCK_M.value, BLOCK_K.value])
    b_desc = _descriptor(b_t, [BLOCK_K.value, BLOCK_N.value])
    c_desc = _descriptor(c_t, [BLOCK_M.value, BLOCK_N.value])
    tiles = triton.cdiv(M, BLOCK_M.value) * triton.cdiv(N, BLOCK_N.value)
    grid = (GRID,)
    gemm_kernel[grid](a_desc, b_desc, c_desc, M, N, K, num_warps=NUM_WARPS)
    if c_t is not c:
        c.copy_(c_t[:, :N])
    return c
'''


def k_loop(plan: KernelPlan, first: str | None) -> list[str]:
    """The wgmma loop over one output tile at four spaces: prologue (deferred waits), steady state, drain.
    ``first`` names the tile's first ring iteration (persistent kernel; ``None``: 0, one tile per CTA)."""
    comp = plan.compute[0]
    mma, wait = comp.roles["mma"], comp.roles["mma_wait"]
    at_mma, at_wait = plan.placement(mma), plan.placement(wait)

    def at(offset: str) -> str:
        return offset if first is None else f"{first} + {offset}"

    ready = [f"mbarrier.wait({b.name}_ready.index(i % {depth_name(b)}), (i // {depth_name(b)}) & 1)"
             for b in plan.barriers]
    ready_why = "; ".join(w.why for w in plan.waits if w.kind == "ready" and w.op == mma)
    issue = "acc = warpgroup_mma(a_ring.index(i % A_DEPTH), b_ring.index(i % B_DEPTH), acc, is_async=True)"
    release = [f"mbarrier.arrive({b.name}_empty.index((i - MMA_LAG) % {depth_name(b)}))" for b in plan.barriers]
    ind = " " * 8
    lines = []
    if plan.decisions.mma_lag > 0:
        lines += [
            f"    # prologue: iterations 0 .. MMA_LAG-1 issue {mma} (stage {at_mma.stage}); their {wait} "
            f"(stage {at_wait.stage}) is deferred",
            f"    for i in range({first or 0}, {at('gl.minimum(k_tiles, MMA_LAG)')}):",
            f"{ind}# ready: ring buffer filled by load_partition ({ready_why})",
            *(ind + w for w in ready),
            ind + issue,
            f"{ind}# returns at once (fewer than MMA_LAG groups in flight); keeps acc a plain tensor",
            f"{ind}acc = warpgroup_mma_wait(MMA_LAG, deps=[acc])",
        ]
    lines += [
        f"    # steady state: {mma} of iteration i, then {wait} of iteration i - MMA_LAG "
        f"(stage distance {plan.decisions.mma_lag})",
        f"    for i in range({at('MMA_LAG')}, {at('k_tiles')}):",
        f"{ind}# ready: ring buffer filled by load_partition ({ready_why})",
        *(ind + w for w in ready),
        ind + issue,
        f"{ind}# {wait}: at most MMA_LAG wgmma groups in flight, so iteration i - MMA_LAG has completed "
        f"({plan.retire(mma).why})",
        f"{ind}acc = warpgroup_mma_wait(MMA_LAG, deps=[acc])",
        f"{ind}# empty: release iteration i - MMA_LAG's buffer(s) to the producer",
        *(ind + r for r in release),
        f"    # epilogue: drain the last MMA_LAG wgmma groups ({wait} of the final iterations)",
        "    acc = warpgroup_mma_wait(0, deps=[acc])",
    ]
    if first is not None and plan.decisions.mma_lag > 0:
        lines += ["    # empty: release the last MMA_LAG iterations' buffer(s) (the producer fills them for the "
                  "next tile)",
                  f"    for i in range({at('gl.maximum(k_tiles - MMA_LAG, 0)')}, {at('k_tiles')}):",
                  *(ind + r.replace("(i - MMA_LAG)", "i") for r in release)]
    return lines


def compute_partition(plan: KernelPlan) -> str:
    """The wgmma partition: prologue (deferred waits), steady state, drain; returns the accumulator."""
    comp = plan.compute[0]
    return "\n".join([
        *compute_def(plan, COMPUTE_PARAMS, (), f"Warp group {comp.group} ({comp.num_warps} warps): wgmma over the K "
                                              f"loop; returns the fp32 accumulator."),
        *ACC_LAYOUT,
        "    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)",
        *k_loop(plan, None),
        "    return (acc,)",
    ]) + "\n"


def persistent_compute_partition(plan: KernelPlan) -> str:
    """The persistent wgmma partition: per output tile of the CTA, the K loop, then the TMA-store epilogue
    left in flight (waited for only before the staging buffer is written again)."""
    comp = plan.compute[0]
    doc = (f"Warp group {comp.group} ({comp.num_warps} warps): for each output tile of this CTA, wgmma over "
           f"the K loop, then the epilogue (the TMA store is left in flight).")
    return "\n".join([
        *compute_def(plan, PERSISTENT_COMPUTE_PARAMS, (), doc),
        *ACC_LAYOUT,
        "    for t in range(cta_tiles):",
        "        off_m, off_n = tile_offsets(gl.program_id(0) + t * gl.num_programs(0), num_m, num_n)",
        "        first = t * k_tiles  # ring iteration of the tile's first K step: the ring runs on across tiles",
        "        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)",
        *("    " + line for line in k_loop(plan, "first")),
        *_persistent_epilogue(plan),
        "    tma.store_wait(0)",
    ]) + "\n"


def _persistent_epilogue(plan: KernelPlan) -> list[str]:
    """Registers -> staging buffer -> TMA store, left in flight; the whole tile, or two column halves."""
    head = "        # epilogue: registers -> shared memory -> TMA store (rows/columns past M, N are clipped by TMA);"
    if plan.decisions.epilogue_split == 1:
        return [head,
                "        # the previous tile's store must have read c_smem first; this one completes during the "
                "next tile",
                "        tma.store_wait(0)",
                "        c_smem.store(acc.to(c_desc.dtype))",
                "        fence_async_shared()  # order the generic-proxy stores before the async-proxy TMA read",
                "        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)"]
    return [head,
            "        # two column halves through one half-width buffer (rings + the whole tile overflow shared memory)",
            "        halves = acc.to(c_desc.dtype).reshape([BLOCK_M, 2, EPILOGUE_N]).permute(0, 2, 1).split()",
            "        for h in gl.static_range(2):",
            "            tma.store_wait(0)  # the previous store (other half, or previous tile) has read c_smem",
            "            c_smem.store(halves[h])",
            "            fence_async_shared()  # order the generic-proxy stores before the async-proxy TMA read",
            "            tma.async_copy_shared_to_global(c_desc, [off_m, off_n + h * EPILOGUE_N], c_smem)"]


#: The wgmma accumulator layout lines of the compute partition.
ACC_LAYOUT = (
    "    # layout policy: wgmma accumulator layout, warps stacked along M, one m64nNk16 per warp group",
    "    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
    "                                                         instr_shape=[16, BLOCK_N, 16])",
)

#: The epilogue after ``gl.warp_specialize`` of the kernel with one tile per CTA.
EPILOGUE = ("    # epilogue: registers -> shared memory -> TMA store (rows/columns past M, N are clipped by TMA)",
            "    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)",
            "    c_smem.store(acc.to(c_desc.dtype))",
            "    fence_async_shared()  # order the generic-proxy stores before the async-proxy TMA read",
            "    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)",
            "    tma.store_wait(0)")


def _staging_why(plan: KernelPlan) -> str:
    """The comment of ``EPILOGUE_N``, the persistent kernel's staging-buffer width."""
    split = plan.decisions.epilogue_split
    if split == 1:
        return "columns of the C staging buffer: the whole tile (BLOCK_N)"
    return (f"columns of the C staging buffer: BLOCK_N / {split} (rings + a whole tile would overflow "
            f"shared memory)")


def _decisions(plan: KernelPlan) -> tuple[str, ...]:
    """The header's decision lines; a persistent kernel says how its loop over tiles is organised."""
    mma, wait = plan.compute[0].roles["mma"], plan.compute[0].roles["mma_wait"]
    shared = "A and B share one ready/empty barrier pair" if len(plan.barriers) == 1 else "A, B: own barriers"
    decided: GemmDecisions = plan.decisions
    head = f"decisions: wgmma wait lag {decided.mma_lag}; {shared}; tile order grouped along M by {GROUP_M}; "
    if not plan.persistent:
        return (head + "one CTA per output tile; epilogue through shared memory + TMA store",)
    need = persistent_smem(plan.tile, [r.depth for r in plan.rings], decided.epilogue_split)
    staging = "c_smem" if decided.epilogue_split == 1 else "c_smem (half the tile: two stores per tile)"
    return (head + "persistent:",
            "  the launcher starts min(tiles, SMs) CTAs; CTA pid walks tiles pid, pid + grid, ... (cta_tiles of them);",
            "  both partitions loop over those tiles and then over K; ring iteration i = t * k_tiles + k runs on",
            "  across tiles (buffers and phases from i, never reset), so the producer loads tile t + 1 while the",
            f"  compute partition drains tile t ({mma}, {wait} as scheduled) and stores it: registers -> {staging}",
            "  -> TMA store, waited for (tma.store_wait(0)) only before c_smem is written again;",
            f"  rings + C staging buffer + barriers: {need} bytes of shared memory")


def body(plan: KernelPlan) -> KernelBody:
    """The GEMM's part of the emitted module (one tile per CTA, or persistent: ``plan.persistent``)."""
    t = plan.tile
    mma, wait = plan.compute[0].roles["mma"], plan.compute[0].roles["mma_wait"]
    decided: GemmDecisions = plan.decisions
    c_cols = "EPILOGUE_N" if plan.persistent else "BLOCK_N"     # the C descriptor's block: the staging buffer
    common = dict(
        title="Warp-specialized GEMM for Hopper (sm_90), Gluon / Triton 3.6.",
        summary="Generated warp-specialized Gluon GEMM; see the header comment.",
        decisions=_decisions(plan),
        tile_constants=(("BLOCK_M", t["block_m"], "output tile rows"),
                        ("BLOCK_N", t["block_n"], "output tile columns"),
                        ("BLOCK_K", t["block_k"], "K extent of one loop iteration")),
        extra_constants=(("MMA_LAG", decided.mma_lag, f"wgmma groups left in flight: stage({wait})="
                                                   f"{plan.placement(wait).stage} - stage({mma})="
                                                   f"{plan.placement(mma).stage}"),
                         ("GROUP_M", GROUP_M, "tile order: output tiles grouped along M for L2 reuse"),
                         *((("EPILOGUE_N", t["block_n"] // decided.epilogue_split, _staging_why(plan)),)
                           if plan.persistent else ())),
        kernel="gemm_kernel",
        kernel_params="a_desc, b_desc, c_desc, M, N, K",
        iv="i",
        trip="k_tiles",
        buffer_shapes={"a": "BLOCK_M, BLOCK_K", "b": "BLOCK_K, BLOCK_N"},
        load_setup=(),
        constexprs=(),
        signature=(("a_desc", "_desc_type([BLOCK_M.value, BLOCK_K.value])"),
                   ("b_desc", "_desc_type([BLOCK_K.value, BLOCK_N.value])"),
                   ("c_desc", f"_desc_type([BLOCK_M.value, {c_cols}.value])"),
                   ("M", '"i32"'), ("N", '"i32"'), ("K", '"i32"')),
    )
    sizes = ("    num_m = gl.cdiv(M, BLOCK_M)", "    num_n = gl.cdiv(N, BLOCK_N)", "    k_tiles = gl.cdiv(K, BLOCK_K)")
    launch = LAUNCH.replace("    grid = (GRID,)", GRID[plan.persistent]).replace(
        "c_desc = _descriptor(c_t, [BLOCK_M.value, BLOCK_N.value])", f"c_desc = _descriptor(c_t, [BLOCK_M.value, "
                                                                     f"{c_cols}.value])")
    if not plan.persistent:
        return KernelBody(
            **common,
            functions=TILE_OFFSETS.strip("\n") + "\n\n\n" + compute_partition(plan),
            kernel_doc="C[M, N] = A[M, K] @ B[K, N]; one CTA per output tile; M, N, K tails are TMA-padded/clipped.",
            setup=(*sizes, "    off_m, off_n = tile_offsets(gl.program_id(0), num_m, num_n)"),
            coords={"a": "[off_m, i * BLOCK_K]", "b": "[i * BLOCK_K, off_n]"},
            load_params=("off_m", "off_n"),
            compute_params=COMPUTE_PARAMS,
            before_specialize=(),
            results="acc, = ",
            epilogue=EPILOGUE,
            launch=launch,
        )
    return KernelBody(
        **common,
        functions=TILE_OFFSETS.strip("\n") + "\n\n\n" + persistent_compute_partition(plan),
        kernel_doc="C[M, N] = A[M, K] @ B[K, N]; persistent: CTA pid computes output tiles pid, pid + grid, ...; "
                   "M, N, K tails are TMA-padded/clipped.",
        setup=(*sizes, "    # output tiles of this CTA: pid, pid + grid, ... below num_m * num_n",
               "    cta_tiles = gl.cdiv(num_m * num_n - gl.program_id(0), gl.num_programs(0))"),
        coords={"a": "[off_m, (i - first) * BLOCK_K]", "b": "[(i - first) * BLOCK_K, off_n]"},
        load_params=("num_m", "num_n", "cta_tiles"),
        load_loop=("    for t in range(cta_tiles):",
                   "        off_m, off_n = tile_offsets(gl.program_id(0) + t * gl.num_programs(0), num_m, num_n)",
                   "        first = t * k_tiles  # ring iteration of the tile's first K step: the ring runs on "
                   "across tiles",
                   "        for i in range(first, first + k_tiles):"),
        compute_params=PERSISTENT_COMPUTE_PARAMS,
        before_specialize=("    # C staging buffer, live with the rings: the compute partition stores tile t while "
                           "the producer fills the rings for tile t + 1",
                           "    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, EPILOGUE_N], "
                           "c_desc.layout)"),
        results="",
        epilogue=(),
        launch=SM_COUNT.strip("\n") + "\n\n" + launch,
    )
