"""Key length different from the query length, on the CPU: the forward and backward kernels take ``seq_q`` and
``seq_k``, bound their loops by them and align the causal mask bottom-right (query i sees keys
0..i + seq_k - seq_q, FlashAttention's convention); every variant compiles for sm_90 (Triton 3.6).

The loop bounds the kernels emit are checked here against a dense reference of the mask (pure Python: which
key tiles a query block loads, which it masks); the numbers are the GPU tests' (tests/gpu/test_gpu_seqlens.py).
"""

from __future__ import annotations

import pytest

from twill.codegen.gluon import emit_gluon, load_emitted
from twill.kernels import build_kernel
from twill.kernels.flash_bwd.variants import flash_bwd_schedule
from twill.kernels.flash_fwd.variants import flash_schedule
from twill.machine.models import H100
from twill.schedule.verify import verify

triton = pytest.importorskip("triton")
aot = pytest.importorskip("twill.codegen.gluon.aot")

FORWARD_CASES = [  # (kernel options, ahead, persistent)
    ({"subtiles": 2, "head_dim": 128}, 1, False),
    ({"subtiles": 2, "head_dim": 128, "causal": True}, 1, False),
    ({"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2, "dtype": "bf16"}, 1, True),
    ({"subtiles": 1, "head_dim": 128, "causal": True, "dtype": "fp8e4m3"}, 1, True),
]


def _module(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_emitted(str(path), f"twill_test_seqlens_{name}")


@pytest.mark.parametrize("options,ahead,persistent", FORWARD_CASES,
                         ids=["plain", "causal", "causal_gqa_persistent", "fp8_causal_persistent"])
def test_forward_takes_seq_q_and_seq_k_and_compiles(tmp_path, options, ahead, persistent):
    sched = flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=ahead, depth=2)
    verify(sched, H100)
    source = emit_gluon(sched, persistent=persistent)
    name = "_".join(f"{k}{v}" for k, v in options.items()) + f"_p{int(persistent)}"
    module = _module(tmp_path, source, f"fwd_{name}")
    signature, _ = module.compile_signature()
    names = list(signature)
    assert signature["seq_q"] == signature["seq_k"] == "i32" and names.index("seq_k") == names.index("seq_q") + 1
    assert "seq_len" not in source
    assert "Sk = k.shape[2]" in source and "lse, S, Sk, H" in source     # the launcher passes both lengths
    if options.get("causal"):
        assert "n_tiles = gl.maximum(gl.cdiv(gl.minimum(q_start + BLOCK_M + seq_k - seq_q, seq_k), BLOCK_N), 1)" \
            in source
        assert "q_first = q_start + SUB * SUB_M + seq_k - seq_q" in source
        assert 'm_use = gl.where(m_new == float("-inf"), 0.0, m_new)' in source
        assert "gl.where(l_i == 0.0, 1.0, l_i)" in source
    else:
        assert "n_tiles = gl.cdiv(seq_k, BLOCK_N)" in source and "if kv_start + BLOCK_N > seq_k:" in source
        assert "m_use" not in source
    facts = aot.ptx_facts(aot.compile_sm90(module))
    assert facts.wgmma and facts.tma_load_ranks == (4,)


@pytest.mark.parametrize("options", [{"causal": True}, {"head_dim": 64, "causal": True, "kv_heads": 2},
                                     {"dtype": "bf16"}], ids=["causal", "d64_causal_gqa", "bf16"])
def test_backward_takes_seq_q_and_seq_k_and_compiles(tmp_path, options):
    sched = flash_bwd_schedule(build_kernel("flash-bwd", H100, **options), H100, depth=2, dq_lag=1)
    verify(sched, H100)
    source = emit_gluon(sched)
    module = _module(tmp_path, source, "bwd_" + "_".join(f"{k}{v}" for k, v in options.items()))
    signature, _ = module.compile_signature()
    assert signature["seq_q"] == signature["seq_k"] == "i32"
    assert "seq_len" not in source
    assert "grid = (_cdiv(Sk, BLOCK_N.value), B * kv_shape[1])" in source
    # keys counted on the query axis from n_pos = n_start - (seq_k - seq_q): one length bounds both
    assert "n_pos = n_start - (seq_k - seq_q)" in source
    assert "keep = (keys < seq_q)[:, None] & (queries < seq_q)[None, :]" in source
    assert "mask = (n_pos + rows < seq_q)[:, None]  # key < seq_k" in source   # dK, dV rows past seq_k not stored
    assert 'lse = gl.where(lse == float("-inf"), 0.0, lse)' in source      # FA3: a row that saw no key
    if options.get("causal"):
        assert "m_first = gl.maximum(n_pos, 0) // BLOCK_M" in source
        assert "keys[:, None] <= queries[None, :]" in source
        assert "| (m_start < n_pos + BLOCK_N)" in source
    facts = aot.ptx_facts(aot.compile_sm90(module))
    assert facts.wgmma and facts.tma_load_ranks == (2, 4)


def _sees(i: int, j: int, sq: int, sk: int) -> bool:
    """FlashAttention's causal mask, aligned bottom-right: query i sees key j."""
    return j <= i + sk - sq


@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 300), (300, 5), (200, 200), (128, 257), (257, 128), (1, 4096),
                                   (4096, 1), (129, 64)])
@pytest.mark.parametrize("block_m,block_n,sub_m", [(128, 128, 64), (128, 64, 64), (192, 128, 64), (128, 176, 128)])
def test_forward_causal_bounds_cover_exactly_the_keys_each_block_sees(sq, sk, block_m, block_n, sub_m):
    """The emitted trip count and diagonal test against a dense mask: every key a query of the block sees
    lies in its first n_tiles tiles; a tile the diagonal test leaves unmasked has every (query, key < seq_k)
    of the sub-tile's stored rows visible (no key past seq_k among them); a row that sees no key is in a masked tile (its output is 0, LSE -inf)."""
    for q_start in range(0, sq, block_m):
        n_tiles = max(-(-min(q_start + block_m + sk - sq, sk) // block_n), 1)   # the emitted expression
        rows = range(q_start, min(q_start + block_m, sq))
        last = max((j for i in rows for j in range(sk) if _sees(i, j, sq, sk)), default=-1)
        assert last < n_tiles * block_n and (n_tiles - 1) * block_n <= max(last, 0)
        for sub in range(block_m // sub_m):
            q_first = q_start + sub * sub_m + sk - sq
            sub_rows = [i for i in range(q_start + sub * sub_m, q_start + (sub + 1) * sub_m) if i < sq]
            for t in range(n_tiles):
                kv_start = t * block_n
                masked = kv_start + block_n > q_first + 1              # CAUSAL_SOFTMAX's diagonal test
                if not masked:   # every key of the tile is below seq_k and seen by every stored row
                    assert all(j < sk and _sees(i, j, sq, sk) for i in sub_rows
                               for j in range(kv_start, kv_start + block_n))
            for i in sub_rows:
                if not any(_sees(i, j, sq, sk) for j in range(sk)):
                    assert 0 + block_n > q_first + 1                      # tile 0 masked for it


@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 300), (300, 5), (200, 200), (128, 257), (257, 128), (64, 4096),
                                   (4096, 64)])
@pytest.mark.parametrize("block_m,block_n", [(64, 128), (128, 128)])
def test_backward_causal_bounds_visit_every_query_that_sees_the_key_block(sq, sk, block_m, block_n):
    """The backward's m_first against a dense mask: for each key block, the query blocks before m_first see
    none of its keys, at least one query block remains (n_m >= 1), and a tile the mask condition leaves
    unmasked has every (key, query) pair visible."""
    for n_start in range(0, sk, block_n):
        n_pos = n_start - (sk - sq)                        # the emitted expressions
        m_first = max(n_pos, 0) // block_m
        n_m = -(-sq // block_m) - m_first
        assert n_m >= 1
        keys = range(n_start, min(n_start + block_n, sk))
        assert not any(_sees(i, j, sq, sk) for i in range(m_first * block_m) for j in keys)
        for m in range(m_first, m_first + n_m):
            m_start = m * block_m
            masked = (n_pos + block_n > sq) | (m_start + block_m > sq) | (m_start < n_pos + block_n)
            if not masked:    # every key of the block below seq_k, every query below seq_q, every pair visible
                assert n_start + block_n <= sk and m_start + block_m <= sq
                assert all(_sees(i, j, sq, sk) for i in range(m_start, m_start + block_m) for j in keys)
            # the mask itself: key position (j - (sk - sq)) <= query, both below seq_q
            for i in range(m_start, min(m_start + block_m, sq)):
                for j in keys:
                    assert (j - (sk - sq) <= i and j - (sk - sq) < sq) == _sees(i, j, sq, sk)


# -- variable-length packed sequences (varlen) --------------------------------------------------------------
VARLEN_CASES = [  # kernel options (every one with varlen=True)
    {"subtiles": 2, "head_dim": 128},
    {"subtiles": 2, "head_dim": 128, "causal": True, "kv_heads": 2, "dtype": "bf16"},
    {"subtiles": 3, "head_dim": 64, "block_n": 64},
    {"subtiles": 2, "head_dim": 256, "block_n": 64, "causal": True},
]


@pytest.mark.parametrize("options", VARLEN_CASES, ids=["d128", "d128_causal_gqa_bf16", "d64_sub3", "d256_causal"])
def test_varlen_forward_reads_its_sequence_from_cu_seqlens_and_compiles(tmp_path, options, refuses_bad_offsets):
    """The varlen kernel: cu_seqlens_q/k and total_q replace seq_q/seq_k in the signature; each CTA loads its
    sequence's offsets and lengths, returns when its block starts past the sequence, and reads the packed
    [1, heads, total, D] views from its sequence's first row; the wgmmas, waits and TMA loads are those of
    the kernel over [B, H, S, D] tensors (the loop is the same schedule)."""
    sched = flash_schedule(build_kernel("flash-fwd", H100, varlen=True, **options), H100, ahead=1, depth=2)
    verify(sched, H100)
    source = emit_gluon(sched)
    name = "_".join(f"{k}{v}" for k, v in options.items())
    module = _module(tmp_path, source, f"varlen_{name}")
    signature, _ = module.compile_signature()
    assert (signature["cu_seqlens_q"], signature["cu_seqlens_k"], signature["total_q"]) == ("*i32", "*i32", "i32")
    assert "seq_q" not in signature and "seq_k" not in signature
    for line in ("q_base = gl.load(cu_seqlens_q + b)", "seq_q = gl.load(cu_seqlens_q + b + 1) - q_base",
                 "k_base = gl.load(cu_seqlens_k + b)", "seq_k = gl.load(cu_seqlens_k + b + 1) - k_base",
                 "if q_start >= seq_q:", "q_row = h * total_q + q_base + q_start",
                 "[0, h, q_base + q_start + sub * SUB_M, 0]", "[0, kv_h, k_base + j * BLOCK_N, 0]",
                 "o_head = o_ptr + q_base.to(gl.int64) * o_stride_s", "gl.where(l_i == 0.0, 1.0, l_i)",
                 'm_use = gl.where(m_new == float("-inf"), 0.0, m_new)'):
        assert line in source, line
    assert ("n_tiles = gl.maximum(gl.cdiv(seq_k, BLOCK_N), 1)" in source) != bool(options.get("causal"))
    assert "def launch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k" in source
    import builtins
    import dis

    names = {i.argval for i in dis.get_instructions(module.launch) if i.opname == "LOAD_GLOBAL"}
    assert not [n for n in names if n not in vars(module) and not hasattr(builtins, n)]   # it runs on a GPU only
    import torch

    dtype = torch.bfloat16 if options.get("dtype") == "bf16" else torch.float16
    q = torch.zeros(8, 4, options["head_dim"], dtype=dtype)
    kv = torch.zeros(8, options.get("kv_heads") or 4, options["head_dim"], dtype=dtype)
    refuses_bad_offsets(module.launch, (q, kv, kv))
    assert "persistent" not in source.split("def attention_kernel")[0].split("decisions:")[1].split("\n#\n")[0]
    facts = aot.ptx_facts(aot.compile_sm90(module))
    plain = _module(tmp_path, emit_gluon(flash_schedule(build_kernel("flash-fwd", H100, **options), H100, ahead=1,
                                                        depth=2)), f"plain_{name}")
    base = aot.ptx_facts(aot.compile_sm90(plain))
    assert (facts.wgmma, facts.wgmma_shapes, facts.wait_depths, facts.tma_loads, facts.tma_load_ranks) == \
        (base.wgmma, base.wgmma_shapes, base.wait_depths, base.tma_loads, base.tma_load_ranks)
    assert facts.tma_load_ranks == (4,)


def test_varlen_launcher_views_the_packed_tensors_as_one_batch_without_a_copy(tmp_path):
    torch = pytest.importorskip("torch")
    sched = flash_schedule(build_kernel("flash-fwd", H100, subtiles=2, head_dim=128, varlen=True), H100)
    module = _module(tmp_path, emit_gluon(sched), "varlen_view")
    packed = torch.zeros(1000, 8, 128, dtype=torch.float16)          # [total, H, D]
    desc = module._tma_view(packed.unsqueeze(0).transpose(1, 2), "q", [64, 128])
    assert list(desc.shape) == [1, 8, 1000, 128] and desc.base.data_ptr() == packed.data_ptr()
    assert list(desc.strides)[1:] == [128, 8 * 128, 1]               # head stride, row stride: the caller's


@pytest.mark.parametrize("options,persistent,words", [
    ({"subtiles": 2, "head_dim": 128, "causal": True}, True, "a persistent varlen forward"),
    ({"subtiles": 1, "head_dim": 128, "dtype": "fp8e4m3"}, False, "an fp8 varlen forward"),
])
def test_varlen_forms_not_emitted_are_refused(options, persistent, words):
    from twill.errors import UnsupportedFeatureError

    sched = flash_schedule(build_kernel("flash-fwd", H100, varlen=True, **options), H100, ahead=1, depth=2)
    with pytest.raises(UnsupportedFeatureError, match=f"cannot generate: {words} not supported"):
        emit_gluon(sched, persistent=persistent)
