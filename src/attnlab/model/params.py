"""Parameter accounting from a config alone: totals, non-embedding count, per-part counts and the
K/V-cache bytes per token. The model is built on the meta device, so even 410M shapes cost no
memory; each parameter is attributed to the part (query, pre_projection, ffn, ...) that owns it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from attnlab.config import ModelConfig

#: module-path segment -> part name; the deepest matching segment wins.
_PARTS = {
    "embed": "embedding",
    "abs_pos": "position",
    "t5_bias": "position",
    "lm_head": "lm_head",
    "query": "query",
    "key": "key",
    "value": "value",
    "q_norm": "qk_norm",
    "k_norm": "qk_norm",
    "mixer": "output",
    "identity_head": "identity_head",
    "virtual": "virtual_heads",
    "pre_projection": "pre_projection",
    "content_skip": "content_skip",
    "ffn": "ffn",
    "norm1": "norm",
    "norm2": "norm",
    "cross_norm": "norm",
    "final_norm": "norm",
    "cross_attention": "cross_attention",
}
EMBEDDING_PARTS = ("embedding", "position", "lm_head")


@dataclass
class ParamReport:
    """Counts for one config. ``kv_cache_bytes_per_token`` assumes 16-bit (bf16/fp16) entries."""

    total: int
    non_embedding: int
    kv_cache_bytes_per_token: int
    by_part: dict[str, int]
    active_non_embedding: int
    flops_per_token: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def part_of(name: str, cfg: ModelConfig) -> str:
    """The part a parameter's dotted name belongs to."""
    segs = name.split(".")
    if "cross_attention" in segs:
        return "cross_attention"
    part = "other"
    for s in segs:
        if s in _PARTS:
            part = _PARTS[s]
    if part == "value" and cfg.moe_values.enabled:
        return "moe_values"
    if part == "output" and cfg.mixer.nonlinear:
        return "nonlinear_mixer"
    return part


def count(cfg: ModelConfig, cache_bytes_per_element: int = 2) -> ParamReport:
    """Parameter report of the model ``cfg`` describes (no weights are allocated)."""
    from attnlab.model.transformer import build_model

    with torch.device("meta"):
        model = build_model(cfg)
    by_part: dict[str, int] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        part = part_of(name, cfg)
        by_part[part] = by_part.get(part, 0) + p.numel()
    total = sum(by_part.values())
    emb = sum(by_part.get(k, 0) for k in EMBEDDING_PARTS)
    active = total - emb
    notes = []
    for m in model.modules():
        if hasattr(m, "active_params"):
            active -= sum(p.numel() for p in m.parameters()) - m.active_params()
    if cfg.moe_values.enabled:
        notes.append(
            f"moe_values: {cfg.moe_values.top_k} of {cfg.moe_values.n_experts} experts active per "
            f"token; the layer is looped {cfg.moe_values.loops} times with shared weights"
        )
    if cfg.mixer.nonlinear:
        from attnlab.model.mixing import nonlinear_mixer_hidden, removed_mlp_params

        blk = model.decoder.blocks[0] if model.decoder is not None else model.encoder.blocks[0]
        n_in = blk.attention.mixer.w_a.in_features
        hidden = nonlinear_mixer_hidden(cfg, n_in)
        notes.append(
            f"nonlinear_mixer: hidden {hidden}, {sum(p.numel() for p in blk.attention.mixer.parameters())} "
            f"params per layer = a linear W_O ({n_in * cfg.d_model}) + the removed MLP block "
            f"({removed_mlp_params(cfg)}), rounded to a whole hidden width"
        )
    slots = model.decoder.n_slots if model.decoder is not None else 0
    kv = 2 * slots * cfg.n_kv_heads * cfg.head_dim * cache_bytes_per_element
    return ParamReport(
        total=total,
        non_embedding=total - emb,
        kv_cache_bytes_per_token=kv,
        by_part=dict(sorted(by_part.items(), key=lambda kv: -kv[1])),
        active_non_embedding=active,
        flops_per_token=model.flops_per_token(cfg.max_seq_len),
        notes=notes,
    )
