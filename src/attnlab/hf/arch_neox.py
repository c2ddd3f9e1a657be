"""GPT-NeoX / Pythia (``model_type = "gpt_neox"``) as attnlab parts.

Rotary positions on a fraction of each head (``partial_rotary_factor``, 0.25 in Pythia),
pre-LayerNorm with biases, the parallel residual ``x + attn(LN1 x) + mlp(LN2 x)`` (or the
sequential one), a fused Q/K/V projection whose rows are laid out per head as [q | k | v], a GELU
MLP with biases, and an untied LM head (``embed_out``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

MODEL_TYPES = ("gpt_neox",)
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def _rope(c: Any) -> dict[str, Any]:
    rp = dict(getattr(c, "rope_parameters", None) or {})
    return {
        "type": rp.get("rope_type", "default"),
        "theta": rp.get("rope_theta", getattr(c, "rotary_emb_base", 10000.0)),
        "fraction": rp.get("partial_rotary_factor", getattr(c, "rotary_pct", 0.25)),
    }


def table(c: Any, differ: list[str]) -> dict[str, Any]:
    ffn = ACTIVATIONS.get(c.hidden_act)
    if ffn is None:
        differ.append(f"hidden_act={c.hidden_act!r} (attnlab: {list(ACTIVATIONS)})")
    rope = _rope(c)
    if rope["type"] != "default":
        differ.append(f"rope_type={rope['type']!r} (attnlab's RoPE is the default, unscaled one)")
    if not getattr(c, "attention_bias", True):
        differ.append("attention_bias=False while the MLP has biases (attnlab: one bias switch)")
    return {
        "family": "decoder",
        "vocab_size": c.vocab_size,
        "d_model": c.hidden_size,
        "n_layers": c.num_hidden_layers,
        "max_seq_len": c.max_position_embeddings,
        "bias": True,
        "tie_embeddings": bool(c.tie_word_embeddings),
        "norm_position": "pre",
        "residual_kind": "parallel" if c.use_parallel_residual else "sequential",
        "norm": {"kind": "layernorm", "bias": True, "eps": c.layer_norm_eps},
        "position": {
            "kind": "rope",
            "fraction": float(rope["fraction"]),
            "base": float(rope["theta"]),
        },
        "attention": {"n_heads": c.num_attention_heads},
        "ffn": {"kind": ffn or "gelu", "hidden": c.intermediate_size},
    }


def weights(c: Any, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    p = "gpt_neox."
    H, d = c.num_attention_heads, c.hidden_size
    dh = d // H
    out = {
        "embed.weight": sd[f"{p}embed_in.weight"],
        "decoder.final_norm.weight": sd[f"{p}final_layer_norm.weight"],
        "decoder.final_norm.bias": sd[f"{p}final_layer_norm.bias"],
    }
    if not c.tie_word_embeddings:
        # ``embed_out`` in checkpoints written before transformers 5, ``lm_head`` since
        out["lm_head.weight"] = sd[
            "lm_head.weight" if "lm_head.weight" in sd else "embed_out.weight"
        ]
    for i in range(c.num_hidden_layers):
        h, b = f"{p}layers.{i}.", f"decoder.blocks.{i}."
        w = sd[f"{h}attention.query_key_value.weight"].view(H, 3, dh, d)
        bias = sd[f"{h}attention.query_key_value.bias"].view(H, 3, dh)
        for j, part in enumerate(("query.w_q", "key.w_k", "value.w_v")):
            out[f"{b}attention.{part}.weight"] = w[:, j].reshape(H * dh, d)
            out[f"{b}attention.{part}.bias"] = bias[:, j].reshape(H * dh)
        out[f"{b}attention.mixer.w_o.weight"] = sd[f"{h}attention.dense.weight"]
        out[f"{b}attention.mixer.w_o.bias"] = sd[f"{h}attention.dense.bias"]
        out[f"{b}ffn.w_in.weight"] = sd[f"{h}mlp.dense_h_to_4h.weight"]
        out[f"{b}ffn.w_in.bias"] = sd[f"{h}mlp.dense_h_to_4h.bias"]
        out[f"{b}ffn.w_out.weight"] = sd[f"{h}mlp.dense_4h_to_h.weight"]
        out[f"{b}ffn.w_out.bias"] = sd[f"{h}mlp.dense_4h_to_h.bias"]
        for ours, theirs in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
            out[f"{b}{ours}.weight"] = sd[f"{h}{theirs}.weight"]
            out[f"{b}{ours}.bias"] = sd[f"{h}{theirs}.bias"]
    return out
