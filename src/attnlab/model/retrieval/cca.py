"""Chunked cross-attention's glue: the neighbour encoding the ``cross_attention`` part reads
(the built-in part itself, ``cca``, is ``model/parts/cross_attention_cca.py``, which only the
part registry imports: imported from here, it would register under whatever plugin is loading)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.base.errors import InvalidRequestError


def encode_neighbours(model: nn.Module, neighbours: Tensor) -> Tensor:
    """neighbours [B, C, k, r] token ids -> [B, C, k r, d] through ``model.encode`` (the shared
    embeddings and the bidirectional neighbour encoder; each neighbour encoded on its own)."""
    B, C, k, r = neighbours.shape
    h = model.encode(neighbours.reshape(B * C * k, r))
    return h.reshape(B, C, k * r, h.shape[-1])


def cached_neighbours(model: nn.Module, neighbours: Tensor, cache, end: int) -> Tensor | None:
    """[B, C, k r, d]: the encoded neighbours of the C = end // m chunks that positions before
    ``end`` may read, each chunk encoded once (kept in ``cache.store["neighbours"]``); None
    while no chunk is complete. ``neighbours`` [B, >= C, k, r]: every chunk's so far."""
    need = end // model.cfg.retrieval.chunk_size
    have = cache.store.get("neighbours")
    done = 0 if have is None else have.shape[1]
    if need > done:
        if neighbours.shape[1] < need:
            raise InvalidRequestError(
                f"positions up to {end - 1} read the neighbours of {need} chunks; got "
                f"{neighbours.shape[1]} (pass every completed chunk's neighbours at each step)"
            )
        new = encode_neighbours(model, neighbours[:, done:need])
        have = new if have is None else torch.cat([have, new], 1)
        cache.store["neighbours"] = have
    return have


__all__ = ["cached_neighbours", "encode_neighbours"]
