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
