"""Gluon attention backward on the CPU: flash-bwd schedules -> emitted kernels -> sm_90 cubins (Triton 3.6).

Each variant is a different valid schedule of the ``flash-bwd`` loop graph (verified with
twill.schedule.verify): ring depths and the dQ staging depth come from the schedule and must show up in the
emitted constants, the shared memory the kernel reserves and its PTX (wgmma shapes, wait depths,
setmaxnreg budgets, TMA copies, the producer's dQ TMA reduce-add).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from solved import solved_kernel

from twill.kernels.flash_bwd.variants import flash_bwd_schedule
from twill.schedule.document import schedule_document
from twill.codegen.gluon import emit_gluon, gluon_plan, load_emitted
from twill.errors import UnsupportedFeatureError, VerificationError
from twill.kernels import build_kernel
from twill.machine.models import H100
from twill.schedule.verify import verify

triton = pytest.importorskip("triton")
aot = pytest.importorskip("twill.codegen.gluon.aot")
HAS_ORTOOLS = importlib.util.find_spec("ortools") is not None


def _schedule(depth: int = 2, dq_lag: int = 1, late: tuple[str, ...] = (), **options):
    sched = flash_bwd_schedule(build_kernel("flash-bwd", H100, **options), H100, depth=depth, dq_lag=dq_lag,
                               late=late)
    verify(sched, H100)
    return sched


def _compile(tmp_path, sched, name: str):
    path = tmp_path / f"{name}.py"
    source = emit_gluon(sched)
    path.write_text(source)
    module = load_emitted(str(path), f"twill_test_bwd_{name}")
    _check_host_globals(module)
    compiled = aot.compile_sm90(module)
    return module, source, aot.ptx_facts(compiled), compiled.asm["ptx"]


def _check_host_globals(module) -> None:
    """Every global the host functions read exists (they only run on a GPU)."""
    import builtins
    import dis

    for fn in (module.launch, module.preprocess, module._preprocess, module._fp32_buffers, module.padded_len,
               module.compile_signature):
        names = {i.argval for i in dis.get_instructions(fn) if i.opname == "LOAD_GLOBAL"}
        missing = [n for n in names if n not in vars(module) and not hasattr(builtins, n)]
        assert not missing, f"{fn.__name__} reads undefined globals {missing}"


def _write(tmp_path, sched, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(emit_gluon(sched))
    return path


def _smem_need(head_dim: int, depth: int, dq_depth: int) -> int:
    """K, V resident; Q, dO rings; the stats ring ([2, 64] fp32); dS; the fp32 dQ staging buffers."""
    return (2 * 128 * head_dim * 2 + depth * (2 * 64 * head_dim * 2 + 2 * 64 * 4) + 128 * 64 * 2
            + dq_depth * 64 * head_dim * 4)


CASES = [  # (head_dim, ring depth, dq lag)
    (128, 2, 1),
    (64, 3, 2),
    (64, 2, 0),
]


@pytest.mark.parametrize("head_dim,depth,lag", CASES)
def test_backward_variant_compiles_with_the_scheduled_rings(tmp_path, head_dim, depth, lag):
    sched = _schedule(depth, lag, head_dim=head_dim)
    plan = gluon_plan(sched)
    assert [r.depth for r in plan.rings] == [depth] * 3
    assert plan.decisions.dq_depth == lag + 1 == sched.stage("dq_atomic") - sched.stage("dq_store") + 1
    module, source, facts, ptx = _compile(tmp_path, sched, f"d{head_dim}_{depth}_{lag}")
    assert module.Q_DEPTH.value == module.DO_DEPTH.value == module.STATS_DEPTH.value == depth
    assert module.DQ_DEPTH.value == lag + 1
    # S^T, dP^T (and dQ's two N halves at D=128): N = 64 per warp group; dV, dK: N = head dim
    assert set(facts.wgmma_shapes) == {"m64n64k16", f"m64n{head_dim}k16", f"m64n{head_dim // 2}k16"}
    # per iteration: S^T and dP^T (K = head dim), dV and dK (K = 64 queries), dQ (K = 128 keys), k16 each
    assert facts.wgmma == 2 * head_dim // 16 + 2 * 64 // 16 + 128 // 16
    waits = {int(n) for n in re.findall(r"warpgroup_mma_wait\((\d+)", source)}
    assert set(facts.wait_depths) == waits                 # the retire depths the schedule's order asks for
    assert ("dec", 24) in facts.setmaxnreg and ("inc", 240) in facts.setmaxnreg
    assert facts.tma_loads >= 5                            # K, V once; Q, dO, stats per iteration
    assert facts.tma_load_ranks == (2, 4)                  # Q, K, V, dO [B, H, S, D] (their strides); stats
    # dq_atomic: one TMA reduce-add of the staged fp32 tile (no per-element atomics), the buffer released
    # once the TMA read it; the compute group's stores fenced for the async proxy before dq_ready
    assert re.search(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add", ptx)
    assert not re.search(r"\b(atom|red)\.global", ptx)
    assert "cp.async.bulk.wait_group.read" in ptx and source.count("fence_async_shared()") == 2
    assert "def dq_reduce(" in source
    need = _smem_need(head_dim, depth, lag + 1)
    assert need <= facts.shared < need + 4096


@pytest.mark.parametrize("options", [{}, {"causal": True, "kv_heads": 2, "dtype": "bf16"}],
                         ids=["d256", "d256_causal_gqa_bf16"])
def test_head_dim_256_backward_splits_queries_and_reduces_dq_in_chunks(tmp_path, options):
    """D = 256: 64-key blocks, warps [4, 2] (the warp groups split S^T's queries and dK's, dV's head
    dimension), P^T and dS^T in shared memory as the A operands of dV and dK, dQ in four 64-column wgmmas whose
    chunks the compute warps stage in one buffer and reduce-add by TMA themselves (the producer only loads)."""
    sched = _schedule(head_dim=256, **options)
    assert sched.graph.attrs["block_n"] == 64 and sched.graph.attrs["dq_chunk"] == 64
    assert not [op for op in sched.graph.ops if op.attrs.get("role") == "dq_atomic"]
    plan = gluon_plan(sched)
    assert plan.decisions.split and (plan.decisions.dq_chunk, plan.decisions.dq_depth) == (64, 1)
    assert "dq_store" in plan.compute[0].ops and plan.load.ops == ("load_q", "load_do", "load_stats")
    module, source, facts, ptx = _compile(tmp_path, sched, "d256_" + "_".join(map(str, options.values())))
    assert (module.BLOCK_M.value, module.BLOCK_N.value, module.HEAD_DIM.value) == (64, 64, 256)
    assert (module.DQ_CHUNK.value, module.DQ_SLOTS.value) == (64, 1) and not hasattr(module, "DQ_LAG")
    assert "def dq_reduce(" not in source and "DQ_DEPTH" not in source   # the producer's reduce: not emitted
    assert source.count("warps_per_cta=[4, 2]") == 3 and "op_layout" not in source   # S^T, dK/dV, dQ
    assert "dv_tok = warpgroup_mma(p_smem, " in source and "dk_tok = warpgroup_mma(ds_smem, " in source
    # S^T, dP^T: N = 32 queries per warp group; dV, dK: N = 128 head dims; dQ chunks: N = 32
    assert set(facts.wgmma_shapes) == {"m64n32k16", "m64n128k16"}
    # per iteration: S^T, dP^T (K = 256), dV, dK (K = 64 queries), four dQ chunks (K = 64 keys), k16 each
    assert facts.wgmma == 2 * 256 // 16 + 2 * 64 // 16 + 4 * 64 // 16
    assert facts.tma_load_ranks == (2, 4)
    # the compute partition's TMA reduce-adds, each 64-column chunk as two 32-column boxes (128-byte swizzle)
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add", ptx)) == 4
    assert not re.search(r"\b(atom|red)\.global", ptx)
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)) >= 5   # before each chunk; drain
    # K, V 64 KB; Q, dO rings 2 x 32 KB each; stats; P^T, dS^T 8 KB each; one 16 KB dQ chunk buffer
    need = 2 * 64 * 256 * 2 + 2 * (2 * 64 * 256 * 2 + 2 * 64 * 4) + 2 * 64 * 64 * 2 + 64 * 64 * 4
    assert need <= facts.shared < need + 4096 and facts.shared <= H100.smem_per_block
    spills = re.findall(r"(\d+) bytes spill", ptx)
    assert not any(int(n) for n in spills)


@pytest.mark.parametrize("S", [77, 129, 513, 1537, 64, 1000])
def test_backward_tma_coordinates_are_16_byte_aligned_for_every_length(tmp_path, S):
    """TMA needs 16-byte global strides and a 16-byte aligned innermost coordinate. The stats rows are read
    with the query block along the innermost dimension, so the launcher pads each head's rows to S_pad (a
    multiple of BLOCK_M): every block the kernel addresses (head * S_pad + m_start) starts aligned, also
    for S % 4 != 0, and stays inside its own head's rows."""
    module = load_emitted(str(_write(tmp_path, _schedule(), f"pad{S}")), f"twill_test_bwd_pad{S}")
    B, H, block = 2, 3, module.BLOCK_M.value
    s_pad = module.padded_len(S)
    stats, dq_acc = module._fp32_buffers(B * H * s_pad, "cpu")
    shapes = {"stats": tuple(stats.shape), "dq_acc": tuple(dq_acc.shape)}
    assert S <= s_pad < S + block and s_pad % block == 0
    assert shapes == {"stats": (2, B * H * s_pad), "dq_acc": (B * H * s_pad, module.HEAD_DIM.value)}
    fp32, fp16 = 4, 2
    assert shapes["stats"][1] * fp32 % 16 == 0 and shapes["dq_acc"][1] * fp32 % 16 == 0
    assert module.HEAD_DIM.value * fp16 % 16 == 0                 # Q, K, V, dO rows
    starts = [head * s_pad + m for head in range(B * H) for m in range(0, S, block)]
    assert all(start * fp32 % 16 == 0 for start in starts)
    assert all(start + block <= (start // s_pad + 1) * s_pad for start in starts)


def test_backward_variants_emit_different_kernels():
    sources = {(d, lag): emit_gluon(_schedule(d, lag, head_dim=64)) for d, lag in ((2, 1), (3, 1), (3, 2))}
    assert len(set(sources.values())) == 3
    assert "if j >= DQ_LAG:" in sources[(3, 2)]
    assert re.search(r"^DQ_DEPTH\s*= gl.constexpr\(3\)", sources[(3, 2)], re.M)
    assert re.search(r"^Q_DEPTH\s*= gl.constexpr\(3\)", sources[(3, 1)], re.M)


@pytest.mark.parametrize("options", [{"causal": True}, {"kv_heads": 4}, {"dtype": "bf16"},
                                     {"head_dim": 64, "causal": True, "kv_heads": 2, "dtype": "bf16"}],
                         ids=["causal", "gqa", "bf16", "d64_causal_gqa_bf16"])
def test_backward_causal_gqa_bf16_compile(tmp_path, options):
    sched = _schedule(**options)
    plan = gluon_plan(sched)
    assert (plan.decisions.causal, plan.decisions.kv_heads) == (bool(options.get("causal")), options.get("kv_heads", 0))
    name = "_".join(f"{k}{v}" for k, v in options.items())
    module, source, facts, _ = _compile(tmp_path, sched, name)
    assert facts.wgmma_shapes and facts.tma_loads >= 5 and facts.tma_load_ranks == (2, 4)
    if options.get("causal"):
        assert "n_pos = n_start - (seq_k - seq_q)" in source and "m_first = gl.maximum(n_pos, 0) // BLOCK_M" in source
        assert "keys[:, None] <= queries[None, :]" in source   # keys on the query axis: bottom-right aligned
    if options.get("kv_heads"):
        assert module.KV_HEADS.value == options["kv_heads"]
    assert module.DTYPE.value == (triton.language.bfloat16 if options.get("dtype") == "bf16"
                                  else triton.language.float16)


def _strides(name: str) -> dict[str, str]:
    return {f"{name}_stride_{d}": "i32" for d in "bhs"}


#: The signatures (fp16) of the backward's dO.O pre-pass and dQ conversion.
HELPER_SIGNATURES = (
    {"o_ptr": "*fp16", **_strides("o"), "do_ptr": "*fp16", **_strides("do"), "delta_ptr": "*fp32", "lse_ptr": "*fp32",
     **_strides("lse"), "lse_out_ptr": "*fp32", "dq_acc_ptr": "*fp32", "seq_q": "i32", "s_pad": "i32"},
    {"acc_ptr": "*fp32", "dq_ptr": "*fp16", **_strides("dq"), "seq_q": "i32", "s_pad": "i32", "sm_scale": "fp32"},
)


def test_backward_helper_kernels_compile(tmp_path):
    """The dO.O pre-pass (with the LSE rows copied into the stats buffer and the dQ accumulator zeroed, as the
    launcher runs it, and without either, as ``preprocess`` does) and the dQ conversion compile for sm_90 too
    (they run on every launch); they read and write through the tensors' strides (kernel arguments), so the LSE
    copy adds a second store and the zeroing a third."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    module = load_emitted(str(_write(tmp_path, _schedule(head_dim=64), "helpers")), "twill_test_bwd_helpers")
    pre, conv = HELPER_SIGNATURES
    stores = {}
    for name, fn, sig, fixed in (
            ("zero", module.preprocess_kernel, pre, {}),
            ("lse", module.preprocess_kernel, pre, {"dq_acc_ptr": None}),
            ("plain", module.preprocess_kernel, pre, {"lse_ptr": None, "lse_out_ptr": None, "dq_acc_ptr": None}),
            ("dq", module.dq_convert_kernel, conv, {})):
        sig = {k: "constexpr" if k in fixed else v for k, v in sig.items()}
        compiled = triton.compile(GluonASTSource(fn, sig, constexprs=fixed), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4})
        stores[name] = len(re.findall(r"st\.global", compiled.asm["ptx"]))
        assert stores[name] > 0
    assert stores["zero"] > stores["lse"] > stores["plain"]


def test_backward_helper_kernels_take_fewer_rows_at_head_dim_256(tmp_path):
    """The pre-pass holds O and dO of its rows in fp32 registers: 64 rows of 256 would spill (128 registers per
    thread each), so at head dim 256 a program takes 32 rows; both helpers compile without spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from twill.tune.spills import ptxas_report

    assert re.search(r"^PRE_ROWS\s+= gl.constexpr\(64\)", _write(tmp_path, _schedule(), "d128").read_text(), re.M)
    module = load_emitted(str(_write(tmp_path, _schedule(head_dim=256), "h256")), "twill_test_bwd_helpers256")
    assert module.PRE_ROWS.value == 32
    for fn, sig in zip((module.preprocess_kernel, module.dq_convert_kernel), HELPER_SIGNATURES):
        compiled = triton.compile(GluonASTSource(fn, sig), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        assert ptxas_report(compiled.asm["ptx"], 90)["spill_bytes"] == 0, fn.__name__


@pytest.mark.parametrize("head_dim,dtype,causal,kv_heads", [(128, "fp16", False, 0), (64, "bf16", True, 2),
                                                           (256, "bf16", True, 0)])
def test_varlen_backward_reads_each_sequence_where_it_lies(tmp_path, head_dim, dtype, causal, kv_heads,
                                                           refuses_bad_offsets):
    """The varlen backward of the op's shipped schedules (a code-generator attribute: the same loop and
    schedule; the D = 64 one in two stages, FA3's 128 query rows): the kernel takes the sequences' offsets and
    padded stats offsets instead of lengths, loads Q/dO and K/V at the sequence's rows of the packed
    [1, heads, total, D] views, leaves a key block past its sequence at once, stores dK and dV at the sequence's
    rows, and it and its pre-pass and dQ conversion (packed forms) compile without spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from twill.ops import shipped
    from twill.ops.spec import KernelSpec
    from twill.tune.spills import ptxas_report

    spec = KernelSpec("flash-bwd", head_dim, dtype, causal, kv_heads, varlen=True)
    sched, _ = shipped.load(spec, shipped.spec_graph(spec))
    options = {"head_dim": head_dim, "dtype": dtype, "causal": causal, "kv_heads": kv_heads}
    plan = gluon_plan(sched)
    assert plan.decisions.varlen and sched.graph.attrs["varlen"] is True
    name = "varlen_" + "_".join(f"{k}{v}" for k, v in options.items())
    path = _write(tmp_path, sched, name)
    source = path.read_text()
    module = load_emitted(str(path), f"twill_test_bwd_{name}")
    signature = module.compile_signature()[0]
    assert {"cu_seqlens_q", "cu_seqlens_k", "pad_cu", "total_pad"} <= set(signature)
    assert "seq_q" not in signature and "heads_per_chunk" not in signature
    assert "if (n_start >= seq_k) | (seq_q == 0):" in source
    assert "[0, h, q_base + m_start, 0]" in source and "kv_block = [0, kv_h, k_base + n_start, 0]" in source
    assert "dk_offs = kv_h * dk_stride_h + (k_base + keys + shift) * dk_stride_s" in source
    assert "def preprocess(" not in source and "def launch(q, k, v, o, do, lse, cu_seqlens_q, cu_seqlens_k," in source
    torch = pytest.importorskip("torch")
    element = torch.bfloat16 if dtype == "bf16" else torch.float16
    q = torch.zeros(8, 4, head_dim, dtype=element)
    kv = torch.zeros(8, kv_heads or 4, head_dim, dtype=element)
    refuses_bad_offsets(module.launch, (q, kv, kv, q, q, torch.zeros(4, 8)))
    compiled = aot.compile_sm90(module)
    report = ptxas_report(compiled.asm["ptx"], 90)
    assert report["spill_bytes"] == 0 and report["serialized_wgmma"] == 0
    assert aot.ptx_facts(compiled).tma_load_ranks == (2, 4)
    pre = {"o_ptr": "*fp16", "o_stride_s": "i32", "o_stride_h": "i32", "do_ptr": "*fp16", "do_stride_s": "i32",
           "do_stride_h": "i32", "delta_ptr": "*fp32", "lse_ptr": "*fp32", "lse_out_ptr": "*fp32",
           "dq_acc_ptr": "*fp32", "cu_seqlens_q": "*i32", "pad_cu": "*i32", "total_q": "i32", "total_pad": "i32"}
    conv = {"acc_ptr": "*fp32", "dq_ptr": "*fp16", "dq_stride_s": "i32", "dq_stride_h": "i32", "cu_seqlens_q": "*i32",
            "pad_cu": "*i32", "total_pad": "i32", "sm_scale": "fp32"}
    for fn, sig in ((module.preprocess_varlen_kernel, pre), (module.dq_convert_varlen_kernel, conv)):
        helper = triton.compile(GluonASTSource(fn, sig), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        assert ptxas_report(helper.asm["ptx"], 90)["spill_bytes"] == 0, fn.__name__
    dense = KernelSpec("flash-bwd", head_dim, dtype, causal, kv_heads)
    assert emit_gluon(shipped.load(dense, shipped.spec_graph(dense))[0]) != source


def _two_stage(sched, ops):
    """``sched`` with ``ops`` (and the producer's dq_atomic) one II later: the next stage."""
    starts = dict(sched.starts)
    for op in (*ops, "dq_atomic"):
        starts[op] += sched.ii
    return replace(sched, starts=starts)


def test_backward_two_stage_schedule_compiles_with_prologue_and_epilogue(tmp_path):
    """P's conversion, dV and the dQ store one stage later (as the joint solver places them at head dim
    64): the loop runs stage 0 of iteration j with stage 1 of j - 1, after a prologue and before an epilogue."""
    sched = _schedule(late=("p_cvt", "dv", "dq_store"), head_dim=64)
    plan = gluon_plan(sched)
    assert plan.decisions.dq_depth == 2 and plan.decisions.dq_lag == 2
    assert sched.steady_state_order().index("p_cvt") < sched.steady_state_order().index("exp")
    module, source, facts, _ = _compile(tmp_path, sched, "two_stage")
    assert "for j in range(1, n_iters):" in source and "il = n_iters - 1" in source
    assert "dv_tok = warpgroup_mma(p16, do_ring.index(jp % DO_DEPTH), dv, is_async=True)" in source
    assert "mbarrier.arrive(do_empty.index(jp % DO_DEPTH))" in source    # dO released after dV of j - 1
    single = aot.ptx_facts(aot.compile_sm90(load_emitted(str(_write(tmp_path, _schedule(head_dim=64), "one")),
                                                         "twill_test_bwd_one_stage")))
    assert facts.wgmma == 2 * single.wgmma                 # loop body + prologue (stage 0) + epilogue (stage 1)


@pytest.mark.slow
def test_backward_register_model_agrees_with_ptxas(tmp_path):
    """Why the solver keeps every head-dim-128 compute op in one stage: with P's conversion, dV and the dQ
    store one stage later (the joint solver's head-dim-64 form) the model counts 224 registers per thread
    against 240 - 24, and ptxas, given the 240-register budget, spills that kernel. The one-stage form at
    128 and the two-stage form at 64 fit both. The register model does not over-count here."""
    from twill.tune.spills import ptxas_report

    late = ("p_cvt", "dv", "dq_store")
    over = flash_bwd_schedule(build_kernel("flash-bwd", H100, head_dim=128), H100, late=late)
    with pytest.raises(VerificationError, match="REGISTER LIMIT: group 0 holds 224 registers per thread"):
        verify(over, H100)
    fits = [_schedule(head_dim=128), _schedule(late=late, head_dim=64)]
    spills = [ptxas_report(_compile(tmp_path, sched, f"regs{k}")[3], 90)["spill_bytes"]
              for k, sched in enumerate([over, *fits])]
    assert spills[0] > 0 and spills[1:] == [0, 0]


@pytest.mark.slow
def test_fa3_head_dim_64_tile_is_over_the_register_model_but_fits_ptxas(tmp_path):
    """FA3's head-dim-64 backward tile (128 query rows per iteration, dQ = dS K on warps [8, 1]): the model
    counts 224 registers per thread at dS (P, dP, dS, dK, dV), as it does for the head-dim-128 kernel above
    that spills, yet ptxas fits this one in 240 without spilling. 224 is where the register rule cannot tell
    the two apart, so ``benchmarks/flash_bwd_check.py`` admits this hand-built variant on ptxas's report, not
    on the model's (docs/performance.md)."""
    from twill.tune.spills import ptxas_report

    sched = flash_bwd_schedule(build_kernel("flash-bwd", H100, head_dim=64, block_m=128), H100)
    with pytest.raises(VerificationError, match="REGISTER LIMIT: group 0 holds 224 registers per thread"):
        verify(sched, H100)
    module, source, facts, ptx = _compile(tmp_path, sched, "bm128")
    assert module.BLOCK_M.value == 128
    assert "dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1]," in source
    assert "warps_per_cta=[4, 2]" not in source
    # S^T, dP^T: [128 keys, 128 queries] (N = 128 per warp group); dV, dK, dQ: N = head dim 64
    assert set(facts.wgmma_shapes) == {"m64n128k16", "m64n64k16"}
    # per iteration: S^T and dP^T (K = 64), dV and dK (K = 128 queries), dQ (K = 128 keys), k16 each
    assert facts.wgmma == 2 * 64 // 16 + 2 * 128 // 16 + 128 // 16
    assert ptxas_report(ptx, 90)["spill_bytes"] == 0
    need = 2 * 128 * 64 * 2 + 2 * (2 * 128 * 64 * 2 + 2 * 128 * 4) + 128 * 128 * 2 + 2 * 128 * 64 * 4
    assert need <= facts.shared < need + 4096


def test_backward_value_needing_two_register_copies_cannot_be_emitted():
    """exp one stage before p_cvt, but p_cvt after exp in the loop body: P of j - 1 would be overwritten."""
    sched = _schedule(head_dim=64)
    assert sched.starts["p_cvt"] > sched.starts["exp"]
    with pytest.raises(UnsupportedFeatureError, match="two register copies"):
        gluon_plan(_two_stage(sched, ("p_cvt", "dv", "dq_store", "dq", "ds_store")))


def test_backward_compute_ops_in_three_stages_cannot_be_emitted():
    sched = _two_stage(_schedule(), ("dq_store",))
    starts = dict(sched.starts)
    starts["dq_store"] += sched.ii
    starts["dq_atomic"] += sched.ii
    with pytest.raises(UnsupportedFeatureError, match="over 3 stages"):
        gluon_plan(replace(sched, starts=starts))


def test_backward_shared_memory_overflow_cannot_be_emitted():
    """Three ring buffers at D=128 exceed shared memory (the verifier rejects the schedule too; the plan
    checks the renderer's own buffers)."""
    sched = flash_bwd_schedule(build_kernel("flash-bwd", H100), H100, depth=3, dq_lag=1)
    with pytest.raises(UnsupportedFeatureError, match="shared memory"):
        gluon_plan(sched)


def test_backward_buffers_that_exactly_fill_shared_memory_are_refused_with_their_barriers():
    """128-row tiles at head dim 64 with 3-deep rings: the buffers alone are exactly the H200's 232 448 bytes
    per block, and their 23 mbarriers put the kernel over it (Triton asked for 233 004 at launch, on the H200);
    the plan refuses it rather than emit a kernel that cannot launch. With 2-deep rings it fits."""
    from twill.machine.models import H200

    graph = build_kernel("flash-bwd", H200, head_dim=64, block_m=128)
    with pytest.raises(UnsupportedFeatureError, match="needs 233472 bytes of shared memory, more than the 232448"):
        gluon_plan(flash_bwd_schedule(graph, H200, depth=3, dq_lag=1))
    assert gluon_plan(flash_bwd_schedule(graph, H200, depth=2, dq_lag=1)).decisions.dq_depth == 2


@pytest.mark.skipif(not HAS_ORTOOLS, reason="the B200 schedule comes from the joint solver")
def test_emit_backward_for_blackwell_is_refused(tmp_path):
    """The session's shared B200 solve (tests/solved.py), written as ``twill schedule -o`` writes it: emitting
    it is refused in one line (a subprocess solving it again would take ~20 s)."""
    path = tmp_path / "bwd_b200.json"
    path.write_text(json.dumps(schedule_document(solved_kernel("flash-bwd", "b200"))))
    out = subprocess.run([sys.executable, "-m", "twill.cli", "emit", "gluon", "--schedule", str(path), "-o", "-"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("twill: error: cannot generate: arch 'b200'") and "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ORTOOLS, reason="the joint solver needs ortools")
def test_emit_backward_from_the_solver(tmp_path, capsys):
    """In-process (``twill emit gluon`` runs as a real subprocess in test_emit_backward_for_blackwell_is_refused)."""
    from twill.cli import main

    path = tmp_path / "bwd.py"
    code = main(["emit", "gluon", "flash-bwd", "--arch", "h200", "--causal", "--kv-heads", "4", "-o", str(path)])
    assert code == 0, capsys.readouterr().err
    module = load_emitted(str(path), "twill_test_bwd_cli")
    facts = aot.ptx_facts(aot.compile_sm90(module))
    assert module.KV_HEADS.value == 4 and "cpsat" in path.read_text().splitlines()[3]
    assert "m64n128k16" in facts.wgmma_shapes


def _causal_order(blocks: int, heads: int, per_chunk: int) -> list[tuple[int, int]]:
    """(key block, batch x K/V head) of every CTA of a (blocks, heads) grid in launch order, from the causal
    backward's own lines (``CAUSAL_ORDER``) run as Python (``BLOCK_N`` = 1: ``n_start`` is the key block)."""
    import types

    from twill.kernels.flash_bwd.gluon import CAUSAL_ORDER

    code = "\n".join(line[4:] for line in CAUSAL_ORDER)
    order = []
    for pid1 in range(heads):
        for pid0 in range(blocks):
            env = {"gl": types.SimpleNamespace(num_programs=(blocks, heads).__getitem__, minimum=min,
                                               program_id=(pid0, pid1).__getitem__),
                   "heads_per_chunk": per_chunk, "BLOCK_N": 1}
            exec(code, env)
            order.append((env["n_start"], env["bh_kv"]))
    return order


@pytest.mark.parametrize("blocks,heads,per_chunk", [(16, 32, 8), (32, 16, 4), (64, 8, 2), (32, 13, 4), (16, 5, 9)])
def test_causal_backward_hands_out_each_chunks_heaviest_key_blocks_first(blocks, heads, per_chunk):
    """The causal backward's program-id mapping (``CAUSAL_ORDER``, run here as Python on every CTA of the
    grid in launch order) is a bijection onto (key block, head), goes chunk by chunk of ``heads_per_chunk``
    heads, and within a chunk puts every head's key block n before any key block n + 1 (a smaller key block
    meets more query blocks: the heaviest work first)."""
    order = _causal_order(blocks, heads, per_chunk)
    assert sorted(order) == [(n, h) for n in range(blocks) for h in range(heads)]
    chunks = [order[i:i + per_chunk * blocks] for i in range(0, len(order), per_chunk * blocks)]
    for k, chunk in enumerate(chunks):
        assert {h for _, h in chunk} == set(range(k * per_chunk, min(heads, (k + 1) * per_chunk)))
        assert [n for n, _ in chunk] == sorted(n for n, _ in chunk)


def test_only_the_causal_backward_passes_heads_per_chunk():
    causal, full = (emit_gluon(_schedule(causal=c)) for c in (True, False))
    assert "heads_per_chunk" in causal and "max(1, _sm_count(q.device.index) // grid[0])" in causal
    assert "heads_per_chunk" not in full and "n_start = gl.program_id(0) * BLOCK_N" in full


@pytest.mark.parametrize("seq,kv_heads,launch_order,chunked", [(2048, 4, 1.30, 1.03), (4096, 4, 1.28, 1.00),
                                                              (8192, 4, 1.24, 1.02), (4096, 16, 1.07, 1.00)])
def test_the_causal_order_balances_the_backward_in_list_scheduling(seq, kv_heads, launch_order, chunked):
    """docs/performance.md, "The causal backward's launch order": the benchmark's causal backward (16384 tokens,
    16 query heads of D = 128, 132 SMs, one CTA each) handed out greedily in the grid's own order finishes
    ``launch_order`` x the ideal, in the order of ``CAUSAL_ORDER`` ``chunked`` x."""
    from twill.tune.predict import list_schedule

    sms, block_m, block_n = 132, 64, 128
    heads, blocks = (16384 // seq) * kv_heads, seq // block_n
    work = {n: (16 // kv_heads) * (seq // block_m - n * block_n // block_m) for n in range(blocks)}
    ours = [work[n] for n, _ in _causal_order(blocks, heads, max(1, sms // blocks))]
    grid = [work[n] for _ in range(heads) for n in range(blocks)]
    ideal = sum(grid) / sms
    assert list_schedule(grid, sms)[0] / ideal == pytest.approx(launch_order, abs=0.01)
    assert list_schedule(ours, sms)[0] / ideal == pytest.approx(chunked, abs=0.01)
