"""``twill.ops.attention`` on the CPU: the kernels it generates compile for sm_90, its cache is keyed and
written whole, and unsupported inputs are refused with the reason (the GPU half is tests/gpu/test_gpu_ops.py)."""

from __future__ import annotations

import pytest

from twill.codegen.gluon import aot, load_emitted
from twill.ops import flash, shipped
from twill.ops.flash import KernelSpec
from twill.tune.spills import ptxas_report


def _fake_version(monkeypatch, version: str = "test+0") -> None:
    from twill.tune import sweep

    monkeypatch.setattr(sweep, "twill_version", lambda: version)


@pytest.mark.parametrize("spec", [KernelSpec("flash-fwd", 128, "fp16", False, 0),
                                  KernelSpec("flash-fwd", 64, "bf16", True, 2),
                                  KernelSpec("flash-fwd", 64, "fp16", False, 2),
                                  KernelSpec("flash-fwd", 256, "fp16", True, 0)],
                         ids=["d128", "d64_bf16_causal_gqa", "d64_gqa", "d256_causal"])
def test_forward_kernels_of_the_op_compile_for_sm90(tmp_path, monkeypatch, spec):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _fake_version(monkeypatch)
    flash.kernel_module.cache_clear()
    module = flash.kernel_module(spec)
    path = tmp_path / "twill" / "ops" / spec.file_name("test+0")
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    assert module.KERNEL == "flash-fwd" and module.HEAD_DIM.value == spec.head_dim
    assert ("causal" in path.read_text()) == spec.causal
    assert ("\n# persistent:" in path.read_text()) == spec.persistent() == (spec.causal or spec.head_dim == 128)
    assert (module.KV_HEADS.value if hasattr(module, "KV_HEADS") else 0) == spec.kv_heads
    assert module.NUM_COMPUTE.value == spec.subtiles()
    facts = aot.ptx_facts(aot.compile_sm90(load_emitted(str(path), f"twill_test_ops_{spec.head_dim}")))
    assert facts.wgmma > 0 and facts.tma_loads > 0


@pytest.mark.parametrize("spec", [KernelSpec("flash-fwd", 64, "fp8e4m3", False, 0),
                                  KernelSpec("flash-fwd", 64, "fp8e4m3", True, 2),
                                  KernelSpec("flash-fwd", 128, "fp8e4m3", False, 2),
                                  KernelSpec("flash-fwd", 128, "fp8e4m3", True, 0),
                                  KernelSpec("flash-fwd", 256, "fp8e4m3", False, 0),
                                  KernelSpec("flash-fwd", 256, "fp8e4m3", True, 4)],
                         ids=["d64", "d64_causal_gqa", "d128_gqa", "d128_causal", "d256", "d256_causal_gqa"])
def test_fp8_forward_kernels_of_the_op_compile_to_e4m3_wgmmas_without_spills(tmp_path, monkeypatch, spec):
    """Every fp8 forward the op runs (from its shipped schedule) compiles for sm_90 to e4m3 wgmmas, reads V^T
    from the pre-pass, runs two compute groups on 128-key blocks, is persistent exactly when causal below
    D = 256, and ptxas spills nothing (the choices of the group count, the key block and persistence rest on
    this)."""
    import re

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _fake_version(monkeypatch)
    flash.kernel_module.cache_clear()
    module = flash.kernel_module(spec)
    text = (tmp_path / "twill" / "ops" / spec.file_name("test+0")).read_text()
    assert ("\n# persistent:" in text) == spec.persistent() == (spec.causal and spec.head_dim != 256)
    assert "def transpose_v(" in text and "q_descale=None" in text
    assert module.NUM_COMPUTE.value == spec.subtiles() == 2
    block_n = spec.kernel_options()["block_n"]
    assert block_n == 128
    kernel = aot.compile_sm90(module)
    ptx = kernel.asm["ptx"]
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)", ptx))
    assert shapes == {f"m64n{block_n}k32.f32.e4m3.e4m3", f"m64n{spec.head_dim}k32.f32.e4m3.e4m3"}
    report = ptxas_report(ptx, 90)
    assert report["spill_bytes"] == 0 and report["serialized_wgmma"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_kernels_of_the_op_are_emitted(tmp_path, head_dim, causal):
    """Every backward the op can ask for is a schedule the Gluon generator emits (shipped, verified, planned),
    with FA3's tile (128 query rows at D = 64, which the model's register count refuses: the ptxas-checked
    search finds it; 64 keys at D = 256), and ptxas compiles it without spilling."""
    spec = KernelSpec("flash-bwd", head_dim, "fp16", causal, 0)
    source = flash._generate(spec)
    assert "def launch(" in source and "def preprocess(" in source
    block_n = 64 if head_dim == 256 else 128
    assert f"tile block_m={spec.block_m()} block_n={block_n} head_dim={head_dim}" in source
    path = tmp_path / "bwd.py"
    path.write_text(source)
    kernel = aot.compile_sm90(load_emitted(str(path), f"twill_test_ops_bwd_{head_dim}_{causal}"))
    report = ptxas_report(kernel.asm["ptx"], 90)
    assert report["spill_bytes"] == 0 and not report["serialized_wgmma"]


def test_cached_module_is_imported_without_solving(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _fake_version(monkeypatch)
    spec = KernelSpec("flash-fwd", 64, "fp16", False, 0)
    path = flash.cache_dir() / spec.file_name("test+0")
    path.parent.mkdir(parents=True)
    path.write_text(flash.cache_text("import triton\nMARK = 'cached'\n"))
    flash.kernel_module.cache_clear()
    monkeypatch.setattr(flash, "_generate", lambda spec: pytest.fail("solved although the module is cached"))
    assert flash.kernel_module(spec).MARK == "cached"


def test_cache_key_follows_every_option_and_the_sources():
    base = KernelSpec("flash-fwd", 128, "fp16", False, 0)
    variants = [base, KernelSpec("flash-bwd", 128, "fp16", False, 0), KernelSpec("flash-fwd", 64, "fp16", False, 0),
                KernelSpec("flash-fwd", 128, "bf16", False, 0), KernelSpec("flash-fwd", 128, "fp16", True, 0),
                KernelSpec("flash-fwd", 128, "fp16", False, 4)]
    names = {v.file_name("v1") for v in variants} | {base.file_name("v2")}
    assert len(names) == len(variants) + 1


def test_forward_spec_options():
    assert KernelSpec("flash-fwd", 256, "fp16", True, 0).kernel_options()["block_n"] == 64
    assert KernelSpec("flash-fwd", 128, "fp16", False, 0).streaming_depth() == 3
    # three 64-row groups at D = 64 without a causal mask, with a 2-buffer ring; two groups otherwise
    plain, causal = KernelSpec("flash-fwd", 64, "fp16", False, 0), KernelSpec("flash-fwd", 64, "fp16", True, 0)
    assert (plain.kernel_options()["subtiles"], plain.streaming_depth()) == (3, 2)
    assert (causal.kernel_options()["subtiles"], causal.streaming_depth()) == (2, 3)
    assert KernelSpec("flash-bwd", 128, "fp16", False, 0).streaming_depth() is None
    assert KernelSpec("flash-fwd", 64, "fp16", False, 0).extra_copies() == 1
    assert KernelSpec("flash-bwd", 64, "fp16", False, 0).extra_copies() == 0
    # the backward's query rows: FA3's 128 at D = 64, 64 at D = 128; the forward has no such option
    assert KernelSpec("flash-bwd", 64, "bf16", True, 2).kernel_options()["block_m"] == 128
    assert KernelSpec("flash-bwd", 128, "fp16", False, 0).kernel_options()["block_m"] == 64
    assert "block_m" not in KernelSpec("flash-fwd", 64, "fp16", False, 0).kernel_options()
    # fp8: V^T from the pre-pass; two compute groups at D = 64, masked or not; 128-key blocks at D = 256;
    # persistent when causal below D = 256
    fp8 = KernelSpec("flash-fwd", 64, "fp8e4m3", False, 0)
    assert fp8.fp8() and fp8.kernel_options()["v_transpose"] == "prepass"
    assert (fp8.subtiles(), fp8.streaming_depth(), fp8.persistent()) == (2, 3, False)
    assert KernelSpec("flash-fwd", 64, "fp8e4m3", True, 0).subtiles() == 2
    assert KernelSpec("flash-fwd", 128, "fp8e4m3", True, 0).persistent()
    fp8_256 = KernelSpec("flash-fwd", 256, "fp8e4m3", True, 0)
    assert fp8_256.kernel_options()["block_n"] == 128 and not fp8_256.persistent()
    # the forward's values stay in their warp group (the generator stages none through shared memory)
    assert not fp8.cross_warp() and KernelSpec("flash-bwd", 64, "fp16", False, 0).cross_warp()
    assert "v_transpose" not in KernelSpec("flash-fwd", 128, "bf16", False, 0).kernel_options()


def test_the_d256_forward_of_the_op_issues_s_a_stage_ahead(monkeypatch):
    """With one extra copy the op's D = 256 schedule (datasheet H200 model) hoists S and P V into different
    stages at the same II, where one copy leaves both pairs in one stage."""
    pytest.importorskip("ortools", reason="generating needs the solver (ortools)")
    monkeypatch.setattr(flash, "_SOLVED", {})
    spec = KernelSpec("flash-fwd", 256, "fp16", False, 0)
    flash._generate_by_solving(spec, shipped.spec_graph(spec))
    (solved,) = flash._SOLVED.values()
    objectives = {r["name"]: (r["value"], r["proven"]) for r in solved.stats["objectives"]}
    assert objectives["unhoisted"] == (0, True) and solved.stats["copies"] == 2
    assert solved.stage("pv_a") == solved.stage("qk_a") + 1


@pytest.mark.parametrize("shape,match", [((1, 2, 16, 64), "CUDA"), ((2, 16, 64), "4-D")])
def test_unsupported_inputs_are_refused_with_the_reason(shape, match):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from twill.ops import attention

    q = torch.zeros(*shape, dtype=torch.float16)
    with pytest.raises(flash.UnsupportedFeatureError, match=match):
        attention(q, q, q)


def test_a_loop_that_differs_only_in_mask_or_kv_groups_is_solved_once(monkeypatch):
    """Causal masking and K/V head groups are code-generator attributes: without shipped schedules the op
    solves the loop once per process and emits each kernel from that verified schedule, with its own masking."""
    pytest.importorskip("ortools", reason="generating needs the solver (ortools)")
    import twill.solve

    solves = []
    real = twill.solve.schedule
    monkeypatch.setattr(twill.solve, "schedule", lambda *a, **k: solves.append(a[0].name) or real(*a, **k))
    monkeypatch.setattr(flash, "_SOLVED", {})

    def generate(spec):
        return flash._generate_by_solving(spec, shipped.spec_graph(spec))

    full, causal, grouped = (generate(KernelSpec("flash-fwd", 128, "fp16", c, g))
                             for c, g in ((False, 0), (True, 0), (True, 2)))
    assert len(solves) == 1
    assert "causal mask" in causal and "causal mask" not in full and grouped != causal
    other = generate(KernelSpec("flash-fwd", 64, "fp16", False, 0))   # three groups: another loop
    assert len(solves) == 2 and "HEAD_DIM" in other
