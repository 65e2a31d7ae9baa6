"""The GEMM as a Pallas Mosaic GPU module: ``plgpu.emit_pipeline_warp_specialized`` over the K loop.

Shape of the emitted kernel: one CTA per output tile (tiles grouped along M, as the Gluon backend does);
the memory warpgroup streams A and B tiles into rings of ``MAX_CONCURRENT_STEPS`` buffers; each compute
warpgroup issues ``wgmma`` on its rows of the tile and waits with ``plgpu.wgmma_wait(DELAY_RELEASE)``, so
the schedule's wait lag stays in flight and each buffer is released ``DELAY_RELEASE`` steps after its body;
the epilogue stores the accumulator through shared memory in 64 x 64 tiles. ``gemm(a, b)`` pads ragged
M, N, K with zeros and slices the result.
"""

from __future__ import annotations

from twill.codegen.pallas.render import (JNP_DTYPES, constant_lines, knob_constants, pipeline_knobs,
                                         render_header, render_module)
from twill.codegen.plan import KernelPlan

#: Output tiles grouped along M so CTAs resident together reuse B tiles from L2 (same policy as Gluon).
GROUP_M = 8
#: Epilogue tile (rows and columns) stored through shared memory, two buffers per compute warpgroup.
EPI_TILE = 64

BODY = '''
def _kernel(a_gmem, b_gmem, out_gmem):
    """One CTA: C[tile] = A[tile rows, :] @ B[:, tile columns]."""
    m, k = a_gmem.shape
    n = b_gmem.shape[1]
    num_m, num_n, k_tiles = m // BLOCK_M, n // BLOCK_N, k // BLOCK_K
    # tile order: output tiles grouped along M by GROUP_M (L2 reuse of B)
    pid = lax.axis_index("tile")
    tiles_per_group = GROUP_M * num_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_m = lax.min(num_m - first_m, GROUP_M)
    m_idx = first_m + (pid % tiles_per_group) % group_m
    n_idx = (pid % tiles_per_group) // group_m
    wg = lax.axis_index("wg")
    wg_rows = pl.ds(wg * WG_ROWS, WG_ROWS)
    itemsize = jnp.dtype(DTYPE).itemsize
    swizzle = plgpu.find_swizzle(BLOCK_K * itemsize * 8)
    transforms = (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))
    out_swizzle = plgpu.find_swizzle(EPI_TILE * itemsize * 8)
    out_transforms = (plgpu.TilingTransform((8, out_swizzle // itemsize)), plgpu.SwizzleTransform(out_swizzle))

    def mma_step(_, a_smem, b_smem, acc_ref):
        """{mma}: one wgmma per step on this warpgroup's rows; {wait} leaves DELAY_RELEASE in flight."""
        # ready: the pipeline waited for this step's buffer ({ready})
        plgpu.wgmma(acc_ref, a_smem.at[wg_rows], b_smem)
        # {wait}: at most DELAY_RELEASE wgmma groups in flight ({retire})
        plgpu.wgmma_wait(DELAY_RELEASE)
        return acc_ref

    def compute_context(run_pipeline):
        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((WG_ROWS, BLOCK_N), jnp.float32))
        def _acc_scope(acc_ref):
            run_pipeline(acc_ref)
            # epilogue: reading the accumulator drains the last wgmma groups; store via shared memory
            acc = acc_ref[...].astype(DTYPE)
            row0 = m_idx * BLOCK_M + wg * WG_ROWS
            for t in range((WG_ROWS // EPI_TILE) * (BLOCK_N // EPI_TILE)):
                mi, ni = divmod(t, BLOCK_N // EPI_TILE)
                buffer = t % 2
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                out_smem[wg, buffer] = acc[mi * EPI_TILE:(mi + 1) * EPI_TILE, ni * EPI_TILE:(ni + 1) * EPI_TILE]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_smem.at[wg, buffer], out_gmem.at[
                    pl.ds(row0 + mi * EPI_TILE, EPI_TILE), pl.ds(n_idx * BLOCK_N + ni * EPI_TILE, EPI_TILE)])
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pipeline = plgpu.emit_pipeline_warp_specialized(
        mma_step,
        grid=(k_tiles,),
        memory_registers=MEMORY_REGISTERS,
        in_specs=[
            plgpu.BlockSpec((BLOCK_M, BLOCK_K), lambda kk: (0, kk), transforms=transforms,
                            delay_release=DELAY_RELEASE),  # ring a: {load_a} -> {mma}
            plgpu.BlockSpec((BLOCK_K, BLOCK_N), lambda kk: (kk, 0), transforms=transforms,
                            delay_release=DELAY_RELEASE),  # ring b: {load_b} -> {mma}
        ],
        wg_axis="wg",
        num_compute_wgs=COMPUTE_WGS,
        max_concurrent_steps=MAX_CONCURRENT_STEPS,
        compute_context=compute_context,
    )

    def scope(smem):
        nonlocal out_smem
        out_smem = smem
        pipeline(a_gmem.at[pl.ds(m_idx * BLOCK_M, BLOCK_M), :], b_gmem.at[:, pl.ds(n_idx * BLOCK_N, BLOCK_N)])

    out_smem = None
    pl.run_scoped(scope, plgpu.SMEM((COMPUTE_WGS, 2, EPI_TILE, EPI_TILE), DTYPE, transforms=out_transforms),
                  collective_axes="wg")


def _round_up(x, to):
    return -(-x // to) * to


@jax.jit
def gemm(a, b):
    """c = a @ b for a [M, K], b [K, N] ({dtype}); ragged M, N, K are zero-padded to whole tiles."""
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: a is {{a.shape}}, b is {{b.shape}}")
    mp, np_, kp = _round_up(m, BLOCK_M), _round_up(n, BLOCK_N), _round_up(k, BLOCK_K)
    if (mp, kp) != (m, k):
        a = jnp.pad(a, ((0, mp - m), (0, kp - k)))
    if (kp, np_) != (k, n):
        b = jnp.pad(b, ((0, kp - k), (0, np_ - n)))
    call = plgpu.kernel(
        _kernel,
        out_type=jax.ShapeDtypeStruct((mp, np_), a.dtype),
        grid=((mp // BLOCK_M) * (np_ // BLOCK_N),),
        grid_names=("tile",),
        num_threads=COMPUTE_WGS + 1,  # compute warpgroups + the memory warpgroup
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    c = call(a, b)
    return c if (mp, np_) == (m, n) else c[:m, :n]


launch = gemm
'''


def emit(plan: KernelPlan) -> str:
    """The Pallas GEMM module for ``plan``."""
    comp = plan.compute[0]
    mma, wait = comp.roles["mma"], comp.roles["mma_wait"]
    lag = plan.decisions.mma_lag
    knobs = pipeline_knobs(plan, lag, f"wgmma wait lag: stage({wait})={plan.placement(wait).stage} - "
                                      f"stage({mma})={plan.placement(mma).stage}")
    t = plan.tile
    wg_rows = t["block_m"] // knobs.compute_wgs
    items = [("BLOCK_M", t["block_m"], "output tile rows"), ("BLOCK_N", t["block_n"], "output tile columns"),
             ("BLOCK_K", t["block_k"], "K extent of one pipeline step"),
             ("WG_ROWS", wg_rows, "rows of the tile per compute warpgroup: BLOCK_M / COMPUTE_WGS"),
             *knob_constants(plan, knobs),
             ("GROUP_M", GROUP_M, "tile order: output tiles grouped along M for L2 reuse"),
             ("EPI_TILE", EPI_TILE, "epilogue tile stored through shared memory (two buffers per warpgroup)")]
    constants = f"DTYPE = jnp.{JNP_DTYPES[plan.dtype]}  # operand dtype\n" + constant_lines(items)
    ring = {r.name: r for r in plan.rings}
    ready = " | ".join(w.why for w in plan.waits if w.kind == "ready" and w.op == mma)
    body = BODY.format(mma=mma, wait=wait, ready=ready, retire=plan.retire(mma).why, load_a=ring["a"].producer,
                       load_b=ring["b"].producer, dtype=plan.dtype)
    decisions = [f"decisions: wgmma wait lag {lag} -> plgpu.wgmma_wait(DELAY_RELEASE) and BlockSpec("
                 f"delay_release={lag}); ring depth {knobs.max_concurrent_steps} -> max_concurrent_steps; "
                 f"{comp.num_warps}-warp compute partition -> {knobs.compute_wgs} compute warpgroup(s) of "
                 f"{wg_rows} rows; tile order grouped along M by {GROUP_M}"]
    header = render_header(plan, "Warp-specialized GEMM for Hopper, JAX Pallas Mosaic GPU.", decisions)
    return render_module(header, "Generated Pallas GEMM; see the header comment. gemm(a, b) -> a @ b.",
                         constants, body)
