"""An attnlab decoder as a transformers causal LM: ``AttnlabForCausalLM``.

The network is attnlab's own :class:`~attnlab.model.transformer.Transformer`, built from the
config's ``attnlab_model`` table (``self.model``, so weights are named ``model.<attnlab name>``);
this class only speaks transformers' protocol around it:

- ``forward(input_ids, attention_mask, cache, labels, logits_to_keep, ...)`` returns a
  ``CausalLMOutputWithPast``; ``labels`` are shifted inside, as in every transformers causal LM.
  The cache arrives as ``cache`` (transformers 5.x, whose ``generate()`` passes it under that
  name) or ``past_key_values`` (4.x); the output carries it under the field the installed
  transformers declares (:data:`CACHE_FIELD`).
- The KV cache is transformers' own ``Cache`` (``DynamicCache`` by default in ``generate``),
  wrapped in :class:`CacheView`, which gives it the interface attnlab's attention layers call
  (``update(slot, k, v, start)``, ``length``). So beam search, cache cropping and reordering work
  as for any transformers model. A model with a part that cannot decode from a cache
  (``supports_kv_cache = False``) is exported with ``use_cache = false`` and recomputes the prefix.
- attnlab's models take no padding mask: ``attention_mask`` may only mark right padding (which a
  causal model never reads before the padded positions); left padding is refused with the fix.

This module is also the remote code of an exported folder (``modeling_attnlab.py``, see
:mod:`attnlab.hf.vendor`); there it imports the copied attnlab sources instead of the package.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import ClassVar

import pydantic  # noqa: F401  (attnlab's configs need it; named so transformers checks for it)
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    DynamicCache,
    GenerationMixin,
    PreTrainedModel,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from attnlab.base.consent import trusting_remote_code
from attnlab.config import ModelConfig
from attnlab.hf.configuration import AttnlabConfig
from attnlab.hf.export_plugins import load_export_plugins
from attnlab.model.transformer import Transformer
from attnlab.parts import families

#: the output field (and ``generate()``'s keyword) that holds the cache in the installed transformers
CACHE_FIELD = (
    "cache"
    if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {})
    else "past_key_values"
)


class CacheView:
    """attnlab's KV-cache interface over a transformers ``Cache``: attention slot ``i`` (layer x
    loop) is the cache's layer ``i``; ``length`` is the number of positions already cached."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self.length = cache.get_seq_length()
        self.cross: dict = {}

    def update(self, slot: int, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
        return self.cache.update(k, v, slot)


def _check_padding(attention_mask: Tensor | None) -> None:
    """Only right padding is exact for a model without a padding mask."""
    if attention_mask is None or attention_mask.ndim != 2 or bool(attention_mask.all()):
        return
    mask = attention_mask.to(torch.bool)
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):  # a kept position after a padded one
        raise ValueError(
            "attnlab models read no padding mask, so left-padded or gapped rows would attend to "
            "padding; pad on the right (tokenizer.padding_side = 'right') or use batch size 1"
        )


class PositionLimit(StoppingCriteria):
    """Stops ``generate()`` when the sequence fills the positions the model can place (a learned
    table's ``max_seq_len``), with one warning saying so, instead of failing at the next step:
    what transformers does for its own models when ``max_length`` is left at its default."""

    def __init__(self, limit: int, noun: str) -> None:
        self.limit, self.noun, self.warned = limit, noun, False

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> Tensor:
        done = input_ids.shape[-1] >= self.limit
        if done and not self.warned:
            self.warned = True
            warnings.warn(
                f"generation stopped at {self.limit} tokens: this model has {self.limit} "
                f"{self.noun} (max_position_embeddings) and cannot place a token past them; ask "
                "for fewer new tokens (max_new_tokens) or give a shorter prompt",
                UserWarning,
                stacklevel=2,
            )
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class AttnlabPreTrainedModel(PreTrainedModel):
    """transformers' base for attnlab models: attnlab initialises its own parts."""

    config_class = AttnlabConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["Block"]
    _supports_sdpa = True

    def _init_weights(self, module) -> None:
        """Nothing: every attnlab part initialises itself when built (``init_weights``)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' ``from_pretrained``; ``trust_remote_code=True`` is also the consent to
        import the plugin files the folder carries (:mod:`attnlab.hf.export_plugins`), which a
        folder's modeling code is as much as its ``modeling_attnlab.py``."""
        trusted = kwargs.get("trust_remote_code") is True
        with trusting_remote_code() if trusted else contextlib.nullcontext():
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)


class AttnlabForCausalLM(AttnlabPreTrainedModel, GenerationMixin):
    """attnlab's decoder-only Transformer behind transformers' causal-LM interface."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"model.lm_head.weight": "model.embed.weight"}

    def __init__(self, config: AttnlabConfig) -> None:
        super().__init__(config)
        load_export_plugins(config)
        cfg = ModelConfig.model_validate(config.attnlab_model)
        if not families.of(cfg).exports:
            raise ValueError(
                f"attnlab_model.family={cfg.family!r}: only {families.where(lambda f: f.exports)} "
                "models are causal LMs"
            )
        self.model = Transformer(cfg)
        self.post_init()

    def generate(self, *args, **kwargs):
        """transformers' ``generate()``; a model whose positions end (``position_limit``, e.g.
        learned positions) stops cleanly at that length (:class:`PositionLimit`). A prompt
        already past it is refused by the first forward (a ``ValueError`` naming the limit)."""
        limit = self.model.cfg.position_limit
        if limit is not None:
            criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
            criteria.append(PositionLimit(limit, self.model.cfg.position_limit_noun))
            kwargs["stopping_criteria"] = criteria
        return super().generate(*args, **kwargs)

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value) -> None:
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value) -> None:
        self.model.lm_head = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        past_key_values=None,
        cache=None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        position_ids: Tensor | None = None,
        return_dict: bool | None = None,
        neighbours: Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits [B, T, V] (the last ``logits_to_keep`` positions when > 0); loss with labels.
        A retrieval model (``family = "retrieval"``) reads ``neighbours`` [B, C, k, r] token ids
        when given (no cache then); without them it is its decoder without retrieval.

        ``cache`` and ``past_key_values`` are the same argument under its 5.x and 4.x names."""
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("pass the cache once, as cache= or past_key_values=, not both")
        past_key_values = cache if cache is not None else past_key_values
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("attnlab models take input_ids (inputs_embeds is not supported)")
        _check_padding(attention_mask)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        view = None
        if self.model.supports_cache and (past_key_values is not None or use_cache):
            if past_key_values is None:
                past_key_values = DynamicCache(config=self.config)
            view = CacheView(past_key_values)
        elif past_key_values is not None and past_key_values.get_seq_length() == 0:
            past_key_values = None  # generate made one; this model recomputes the prefix
        elif past_key_values is not None:
            raise ValueError(
                "this attnlab model has a part without KV-cache support; call with use_cache=False"
            )
        if neighbours is not None:
            out = self.model(input_ids, neighbours=neighbours, last_logits_only=logits_to_keep == 1)
        else:
            out = self.model(input_ids, cache=view, last_logits_only=logits_to_keep == 1)
        logits = out.logits
        if isinstance(logits_to_keep, int) and logits_to_keep > 1:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                labels[:, 1:].reshape(-1).to(logits.device),
                ignore_index=-100,
            )
            if self.training and out.aux_loss is not None:
                loss = loss + out.aux_loss
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: past_key_values})
