"""Attention forward as a Pallas Mosaic GPU module: ``plgpu.emit_pipeline_warp_specialized`` over the key
blocks, one compute warpgroup per 64 query rows, K and V rings released by hand.

Shape of the emitted kernel: each compute warpgroup loads its Q rows once, then runs the pipeline body per
key block. With ``pv`` in ``qk``'s stage: ``S = Q K^T`` (``wgmma``, read back = retired), release the K buffer,
online softmax, ``O += P V`` (``wgmma``, retired), release the V buffer. With ``pv`` one stage later (FA3's
intra-warpgroup overlap): ``S(j)`` and ``O += P(j-1) V(j-1)`` are issued back to back, S is read with the PV
still in flight (``wgmma_accumulator_load(wait_n=1)``), the softmax of ``j`` runs under it, then O is read
and V(j-1)'s buffer released; the last PV follows the loop. With two compute partitions every tensor-core
turn of the plan is a ``plgpu.Barrier`` hand-off: a warpgroup waits on its own turn barrier before the
first wgmma of its turn and arrives on the other's after the last (ping-pong). ``attention(q, k, v)`` takes
``(B, S, H, D)`` as the Pallas ops do, pads S to whole blocks and masks the padded keys.
"""

from __future__ import annotations

from twill.codegen.pallas.render import (JNP_DTYPES, WG_ROWS, cannot_emit, constant_lines, knob_constants,
                                         pipeline_knobs, render_header, render_module)
from collections.abc import Mapping
from typing import Any

from twill.codegen.plan import KernelPlan
from twill.kernels.flash_fwd.plan import PROGRAM_ORDER

#: Streaming depth (K/V ring depth) ``twill emit pallas`` solves with when ``--streaming-depth`` is not given, by
#: head dim: the depth that ran fastest on the H200 against ``attention_mgpu`` (docs/codegen.md, "Pallas ring
#: depth"). Only head dim 128 was measured; the others keep the graph's default.
MEASURED_STREAMING_DEPTH = {128: 3}


def streaming_depth(attrs: Mapping[str, Any]) -> int | None:
    """The streaming depth to solve a graph with these attributes with for this body when none is asked for
    (:data:`MEASURED_STREAMING_DEPTH`, by ``head_dim``), or None for the graph's default."""
    return MEASURED_STREAMING_DEPTH.get(int(attrs.get("head_dim", 0)))

BODY = '''
LOG2E = math.log2(math.e)  # exp(x) = exp2(x * log2(e)): the softmax runs in base 2


def _kernel(q_ref, k_ref, v_ref, out_ref, qo_smem2, q_barriers, {turn_param}*, seq_len, qk_scale):
    """One CTA: BLOCK_M query rows of one (batch, head), COMPUTE_WGS warpgroups of WG_ROWS rows each."""
    batch, head = lax.axis_index("batch"), lax.axis_index("heads")
    wg = lax.axis_index("wg")
    q_base = lax.axis_index("q_seq") * BLOCK_M + wg * WG_ROWS
{turn_fns}
    def compute_thread(run_pipeline):
        qo_smem = qo_smem2.at[wg]
        m_i = jnp.full((WG_ROWS,), -jnp.inf, dtype=jnp.float32)
        l_i = jnp.full((WG_ROWS,), 0, dtype=jnp.float32)
        acc = jnp.full((WG_ROWS, HEAD_DIM), 0, dtype=jnp.float32)
        plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(q_base, WG_ROWS), head], qo_smem, q_barriers.at[wg])
        plgpu.barrier_wait(q_barriers.at[wg])
{first_turn}
{run_pipeline}        acc /= lax.broadcast_in_dim(l_i, (WG_ROWS, HEAD_DIM), [0])
        qo_smem[...] = acc.astype(DTYPE)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(qo_smem, out_ref.at[batch, pl.ds(q_base, WG_ROWS), head])
        plgpu.wait_smem_to_gmem(0)

{kv_step}    pipeline = plgpu.emit_pipeline_warp_specialized(
        kv_step,
        grid=(k_ref.shape[1] // BLOCK_N,),
        max_concurrent_steps=MAX_CONCURRENT_STEPS,
        num_compute_wgs=COMPUTE_WGS,
        memory_registers=MEMORY_REGISTERS,
        wg_axis="wg",
        manual_consumed_barriers=True,  # K and V buffers are released where the schedule releases them
        compute_context=compute_thread,
        in_specs=[
            plgpu.BlockSpec(block_shape=(BLOCK_N, HEAD_DIM), index_map=lambda i: (i, 0),
                            delay_release=DELAY_RELEASE),  # ring k: {load_k} -> {qk}
            plgpu.BlockSpec(block_shape=(BLOCK_N, HEAD_DIM), index_map=lambda i: (i, 0),
                            delay_release=DELAY_RELEASE),  # ring v: {load_v} -> {pv}
        ],
    )
{pipeline_call}

def _round_up(x, to):
    return -(-x // to) * to


@functools.partial(jax.jit, static_argnames=("sm_scale",))
def attention(q, k, v, sm_scale=None):
    """softmax(q k^T * sm_scale) v for q, k, v [B, S, H, D] ({dtype}, non-causal; sm_scale defaults to
    1/sqrt(D)); returns [B, S, H, D]."""
    batch, seq_len, heads, head_dim = q.shape
    if head_dim != HEAD_DIM or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of shape [B, S, H, {{HEAD_DIM}}], got {{q.shape}}")
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    q_len, kv_len = _round_up(seq_len, BLOCK_M), _round_up(seq_len, BLOCK_N)
    pad = lambda t, n: t if n == seq_len else jnp.pad(t, ((0, 0), (0, n - seq_len), (0, 0), (0, 0)))
    q, k, v = pad(q, q_len), pad(k, kv_len), pad(v, kv_len)
    call = plgpu.kernel(
        functools.partial(_kernel, seq_len=seq_len, qk_scale=sm_scale * LOG2E),
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(heads, q_len // BLOCK_M, batch),
        grid_names=("heads", "q_seq", "batch"),
        num_threads=COMPUTE_WGS + 1,  # compute warpgroups + the memory warpgroup
        thread_name="wg",
        scratch_types=(
            plgpu.SMEM((COMPUTE_WGS, WG_ROWS, HEAD_DIM), DTYPE),  # Q in, O out, per compute warpgroup
            plgpu.Barrier(num_barriers=COMPUTE_WGS),  # Q loaded, per compute warpgroup
{turn_scratch}        ),
        compiler_params=plgpu.CompilerParams(approx_math=True,
                                             lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    out = call(q, k, v)
    return out if q_len == seq_len else out[:, :seq_len]


launch = attention
'''

KV_STEP_SERIAL = '''
    def kv_step(idx, k_smem, v_smem, k_consumed, v_consumed, carry):
        """One key block: {qk} -> softmax -> {pv} (stage(pv) - stage(qk) = 0: in series)."""
        acc, m_i, l_i = carry
        qo_smem = qo_smem2.at[wg]
        # ready: the pipeline waited for this step's K and V buffers ({ready})

        def compute_qk(s_ref):
{qk_wait}            plgpu.wgmma(s_ref, qo_smem, k_smem.transpose((1, 0)))
{qk_pass}            # reading S retires the wgmma ({retire_qk})
            return s_ref[...]

        s = pl.run_scoped(compute_qk, plgpu.ACC((WG_ROWS, BLOCK_N), jnp.float32))
        plgpu.barrier_arrive(k_consumed)  # empty: K buffer released, its wgmma retired ({k_release})
{mask}        m_new = jnp.maximum(m_i, s.max(axis=1) * qk_scale)  # rowmax (m kept in scaled log2 units)
        alpha = jnp.exp2(m_i - m_new)  # alpha
        p = jnp.exp2(s * qk_scale - lax.broadcast_in_dim(m_new, s.shape, [0]))  # exp
        acc *= lax.broadcast_in_dim(alpha, acc.shape, [0])  # rescale
        l_i = l_i * alpha + p.sum(axis=1)  # rowsum
        p16 = p.astype(DTYPE)

        def compute_pv(o_ref):
{pv_wait}            plgpu.wgmma(o_ref, p16, v_smem)
{pv_pass}
        # run_state reads O back: the wgmma retired ({retire_pv})
        acc = pl.run_state(compute_pv)(plgpu.ACC.init(acc))
        plgpu.barrier_arrive(v_consumed)  # empty: V buffer released, its wgmma retired ({v_release})
        return acc, m_new, l_i

'''

MASK = """\
{ind}if seq_len % BLOCK_N:  # keys past seq_len (padding) are masked to -inf
{ind}    cols = plgpu.broadcasted_iota(jnp.int32, (WG_ROWS, BLOCK_N), 1, layout=plgpu.Layout.WGMMA)
{ind}    s = jnp.where(idx[0] * BLOCK_N + cols < seq_len, s, -jnp.inf)
"""

KV_STEP_AHEAD = '''
    def kv_step(idx, k_smem, v_smem, k_consumed, v_consumed, carry):
        """One key block j: S(j) = {qk} issued with O += P(j-1) V(j-1) ({pv}); the softmax of j runs while that
        PV is on the tensor core (stage(pv) - stage(qk) = 1)."""
        acc, m_i, l_i, p_prev = carry
        qo_smem = qo_smem2.at[wg]
        # ready: the pipeline waited for this step's K and V buffers ({ready})
        # V(j-1) stays in its buffer for this step (its release is below); step 0 adds P = 0 times V(0)
        prev = lax.rem(lax.max(idx[0] - 1, 0), v_ring.shape[0])

        def issue(s_ref, o_ref):
            o_ref[...] = acc
{qk_wait}            plgpu.wgmma(s_ref, qo_smem, k_smem.transpose((1, 0)))
{qk_pass}{pv_wait}            plgpu.wgmma(o_ref, p_prev, v_ring.at[prev])
{pv_pass}            # S(j) retired, O += P(j-1) V(j-1) may still run ({retire_qk})
            s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
            plgpu.barrier_arrive(k_consumed)  # empty: K buffer released, its wgmma retired ({k_release})
{mask}            m_new = jnp.maximum(m_i, s.max(axis=1) * qk_scale)  # rowmax (m kept in scaled log2 units)
            alpha = jnp.exp2(m_i - m_new)  # alpha
            p = jnp.exp2(s * qk_scale - lax.broadcast_in_dim(m_new, s.shape, [0]))  # exp
            l_new = l_i * alpha + p.sum(axis=1)  # rowsum
            # reading O waits for O += P(j-1) V(j-1) ({retire_pv})
            return o_ref[...], p.astype(DTYPE), m_new, l_new, alpha

        o, p16, m_new, l_new, alpha = pl.run_scoped(issue, plgpu.ACC((WG_ROWS, BLOCK_N), jnp.float32),
                                                    plgpu.ACC((WG_ROWS, HEAD_DIM), jnp.float32))
        # empty: V(j-1)'s buffer released, its wgmma retired ({v_release}, one step after it was read)
        pl.when(idx[0] > 0)(lambda: plgpu.barrier_arrive(v_consumed_ring.at[prev]))
        o *= lax.broadcast_in_dim(alpha, o.shape, [0])  # rescale
        return o, m_new, l_new, p16

'''

RUN_SERIAL = '''        acc, m_i, l_i = run_pipeline((acc, m_i, l_i))
'''

RUN_AHEAD = '''        p_prev = jnp.full((WG_ROWS, BLOCK_N), 0, dtype=DTYPE)
        acc, m_i, l_i, p_last = run_pipeline((acc, m_i, l_i, p_prev))
        # the last key block's O += P V, issued after the loop, and the release of its V buffer
        last = lax.rem(k_ref.shape[1] // BLOCK_N - 1, v_ring.shape[0])

        def final_pv(o_ref):
            plgpu.wgmma(o_ref, p_last, v_ring.at[last])

        acc = pl.run_state(final_pv)(plgpu.ACC.init(acc))
        plgpu.barrier_arrive(v_consumed_ring.at[last])
'''

CALL_SERIAL = '''    pipeline(k_ref.at[batch, :, head, :], v_ref.at[batch, :, head, :])
'''

CALL_AHEAD = '''    k_in, v_in = k_ref.at[batch, :, head, :], v_ref.at[batch, :, head, :]

    def with_rings(allocations):
        """The V ring and its consumed barriers by name: step j reads and releases V(j-1)'s buffer."""
        nonlocal v_ring, v_consumed_ring
        v_ring = allocations["flat_in_smem_refs"][1]
        v_consumed_ring = allocations["flat_consumed_barrier_refs"][1]
        pipeline(k_in, v_in, allocations=allocations)

    v_ring = v_consumed_ring = None
    pl.run_scoped(with_rings, pipeline.get_allocations(k_in, v_in), collective_axes="wg")
'''

TURN_FNS = '''
    def _take_turn():
        """turn: wait until the other compute warpgroup hands over the tensor core."""
        plgpu.barrier_wait(turn.at[wg])

    def _pass_turn():
        """turn: hand the tensor core to the other compute warpgroup."""
        plgpu.barrier_arrive(turn.at[1 - wg])

    def _first_turn():
        """turn: give this warpgroup the first turn."""
        plgpu.barrier_arrive(turn.at[wg])
'''


def _turn_lines(plan: KernelPlan, role: str, indent: str) -> tuple[str, str]:
    """The turn wait before ``role``'s wgmma and the pass after it, for the partitions whose turn starts or
    ends there (unconditional when every partition does, under ``pl.when(wg == i)`` when one does)."""
    comp = plan.compute
    out = []
    for what, fn, holds in (("wait", "_take_turn", lambda p: p.roles[role] in p.turn_waits),
                            ("pass", "_pass_turn", lambda p: p.roles[role] in p.turn_passes)):
        who = [i for i, p in enumerate(comp) if plan.turns and holds(p)]
        if not who:
            out.append("")
            continue
        ops = " | ".join(p.roles[role] for p in comp)
        why = " | ".join(w.why for w in plan.waits if w.kind == "turn" and w.op in {comp[i].roles[role] for i in who})
        note = f"{indent}# turn {what} ({ops}){': ' + why if what == 'wait' else ''}\n"
        call = f"{fn}()" if len(who) == len(comp) else f"pl.when(wg == {who[0]})({fn})"
        out.append(f"{note}{indent}{call}\n")
    return out[0], out[1]


def _kv_step(plan: KernelPlan, ahead: int) -> str:
    """The pipeline body: in series (``ahead`` 0) or S(j) issued with P(j-1) V(j-1) (``ahead`` 1)."""
    comp = plan.compute
    rings = {r.name: r for r in plan.rings}
    ind = " " * 12
    qk_wait, qk_pass = _turn_lines(plan, "qk", ind)
    pv_wait, pv_pass = _turn_lines(plan, "pv", ind)
    ops = {role: " | ".join(p.roles[role] for p in comp) for role in PROGRAM_ORDER}
    template = KV_STEP_AHEAD if ahead else KV_STEP_SERIAL
    return template.format(
        qk_wait=qk_wait, qk_pass=qk_pass, pv_wait=pv_wait, pv_pass=pv_pass, qk=ops["qk"], pv=ops["pv"],
        mask=MASK.format(ind=ind if ahead else " " * 8),
        ready=" | ".join(w.why for w in plan.waits if w.kind == "ready"),
        retire_qk=" | ".join(plan.retire(p.roles["qk"]).why for p in comp),
        retire_pv=" | ".join(plan.retire(p.roles["pv"]).why for p in comp),
        k_release=" | ".join(rings["k"].consumers), v_release=" | ".join(rings["v"].consumers))


def emit(plan: KernelPlan) -> str:
    """The Pallas attention-forward module for ``plan``."""
    comp = plan.compute
    aheads = set(plan.decisions.qk_ahead)
    if len(aheads) > 1:
        raise cannot_emit("compute partitions with different stage(pv) - stage(qk)",
                          "backend: every compute warpgroup runs one pipeline body")
    ahead = aheads.pop()
    if len(comp) > 2:
        raise cannot_emit(f"{len(comp)} compute partitions", "backend: turn hand-offs between two warpgroups")
    if plan.turns and any(p.num_warps != 4 for p in comp):
        raise cannot_emit("ping-pong between compute partitions of more than one warpgroup",
                          "turn barriers are per warpgroup")
    release = ("K and V buffers are released by hand (manual consumed barriers) once the wgmma reading them "
               "retired: K in its step" + (", V one step later (stage(pv) - stage(qk) = 1)" if ahead else
                                           ", V in its step"))
    knobs = pipeline_knobs(plan, 0, release)
    t = plan.tile
    items = [("BLOCK_M", t["block_m"], "query rows per CTA (all compute warpgroups)"),
             ("BLOCK_N", t["block_n"], "keys per pipeline step"),
             ("HEAD_DIM", t["head_dim"], "head dimension"),
             ("WG_ROWS", WG_ROWS, "query rows per compute warpgroup (one m64 wgmma row block)"),
             *knob_constants(plan, knobs)]
    constants = f"DTYPE = jnp.{JNP_DTYPES[plan.dtype]}  # operand dtype\n" + constant_lines(items)
    first = ""
    if plan.turns:
        first = (f"        # turn: the first turn of the steady state is compute partition {plan.turns[0].partition}'s"
                 f" ({', '.join(plan.turns[0].ops)})\n"
                 f"        pl.when(wg == {plan.turns[0].partition})(_first_turn)")
    turn_scratch = ("            plgpu.Barrier(num_arrivals=1, num_barriers=COMPUTE_WGS),  # tensor-core turn, "
                    "per warpgroup\n")
    body = BODY.format(first_turn=first, turn_fns=TURN_FNS if plan.turns else "", dtype=plan.dtype,
                       turn_param="turn, " if plan.turns else "", turn_scratch=turn_scratch if plan.turns else "",
                       run_pipeline=RUN_AHEAD if ahead else RUN_SERIAL, kv_step=_kv_step(plan, ahead),
                       pipeline_call=CALL_AHEAD if ahead else CALL_SERIAL,
                       load_k=plan.rings[0].producer, load_v=plan.rings[1].producer,
                       qk=" | ".join(p.roles["qk"] for p in comp), pv=" | ".join(p.roles["pv"] for p in comp))
    turns = (f"{len(plan.turns)} tensor-core turns per iteration ("
             + "; ".join(f"compute{t.partition}: {', '.join(t.ops)}" for t in plan.turns)
             + ") -> plgpu.Barrier hand-offs") if plan.turns else "one compute partition: no turns"
    overlap = ("stage(pv) - stage(qk) = 1 -> S(j) issued with O += P(j-1) V(j-1), S read with "
               "wgmma_accumulator_load(wait_n=1), the softmax of j overlaps that PV, V(j-1) released in step j"
               if ahead else "stage(pv) - stage(qk) = 0 -> S, softmax, PV in series in the pipeline body")
    decisions = [f"decisions: {overlap}",
                 f"           ring depth {knobs.max_concurrent_steps} -> max_concurrent_steps; {turns}",
                 f"           {len(comp)} compute partition(s) of {comp[0].num_warps} warps -> "
                 f"{knobs.compute_wgs} compute warpgroups of {WG_ROWS} rows"]
    header = render_header(plan, "Warp-specialized attention forward for Hopper, JAX Pallas Mosaic GPU.",
                           decisions)
    return render_module(header, "Generated Pallas attention forward; see the header comment. "
                                 "attention(q, k, v) with (B, S, H, D) layout.",
                         constants, body, extra_imports="import math\n")
