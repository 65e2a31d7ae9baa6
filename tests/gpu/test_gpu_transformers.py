"""``attn_implementation="twill"`` on a Hopper GPU: a small Hugging Face Llama (random init, bf16, no
download) trains five steps with the op and, from the same weights, with SDPA; the losses agree to bf16
tolerance.

Marked ``gpu``; skipped without torch, transformers, CUDA or an sm_90 device.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a Hopper (sm_90) GPU")]

import twill.integrations.transformers  # noqa: E402


def _losses(implementation: str, state: dict | None, config, ids) -> tuple[list[float], dict]:
    """Five AdamW steps of a causal-LM loss from ``state`` (or a fresh init): the losses and the first state."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation,
                                                          dtype=torch.bfloat16).cuda()
    if state is None:
        state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, state


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_llama_training_steps_match_sdpa(kv_heads):
    twill.integrations.transformers.register()
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2816,
                                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=kv_heads,
                                      max_position_embeddings=2048)
    ids = torch.randint(0, 1000, (2, 1024), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    twill_losses, state = _losses("twill", None, config, ids)
    sdpa_losses, _ = _losses("sdpa", state, config, ids)
    assert all(a == a for a in twill_losses)            # no NaN
    for step, (a, b) in enumerate(zip(twill_losses, sdpa_losses)):
        assert abs(a - b) <= 2e-2 * abs(b), (step, twill_losses, sdpa_losses)
    assert twill_losses[-1] < twill_losses[0]            # it trains


def test_decode_steps_with_a_kv_cache_match_sdpa():
    """Prefill and decode with a DynamicCache: the decode steps call the op with one query and every cached
    key (bottom-right causal, S_k > S); the logits of each step agree with SDPA's from the same weights."""
    twill.integrations.transformers.register()
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2816,
                                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=2048)
    torch.manual_seed(0)
    models = {name: transformers.AutoModelForCausalLM.from_config(config, attn_implementation=name,
                                                                  dtype=torch.bfloat16).cuda().eval()
              for name in ("twill", "sdpa")}
    models["sdpa"].load_state_dict(models["twill"].state_dict())
    ids = torch.randint(0, 1000, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    logits = {}
    with torch.no_grad():
        for name, model in models.items():
            cache = transformers.DynamicCache(config=config)
            out = model(input_ids=ids, cache=cache, use_cache=True)
            steps, token = [out.logits[:, -1].float()], ids[:, -1:]
            for _ in range(8):       # decode: one query against the growing cache
                out = model(input_ids=token, cache=cache, use_cache=True)
                steps.append(out.logits[:, -1].float())
            logits[name] = torch.stack(steps)
    err = (logits["twill"] - logits["sdpa"]).norm() / logits["sdpa"].norm()
    assert float(err) < 2e-2
