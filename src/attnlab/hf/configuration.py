"""The Hugging Face config of an exported attnlab model (``model_type = "attnlab"``).

It carries attnlab's own model config whole (``attnlab_model``, the ``[model]`` table of the run),
which the modeling code validates and builds from, plus the standard fields that transformers,
``generate`` and lm-evaluation-harness read (sizes, context length, special token ids, tying).
This module imports nothing but transformers: ``AutoConfig`` loads it without torch models.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PretrainedConfig


class AttnlabConfig(PretrainedConfig):
    """An attnlab decoder as a transformers config.

    ``attnlab_model``: the run's model config (``attnlab.config.ModelConfig`` as a dict).
    ``attnlab_plugins``: the plugin modules the model's parts come from (copied into the folder).
    ``num_hidden_layers`` counts attention layers as the KV cache sees them (layers x loops).
    """

    model_type = "attnlab"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["past_key_values"]

    def __init__(
        self,
        attnlab_model: dict[str, Any] | None = None,
        attnlab_plugins: list[dict[str, Any]] | None = None,
        attnlab_version: str = "",
        vocab_size: int = 257,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        max_position_embeddings: int = 128,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.attnlab_model = dict(attnlab_model or {})
        self.attnlab_plugins = list(attnlab_plugins or [])
        self.attnlab_version = attnlab_version
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        # Passed on too: transformers 4.x's PretrainedConfig.__init__ sets these four from its own
        # keyword arguments (tie_word_embeddings=True, token ids None when not given).
        super().__init__(
            tie_word_embeddings=tie_word_embeddings,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            **kwargs,
        )
