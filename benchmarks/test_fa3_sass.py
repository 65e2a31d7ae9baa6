"""CPU checks of ``benchmarks/fa3_sass.py``'s parsing (instruction classes, wgmma shapes, named barriers, FA3
kernel names, loops and the unmasked path) on hand-written SASS; the wheel itself is used only if present."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import fa3_sass as fs  # noqa: E402

FA3_NAME = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
            "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
            "cute::tuple<cute::C<128>, cute::C<176>, cute::C<128> >, 128, cutlass::bfloat16_t, float, "
            "cutlass::arch::Sm90, false, false, false, false, false, false, false, true, true, false, false, false>, "
            "flash::CollectiveEpilogueFwd<...>, flash::StaticPersistentTileScheduler<false> > > >(...)")


def test_classes_shapes_and_barriers():
    assert fs.instruction_class("@!P0 BRA `(.L_x_3)") == "BRA"
    assert fs.instruction_class("MUFU.EX2 R1, R2") == "MUFU.EX2"
    assert fs.instruction_class("FMNMX.FTZ R1, R2, R3, !PT") == "FMNMX"
    assert fs.instruction_class("@!P2 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [R96+URZ], RZ") == "SYNCS arrive"
    assert fs.instruction_class("UIADD3 UR6, UR48, 0x1, URZ") == "uniform int"
    assert fs.hgmma_shape("HGMMA.64x176x16.F32.BF16 R24, gdesc[UR40], RZ, !UPT") == "64x176x16 SS"
    assert fs.hgmma_shape("HGMMA.64x128x16.F32.BF16 R112, R176, gdesc[UR8].tnspB, R112") == "64x128x16 RS"
    assert fs.barrier("BAR.SYNC.DEFER_BLOCKING R9, 0x100") == "SYNC id=R9 threads=256"
    assert fs.barrier("BAR.ARV 0x2, 0x80") == "ARV id=2 threads=128"


def test_fa3_name():
    facts = fs.parse_fa3_name(FA3_NAME)
    assert (facts["block_m"], facts["block_n"], facts["head_dim"], facts["stages"]) == (128, 176, 128, 2)
    assert facts["flags"]["MmaPV_is_RS"] and facts["flags"]["IntraWGOverlap"] and not facts["flags"]["Split"]
    assert facts["scheduler"] == "StaticPersistentTileScheduler"
    # FA3 launches the two-CTA cluster instance at D = 128 non-causal, one CTA when causal
    assert not fs.plain(facts, 128, False) and not fs.plain(facts, 128, True) and not fs.plain(facts, 64, False)
    clustered = fs.parse_fa3_name(FA3_NAME.replace("cute::C<1>, cute::C<1>, cute::C<1>",
                                                   "cute::C<2>, cute::C<1>, cute::C<1>"))
    assert clustered["cluster"] == [2, 1, 1] and fs.plain(clustered, 128, False)
    causal = dict(facts, flags=dict(facts["flags"], Is_causal=True))
    assert fs.plain(causal, 128, True)
    assert fs.parse_fa3_name("void flash::FlashAttnFwdCombine<...>") is None


SASS = """
.L_x_1:
        /*0000*/                   UIADD3 UR6, UR48, 0x1, URZ ;
.L_x_2:
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR40], RZ, !UPT ;
        /*0020*/              @!P0 BRA `(.L_x_3) ;
        /*0030*/                   FSEL R26, R26, -INF , !P3 ;
.L_x_3:
        /*0040*/                   MUFU.EX2 R1, R2 ;
        /*0050*/               @P0 BRA `(.L_x_2) ;
        /*0060*/               @P1 BRA `(.L_x_1) ;
"""


def test_loops_and_unmasked_path():
    compute, producer = fs.main_and_producer_loops(SASS)
    assert [len(loop) for loop in compute] == [5] and producer == []    # the inner loop, not the outer one
    assert fs.unmasked_path(SASS, compute[0]) == [compute[0][k] for k in (0, 1, 3, 4)]
    assert list(fs.split_functions(".text.foo:\n" + SASS)) == ["foo"]


def test_missing_wheel_is_one_error_line(capsys):
    assert fs.main(["--wheel", os.path.join(str(ROOT), "no-such.whl")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.skipif(not os.path.exists(fs.WHEEL), reason="the FA3 wheel is not in .peers (CI has none)")
def test_wheel_is_readable():
    import zipfile

    assert "fa3_fwd/_C.abi3.so" in zipfile.ZipFile(fs.WHEEL).namelist()
