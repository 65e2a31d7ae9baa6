"""What every GPU test module shares: a kernel cache of its own for ``twill.ops`` (``$XDG_CACHE_HOME`` pointed
at a fresh folder while the module runs), so each module generates the kernels it runs instead of importing
what an earlier run left in the user's cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def fresh_kernel_cache(tmp_path_factory):
    from twill.ops.flash import kernel_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        kernel_module.cache_clear()
        yield
    kernel_module.cache_clear()
