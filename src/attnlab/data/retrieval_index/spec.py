"""Which index a retrieval database is built with: its kind and its encoder, typed and validated.

Three kinds (``attnlab data retrieval --kind KIND --encoder ENCODER``):

* ``bm25-bigrams`` (encoder ``bigrams``): BM25 over token 2/3-grams scored by one sparse product
  per block of queries, the original database (exact, O(n^2): every query scores ~70% of the
  database). Its directory keeps the original name ``mM-kK-cC``, so databases built before the
  other kinds existed keep loading.
* ``bm25`` (encoder ``words``: the chunk decoded by the data's tokenizer and split into lower-case
  words; or ``unigrams``: the token ids): BM25 (lucene, k1 = 1.5, b = 0.75) indexed by bm25s and
  searched with bounded cost (:mod:`.impact`): a query keeps its ``query_terms`` = 4 terms of
  highest idf, each term its ``postings`` = 512 chunks of highest BM25 impact, so a query touches
  at most 2,048 postings whatever the database's size (bm25s' own ``retrieve`` fills a dense score
  row over the whole database per query: O(n) a query, O(n^2) a build). Terms in more than
  ``max(1000, chunks / 10)`` database chunks are stop terms (not indexed).
* ``hnsw`` (encoder ``random``: a fixed random projection of the chunk's idf-weighted token
  counts, d = 128; ``smollm2-table``: the mean of SmolLM2-135M's frozen input embeddings of the
  chunk's text; ``smollm2``: SmolLM2-135M's mean-pooled last hidden states): faiss' HNSW graphs
  (M = 16, efConstruction = 40, efSearch = 64) over L2-normalised embeddings, inner product, in
  ``shards`` = 2 graphs over contiguous ranges of chunks (a fixed number, not the worker count:
  each graph is built on one thread, the graphs in parallel, and a query's answer, merged over
  the graphs by (similarity, chunk), does not depend on the workers). Build and search cost
  O(n log n) distance evaluations.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from attnlab.base.errors import UserError

Kind = Literal["bm25-bigrams", "bm25", "hnsw"]
ENCODERS: dict[str, tuple[str, ...]] = {
    "bm25-bigrams": ("bigrams",),
    "bm25": ("words", "unigrams"),
    "hnsw": ("random", "smollm2-table", "smollm2"),
}
#: the index the retrieval family builds when nothing else is asked for (``attnlab train`` has
#: no setting for it yet): the original one, so existing runs find their database
DEFAULT_KIND: Kind = "bm25-bigrams"


class IndexSpec(BaseModel):
    """An index kind with its encoder and its fixed parameters (recorded in ``meta.json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind = DEFAULT_KIND
    encoder: str = "bigrams"
    #: hnsw: embedding width of the ``random`` encoder, graph degree, build and search beams
    dim: int = 128
    hnsw_m: int = 16
    ef_construction: int = 40
    ef_search: int = 64
    #: hnsw: graphs over contiguous chunk ranges, each built on one thread (see the module doc)
    shards: int = Field(2, ge=1, le=64)
    #: bm25: a query's highest-idf terms kept, and each term's highest-impact postings kept
    query_terms: int = Field(4, ge=1)
    postings: int = Field(512, ge=1)

    @property
    def slug(self) -> str:
        """The suffix of the database directory's name ("" for the original kind)."""
        return "" if self.kind == "bm25-bigrams" else f"{self.kind}-{self.encoder}"

    @property
    def lexical(self) -> bool:
        return self.kind != "hnsw"

    def describe(self) -> str:
        """One line for ``meta.json["embedder"]`` and the command's summary."""
        if self.kind == "bm25-bigrams":
            return "bm25 over token 2- and 3-grams (bm25s, method lucene, k1=1.5, b=0.75)"
        if self.kind == "bm25":
            terms = "decoded lower-case words" if self.encoder == "words" else "token unigrams"
            return (
                f"bm25 over {terms} (bm25s index, method lucene, k1=1.5, b=0.75; terms in more "
                "than max(1000, chunks/10) chunks are stop terms; a query's "
                f"{self.query_terms} highest-idf terms, each term's {self.postings} "
                "highest-impact chunks)"
            )
        enc = {
            "random": f"a fixed random projection (d={self.dim}) of idf-weighted token counts",
            "smollm2-table": "the mean of SmolLM2-135M's frozen input embeddings",
            "smollm2": "SmolLM2-135M's mean-pooled last hidden states",
        }[self.encoder]
        return (
            f"faiss HNSW (M={self.hnsw_m}, efConstruction={self.ef_construction}, "
            f"efSearch={self.ef_search}, inner product, {self.shards} shards) over {enc}"
        )


def index_spec(kind: str | None = None, encoder: str | None = None) -> IndexSpec:
    """The spec of ``--kind KIND --encoder ENCODER`` (each defaulting: the kind to
    ``DEFAULT_KIND``, the encoder to the kind's first); a bad pair is a ``UserError``."""
    kind = kind or DEFAULT_KIND
    if kind not in ENCODERS:
        raise UserError(f"--kind {kind!r} is not an index kind; use one of {', '.join(ENCODERS)}")
    allowed = ENCODERS[kind]
    encoder = encoder or allowed[0]
    if encoder not in allowed:
        raise UserError(
            f"--encoder {encoder!r} does not go with --kind {kind}; use one of {', '.join(allowed)}"
        )
    return IndexSpec(kind=kind, encoder=encoder)  # type: ignore[arg-type]


def spec_from_slug(slug: str) -> IndexSpec | None:
    """The spec whose directory suffix is ``slug`` ("" is the original kind); None if none."""
    if not slug:
        return index_spec()
    for kind, encoders in ENCODERS.items():
        for enc in encoders:
            spec = IndexSpec(kind=kind, encoder=enc)  # type: ignore[arg-type]
            if spec.slug == slug:
                return spec
    return None
