"""Hugging Face transformers: ``attn_implementation="twill"`` runs a model's attention with
:func:`twill.ops.attention`.

>>> import twill.integrations.transformers
>>> twill.integrations.transformers.register()
>>> model = AutoModelForCausalLM.from_config(cfg, attn_implementation="twill")

:func:`register` adds ``"twill"`` to transformers' ``AttentionInterface`` (the attention function,
:func:`~twill.integrations.transformers.attention.attention_forward`) and ``AttentionMaskInterface`` (the mask
function, :func:`~twill.integrations.transformers.attention.attention_mask`: no mask where the causal flag or no
mask at all says everything). Importing this package imports neither torch nor transformers; ``register``
does.
"""

from __future__ import annotations

from twill.errors import UnsupportedFeatureError

#: The ``attn_implementation`` name.
NAME = "twill"


def register() -> None:
    """Add ``"twill"`` to transformers' attention and attention-mask interfaces (again: the same functions),
    or raise :class:`UnsupportedFeatureError` naming the extra when transformers is not installed."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as exc:
        raise UnsupportedFeatureError("twill.integrations.transformers needs Hugging Face transformers: "
                                      "pip install 'twill-gpu[transformers]'") from exc
    from twill.integrations.transformers.attention import attention_forward, attention_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)


__all__ = ["NAME", "register"]
