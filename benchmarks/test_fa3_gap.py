"""CPU checks of the FA3-gap experiment's scripts: ``benchmarks/fa3_ablate.py`` (its text edits on the op's
emitted forward modules) and ``benchmarks/attention_ncu.py`` (its reading of Nsight Compute exports)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import attention_ncu as an  # noqa: E402
from benchmarks import fa3_ablate as fa  # noqa: E402


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """The op's emitted forward module text per ablation case (a fresh kernel cache)."""
    import os

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        from twill.ops.flash import kernel_path
        from twill.ops.spec import KernelSpec

        return {case: Path(kernel_path(KernelSpec("flash-fwd", d, "bf16", causal, kv))).read_text()
                for case, (d, causal, kv) in fa.CASES.items()}
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


def _turns(text: str) -> int:
    return len(re.findall(r"mbarrier\.(?:wait|arrive)\(turn_bars\.index\(\(?SUB", text))


def test_named_turns_replace_every_turn_wait_and_arrive(modules):
    for case, text in modules.items():
        out = fa.ablate(text, "named")
        n = int(re.search(r"NUM_COMPUTE\s*=\s*gl\.constexpr\((\d+)\)", text).group(1))
        assert _turns(text) == 2 and _turns(out) == 0, case
        assert out.count("named_sync(SUB)") == 1 and out.count("named_arrive((SUB + ") == 1, case
        # one warp group opens the first turn's barrier once, before its first Q wait
        first = int(fa.FIRST_TURN.search(text).group(1))
        step = int(fa.TURN_ARRIVE.search(text).group(2))
        assert f"if SUB == {(first - step) % n}:\n        named_arrive({first})" in out, case
        # one bar.sync and one bar.arrive per warp group, each on its own named barrier
        ids = sorted(int(i) for i in re.findall(r'_ptx\("bar\.sync (\d+), 256;"\)', out))
        assert ids == list(range(fa.NAMED_BASE, fa.NAMED_BASE + n)), case


def test_noturn_and_fence(modules):
    for case, text in modules.items():
        assert _turns(fa.ablate(text, "noturn")) == 0, case
        if fa.FENCE.search(text):
            out = fa.ablate(text, "fence")
            assert "sched_fence()\n" in out and not fa.FENCE.search(out), case
        else:
            with pytest.raises(ValueError, match="fence"):
                fa.ablate(text, "fence")


def test_generate_writes_a_manifest_fa3_bench_reads(tmp_path):
    from benchmarks import fa3_bench as fb

    rows = fa.generate(str(tmp_path), ["d128", "d64"], ["named", "fence"])
    assert [r["name"] for r in rows] == ["d128_named", "d128_fence", "d64_named"]     # D = 64 has no fence
    manifest = fb.read_manifest(str(tmp_path))
    assert [r["name"] for r in fb.case_variants(manifest, fb.Case(128, False))] == ["d128_named", "d128_fence"]
    assert all((tmp_path / r["file"]).exists() for r in rows)


@pytest.mark.slow
def test_ablated_kernel_compiles_with_named_barriers(modules, tmp_path):
    from twill.codegen.gluon import aot, load_emitted

    path = tmp_path / "named_fence.py"
    path.write_text(fa.ablate(modules["d128"], "named_fence"))
    sass = aot.sass(aot.compile_sm90(load_emitted(str(path))))
    assert re.search(r"BAR\.SYNC\S* 0xc, 0x100", sass) and re.search(r"BAR\.ARV 0xd, 0x100", sass)


SOURCE = '''"Kernel Name","attention_kernel",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_wait","stall_wait (Not Issued)"
"0x0","      LDC R1, c[0x0][0x28]","5","5","10","0","5","5"
"0x10","      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT","20","2","900","0","20","2"
"0x20","      FMNMX R17, R22, R17, !PT","30","30","900","0","30","30"
"0x30","      @!P1  SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR43+0x38198], RZ","40","40","900","40","0","0"
"0x40","      NOP","100","100","3","100","0","0"
'''


def test_read_source_csv_splits_loops_from_idle_warps(tmp_path):
    (tmp_path / "k_source.csv").write_text(SOURCE)
    (tmp_path / "k_details.csv").write_text('"ID","Section Name","Metric Name","Metric Unit","Metric Value"\n'
                                            '"0","SpeedOfLight","Duration","ms","6.24"\n')
    doc = an.read_source_csv(str(tmp_path / "k_source.csv"))
    assert doc["samples"] == 195 and doc["warp_instructions"] == 2713
    assert doc["by_class"] == {"memory": 5, "other": 100, "wgmma": 20, "FP32 math": 30, "mbarrier": 40}
    loops = doc["loops"]          # rows executed at least a third as often as the wgmma
    assert loops["samples"] == 90 and doc["loop_warp_instructions"] == 2700
    assert loops["by_reason"] == {"stall_barrier": 40, "stall_wait": 50}     # Not Issued columns are not reasons
    assert doc["details"] == {"Duration": "6.24 ms"}
    table = an.summary_markdown([doc])
    assert "| Duration | 6.24 ms |" in table and "| mbarrier | 44.4% |" in table
    json.dumps(doc)


def test_opcode_classes():
    assert an.opcode_class("@!P0 BAR.SYNC.DEFER_BLOCKING 0xc, 0x100") == "named barrier"
    assert an.opcode_class("BAR.SYNC.DEFER_BLOCKING 0x0, 0x80") == "barrier"
    assert an.opcode_class("BAR.ARV R14, 0x100") == "barrier"
    assert an.opcode_class("WARPGROUP.DEPBAR.LE gsb0, 0x1") == "wgmma wait"
    assert an.opcode_class("MUFU.EX2 R1, R2") == "MUFU"
    assert an.opcode_class("UTMALDG.4D [UR8], [UR24]") == "memory"


def test_summary_command_exits_2_on_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "x_source.csv"
    bad.write_text("not,a,profile\n")
    assert an.main(["summary", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_wide_tile_edit_splits_the_tile_into_power_of_two_pieces(modules, tmp_path):
    from benchmarks import fa3_wide_tile as fw

    text = fw.widen(modules["d128"])
    assert "BLOCK_N       = gl.constexpr(176)" in text and "K_DEPTH       = gl.constexpr(2)" in text
    assert text.count("tma.async_copy_global_to_shared(k_desc[") == 3
    assert text.count("tma.async_copy_global_to_shared(v_desc[") == 3
    assert "s_tok" not in text.split("def compute_partition")[1].split("def attention_kernel")[0]
    assert "p_op" not in text.split("def compute_partition")[1].split("def attention_kernel")[0]
    with pytest.raises(ValueError, match="no"):
        fw.widen(modules["d64"])          # not the persistent D = 128 kernel it edits


@pytest.mark.slow
def test_wide_tile_compiles_to_three_wgmma_shapes(modules, tmp_path):
    from benchmarks import fa3_wide_tile as fw
    from twill.codegen.gluon import aot, load_emitted

    path = tmp_path / "wide176.py"
    path.write_text(fw.widen(modules["d128"]))
    ptx = aot.compile_sm90(load_emitted(str(path))).asm["ptx"]
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx))
    assert shapes == {"m64n128k16", "m64n32k16", "m64n16k16"}
