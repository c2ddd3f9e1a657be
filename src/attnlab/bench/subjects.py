"""A benchmark subject: one network (an attnlab variant or a peer) with its loss and FLOP count.

Every subject trains with the same recipe (AdamW, decay on >= 2-D weights, the same batch), so the
only difference between two rows of a table is the network code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.base.params import n_params as count_params
from attnlab.bench.peers import (
    PEERS,
    SUMMARIES,
    build_peer,
    peer_flops_per_token,
    peer_loss,
    peer_mismatches,
)
from attnlab.bench.variants import find_variant, variant_config
from attnlab.config import Config
from attnlab.parts import families
from attnlab.parts.family import NEIGHBOURS

LossFn = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Subject:
    """``loss(x, y)`` runs the (possibly compiled) model; ``flops_per_token`` is forward FLOPs at
    the benchmark's sequence length (training = 3x)."""

    name: str
    kind: str  # "variant" or "peer"
    model: nn.Module
    loss: LossFn
    flops_per_token: int
    params: int
    summary: str
    materialises_attention: bool = False
    config: Config | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def decodes(self) -> bool:
        """attnlab decoders are timed decoding (peers in training only); without the KV cache
        when a part declares ``supports_kv_cache = False``."""
        return self.kind == "variant"

    @property
    def caches(self) -> bool:
        """Whether cached decoding is exact with this model's parts (their declaration)."""
        return bool(getattr(self.model, "supports_cache", False))


def n_params(model: nn.Module) -> int:
    """Parameters, a tied tensor counted once."""
    return count_params(model)


def build_subject(
    name: str,
    base: Config,
    seq_len: int,
    device: torch.device | str = "cpu",
    compile: bool = False,
    seed: int = 0,
) -> Subject:
    """Build variant or peer ``name`` at the base config's shapes on ``device`` (fp32 weights).

    Raises ConfigError when a variant does not apply, PeerUnavailableError when a peer cannot be built.
    """
    variant = find_variant(name)
    if variant is not None:
        cfg = variant_config(base, name)
        return variant_subject(name, cfg, variant.summary, seq_len, device, compile, seed)
    if name not in PEERS:
        raise KeyError(name)
    return peer_subject(name, base, seq_len, device, compile, seed)


def variant_subject(
    name: str,
    cfg: Config,
    summary: str,
    seq_len: int,
    device: torch.device | str = "cpu",
    compile: bool = False,
    seed: int = 0,
) -> Subject:
    """An attnlab model built from ``cfg`` (a variant's own, resolved config) as subject ``name``.
    Needs no variant table, so a fresh process (the memory probe) builds the same model."""
    from attnlab.model import build_model

    torch.manual_seed(seed)
    model = build_model(cfg.model).to(device)
    if families.of(cfg.model).needs(NEIGHBOURS):  # model time with synthetic neighbours
        from attnlab.bench.retrieval import WithNeighbours

        model = WithNeighbours(model, seed)
    run = torch.compile(model) if compile else model

    def loss(x: Tensor, y: Tensor) -> Tensor:
        return run(x, y, return_logits=False).total_loss  # as the trainer calls it

    return Subject(
        name=name,
        kind="variant",
        model=model,
        loss=loss,
        flops_per_token=model.flops_per_token(seq_len),
        params=n_params(model),
        summary=summary,
        materialises_attention=cfg.model.needs_attention_matrix
        or cfg.model.attention.backend == "math",
        config=cfg,
    )


def peer_subject(
    name: str,
    base: Config,
    seq_len: int,
    device: torch.device | str = "cpu",
    compile: bool = False,
    seed: int = 0,
) -> Subject:
    """Peer ``name`` (nanoGPT, Hugging Face GPT-2, x-transformers) at the base config's shapes."""
    torch.manual_seed(seed)
    model = build_peer(name, base.model).to(device)
    run_peer = torch.compile(model) if compile else model

    def peer_step_loss(x: Tensor, y: Tensor) -> Tensor:
        return peer_loss(name, run_peer, x, y)

    mism = peer_mismatches(name, base.model)
    return Subject(
        name=name,
        kind="peer",
        model=model,
        loss=peer_step_loss,
        flops_per_token=peer_flops_per_token(name, model, base.model, seq_len),
        params=n_params(model),
        summary=SUMMARIES[name],
        config=None,
        notes=[f"{name} differs from the base config: " + "; ".join(mism)] if mism else [],
    )
