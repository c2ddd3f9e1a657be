"""Where each supported architecture keeps the pieces the probe hooks into.

For every decoder layer: the attention module (its first input is x^ = Norm(x), its first output
the attention branch after the output projection), the module computing q (alone or fused with K
and V) and how q sits in that module's output, and the LoRA targets (q/k/v/o).

============  ======================  ================  ==================================  ==========
model_type    layers                  attention         q lives in                          residual
============  ======================  ================  ==================================  ==========
gpt_neox      gpt_neox.layers         attention         query_key_value, per head [q|k|v]   parallel*
llama**       model.layers            self_attn         q_proj (whole output)               sequential
gpt2          transformer.h           attn              c_attn (Conv1D), first d columns    sequential
============  ======================  ================  ==================================  ==========

\\* ``use_parallel_residual`` (Pythia): out = x + attn + mlp, so a term added to the attention
branch is the seed's ``x + attn + mlp + W_skip x~``. \\*\\* also mistral and qwen2 (same layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.parts import Dims

QLayout = Literal["whole", "first", "per_head_qkv"]


@dataclass(frozen=True)
class ArchSpec:
    """Attribute paths of one architecture family (see the module docstring)."""

    family: str
    layers: str
    attention: str
    q_module: str
    q_layout: QLayout
    lora_targets: tuple[str, ...]

    def layer_list(self, model: nn.Module) -> nn.ModuleList:
        node: Any = model
        for part in self.layers.split("."):
            node = getattr(node, part)
        return node

    def attention_of(self, layer: nn.Module) -> nn.Module:
        return getattr(layer, self.attention)


_LLAMA = ArchSpec(
    "llama",
    "model.layers",
    "self_attn",
    "q_proj",
    "whole",
    ("q_proj", "k_proj", "v_proj", "o_proj"),
)
SPECS: dict[str, ArchSpec] = {
    "gpt_neox": ArchSpec(
        "gpt_neox",
        "gpt_neox.layers",
        "attention",
        "query_key_value",
        "per_head_qkv",
        ("query_key_value", "dense"),
    ),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "gpt2": ArchSpec("gpt2", "transformer.h", "attn", "c_attn", "first", ("c_attn", "c_proj")),
}


def arch_of(model: nn.Module) -> ArchSpec:
    """The :class:`ArchSpec` of a transformers causal LM, or a UserError listing what is supported."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SPECS:
        raise UserError(
            f"the probe does not know the architecture {model_type!r}; supported: "
            f"{', '.join(sorted(SPECS))}. Add its attribute paths to attnlab/probe/arch.py"
        )
    return SPECS[model_type]


def dims_of(model: nn.Module) -> Dims:
    """The part dims of a pretrained base: its widths, ``pretrained=True`` (the base keeps its
    own projections), and the injected parts' own settings: no biases, norms with bias and
    eps 1e-5 (they run in float32 beside the base)."""
    cfg = model.config
    d = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or d // heads)
    return Dims(
        d_model=d,
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=head_dim,
        n_layers=int(cfg.num_hidden_layers),
        bias=False,
        norm_eps=1e-5,
        norm_bias=True,
        pretrained=True,
        heads_out=heads,
        mixer_in=heads * head_dim,
    )


def add_to_q(out: Tensor, f: Tensor, layout: QLayout, n_heads: int) -> Tensor:
    """``out`` (the q module's output) plus ``f`` on the query columns only.

    ``first``: q is ``out[..., :d_q]`` (GPT-2's c_attn = [q | k | v]); ``per_head_qkv``: GPT-NeoX's
    query_key_value is viewed as ``[..., H, 3 * d_h]`` with [q_h | k_h | v_h] per head.
    """
    if layout == "whole":
        return out + f
    if layout == "first":
        pad = out.new_zeros(*out.shape[:-1], out.shape[-1] - f.shape[-1])
        return out + torch.cat([f, pad.to(f.dtype)], dim=-1)
    head = f.view(*f.shape[:-1], n_heads, -1)
    pad = head.new_zeros(*head.shape[:-1], 2 * head.shape[-1])
    return out + torch.cat([head, pad], dim=-1).reshape(out.shape)
