"""Fixtures shared by the code-generation tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def attention_modules(tmp_path_factory):
    """The emitted attention forward (D 128, two sub-tiles) and backward (D 128) modules, loaded once: their
    host helpers (descriptors, launch path) run on CPU tensors."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("triton.experimental.gluon", reason="Triton 3.6 with Gluon is needed")
    from twill.codegen.gluon import emit_gluon, load_emitted
    from twill.kernels import build_kernel
    from twill.kernels.flash_bwd.variants import flash_bwd_schedule
    from twill.kernels.flash_fwd.variants import flash_schedule
    from twill.machine.models import H100

    tmp = tmp_path_factory.mktemp("attention_modules")
    fwd = flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, head_dim=128), H100, ahead=1, depth=2)
    bwd = flash_bwd_schedule(build_kernel("flash-bwd", H100), H100, depth=2, dq_lag=1)
    out = {}
    for name, sched in (("fwd", fwd), ("bwd", bwd)):
        path = tmp / f"{name}.py"
        path.write_text(emit_gluon(sched))
        out[name] = load_emitted(str(path), f"twill_test_attention_{name}")
    return out


@pytest.fixture
def refuses_bad_offsets():
    """A check that an emitted varlen launcher ``launch(*tensors, cu_seqlens_q, cu_seqlens_k, max_q, max_k)``
    refuses, with one ValueError before touching a GPU, offsets that are strided, of the wrong dtype or of the
    wrong count; ``tensors`` are CPU tensors of the launcher's shapes holding two sequences of 4 rows."""
    torch = pytest.importorskip("torch", reason="torch is not installed")

    def check(launch, tensors):
        good = torch.tensor([0, 4, 8], dtype=torch.int32)
        bad = {"strided": torch.tensor([0, 9, 4, 9, 8, 9], dtype=torch.int32)[::2],
               "int64": good.long(), "count": torch.tensor([0, 8], dtype=torch.int32)}
        for what, offsets in bad.items():
            for first, second, name in ((offsets, good, "cu_seqlens_q"), (good, offsets, "cu_seqlens_k")):
                if what == "count" and name == "cu_seqlens_q":
                    continue   # the batch is read from cu_seqlens_q: its count is the reference
                with pytest.raises(ValueError, match=f"^{name} must be a contiguous int32 vector of batch \\+ 1 "
                                                     f"= 3 offsets on cpu$"):
                    launch(*tensors, first, second, 4, 4)

    return check
