"""Querying a stored ``bm25-bigrams``, ``bm25`` or ``hnsw`` index with one chunk, for decoding with retrieval.

The index files beside ``train.npy`` are opened once (the bigrams' and bm25s' score arrays
memory-mapped and their postings pruned, faiss' graphs read), so the first query costs a load, not a build; a query's top k comes from the same
search the build ran (nothing is excluded: a generated chunk is in no training document).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.retrieval_index import bm25, dense, terms
from attnlab.data.retrieval_index.build import encoder_for
from attnlab.data.retrieval_index.spec import IndexSpec
from attnlab.data.tokendata import TokenData


def import_backend(spec: IndexSpec) -> None:
    """Import the library that queries ``spec``'s index (scipy's sparse matrices, bm25s or
    faiss), so a caller can time loading the index apart from importing its library."""
    import importlib

    lib = {"bm25-bigrams": "scipy.sparse", "bm25": "bm25s", "hnsw": "faiss"}[spec.kind]
    importlib.import_module(lib)


def stored_search(
    directory: Path, meta: dict[str, Any], spec: IndexSpec, data: TokenData
) -> Callable[[np.ndarray], np.ndarray]:
    """A callable chunk [m] -> database chunk indices [k] (-1 padded) over the stored index."""
    k, m = int(meta["neighbours"]), int(meta["chunk_size"])
    none = np.zeros(1, dtype=np.int64)
    if spec.kind == "bm25-bigrams":
        from attnlab.data.retrieval_index.bigrams import StoredBigrams
        from attnlab.data.retrieval_index.topk import top_k

        stored = StoredBigrams(directory, int(meta["database_chunks"]))
        return lambda chunk: top_k(stored.scores(np.asarray(chunk)[:m]), k)
    if spec.kind == "bm25":
        bm = bm25.load(directory / "bm25")
        index, vocab = bm25.pruned(bm, spec), bm.vocab_dict
        decode = data.tokenizer.decode if spec.encoder == "words" else None

        def search_bm25(chunk: np.ndarray) -> np.ndarray:
            q = terms.query_ids(np.asarray(chunk)[:m], m, decode, vocab)
            return bm25.search(index, q, k, none, none, spec)[0]

        return search_bm25
    graphs = dense.load(directory, spec)
    idf = np.load(directory / "idf.npy") if spec.encoder == "random" else None
    encode = encoder_for(spec, data, idf)

    def search_dense(chunk: np.ndarray) -> np.ndarray:
        vec = encode(np.asarray(chunk, dtype=np.int64)[None, :m])
        return dense.search(graphs, vec, k, none, none, spec)[0]

    return search_dense
