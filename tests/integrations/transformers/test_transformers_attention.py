"""``attn_implementation="twill"`` in Hugging Face transformers, on the CPU: ``register()`` adds the name to
both interfaces, a Llama model built with it sends its attention to ``twill.ops.attention`` (K/V heads not
repeated, the model's scaling, causal), forward and backward on ``meta`` tensors (the op's fake
implementation), and dropout and masks the kernels cannot apply are refused with the reason. The training
step against SDPA on a GPU is tests/gpu/test_gpu_transformers.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import twill.ops  # noqa: E402
from twill.errors import UnsupportedFeatureError  # noqa: E402
from twill.integrations import transformers as twill_transformers  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64


def _config(**overrides):
    options = dict(vocab_size=128, hidden_size=HEADS * HEAD_DIM, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256)
    return transformers.LlamaConfig(**{**options, **overrides})


def _model(device="cpu", **overrides):
    twill_transformers.register()
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(_config(**overrides), attn_implementation="twill",
                                                             dtype=torch.bfloat16)


@pytest.fixture
def calls(monkeypatch):
    """The arguments of every ``twill.ops.attention`` call (the call itself goes on to the op)."""
    seen = []
    real = twill.ops.attention

    def recording(q, k, v, causal=False, scale=None):
        seen.append({"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape), "causal": causal,
                     "scale": scale})
        return real(q, k, v, causal=causal, scale=scale)

    monkeypatch.setattr(twill.ops, "attention", recording)
    return seen


def test_register_adds_twill_to_both_interfaces_and_is_idempotent():
    twill_transformers.register()
    twill_transformers.register()
    from transformers import AttentionInterface, AttentionMaskInterface

    from twill.integrations.transformers.attention import attention_forward, attention_mask

    assert AttentionInterface._global_mapping["twill"] is attention_forward
    assert AttentionMaskInterface._global_mapping["twill"] is attention_mask
    assert "twill" in transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS


def test_a_llama_model_runs_its_attention_through_the_op_forward_and_backward(calls):
    model = _model("meta")
    assert model.config._attn_implementation == "twill"
    ids = torch.zeros(2, 96, dtype=torch.long, device="meta")
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 96, 128) and out.loss.shape == ()
    out.loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    # one call per layer: the K/V heads as the model has them, its scaling, the causal mask
    assert calls == [{"q": (2, HEADS, 96, HEAD_DIM), "k": (2, KV_HEADS, 96, HEAD_DIM),
                      "v": (2, KV_HEADS, 96, HEAD_DIM), "causal": True, "scale": HEAD_DIM ** -0.5}] * 2


def test_the_attention_output_is_the_ops_result_transposed_without_a_copy():
    from twill.integrations.transformers.attention import attention_forward

    module = torch.nn.Module()
    module.is_causal = False
    q = torch.randn(1, HEADS, 64, HEAD_DIM, device="meta", dtype=torch.bfloat16)
    k = torch.randn(1, KV_HEADS, 64, HEAD_DIM, device="meta", dtype=torch.bfloat16)
    out, weights = attention_forward(module, q, k, k, None, scaling=0.5)
    assert weights is None and out.shape == (1, 64, HEADS, HEAD_DIM) and not out.is_contiguous()
    assert out.transpose(1, 2).is_contiguous()


def test_on_the_cpu_the_call_reaches_the_op_which_refuses_the_device():
    """A real CPU model: the mask is none (no padding), so the call reaches the kernels' implementation,
    whose device check refuses CPU tensors."""
    model = _model()
    ids = torch.zeros(1, 64, dtype=torch.long)
    for mask in (None, torch.ones(1, 64, dtype=torch.long)):
        with pytest.raises(UnsupportedFeatureError, match="is on cpu; the kernels run on a CUDA"):
            model(input_ids=ids, attention_mask=mask)


def test_dropout_is_refused():
    model = _model(attention_dropout=0.1).train()
    with pytest.raises(UnsupportedFeatureError, match="attention dropout 0.1 is not supported"):
        model(input_ids=torch.zeros(1, 64, dtype=torch.long))


def test_a_padding_mask_is_refused_rather_than_ignored(calls):
    model = _model()
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, :10] = 0
    with pytest.raises(UnsupportedFeatureError, match="attention mask is not the causal one"):
        model(input_ids=torch.zeros(2, 64, dtype=torch.long), attention_mask=mask)
    assert calls == []


def test_the_mask_function_leaves_out_only_the_plain_causal_mask():
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    from twill.integrations.transformers.attention import attention_mask

    assert attention_mask(2, 16, 16, mask_function=causal_mask_function) is None
    assert attention_mask(2, 16, 16, mask_function=causal_mask_function,
                          attention_mask=torch.ones(2, 16, dtype=torch.bool)) is None
    padded = torch.ones(2, 16, dtype=torch.bool)
    padded[0, 0] = False
    sliding = sliding_window_causal_mask_function(4)
    for kwargs in ({"attention_mask": padded}, {"mask_function": sliding}, {"allow_is_causal_skip": False},
                   {"q_offset": 3, "kv_length": 24}, {"q_offset": 2, "kv_length": 19},
                   {"q_offset": 3, "kv_offset": 1, "kv_length": 19}):
        args = {"mask_function": causal_mask_function, "kv_length": 16, **kwargs}
        mask = attention_mask(2, 16, **args)
        assert mask is not None and mask.dtype == torch.bool and mask.shape[-2:] == (16, args["kv_length"]), kwargs


@pytest.mark.parametrize("q_length,q_offset,kv_offset,kv_length", [(16, 3, 0, 19), (1, 40, 0, 41), (5, 0, 0, 5),
                                                                    (4, 10, 2, 12)])
def test_a_query_offset_from_a_filled_cache_is_the_kernels_bottom_right_causal_mask(q_length, q_offset, kv_offset,
                                                                                     kv_length):
    """The queries at the cache's last positions (prefill or decode with a KV cache): no mask, as the
    kernels' causal mask aligned bottom-right (query i sees keys 0..i + kv_length - q_length) is the one
    transformers builds for these arguments."""
    from transformers.masking_utils import causal_mask_function

    from twill.integrations.transformers.attention import attention_mask

    args = dict(q_offset=q_offset, kv_offset=kv_offset, mask_function=causal_mask_function)
    assert attention_mask(2, q_length, kv_length, **args) is None
    built = attention_mask(2, q_length, kv_length, allow_is_causal_skip=False, **args)
    bottom_right = torch.ones(q_length, kv_length, dtype=torch.bool).tril(kv_length - q_length)
    assert torch.equal(built[0, 0], bottom_right)


def test_generation_with_a_kv_cache_calls_the_op_with_the_cached_keys(calls):
    """Prefill then one decode step with a DynamicCache (meta tensors, the op's fake implementation): the
    decode step's one query attends to every cached key, the op's causal call with Sk > Sq."""
    model = _model("meta")
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 12, dtype=torch.long, device="meta"), cache=cache, use_cache=True)
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device="meta"), cache=cache,
                    use_cache=True)
    assert out.logits.shape == (1, 1, 128)
    assert [(c["q"][2], c["k"][2], c["causal"]) for c in calls] == [(12, 12, True)] * 2 + [(1, 13, True)] * 2
