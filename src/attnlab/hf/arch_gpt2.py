"""GPT-2 (``model_type = "gpt2"``) as attnlab parts.

Learned absolute positions, pre-LayerNorm with biases, one fused Q/K/V projection with bias
(``Conv1D``: weights stored [in, out], transposed here), a GELU MLP with biases (GPT-2's
``gelu_new`` is the tanh approximation: attnlab's ``gelu_tanh`` FFN), a final LayerNorm and the
LM head tied to the token embedding.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

MODEL_TYPES = ("gpt2",)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def table(c: Any, differ: list[str]) -> dict[str, Any]:
    """attnlab's ``[model]`` table for GPT-2 config ``c``; what cannot map goes to ``differ``."""
    ffn = ACTIVATIONS.get(c.activation_function)
    if ffn is None:
        differ.append(
            f"activation_function={c.activation_function!r} (attnlab: {list(ACTIVATIONS)})"
        )
    if not c.scale_attn_weights:
        differ.append("scale_attn_weights=False (attnlab always scales by 1/sqrt(d_head))")
    if c.scale_attn_by_inverse_layer_idx:
        differ.append("scale_attn_by_inverse_layer_idx=True (no attnlab part scales by layer)")
    if c.add_cross_attention:
        differ.append("add_cross_attention=True (a decoder-only attnlab model has none)")
    hidden = c.n_inner or 4 * c.n_embd
    return {
        "family": "decoder",
        "vocab_size": c.vocab_size,
        "d_model": c.n_embd,
        "n_layers": c.n_layer,
        "max_seq_len": c.n_positions,
        "bias": True,
        "tie_embeddings": True,
        "norm_position": "pre",
        "residual_kind": "sequential",
        "norm": {"kind": "layernorm", "bias": True, "eps": c.layer_norm_epsilon},
        "position": {"kind": "learned"},
        "attention": {"n_heads": c.n_head},
        "ffn": {"kind": ffn or "gelu", "hidden": hidden},
    }


def weights(c: Any, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """attnlab parameter name -> tensor, from a ``GPT2LMHeadModel`` state dict."""
    p = "transformer."
    d = c.n_embd
    out = {
        "embed.weight": sd[f"{p}wte.weight"],
        "abs_pos.table.weight": sd[f"{p}wpe.weight"],
        "decoder.final_norm.weight": sd[f"{p}ln_f.weight"],
        "decoder.final_norm.bias": sd[f"{p}ln_f.bias"],
    }
    for i in range(c.n_layer):
        h, b = f"{p}h.{i}.", f"decoder.blocks.{i}."
        qkv_w, qkv_b = sd[f"{h}attn.c_attn.weight"].t(), sd[f"{h}attn.c_attn.bias"]
        for j, part in enumerate(("query.w_q", "key.w_k", "value.w_v")):
            out[f"{b}attention.{part}.weight"] = qkv_w[j * d : (j + 1) * d]
            out[f"{b}attention.{part}.bias"] = qkv_b[j * d : (j + 1) * d]
        out[f"{b}attention.mixer.w_o.weight"] = sd[f"{h}attn.c_proj.weight"].t()
        out[f"{b}attention.mixer.w_o.bias"] = sd[f"{h}attn.c_proj.bias"]
        out[f"{b}ffn.w_in.weight"] = sd[f"{h}mlp.c_fc.weight"].t()
        out[f"{b}ffn.w_in.bias"] = sd[f"{h}mlp.c_fc.bias"]
        out[f"{b}ffn.w_out.weight"] = sd[f"{h}mlp.c_proj.weight"].t()
        out[f"{b}ffn.w_out.bias"] = sd[f"{h}mlp.c_proj.bias"]
        for n in ("1", "2"):
            out[f"{b}norm{n}.weight"] = sd[f"{h}ln_{n}.weight"]
            out[f"{b}norm{n}.bias"] = sd[f"{h}ln_{n}.bias"]
    return out
