"""The retrieval-augmented decoder (RETRO, Borgeaud et al. 2022): chunked cross-attention from a
causal decoder to an encoder over retrieved neighbours, and decoding with live retrieval."""

from attnlab.model.retrieval.cca import encode_neighbours
from attnlab.model.retrieval.generate import Retriever, generate_with_retrieval

__all__ = ["Retriever", "encode_neighbours", "generate_with_retrieval"]
