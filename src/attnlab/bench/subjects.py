"""A benchmark subject: one network (an attnlab variant or a peer) with its loss and FLOP count.

Every subject trains with the same recipe (AdamW, decay on >= 2-D weights, the same batch), so the
only difference between two rows of a table is the network code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.bench.peers import (
    PEERS,
    SUMMARIES,
    build_peer,
    peer_flops_per_token,
    peer_loss,
    peer_mismatches,
)
from attnlab.bench.variants import VARIANTS, variant_config
from attnlab.config import Config

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
        """attnlab decoders decode with and without the KV cache (peers are timed in training)."""
        return self.kind == "variant" and bool(getattr(self.model, "supports_cache", False))


def n_params(model: nn.Module) -> int:
    """Parameters, a tied tensor counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


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
    torch.manual_seed(seed)
    if name in VARIANTS:
        from attnlab.model import build_model

        cfg = variant_config(base, name)
        model = build_model(cfg.model).to(device)
        run = torch.compile(model) if compile else model

        def loss(x: Tensor, y: Tensor) -> Tensor:
            return run(x, y, return_logits=False).total_loss  # as the trainer calls it

        v = VARIANTS[name]
        return Subject(
            name=name,
            kind="variant",
            model=model,
            loss=loss,
            flops_per_token=model.flops_per_token(seq_len),
            params=n_params(model),
            summary=v.summary,
            materialises_attention=cfg.model.needs_attention_matrix
            or cfg.model.attention.backend == "math",
            config=cfg,
        )
    if name not in PEERS:
        raise KeyError(name)
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
        notes=[f"{name} differs from the base config: " + "; ".join(mism)] if mism else [],
    )
