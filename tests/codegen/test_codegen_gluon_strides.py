"""The attention launchers read ``[B, H, S, D]`` tensors where they lie: ``_tma_view`` (the emitted modules'
host helper) builds a rank-4 TMA descriptor with the tensor's own strides (a ``[B, S, H, D]`` tensor's
``transpose(1, 2)`` included, no copy), and refuses a layout TMA cannot read with one error naming the
tensor. Checked on CPU tensors (building a descriptor needs no GPU); the kernels' results on such tensors
are tests/gpu/test_gpu_strides.py's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("triton.experimental.gluon", reason="Triton 3.6 with Gluon is needed")



@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_a_transposed_bshd_tensor_gets_a_rank_4_descriptor_with_its_own_strides(attention_modules, kind):
    module = attention_modules[kind]
    x = torch.zeros(2, 300, 8, 128, dtype=torch.float16)          # [B, S, H, D], as a projection makes it
    q = x.transpose(1, 2)                                          # [B, H, S, D] view, not contiguous
    desc = module._tma_view(q, "q", [64, 128])
    assert desc.base is q and desc.base.data_ptr() == x.data_ptr()  # the caller's memory: no copy
    assert list(desc.shape) == [2, 8, 300, 128]                    # S bounds each (batch, head): TMA zero-fills
    assert list(desc.strides) == list(q.stride()) == [300 * 8 * 128, 128, 8 * 128, 1]
    assert list(desc.block_shape) == [1, 1, 64, 128] and desc.layout.rank == 4
    assert desc.layout.swizzle_byte_width == 128                   # the 2-d tile's swizzle: its buffers' layout


def test_a_dimension_of_one_element_takes_an_aligned_stride(attention_modules):
    """A size-1 dimension's stride is never stepped and may be anything torch chose (even unaligned)."""
    x = torch.zeros(1, 8, 300, 136, dtype=torch.float16)[..., :128]   # rows of 272 bytes: aligned
    q = x.as_strided((1, 8, 300, 128), (7, 300 * 136, 136, 1))        # batch stride 7: never used
    desc = attention_modules["fwd"]._tma_view(q, "q", [64, 128])
    assert list(desc.strides[1:]) == [300 * 136, 136, 1] and desc.strides[0] * 2 % 16 == 0


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
@pytest.mark.parametrize("make,name,words", [
    (lambda: torch.zeros(2, 8, 128, 300, dtype=torch.float16).transpose(2, 3), "k", "contiguous last dimension"),
    (lambda: torch.zeros(2, 8, 300, 129, dtype=torch.float16)[..., :128], "v", "multiple of 16 bytes"),
    (lambda: torch.zeros(2 * 8 * 300 * 128 + 1, dtype=torch.float16)[1:].view(2, 8, 300, 128), "do",
     "16-byte aligned base"),
])
def test_a_layout_tma_cannot_read_is_refused_naming_the_tensor(attention_modules, kind, make, name, words):
    with pytest.raises(ValueError) as err:
        attention_modules[kind]._tma_view(make(), name, [64, 128])
    assert str(err.value).startswith(f"{name} ") and words in str(err.value)


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_a_layout_checked_once_is_still_checked_for_each_tensors_address(attention_modules, kind):
    """``_tma_view`` keeps the fields of each layout it accepted; a new tensor of that layout gets them with its
    own base, a misaligned one of that layout is still refused, and a refused layout is refused every time."""
    module = attention_modules[kind]
    x = torch.zeros(2, 300, 8, 128, dtype=torch.float16)
    first = module._tma_view(x.transpose(1, 2), "q", [64, 128])
    y = torch.zeros(2 * 300 * 8 * 128 + 8, dtype=torch.float16)
    second = module._tma_view(y[8:].view(2, 300, 8, 128).transpose(1, 2), "q", [64, 128])
    assert second.base.data_ptr() == y.data_ptr() + 16 and second.base is not first.base
    assert (second.shape, second.strides, second.block_shape, second.layout) == \
        (first.shape, first.strides, first.block_shape, first.layout)
    with pytest.raises(ValueError, match="^q starts at address"):
        module._tma_view(y[1:1 + x.numel()].view(2, 300, 8, 128).transpose(1, 2), "q", [64, 128])
    for _ in range(2):
        with pytest.raises(ValueError, match="^k must have a contiguous last dimension"):
            module._tma_view(torch.zeros(2, 8, 128, 300, dtype=torch.float16).transpose(2, 3), "k", [64, 128])
