"""Llama (``model_type = "llama"``; SmolLM2 is one) as attnlab parts.

RMSNorm before attention and MLP, RoPE on the whole head (default, unscaled), grouped-query
attention (``num_key_value_heads``), a SwiGLU MLP ``down(silu(gate x) * up x)`` (attnlab's
``swiglu`` computes gate and up as one matmul, gate rows first), no biases, and a final RMSNorm;
the LM head tied or not as the config says.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

MODEL_TYPES = ("llama",)


def table(c: Any, differ: list[str]) -> dict[str, Any]:
    rp = dict(getattr(c, "rope_parameters", None) or {})
    if rp.get("rope_type", "default") != "default":
        differ.append(
            f"rope_type={rp.get('rope_type')!r} (attnlab's RoPE is the default, unscaled one)"
        )
    if c.hidden_act != "silu":
        differ.append(f"hidden_act={c.hidden_act!r} (attnlab's swiglu gates with silu)")
    if c.attention_bias != c.mlp_bias:
        differ.append(
            f"attention_bias={c.attention_bias} but mlp_bias={c.mlp_bias} (attnlab: one bias "
            "switch for every projection)"
        )
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {
        "family": "decoder",
        "vocab_size": c.vocab_size,
        "d_model": c.hidden_size,
        "n_layers": c.num_hidden_layers,
        "max_seq_len": c.max_position_embeddings,
        "bias": bool(c.attention_bias),
        "tie_embeddings": bool(c.tie_word_embeddings),
        "norm_position": "pre",
        "residual_kind": "sequential",
        "norm": {"kind": "rmsnorm", "bias": False, "eps": c.rms_norm_eps},
        "position": {
            "kind": "rope",
            "fraction": 1.0,
            "base": float(rp.get("rope_theta", 10000.0)),
        },
        "attention": {
            "n_heads": c.num_attention_heads,
            "n_kv_heads": c.num_key_value_heads or c.num_attention_heads,
            "head_dim": head_dim,
        },
        "ffn": {"kind": "swiglu", "hidden": c.intermediate_size},
    }


def weights(c: Any, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    p = "model."
    out = {
        "embed.weight": sd[f"{p}embed_tokens.weight"],
        "decoder.final_norm.weight": sd[f"{p}norm.weight"],
    }
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        h, b = f"{p}layers.{i}.", f"decoder.blocks.{i}."
        for ours, theirs in (("query.w_q", "q"), ("key.w_k", "k"), ("value.w_v", "v")):
            out[f"{b}attention.{ours}.weight"] = sd[f"{h}self_attn.{theirs}_proj.weight"]
            if c.attention_bias:
                out[f"{b}attention.{ours}.bias"] = sd[f"{h}self_attn.{theirs}_proj.bias"]
        out[f"{b}attention.mixer.w_o.weight"] = sd[f"{h}self_attn.o_proj.weight"]
        if c.attention_bias:
            out[f"{b}attention.mixer.w_o.bias"] = sd[f"{h}self_attn.o_proj.bias"]
        out[f"{b}ffn.w_gate_in.weight"] = torch.cat(
            [sd[f"{h}mlp.gate_proj.weight"], sd[f"{h}mlp.up_proj.weight"]]
        )
        out[f"{b}ffn.w_out.weight"] = sd[f"{h}mlp.down_proj.weight"]
        if c.mlp_bias:
            out[f"{b}ffn.w_gate_in.bias"] = torch.cat(
                [sd[f"{h}mlp.gate_proj.bias"], sd[f"{h}mlp.up_proj.bias"]]
            )
            out[f"{b}ffn.w_out.bias"] = sd[f"{h}mlp.down_proj.bias"]
        out[f"{b}norm1.weight"] = sd[f"{h}input_layernorm.weight"]
        out[f"{b}norm2.weight"] = sd[f"{h}post_attention_layernorm.weight"]
    return out
