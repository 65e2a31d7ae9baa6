"""A Hugging Face Llama training step with ``attn_implementation="twill"`` against ``"sdpa"`` (a GPU
benchmark for issue 34's Hugging Face target, not a test).

One random-init ``LlamaForCausalLM`` (no download; by default 8 layers of the issue's decoder shape: d 4096,
32 query heads of 128, 8 K/V heads, SwiGLU 14336, bf16) is built once per contender from the same seed and
the same weights:

* ``losses``: five training steps (causal-LM loss on fixed random tokens, AdamW) per contender, from the same
  weights; the issue asks that they agree to bf16 tolerance (``max_rel_diff`` against ``sdpa``);
* ``step_ms``: the median time of one step (forward, backward over every parameter, no optimizer update, so
  the weights stay put) in interleaved rounds between CUDA events, with ``[min, max]`` over the rounds; and
  ``speedup`` = sdpa's time / the contender's.

Contenders: ``twill`` (``twill.integrations.transformers.register()``), ``sdpa`` (PyTorch's default
dispatch), ``sdpa-cudnn`` and ``sdpa-flash`` (``"sdpa"`` with SDPA held to its cuDNN or FA2 backend); a
contender that fails records its error line. Prints a table and writes ``$OUT/hf_llama_step.json``.

    python benchmarks/hf_llama_step.py [--layers 8] [--batch 2] [--seq 4096] [--rounds 5] --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times  # noqa: E402

#: Training steps whose losses are compared.
LOSS_STEPS = 5


def _config(layers: int) -> Any:
    import transformers

    return transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                    num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                                    max_position_embeddings=16384, attention_dropout=0.0)


def _backend(name: str) -> Callable[[], Any]:
    """A context manager factory that holds SDPA to the contender's backend (none for twill and sdpa)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
    return (lambda: sdpa_kernel(backends[name])) if name in backends else contextlib.nullcontext


def _model(name: str, config: Any, state: dict | None) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    implementation = "twill" if name == "twill" else "sdpa"
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation,
                                                              dtype=torch.bfloat16)
    if state is not None:
        model.load_state_dict(state)
    return model.train()


def _losses(model: Any, ids: Any, within: Callable[[], Any]) -> list[float]:
    """:data:`LOSS_STEPS` AdamW steps from the model's weights; the weights are restored afterwards."""
    import torch

    saved = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    with within():
        for _ in range(LOSS_STEPS):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    model.load_state_dict(saved)
    return losses


def _step(model: Any, ids: Any, within: Callable[[], Any]) -> Callable[[], None]:
    def step() -> None:
        with within():
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=["twill", "sdpa", "sdpa-cudnn", "sdpa-flash"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import torch

    import twill.integrations.transformers

    twill.integrations.transformers.register()
    config = _config(args.layers)
    generator = torch.Generator("cuda").manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda", generator=generator)
    result: dict[str, Any] = {"layers": args.layers, "batch": args.batch, "seq": args.seq, "rounds": args.rounds,
                              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "contenders": {}}
    state = None
    steps: dict[str, Callable[[], None]] = {}
    for name in args.only:
        entry: dict[str, Any] = {}
        result["contenders"][name] = entry
        try:
            model = _model(name, config, state)
            if state is None:
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            entry["losses"] = _losses(model, ids, _backend(name))
            steps[name] = _step(model, ids, _backend(name))
            steps[name]()
        except Exception as exc:  # a contender this GPU or this torch cannot run
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            steps.pop(name, None)
    medians, spreads, _ = event_times(steps, calls=1, rounds=args.rounds)
    reference = result["contenders"].get("sdpa", {})
    for name, entry in result["contenders"].items():
        if name in medians:
            entry["step_ms"], entry["step_ms_range"] = medians[name], spreads[name]
            if "sdpa" in medians:
                entry["speedup"] = medians["sdpa"] / medians[name]
        if "losses" in entry and "losses" in reference:
            entry["max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(entry["losses"], reference["losses"]))
    print(f"{'contender':<12} {'step ms':>9} {'vs sdpa':>8} {'loss diff':>10}  losses")
    for name, entry in result["contenders"].items():
        if "error" in entry:
            print(f"{name:<12} {entry['error']}")
            continue
        print(f"{name:<12} {entry.get('step_ms', float('nan')):9.2f} {entry.get('speedup', float('nan')):7.3f}x "
              f"{entry.get('max_rel_diff', float('nan')):10.2e}  {', '.join(f'{x:.4f}' for x in entry['losses'])}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hf_llama_step.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
