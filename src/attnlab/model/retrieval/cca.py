"""Chunked cross-attention's glue: the neighbour encoding the ``cross_attention`` part reads
(the built-in part itself, ``cca``, is ``model/parts/cross_attention_cca.py``, which only the
part registry imports: imported from here, it would register under whatever plugin is loading)."""

from __future__ import annotations

from torch import Tensor, nn


def encode_neighbours(model: nn.Module, neighbours: Tensor) -> Tensor:
    """neighbours [B, C, k, r] token ids -> [B, C, k r, d] through ``model.encode`` (the shared
    embeddings and the bidirectional neighbour encoder; each neighbour encoded on its own)."""
    B, C, k, r = neighbours.shape
    h = model.encode(neighbours.reshape(B * C * k, r))
    return h.reshape(B, C, k * r, h.shape[-1])


__all__ = ["encode_neighbours"]
