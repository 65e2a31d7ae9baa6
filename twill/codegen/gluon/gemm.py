"""The GEMM body of the shared Gluon module (:mod:`~twill.codegen.gluon.render`): its compute partition,
tile order, TMA-store epilogue and launcher.

Shape of the emitted kernel: ``load_partition`` (the TMA producer warp group) fills the A and B rings;
``compute_partition`` (the default partition) runs the wgmma loop with the schedule's wait lag split into a
prologue (iterations whose wait is deferred), a steady state and an epilogue that drains the lag; the kernel
body stores the accumulator through shared memory with a TMA store (tails clipped by TMA).
"""

from __future__ import annotations

from twill.codegen.gluon.render import KernelBody, compute_def, depth_name
from twill.codegen.plan import KernelPlan

#: Output tiles grouped along M so CTAs resident together reuse B tiles from L2 (tile-order policy).
GROUP_M = 8
#: Parameters of the compute partition after the rings and barriers (the kernel passes the same names).
COMPUTE_PARAMS = ("k_tiles",)

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
    grid = (triton.cdiv(M, BLOCK_M.value) * triton.cdiv(N, BLOCK_N.value),)
    gemm_kernel[grid](a_desc, b_desc, c_desc, M, N, K, num_warps=NUM_WARPS)
    if c_t is not c:
        c.copy_(c_t[:, :N])
    return c
'''


def compute_partition(plan: KernelPlan) -> str:
    """The wgmma partition: prologue (deferred waits), steady state, drain."""
    comp = plan.compute[0]
    mma, wait = comp.roles["mma"], comp.roles["mma_wait"]
    at_mma, at_wait = plan.placement(mma), plan.placement(wait)
    ready = [f"mbarrier.wait({b.name}_ready.index(i % {depth_name(b)}), (i // {depth_name(b)}) & 1)"
             for b in plan.barriers]
    ready_why = "; ".join(w.why for w in plan.waits if w.kind == "ready" and w.op == mma)
    issue = "acc = warpgroup_mma(a_ring.index(i % A_DEPTH), b_ring.index(i % B_DEPTH), acc, is_async=True)"
    release = [f"mbarrier.arrive({b.name}_empty.index((i - MMA_LAG) % {depth_name(b)}))" for b in plan.barriers]
    ind = " " * 8
    lines = [
        *compute_def(plan, COMPUTE_PARAMS, (), f"Warp group {comp.group} ({comp.num_warps} warps): wgmma over the K "
                                             f"loop; returns the fp32 accumulator."),
        "    # layout policy: wgmma accumulator layout, warps stacked along M, one m64nNk16 per warp group",
        "    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],",
        "                                                         instr_shape=[16, BLOCK_N, 16])",
        "    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)",
    ]
    if plan.mma_lag > 0:
        lines += [
            f"    # prologue: iterations 0 .. MMA_LAG-1 issue {mma} (stage {at_mma.stage}); their {wait} "
            f"(stage {at_wait.stage}) is deferred",
            "    for i in range(0, gl.minimum(k_tiles, MMA_LAG)):",
            f"{ind}# ready: ring buffer filled by load_partition ({ready_why})",
            *(ind + w for w in ready),
            ind + issue,
            f"{ind}# returns at once (fewer than MMA_LAG groups in flight); keeps acc a plain tensor",
            f"{ind}acc = warpgroup_mma_wait(MMA_LAG, deps=[acc])",
        ]
    lines += [
        f"    # steady state: {mma} of iteration i, then {wait} of iteration i - MMA_LAG "
        f"(stage distance {plan.mma_lag})",
        "    for i in range(MMA_LAG, k_tiles):",
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
        "    return (acc,)",
    ]
    return "\n".join(lines) + "\n"


def gemm_body(plan: KernelPlan) -> KernelBody:
    """The GEMM's part of the emitted module."""
    t = plan.tile
    mma, wait = plan.compute[0].roles["mma"], plan.compute[0].roles["mma_wait"]
    shared = "A and B share one ready/empty barrier pair" if len(plan.barriers) == 1 else "A, B: own barriers"
    return KernelBody(
        title="Warp-specialized GEMM for Hopper (sm_90), Gluon / Triton 3.6.",
        summary="Generated warp-specialized Gluon GEMM; see the header comment.",
        decisions=(f"decisions: wgmma wait lag {plan.mma_lag}; {shared}; tile order grouped along M by {GROUP_M}; "
                   f"epilogue through shared memory + TMA store",),
        tile_constants=(("BLOCK_M", t["block_m"], "output tile rows"),
                        ("BLOCK_N", t["block_n"], "output tile columns"),
                        ("BLOCK_K", t["block_k"], "K extent of one loop iteration")),
        extra_constants=(("MMA_LAG", plan.mma_lag, f"wgmma groups left in flight: stage({wait})="
                                                   f"{plan.placement(wait).stage} - stage({mma})="
                                                   f"{plan.placement(mma).stage}"),
                         ("GROUP_M", GROUP_M, "tile order: output tiles grouped along M for L2 reuse")),
        functions=compute_partition(plan),
        kernel="gemm_kernel",
        kernel_params="a_desc, b_desc, c_desc, M, N, K",
        kernel_doc="C[M, N] = A[M, K] @ B[K, N]; one CTA per output tile; M, N, K tails are TMA-padded/clipped.",
        setup=("    pid = gl.program_id(0)",
               "    num_m = gl.cdiv(M, BLOCK_M)",
               "    num_n = gl.cdiv(N, BLOCK_N)",
               "    tiles_per_group = GROUP_M * num_n",
               "    first_m = (pid // tiles_per_group) * GROUP_M",
               "    group_m = gl.minimum(num_m - first_m, GROUP_M)",
               "    off_m = (first_m + (pid % tiles_per_group) % group_m) * BLOCK_M",
               "    off_n = ((pid % tiles_per_group) // group_m) * BLOCK_N",
               "    k_tiles = gl.cdiv(K, BLOCK_K)"),
        iv="i",
        trip="k_tiles",
        buffer_shapes={"a": "BLOCK_M, BLOCK_K", "b": "BLOCK_K, BLOCK_N"},
        coords={"a": "[off_m, i * BLOCK_K]", "b": "[i * BLOCK_K, off_n]"},
        load_params=("off_m", "off_n"),
        load_setup=(),
        compute_params=COMPUTE_PARAMS,
        constexprs=(),
        before_specialize=(),
        results="acc, = ",
        epilogue=("    # epilogue: registers -> shared memory -> TMA store (rows/columns past M, N are clipped by TMA)",
                  "    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)",
                  "    c_smem.store(acc.to(c_desc.dtype))",
                  "    fence_async_shared()  # order the generic-proxy stores before the async-proxy TMA read",
                  "    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)",
                  "    tma.store_wait(0)"),
        signature=(("a_desc", "_desc_type([BLOCK_M.value, BLOCK_K.value])"),
                   ("b_desc", "_desc_type([BLOCK_K.value, BLOCK_N.value])"),
                   ("c_desc", "_desc_type([BLOCK_M.value, BLOCK_N.value])"),
                   ("M", '"i32"'), ("N", '"i32"'), ("K", '"i32"')),
        launch=LAUNCH,
    )
