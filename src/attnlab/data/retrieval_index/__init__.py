"""Retrieval indices that scale: BM25 over words through bm25s, faiss HNSW over frozen
embeddings, the leakage rule per reading token, a streaming resumable build, the database's
integrity check and a human-readable view of a chunk's neighbours.

``attnlab.data.retrieval`` holds the database (``Database``, ``build_database``); this package
the pieces, one idea per module: :mod:`.spec` (which index), :mod:`.terms` and :mod:`.bm25`,
:mod:`.encoders` and :mod:`.dense`, :mod:`.leakage`, :mod:`.build`, :mod:`.live`,
:mod:`.integrity`, :mod:`.show`.
"""

from attnlab.data.retrieval_index.spec import DEFAULT_KIND, ENCODERS, IndexSpec, index_spec

__all__ = ["DEFAULT_KIND", "ENCODERS", "IndexSpec", "index_spec"]
