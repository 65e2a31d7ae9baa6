"""The attention launchers' direct launch (``_launch`` in every attention module): after the first launch of
a specialization, which goes through Triton's JIT with Triton's own ``TensorDescriptor`` objects, every launch
calls the compiled kernel's C launcher itself, with each TMA descriptor encoded once per address, shape and
strides. Checked on the CPU against Triton's own launcher: the C entry point is a recorder, Triton's wrapper
around it (``wrap_handle_tensordesc``) is Triton's, and the encoding is a stand-in for the driver's. The
kernels' results under repeated direct launches are tests/gpu/test_gpu_launch.py's."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("triton.experimental.gluon", reason="Triton 3.6 with Gluon is needed")

from triton.backends.nvidia import driver as nvidia_driver  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402
from triton.runtime import driver  # noqa: E402


STREAM = 0x5EED


class Recorder:
    """A C launcher stand-in: records its arguments (and, like a C function, has no ``__code__``)."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, *args):
        self.calls.append(args)


class FakeKernel:
    """A JIT kernel whose ``kernel[grid](*args)`` records the call and returns a compiled kernel whose launcher
    is Triton's wrapper (``wrap_handle_tensordesc``) around a recording C entry point; ``wrapped=False``
    gives it a launcher of another shape (a callable that is not Triton's wrapper)."""

    def __init__(self, scratch=0, wrapped=True):
        self.jit_calls, self.c_calls, self.scratch, self.wrapped = [], [], scratch, wrapped

    def __getitem__(self, grid):
        def jit(*args, num_warps):
            self.jit_calls.append(args)
            signature = {f"a{i}": "tensordesc<bf16[1, 1, 64, 128]>" if isinstance(a, TensorDescriptor) else "i32"
                         for i, a in enumerate(args)}
            metas = [{"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": list(a.block_shape),
                      "fp4_padded": False} for a in args if isinstance(a, TensorDescriptor)]
            c_entry = Recorder(self.c_calls)
            wrapper = nvidia_driver.wrap_handle_tensordesc(c_entry, signature, metas) if self.wrapped else c_entry

            class Run:   # CudaLauncher's fields and call, without compiling a C module
                launch, launch_cooperative_grid, launch_pdl = staticmethod(wrapper), False, False
                global_scratch_size = profile_scratch_size = self.scratch

                def __call__(self, gx, gy, gz, stream, function, *rest):
                    self.launch(gx, gy, gz, stream, function, False, False, None, None, *rest)

            return types.SimpleNamespace(run=Run(), function=0xF00, packed_metadata=(4, 1, 1000),
                                         metadata=types.SimpleNamespace(tensordesc_meta=metas))

        return jit


@pytest.fixture
def fake_driver(monkeypatch):
    """The active driver on CPU (device 0, a fixed stream) and a stand-in for Triton's descriptor encoding that
    counts its calls."""
    encodings = []

    def encode(arg, meta):
        encodings.append(arg)
        return [("tensormap", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta["swizzle"]),
                *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "_active", types.SimpleNamespace(get_current_device=lambda: 0,
                                                                 get_current_stream=lambda device: STREAM))
    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", encode)
    return encodings


def _args(module, q, k):
    return (module._tma_view(q, "q", [64, 128]), module._tma_view(k, "k", [128, 128]), 300, 7, q)


def test_later_launches_reach_the_c_launcher_with_what_tritons_launcher_passes(attention_modules, fake_driver):
    module, kernel = attention_modules["fwd"], FakeKernel()
    module._COMPILED.clear()
    q = torch.zeros(2, 300, 8, 128, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)
    module._launch(kernel, (5, 16), 4, *_args(module, q, k))
    assert len(kernel.jit_calls) == 1 and not kernel.c_calls
    assert all(isinstance(a, TensorDescriptor) for a in kernel.jit_calls[0][:2])   # the JIT gets Triton's own
    compiled = next(iter(module._COMPILED.values()))[0]
    compiled.run(5, 16, 1, STREAM, 0xF00, (4, 1, 1000), None, None, None,
                 *(a.descriptor() if isinstance(a, module._TmaArg) else a for a in _args(module, q, k)))
    module._launch(kernel, (5, 16), 4, *_args(module, q, k))
    assert len(kernel.jit_calls) == 1 and len(kernel.c_calls) == 2
    tritons, direct = kernel.c_calls
    assert direct == tritons                   # same entry point, same arguments
    assert direct[:5] == (5, 16, 1, STREAM, 0xF00)


def test_a_descriptor_is_encoded_once_per_address_shape_and_strides(attention_modules, fake_driver):
    module, kernel = attention_modules["fwd"], FakeKernel()
    module._COMPILED.clear()
    module._ENCODED.clear()
    x = torch.zeros(2, 300, 8, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)
    for _ in range(4):
        module._launch(kernel, (5, 16), 4, *_args(module, x.transpose(1, 2), k))
    assert len(fake_driver) == 2               # q and k, encoded at the first direct launch only
    other = torch.zeros_like(x)                # another address: encoded anew, and passed as its own
    module._launch(kernel, (5, 16), 4, *_args(module, other.transpose(1, 2), k))
    assert len(fake_driver) == 3 and kernel.c_calls[-1][13][1] == other.data_ptr()
    dense = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)   # same address as nothing above, other strides
    module._launch(kernel, (5, 16), 4, *_args(module, dense, k))
    assert kernel.c_calls[-1][13][3] == dense.stride()
    assert len(kernel.jit_calls) == 1


def test_a_full_encoding_table_is_emptied_not_grown(attention_modules, fake_driver, monkeypatch):
    module, kernel = attention_modules["fwd"], FakeKernel()
    module._COMPILED.clear()
    module._ENCODED.clear()
    monkeypatch.setattr(module, "_ENCODED_MAX", 3)
    k = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)
    for _ in range(6):
        module._launch(kernel, (5, 16), 4, *_args(module, torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16), k))
    assert len(module._ENCODED) <= 3


def _launch_three_times(module, kernel):
    """Three launches of ``kernel`` on fresh caches, over two descriptors (q, k) and three scalars."""
    module._COMPILED.clear()
    module._ENCODED.clear()
    q = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)
    for _ in range(3):
        module._launch(kernel, (5, 16), 4, *_args(module, q, q))


def test_a_launch_that_needs_scratch_memory_goes_through_tritons_launcher(attention_modules, fake_driver):
    module, kernel = attention_modules["bwd"], FakeKernel(scratch=256)
    _launch_three_times(module, kernel)
    assert len(kernel.jit_calls) == 1 and len(kernel.c_calls) == 2 and not module._ENCODED
    assert len(fake_driver) == 4               # Triton's wrapper encodes every descriptor of every launch


def test_the_launchers_own_buffers_get_dense_descriptors(attention_modules):
    module = attention_modules["bwd"]
    stats = torch.zeros(2, 4 * 384, dtype=torch.float32)
    desc = module._tma_buffer(stats, [2, 128], module.gl.float32, module.STATS_LAYOUT)
    assert (tuple(desc.shape), tuple(desc.strides), desc.block_shape) == ((2, 1536), (1536, 1), (2, 128))
    triton_desc = desc.descriptor()            # what the JIT gets: Triton's checks pass on it
    assert isinstance(triton_desc, TensorDescriptor) and triton_desc.layout is module.STATS_LAYOUT


def test_the_backward_buffers_are_views_of_one_allocation(attention_modules):
    """The stats rows and the dQ accumulator share one fp32 allocation, the accumulator after the stats at a
    16-byte aligned address, both dense (as ``_tma_buffer`` reads them); zeroed when asked."""
    module = attention_modules["bwd"]
    n, d = 3 * module.BLOCK_M.value, module.HEAD_DIM.value
    stats, dq_acc = module._fp32_buffers(n, "cpu")
    assert (stats.shape, dq_acc.shape) == ((2, n), (n, d)) and stats.is_contiguous() and dq_acc.is_contiguous()
    assert stats.untyped_storage().data_ptr() == dq_acc.untyped_storage().data_ptr()
    assert dq_acc.data_ptr() == stats.data_ptr() + 2 * n * 4 and dq_acc.data_ptr() % 16 == 0
    stats, dq_acc = module._fp32_buffers(n, "cpu", zeroed=True)
    assert not stats.any() and not dq_acc.any()


def test_a_kernel_without_descriptors_is_launched_by_the_c_function_triton_calls(attention_modules, fake_driver):
    module, kernel = attention_modules["bwd"], FakeKernel()
    module._COMPILED.clear()
    q = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)
    for _ in range(3):
        module._launch(kernel, (5, 16), 4, q, 300, 0.5, None)
    assert len(kernel.jit_calls) == 1 and len(kernel.c_calls) == 2
    assert kernel.c_calls[0][13:] == (q, 300, 0.5, None) and not fake_driver


def test_a_launcher_of_another_shape_keeps_tritons_launcher(attention_modules, fake_driver):
    """A Triton whose launcher is not the wrapper ``_entry_point`` reads: every launch goes through it, with
    Triton's descriptors, and nothing is encoded by the module."""
    module, kernel = attention_modules["fwd"], FakeKernel(wrapped=False)
    _launch_three_times(module, kernel)
    assert len(kernel.jit_calls) == 1 and len(kernel.c_calls) == 2 and not module._ENCODED
    assert all(isinstance(a, TensorDescriptor) for a in kernel.c_calls[0][13:15])


@pytest.mark.parametrize("grid", [(5, 65536), (2, 3, 70000)])
def test_a_grid_past_cudas_limit_is_refused_before_any_launch(attention_modules, fake_driver, grid):
    module, kernel = attention_modules["bwd"], FakeKernel()
    module._COMPILED.clear()
    q = torch.zeros(2, 8, 300, 128, dtype=torch.bfloat16)
    for _ in range(2):   # the JIT launch and, with a grid that fits, a direct one: neither takes it
        with pytest.raises(ValueError, match=r"^the launch grid .* more than CUDA's 65535 blocks"):
            module._launch(kernel, grid, 4, q, 300)
        module._launch(kernel, (5, 65535), 4, q, 300)
    assert len(kernel.jit_calls) == 1 and len(kernel.c_calls) == 1


def test_the_forward_takes_more_than_65535_batch_x_heads(attention_modules, fake_driver, monkeypatch):
    """The forward's grid is (query blocks, heads, batch): 2200 x 32 heads launch (as (2, 32, 2200)), where a
    (blocks, batch x heads) grid would pass CUDA's limit. The tensors are expanded views (no memory)."""
    module, kernel = attention_modules["fwd"], FakeKernel()
    module._COMPILED.clear()
    grids = []
    real = module._launch
    monkeypatch.setattr(module, "_launch", lambda k, grid, *rest: (grids.append(grid), real(kernel, grid, *rest)))
    q = torch.zeros(1, 1, 200, 128, dtype=torch.float16).expand(2200, 32, 200, 128)
    out = torch.zeros(1, 1, 200, 128, dtype=torch.float16).expand(2200, 32, 200, 128)
    module.launch(q, q, q, out=out)
    assert grids == [(2, 32, 2200)] and len(kernel.jit_calls) == 1


def test_a_descriptors_launch_key_is_what_triton_specializes_on(attention_modules):
    """Two views of one layout share a key; lengths of another divisibility by 16, another block or dtype get
    another; the key is a small tuple (no layout object to hash per launch)."""
    module = attention_modules["fwd"]
    views = [module._tma_view(torch.zeros(2, 8, s, 128, dtype=dtype), "q", block)
             for s, dtype, block in ((320, torch.bfloat16, [64, 128]), (320, torch.bfloat16, [64, 128]),
                                     (336, torch.bfloat16, [64, 128]), (300, torch.bfloat16, [64, 128]),
                                     (320, torch.bfloat16, [128, 128]), (320, torch.float16, [64, 128]))]
    keys = [module._arg_key(v) for v in views]
    assert keys[0] == keys[1] == keys[2] and len(set(keys[2:])) == 4
    assert all(isinstance(k, tuple) and all(isinstance(x, (str, int)) for x in k) for k in keys)
    assert views[0].base is not views[1].base


def test_a_buffer_of_a_known_layout_is_still_checked_for_alignment(attention_modules):
    module = attention_modules["bwd"]
    flat = torch.zeros(2 * 1536 + 4, dtype=torch.float32)
    good = module._tma_buffer(flat[:3072].view(2, 1536), [2, 128], module.gl.float32, module.STATS_LAYOUT)
    assert good.key == module._tma_buffer(torch.zeros(2, 1536), [2, 128], module.gl.float32,
                                          module.STATS_LAYOUT).key
    with pytest.raises(ValueError, match="16-byte aligned base"):
        module._tma_buffer(flat[1:3073].view(2, 1536), [2, 128], module.gl.float32, module.STATS_LAYOUT)
