"""Parameter accounting from a config alone: totals, non-embedding count, per-part counts and the
K/V-cache bytes per token. The model is built on the meta device, so even 410M shapes cost no
memory. Each parameter is counted in the row its part declares (``param_label``: query,
pre_projection, ffn, ...); parameters outside any part belong to the assembly (embedding,
position, norm, qk_norm, lm_head), and everything inside cross-attention to ``cross_attention``;
a family may name rows of its own for whole modules (``Family.param_rows``: a retrieval model's
CCA layers are ``chunked_cross_attention``, its encoder ``neighbour_encoder``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from attnlab.base.params import n_params
from attnlab.config import ModelConfig
from attnlab.parts import Part

#: module-path segment of the assembly's own modules -> row; the deepest matching segment wins.
_ASSEMBLY = {
    "embed": "embedding",
    "abs_pos": "position",
    "lm_head": "lm_head",
    "q_norm": "qk_norm",
    "k_norm": "qk_norm",
    "norm1": "norm",
    "norm2": "norm",
    "cross_norm": "norm",
    "final_norm": "norm",
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


def labels(model: nn.Module) -> dict[str, str]:
    """Dotted parameter name -> its ``attnlab params`` row."""
    owner: dict[str, str] = {}
    for name, m in model.named_modules():
        if isinstance(m, Part):
            for pname, _ in m.named_parameters():
                owner[f"{name}.{pname}" if name else pname] = m.label()
    out = {}
    family = getattr(model, "family", None)
    rows = family.param_rows if family is not None else {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        segs = name.split(".")
        if segs[0] in rows:
            out[name] = rows[segs[0]]
        elif "cross_attention" in segs:
            out[name] = "cross_attention"
        elif name in owner:
            out[name] = owner[name]
        else:
            out[name] = next((_ASSEMBLY[s] for s in reversed(segs) if s in _ASSEMBLY), "other")
    return out


def count(cfg: ModelConfig, cache_bytes_per_element: int = 2) -> ParamReport:
    """Parameter report of the model ``cfg`` describes (no weights are allocated)."""
    from attnlab.model.transformer import build_model, parts_of

    with torch.device("meta"):
        model = build_model(cfg)
    rows = labels(model)
    by_part: dict[str, int] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        by_part[rows[name]] = by_part.get(rows[name], 0) + p.numel()
    total = sum(by_part.values())
    emb = sum(by_part.get(k, 0) for k in EMBEDDING_PARTS)
    parts = parts_of(model)
    active = total - emb - sum(n_params(part) - part.active_params() for part in parts)
    notes: list[str] = []
    stack = model.decoder if model.decoder is not None else model.encoder
    for part in parts_of(stack.blocks[0]):
        notes.extend(part.notes())
    notes.extend(model.family.notes(cfg))
    if stack.loops > 1:
        notes.append(f"loops: the layers run {stack.loops} times with shared weights")
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
