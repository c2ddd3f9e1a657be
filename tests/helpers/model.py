"""Shared helpers of the model tests: a tiny config, parts built alone, perturbed models.
(Exact float64 arithmetic is the ``float64`` fixture of ``conftest.py``.)"""

from __future__ import annotations

import torch

from attnlab.config import ModelConfig, load_config

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.attention.n_heads=4",
    "model.vocab_size=64",
    "model.max_seq_len=32",
    "data.seq_len=16",
]


def tiny(*overrides: str) -> ModelConfig:
    """A 2-layer, 32-wide model config with the given ``--set`` overrides."""
    return load_config(None, [*TINY, *overrides]).model


def make_part(slot: str, kind: str, dims=None, /, **options):
    """The registered part ``kind`` of ``slot`` built for ``dims`` (a :class:`attnlab.parts.Dims`,
    or keyword widths d_model, n_heads, n_kv_heads, head_dim, bias), with ``options``."""
    from attnlab.parts import Dims, registry

    widths = {
        k: options.pop(k)
        for k in ("d_model", "n_heads", "n_kv_heads", "head_dim", "bias")
        if k in options
    }
    if dims is None:
        widths.setdefault("d_model", 32)
        widths.setdefault("n_heads", 1)
        widths.setdefault("n_kv_heads", widths["n_heads"])
        widths.setdefault("head_dim", widths["d_model"] // widths["n_heads"])
        dims = Dims(**widths, heads_out=widths["n_heads"])
    opts = registry.get(slot, kind).options(kind=kind, **options)
    return registry.build(opts, dims, slot)


def slot_part(cfg: ModelConfig, slot: str):
    """The part ``cfg`` puts in ``slot``, built alone for the config's dims."""
    from attnlab.parts import Dims, registry

    return registry.build(getattr(cfg, slot), Dims.from_config(cfg), slot)


def perturb(module: torch.nn.Module, std: float = 0.1) -> None:
    """Move every weight of ``module`` off its init by N(0, std) (norm gains off 1, zeroed parts
    off 0), so no term hides."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)


def ids(B: int = 2, T: int = 9, vocab: int = 64) -> torch.Tensor:
    """Random token ids [B, T]."""
    return torch.randint(0, vocab, (B, T))


def perturbed(*flags: str):
    """The model of ``tiny(*flags)`` in eval mode with every weight moved off its init by
    N(0, 0.1), so parts that start as identities or zeros really take part."""
    from attnlab.model import build_model

    model = build_model(tiny(*flags))
    perturb(model)
    return model.eval()


def bump(ids: torch.Tensor, t: int, vocab: int = 64) -> torch.Tensor:
    """``ids`` with the token at position ``t`` changed (to probe what position t influences)."""
    out = ids.clone()
    out[:, t] = (out[:, t] + 7) % vocab
    return out
