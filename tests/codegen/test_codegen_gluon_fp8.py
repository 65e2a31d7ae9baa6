"""The fp8 attention forward's Gluon kernels on the CPU (issue 35): every variant compiles for sm_90 (Triton 3.6,
no GPU) to e4m3 (or e5m2) ``m64nNk32`` wgmmas, with V read through the pre-pass's V^T, the descale factors as
kernel parameters and a 16-bit O."""

from __future__ import annotations

import re

import pytest

from twill.codegen.gluon import emit_gluon, gluon_plan, load_emitted
from twill.errors import UnsupportedFeatureError
from twill.kernels import build_kernel
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.machine.models import H100
from twill.schedule.verify import verify

triton = pytest.importorskip("triton")
aot = pytest.importorskip("twill.codegen.gluon.aot")


def _schedule(ahead: int = 1, **options):
    graph = build_kernel("flash-fwd", H100, **options)
    schedule = flash_schedule(graph, H100, ahead=ahead, depth=2)
    verify(schedule, H100)
    return schedule


def _compile(tmp_path, schedule, name: str, persistent: bool = False):
    path = tmp_path / f"{name}.py"
    path.write_text(emit_gluon(schedule, persistent=persistent))
    module = load_emitted(str(path), f"twill_test_{name}")
    return module, aot.compile_sm90(module)


#: (kernel options, ahead, persistent): D 64/128/256, causal and not, grouped-query, one to three sub-tiles.
FP8_CASES = [
    ({"subtiles": 1, "head_dim": 64}, 1, False),
    ({"subtiles": 3, "head_dim": 64, "causal": True}, 0, False),
    ({"subtiles": 2, "head_dim": 128}, 1, False),
    ({"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2}, 1, False),
    ({"subtiles": 2, "head_dim": 128, "kv_heads": 1}, 1, True),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64}, 1, False),
    ({"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True, "kv_heads": 4}, 1, True),
]


@pytest.mark.parametrize("options,ahead,persistent", FP8_CASES)
def test_fp8_forward_compiles_to_e4m3_wgmmas(tmp_path, options, ahead, persistent):
    from twill.tune.spills import ptxas_report

    schedule = _schedule(ahead, dtype="fp8e4m3", **options)
    plan = gluon_plan(schedule)
    assert plan.dtype == "fp8e4m3"
    name = "fa8_" + "_".join(f"{k}{v}" for k, v in options.items()) + ("_persistent" if persistent else "")
    module, compiled = _compile(tmp_path, schedule, name, persistent)
    ptx = compiled.asm["ptx"]
    d, bn = options["head_dim"], options.get("block_n", 128)
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)", ptx))
    assert shapes == {f"m64n{bn}k32.f32.e4m3.e4m3", f"m64n{d}k32.f32.e4m3.e4m3"}   # S = Q K^T, O += P V
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx                # P converted to fp8 in registers
    assert aot.ptx_facts(compiled).tma_load_ranks == (4,)      # Q, K and V^T read through rank-4 descriptors
    assert "__nv_log2f" in ptx                                 # the LSE output
    assert ("%nctaid.x" in ptx) == (options.get("causal", False) or persistent)
    signature = module.compile_signature()[0]
    assert signature["o_ptr"] == "*bf16"
    assert signature["qk_descale_ptr"] == signature["v_descale_ptr"] == "*fp32"
    assert "fp8e4nv[1, 1, " + f"{d}, {bn}]" in signature["v_desc"]    # V^T tiles [head_dim, block_n], rank 4
    assert ("group" in signature) == bool(options.get("kv_heads"))
    rows = plan.tile["block_m"]
    ring_bytes = 2 * 2 * bn * d + rows * d                     # one byte per element
    assert ring_bytes <= compiled.metadata.shared < ring_bytes + 4096
    report = ptxas_report(ptx, 90)
    assert report["serialized_wgmma"] == 0
    # P becomes the A operand within each thread (fp8_p_operand): the only shuffles are the row reductions'
    # butterflies (and at most one broadcast of the warp index, and in a persistent kernel one of the producer's
    # count of CTAs done claiming; the cross-thread conversion had 64 and more)
    sass = aot.sass(compiled)
    ops = [re.sub(r"^@!?U?P\w+\s+", "", i[2]).split(" ")[0] for i in aot.sass_instructions(sass)]
    assert ops.count("SHFL.IDX") <= 1 + persistent and ops.count("SHFL.BFLY") > 0
    # P travels as 32-bit registers of four fp8 values (fp8_p_operand, fp8_operand): no byte is unpacked or
    # repacked in a main loop (an 8-bit P carried over the loop cost about 100 PRMT per warp and iteration)
    mains = aot.wgmma_loops(sass)[:options["subtiles"]]    # the compute partitions' loops come first
    assert len(mains) == options["subtiles"] and not any(op.startswith("PRMT") for loop in mains for op in loop)
    # the persistent non-causal D = 128 kernel (not one the op runs) spills 88 bytes at ptxas's 168-register
    # compile of the whole kernel (256 while P crossed the loop as bytes, 240 before P took the permuted key
    # order; the bf16 one does not): pinned
    assert report["spill_bytes"] == (88 if persistent and d == 128 else 0)


def test_fp8_forward_without_descale_drops_the_loads(tmp_path):
    """The launcher passes ``None`` descale pointers when no descale factor is given: the kernel then loads
    none (Triton makes the ``None`` a constexpr)."""
    schedule = _schedule(dtype="fp8e4m3", subtiles=2)
    path = tmp_path / "fa8_plain.py"
    path.write_text(emit_gluon(schedule))
    module = load_emitted(str(path), "twill_test_fa8_plain")
    with_descale = aot.compile_sm90(module).asm["ptx"]
    without = aot.compile_sm90(module, {"qk_descale_ptr": None, "v_descale_ptr": None}).asm["ptx"]
    assert with_descale.count("ld.global") > without.count("ld.global")


def test_fp8_e5m2_forward_compiles_to_e5m2_wgmmas(tmp_path):
    _, compiled = _compile(tmp_path, _schedule(dtype="fp8e5m2", subtiles=2), "fa8_e5m2")
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)", compiled.asm["ptx"]))
    assert shapes == {"m64n128k32.f32.e5m2.e5m2"}


def test_fp8_source_reads_v_transposed_and_scales_by_the_descale_factors():
    source = emit_gluon(_schedule(dtype="fp8e4m3", subtiles=2, kv_heads=2))
    assert ("warpgroup_mma(fp8_operand(p_op, p_layout), v_ring.index(j % V_DEPTH).permute((1, 0)), o, "
            "is_async=True)") in source
    assert "[b, kv_h, 0, j * BLOCK_N]" in source     # V^T [B, KV_HEADS, D, S_pad]: the K/V head's D rows
    assert "block_scale = qk_scale * gl.load(qk_descale_ptr + bh)" in source
    assert "o = o * gl.convert_layout(v_scale / l_i, row_o)[:, None]" in source
    assert "def transpose_v(v):" in source and "torch.float8_e4m3fn" in source
    bf16 = emit_gluon(_schedule(dtype="bf16", subtiles=2, kv_heads=2))
    assert "descale" not in bf16 and "P_OFFSET" not in bf16


def test_in_kernel_v_transpose_and_other_backends_are_refused():
    with pytest.raises(UnsupportedFeatureError, match="--v-transpose prepass"):
        gluon_plan(_schedule(dtype="fp8e4m3", subtiles=2, v_transpose="kernel"))
    from twill.kernels.flash_fwd.plan import plan

    with pytest.raises(UnsupportedFeatureError, match="dtype fp8e4m3 not supported by the Pallas backend"):
        plan(_schedule(dtype="fp8e4m3", subtiles=2), "Pallas")


def test_the_p_operand_key_order_matches_the_pre_pass():
    """``fp8_p_operand`` reorders the keys of each 32-key group (a reshape and a permute of P) and the launcher's
    ``transpose_v`` writes V^T's keys in the same order: P V is unchanged. Checked with numpy's reshape and
    transpose (the same index semantics as Gluon's) on random data, a ragged key length included."""
    torch = pytest.importorskip("torch")
    import numpy as np

    source = emit_gluon(_schedule(dtype="fp8e4m3", subtiles=2))
    assert "p = gl.reshape(p, [SUB_M, BLOCK_N // 32, 2, 2, 4, 2])" in source
    assert "p = gl.reshape(gl.permute(p, [0, 1, 2, 4, 3, 5]), [SUB_M, BLOCK_N])" in source
    namespace: dict = {}
    start = source.index("def transpose_v(v):")
    helper = source.index("def _cdiv(a, b):")
    exec(source[helper:source.index("\ndef ", helper + 1)] + "\n" + source[start:source.index("\ndef ", start + 1)],
         namespace)
    rng = np.random.default_rng(0)
    for keys in (128, 77):
        v = torch.from_numpy(rng.standard_normal((2, 3, keys, 16)).astype(np.float32))
        vt = namespace["transpose_v"](v).numpy()                   # [B, KVH, D, keys padded to 32]
        padded = vt.shape[-1]
        assert padded % 32 == 0 and padded - keys < 32
        p = rng.standard_normal((2, 3, 8, padded)).astype(np.float32)
        p[..., keys:] = 0.0                                          # keys past seq_k: P = 0 (masked)
        shape = p.shape[:-1]
        p_op = p.reshape(*shape, padded // 32, 2, 2, 4, 2).transpose(0, 1, 2, 3, 4, 6, 5, 7).reshape(*shape, padded)
        expected = p[..., :keys] @ v.numpy()
        np.testing.assert_allclose(p_op @ vt.swapaxes(-1, -2), expected, rtol=1e-5, atol=1e-5)


def test_the_packed_p_holds_each_group_of_four_columns_in_byte_order():
    """``fp8_p_operand`` splits P's columns 4g..4g + 3 (reshape to [.., 2, 2], split twice: Gluon's split takes
    the last axis, as numpy's indexing below) and hands them to its cvt pairs in the order that puts column
    4g + k in byte k (``cvt ... d, a, b`` puts a in the upper byte); ``fp8_operand`` reads byte k as column
    4g + k, four consecutive columns per operand register."""
    import numpy as np

    source = emit_gluon(_schedule(dtype="fp8e4m3", subtiles=2))
    assert "even, odd = gl.split(p)" in source and "c0, c2 = gl.split(even)" in source
    assert "c1, c3 = gl.split(odd)" in source and "[c0, c1, c2, c3], dtype=gl.int32" in source
    assert "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3" in source
    assert "mov.b32 $0, {lo, hi}" in source and "dtype=gl.float8e4nv, is_pure=True" in source
    p = np.arange(4 * 64).reshape(4, 64)                       # P' columns (values = their own labels)
    even, odd = (p.reshape(4, 16, 2, 2)[..., y] for y in (0, 1))
    c0, c2 = even[..., 0], even[..., 1]
    c1, c3 = odd[..., 0], odd[..., 1]

    def cvt(a, b):     # cvt.rn.satfinite.e4m3x2.f32 d, a, b: b in the lower byte, a in the upper
        return [b, a]

    lo, hi = cvt(c1, c0), cvt(c3, c2)                          # the asm's operands $2, $1 and $4, $3
    packed = np.stack([*lo, *hi], axis=-1)                     # bytes 0..3 of each register (mov.b32 {lo, hi})
    np.testing.assert_array_equal(packed.reshape(4, 64), p)    # byte k of group g is column 4g + k


def test_fp8_e5m2_converts_p_with_its_own_format():
    source = emit_gluon(_schedule(dtype="fp8e5m2", subtiles=2))
    assert "cvt.rn.satfinite.e5m2x2.f32" in source and "e4m3" not in source
    assert "dtype=gl.float8e5, is_pure=True" in source
